#!/usr/bin/env node
// qwen3-tts-node: speak text through a qwen3-tts server from the command line.

import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { AudioSink } from '../src/audio-file.js';
import { createClient, encodingName, finishReasonName, PROTO_ENV, shortEncoding, TtsError } from '../src/client.js';

const USAGE = `usage: qwen3-tts-node <command> [options]

commands:
  voices                 show the model, its speakers, languages and audio formats
  say TEXT               speak TEXT into a file (audio streamed to it as it is generated)
  stream                 speak text read from stdin as it arrives (bidirectional streaming)
  voice create           clone a voice from --reference-audio (Base models) and keep it; prints its id
  voice get|delete ID    show or forget a registered voice
  voice list             the registered voices of this caller

connection:
  --server HOST:PORT     the server (default localhost:50051)
  --api-key KEY          API key, sent as "authorization: Bearer KEY" (or env QWEN3_TTS_API_KEY)
  --tls                  connect with TLS (system roots unless --ca)
  --ca FILE              PEM root certificate(s) to trust (implies --tls)
  --cert FILE --key FILE PEM client certificate chain and key, for mutual TLS
  --timeout SECONDS      deadline of the call
  --proto FILE           the API's tts.proto (or env ${PROTO_ENV})

say / stream:
  -o, --output FILE      output file, or - for stdout (default out.wav)
  --speaker NAME         built-in speaker (CustomVoice models)
  --language NAME        language of the text (default auto)
  --instruction TEXT     voice description or speaking style
  --voice-id ID          a registered voice (voice create) instead of the fields above
  --encoding ENC         wav, pcm16, ogg_opus, mulaw, alaw or mp3 (default: from the output's suffix, else wav)
  --sample-rate HZ       output rate (default 24000)
  --temperature T  --top-k K  --top-p P  --repetition-penalty R  --seed N  --max-seconds S
  --unary                say: one Synthesize call instead of streaming the audio back
  --timestamps           print when each word is spoken to stderr as the timings arrive
                         (a server started with --aligner-model): word START-END s: WORD [START_CHAR:END_CHAR]

voice create:
  --reference-audio FILE the recording to clone (an audio file)
  --reference-text TEXT  its transcript (an in-context voice); without it, --x-vector-only
  --x-vector-only        clone from the speaker embedding alone

examples:
  qwen3-tts-node say "Hello there." -o hello.wav --speaker ryan --language english
  llm ... | qwen3-tts-node stream -o answer.wav --speaker ryan
  qwen3-tts-node say "Hi." -o - --encoding pcm16 --sample-rate 16000 | aplay -f S16_LE -r 16000
  ID=$(qwen3-tts-node voice create --reference-audio me.wav --reference-text "What I said.")
  qwen3-tts-node say "In my voice." -o mine.wav --voice-id "$ID"
`;

// The model's own rate: AudioFormat.sample_rate 0 means this.
const NATIVE_SAMPLE_RATE = 24000;
const ENCODINGS = ['wav', 'pcm16', 'ogg_opus', 'mulaw', 'alaw', 'mp3'];
const ENCODING_BY_SUFFIX = {
  '.wav': 'wav', '.ogg': 'ogg_opus', '.opus': 'ogg_opus', '.pcm': 'pcm16', '.raw': 'pcm16', '.l16': 'pcm16',
  '.ulaw': 'mulaw', '.mulaw': 'mulaw', '.alaw': 'alaw', '.mp3': 'mp3',
};

const OPTIONS = {
  help: { type: 'boolean', short: 'h' },
  server: { type: 'string', default: 'localhost:50051' },
  'api-key': { type: 'string' },
  tls: { type: 'boolean' },
  ca: { type: 'string' },
  cert: { type: 'string' },
  key: { type: 'string' },
  timeout: { type: 'string' },
  proto: { type: 'string' },
  output: { type: 'string', short: 'o', default: 'out.wav' },
  speaker: { type: 'string', default: '' },
  language: { type: 'string', default: '' },
  instruction: { type: 'string', default: '' },
  'voice-id': { type: 'string', default: '' },
  'reference-audio': { type: 'string' },
  'reference-text': { type: 'string', default: '' },
  'x-vector-only': { type: 'boolean', default: false },
  encoding: { type: 'string' },
  'sample-rate': { type: 'string' },
  temperature: { type: 'string' },
  'top-k': { type: 'string' },
  'top-p': { type: 'string' },
  'repetition-penalty': { type: 'string' },
  seed: { type: 'string' },
  'max-seconds': { type: 'string' },
  unary: { type: 'boolean' },
  timestamps: { type: 'boolean' },
  json: { type: 'boolean' },
};

class UsageError extends Error {}

function number(values, name, { integer = false } = {}) {
  const text = values[name];
  if (text === undefined) return undefined;
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new UsageError(`--${name}: expected ${integer ? 'an integer' : 'a number'}, got '${text}'`);
  }
  return value;
}

