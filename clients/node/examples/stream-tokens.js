#!/usr/bin/env node
// Speak text as an LLM would produce it: small fragments, some ending inside a word, with a flush
// marker in between, reading the audio with `for await`. Prints a JSON summary on stdout.
//
//   node examples/stream-tokens.js [host:port] [speaker] > summary.json
//   (API key from QWEN3_TTS_API_KEY)

import { setTimeout as sleep } from 'node:timers/promises';

import { createClient } from '../src/client.js';

const [address = 'localhost:50051', speaker = 'ryan'] = process.argv.slice(2);
const tokens = ['Hel', 'lo', ' there', ', this', ' is a', ' str', 'eaming', ' test', '.'];

const tts = createClient({ address, apiKey: process.env.QWEN3_TTS_API_KEY });
try {
  const stream = tts.streamingSynthesize({
    voice: { speaker, language: 'english' },
    audio_format: { encoding: 'PCM16', sample_rate: 16000 },
    generation: { temperature: 0 },
  });

  // Write in the background, as tokens arrive; read the responses below as they come back.
  const writer = (async () => {
    for (const [index, token] of tokens.entries()) {
      stream.write(token);
      if (index === 3) stream.flush('after-this');
      await sleep(20);
    }
    stream.end();
  })();

  let bytes = 0;
  let chunks = 0;
  let lastEnd = 0;
  let contiguous = true;
  const flushAcks = [];
  let completion = null;
  for await (const message of stream) {
    if (message.chunk) {
      chunks += 1;
      bytes += message.chunk.audio.length;
      contiguous &&= message.chunk.offset_samples === lastEnd;
      lastEnd = message.chunk.offset_samples + message.chunk.num_samples;
    }
    if (message.flush_ack) flushAcks.push(message.flush_ack.marker);
    if (message.completion) completion = message.completion;
  }
  await writer;
  const { requestId } = await stream.done;
  process.stdout.write(`${JSON.stringify({ chunks, bytes, samples: lastEnd, contiguous, flushAcks, completion, requestId })}\n`);
} catch (error) {
  process.stderr.write(`${error.codeName ?? error.name}: ${error.details ?? error.message}\n`);
  process.exitCode = 1;
} finally {
  tts.close();
}
