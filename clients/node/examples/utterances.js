#!/usr/bin/env node
// A voice agent's turns as utterances of ONE call, with word timestamps: "t1" is spoken to its end; "t2" is
// cancelled as soon as its first audio arrives (the user barged in); then "t3" is spoken on the same call.
// Prints a JSON summary on stdout: each utterance's text, finish reason, audio and timed words.
//
//   node examples/utterances.js [host:port] [speaker] > summary.json
//   (the server needs --aligner-model, e.g. random:tiny; API key from QWEN3_TTS_API_KEY)

import { createClient, finishReasonName } from '../src/client.js';

const [address = 'localhost:50051', speaker = 'ryan'] = process.argv.slice(2);
const texts = {
  t1: 'Sure. The weather today is sunny.',
  t2: 'Tomorrow brings rain in the morning, then it clears up and the evening is mild.',
  t3: 'Of course. Here is Sunday.',
};

const tts = createClient({ address, apiKey: process.env.QWEN3_TTS_API_KEY });
try {
  // The config opens the first utterance, so that its voice prompt is ready before its text arrives.
  const stream = tts.streamingSynthesize({
    voice: { speaker, language: 'english' },
    audio_format: { encoding: 'PCM16', sample_rate: 16000 },
    utterance_id: 't1',
    word_timestamps: true,
  });
  const heard = Object.fromEntries(Object.entries(texts).map(([id, text]) => [id, { text, chunks: 0, samples: 0, contiguous: true, words: [] }]));
  stream.on('audio', (chunk, id) => {
    const utterance = heard[id];
    utterance.contiguous &&= chunk.offset_samples === utterance.samples;
    utterance.chunks += 1;
    utterance.samples = chunk.offset_samples + chunk.num_samples;
    if (id === 't2' && utterance.chunks === 1) stream.cancelUtterance('t2'); // the user started speaking
  });
  stream.on('words', (words, id) => heard[id].words.push(...words));

  stream.write(texts.t1, 't1');
  stream.closeUtterance('t1');
  await stream.utteranceDone('t1');
  stream.write(texts.t2, 't2'); // never closed: cancelled instead
  await stream.utteranceDone('t2');
  stream.write(texts.t3, 't3');
  stream.closeUtterance('t3');
  stream.end(); // no more utterances: the call ends once t3 has been spoken

  const { completions } = await stream.done;
  for (const [id, completion] of completions) {
    Object.assign(heard[id], { finishReason: finishReasonName(completion.finish_reason), audioSeconds: completion.usage.audio_seconds });
  }
  process.stdout.write(`${JSON.stringify(heard)}\n`);
} catch (error) {
  process.stderr.write(`${error.codeName ?? error.name}: ${error.details ?? error.message}\n`);
  process.exitCode = 1;
} finally {
  tts.close();
}