function connection(values) {
  const read = (file) => (file ? readFileSync(file) : undefined);
  const useTls = values.tls || values.ca || values.cert || values.key;
  const timeout = number(values, 'timeout');
  return {
    address: values.server,
    apiKey: values['api-key'] ?? process.env.QWEN3_TTS_API_KEY,
    tls: useTls ? { ca: read(values.ca), cert: read(values.cert), key: read(values.key) } : undefined,
    protoPath: values.proto,
    timeoutMs: timeout === undefined ? undefined : timeout * 1000,
  };
}

function encodingOf(values) {
  const encoding = values.encoding ?? ENCODING_BY_SUFFIX[path.extname(values.output).toLowerCase()] ?? 'wav';
  if (!ENCODINGS.includes(encoding)) throw new UsageError(`--encoding: one of ${ENCODINGS.join(', ')}`);
  return encoding;
}

function requestParts(values) {
  const generation = {
    temperature: number(values, 'temperature'),
    top_k: number(values, 'top-k', { integer: true }),
    top_p: number(values, 'top-p'),
    repetition_penalty: number(values, 'repetition-penalty'),
    seed: number(values, 'seed', { integer: true }),
    max_audio_seconds: number(values, 'max-seconds'),
  };
  return {
    voice: { speaker: values.speaker, language: values.language, instruction: values.instruction,
      voice_id: values['voice-id'] },
    audio_format: { encoding: encodingName(encodingOf(values)), sample_rate: number(values, 'sample-rate', { integer: true }) ?? 0 },
    generation: Object.fromEntries(Object.entries(generation).filter(([, v]) => v !== undefined)),
    ...(values.timestamps ? { word_timestamps: true } : {}),
  };
}

// One line a word on stderr, as the Python CLI prints them; the audio's output is left alone.
function printWords(words) {
  for (const w of words) {
    process.stderr.write(`word ${w.start_seconds.toFixed(3)}-${w.end_seconds.toFixed(3)} s: ${w.word} [${w.start_char}:${w.end_char}]\n`);
  }
}

function summary(output, completion, audioFormat, clientTiming) {
  const usage = completion.usage ?? {};
  const where = output === '-' ? 'stdout' : output;
  const rate = audioFormat.sample_rate || NATIVE_SAMPLE_RATE;
  return `wrote ${where}: ${(usage.audio_seconds ?? 0).toFixed(2)} s of audio (${shortEncoding(audioFormat.encoding)}, ${rate} Hz), `
    + `time to first audio ${(usage.time_to_first_audio_seconds ?? 0).toFixed(3)} s (server), ${clientTiming}, `
    + `finish reason ${finishReasonName(completion.finish_reason)}, request ${completion.request_id}`;
}

function seconds(value, what) {
  return value === null ? `no audio ${what}` : `${value.toFixed(3)} s ${what}`;
}

async function say(client, values, text) {
  const request = { text, ...requestParts(values) };
  const sink = new AudioSink(values.output, { patchWav: request.audio_format.encoding === encodingName('wav') });
  const started = performance.now();
  let firstAudio = null;
  try {
    if (values.unary) {
      const response = await client.synthesize(request);
      firstAudio = (performance.now() - started) / 1000;
      sink.write(response.audio);
      printWords(response.words);
      return summary(values.output, response.completion, response.audio_format, seconds(firstAudio, 'to the whole file'));
    }
    const { completion } = await client.synthesizeOnline(request, (chunk) => {
      if (firstAudio === null && chunk.audio.length > 0) firstAudio = (performance.now() - started) / 1000;
      sink.write(chunk.audio);
    }, { onWords: printWords });
    return summary(values.output, completion, request.audio_format, seconds(firstAudio, 'from the request to first audio here'));
  } finally {
    await sink.close(!values.unary);
  }
}

async function stream(client, values) {
  const config = requestParts(values); // {voice, audio_format, generation[, word_timestamps]}
  const audioFormat = config.audio_format;
  const sink = new AudioSink(values.output, { patchWav: audioFormat.encoding === encodingName('wav') });
  const call = client.streamingSynthesize(config);
  call.on('words', printWords);
  let firstText = null;
  let firstAudio = null;
  call.on('audio', (chunk) => {
    if (firstAudio === null && chunk.audio.length > 0 && firstText !== null) firstAudio = (performance.now() - firstText) / 1000;
    sink.write(chunk.audio);
  });

  // Every piece of stdin is sent the moment it is read: no line buffering, UTF-8 kept whole.
  process.stdin.setEncoding('utf8');
  const onData = (text) => {
    if (firstText === null) firstText = performance.now();
    if (!call.write(text)) {
      process.stdin.pause();
      call.once('drain', () => process.stdin.resume());
    }
  };
  const onEnd = () => call.end();
  process.stdin.on('data', onData);
  process.stdin.on('end', onEnd);
  try {
    const { completion } = await call.done;
    return summary(values.output, completion, audioFormat, seconds(firstAudio, 'from the first text to first audio here'));
  } finally {
    process.stdin.off('data', onData);
    process.stdin.off('end', onEnd);
    process.stdin.pause();
    process.stdin.destroy();
    await sink.close(true);
  }
}

function describeVoices(response) {
  const mode = response.mode.replace(/^MODEL_MODE_/, '').toLowerCase();
  const lines = [`model: ${response.model} (${response.model_size}, ${mode})`
    + (response.random_weights ? ' RANDOM WEIGHTS: noise, not speech' : '')];
  if (response.speakers.length > 0) {
    lines.push(`speakers: ${response.speakers.map((s) => s.name + (s.dialect ? ` (${s.dialect})` : '')).join(', ')}`);
  }
  lines.push(`languages: ${response.languages.join(', ')}`);
  lines.push(`instruction: ${response.accepts_instruction ? 'yes' : 'no'}`);
  for (const support of response.output_formats) {
    lines.push(`${shortEncoding(support.encoding)}: ${support.sample_rates.join(', ')} Hz (${support.mime_type})`);
  }
  const limits = response.limits ?? {};
  lines.push(`limits: ${limits.max_document_chars} characters a text or a streamed utterance (spoken in segments `
    + `of up to ${limits.max_segment_chars}); ${limits.max_audio_seconds} s of audio a generation, `
    + `${limits.max_document_audio_seconds} s a text`);
  return `${lines.join('\n')}\n`;
}

function describeVoice(voice) {
  const kind = voice.kind.replace(/^VOICE_KIND_/, '').toLowerCase();
  const created = voice.create_time ? new Date(Number(voice.create_time.seconds) * 1000).toISOString() : '';
  return `${voice.voice_id}\t${kind}\t${voice.reference_seconds.toFixed(2)} s\t${created}\t${voice.reference_text}`;
}

async function voiceCommand(client, values, [action, ...ids]) {
  const expected = { create: 0, get: 1, delete: 1, list: 0 }[action];
  if (expected === undefined) throw new UsageError(`voice: unknown action '${action ?? ''}' (create, get, list, delete)`);
  if (ids.length !== expected) throw new UsageError(`voice ${action} takes ${expected ? 'one voice id' : 'no arguments'}`);
  if (action === 'create') {
    if (!values['reference-audio']) throw new UsageError('voice create needs --reference-audio FILE');
    const voice = await client.createVoice({
      reference_audio: readFileSync(values['reference-audio']), reference_text: values['reference-text'],
      x_vector_only: values['x-vector-only'],
    });
    return values.json ? JSON.stringify(voice, null, 2) : voice.voice_id;
  }
  if (action === 'delete') {
    await client.deleteVoice(ids[0]);
    return `deleted ${ids[0]}`;
  }
  const voices = action === 'get' ? [await client.getVoice(ids[0])] : (await client.listVoices()).registered_voices;
  return values.json ? JSON.stringify(action === 'get' ? voices[0] : voices, null, 2) : voices.map(describeVoice).join('\n');
}

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
  } catch (error) {
    throw new UsageError(error.message);
  }
  const { values, positionals } = parsed;
  if (values.help || positionals.length === 0) {
    process.stdout.write(USAGE);
    return values.help ? 0 : 2;
  }
  const [command, ...rest] = positionals;
  const expected = { voices: 0, say: 1, stream: 0, voice: rest.length }[command];
  if (expected === undefined) throw new UsageError(`unknown command '${command}'`);
  if (rest.length !== expected) throw new UsageError(command === 'say' ? 'say takes one TEXT argument' : `${command} takes no arguments`);
  if (values.unary && command !== 'say') throw new UsageError('--unary is an option of say');

  const client = createClient(connection(values));
  const interrupted = new Promise((resolve) => process.once('SIGINT', () => resolve(130)));
  try {
    const work = (async () => {
      if (command === 'voice') {
        const text = await voiceCommand(client, values, rest);
        if (text) process.stdout.write(`${text}\n`);
      } else if (command === 'voices') {
        const response = await client.listVoices();
        process.stdout.write(values.json ? `${JSON.stringify(response, null, 2)}\n` : describeVoices(response));
      } else {
        const line = command === 'say' ? await say(client, values, rest[0]) : await stream(client, values);
        process.stderr.write(`${line}\n`);
      }
      return 0;
    })();
    return await Promise.race([work, interrupted]);
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; if (code === 130) process.exit(code); },
  (error) => {
    if (error instanceof TtsError) {
      process.stderr.write(`qwen3-tts-node: ${error.codeName}: ${error.details}`
        + `${error.retryDelaySeconds !== null ? ` (retry after ${error.retryDelaySeconds} s)` : ''}\n`);
      process.exitCode = 1;
    } else if (error instanceof UsageError) {
      process.stderr.write(`qwen3-tts-node: ${error.message}\n(run qwen3-tts-node --help)\n`);
      process.exitCode = 2;
    } else {
      process.stderr.write(`qwen3-tts-node: ${error?.message ?? error}\n`);
      process.exitCode = error instanceof TypeError || error?.code === 'ENOENT' ? 2 : 1;
    }
  },
);
