// Checks that need no server: `node --test test/` (Node 18+).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventEmitter } from 'node:events';
import { test } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { patchWavSizes } from '../src/audio-file.js';
import {
  createClient, encodingName, finishReasonName, loadApi, PROTO_ENV, resolveProtoPath, SynthesisStream, TtsError,
} from '../src/client.js';

// A client on a port nobody listens on: requests are checked before anything is sent.
const offline = () => createClient({ address: '127.0.0.1:9', timeoutMs: 2000 });

test('the proto loads and defines the four calls', () => {
  const { Client } = loadApi();
  for (const method of ['ListVoices', 'Synthesize', 'SynthesizeOnline', 'StreamingSynthesize']) {
    assert.equal(typeof Client.prototype[method], 'function', method);
  }
});

test('the proto path can be set by the environment', () => {
  const copy = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'qwen3-tts-proto-')), 'tts.proto');
  fs.copyFileSync(resolveProtoPath(), copy);
  process.env[PROTO_ENV] = copy;
  try {
    assert.equal(resolveProtoPath(), copy);
    assert.ok(loadApi().Client);
  } finally {
    delete process.env[PROTO_ENV];
  }
  process.env[PROTO_ENV] = path.join(os.tmpdir(), 'no-such-dir', 'tts.proto');
  try {
    assert.throws(() => resolveProtoPath(), /cannot find the API proto/);
  } finally {
    delete process.env[PROTO_ENV];
  }
});

test('a misspelt field is refused instead of silently dropped', async () => {
  const tts = offline();
  try {
    await assert.rejects(tts.synthesize({ text: 'x', audioFormat: { encoding: 'WAV' } }),
      (error) => error instanceof TypeError && /has no field 'audioFormat'.*audio_format/.test(error.message));
    await assert.rejects(tts.synthesize({ text: 'x', audio_format: { sampleRate: 8000 } }),
      /audio_format.sampleRate: AudioFormat has no field/);
    assert.throws(() => tts.streamingSynthesize({ voice: { speakr: 'ryan' } }), /voice.speakr/);
  } finally {
    tts.close();
  }
});

test('an unknown encoding is refused; known ones are accepted in any case', async () => {
  const tts = offline();
  try {
    await assert.rejects(tts.synthesize({ text: 'x', audio_format: { encoding: 'aac' } }), /not a AudioEncoding/);
    // Accepted locally, then the call fails to connect: a TtsError with a gRPC code, not a TypeError.
    await assert.rejects(tts.synthesize({ text: 'x', audio_format: { encoding: 'ogg_opus' } }),
      (error) => error instanceof TtsError && error.codeName === 'UNAVAILABLE' && error.code === grpc.status.UNAVAILABLE);
  } finally {
    tts.close();
  }
  assert.equal(encodingName('ogg_opus'), 'AUDIO_ENCODING_OGG_OPUS');
  assert.equal(finishReasonName('FINISH_REASON_LENGTH'), 'length');
});

// Minimal protobuf writer for the test's google.rpc.Status.
const varint = (n) => {
  const bytes = [];
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    bytes.push(byte);
  } while (n > 0);
  return Buffer.from(bytes);
};
const field = (number, value) => (typeof value === 'number'
  ? Buffer.concat([varint(number * 8), varint(value)])
  : Buffer.concat([varint(number * 8 + 2), varint(value.length), Buffer.from(value)]));

test('a RetryInfo in the status details becomes retryDelaySeconds', () => {
  const duration = Buffer.concat([field(1, 2), field(2, 500_000_000)]);
  const retryInfo = field(1, duration);
  const any = Buffer.concat([field(1, 'type.googleapis.com/google.rpc.RetryInfo'), field(2, retryInfo)]);
  const status = Buffer.concat([field(1, 8), field(2, 'queue full'), field(3, any)]);
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', status);
  const error = new TtsError({ code: 8, details: 'queue full', metadata });
  assert.equal(error.codeName, 'RESOURCE_EXHAUSTED');
  assert.equal(error.message, 'RESOURCE_EXHAUSTED: queue full');
  assert.equal(error.retryDelaySeconds, 2.5);
  assert.equal(new TtsError({ code: 3, details: 'bad', metadata: new grpc.Metadata() }).retryDelaySeconds, null);
});

test('a streamed WAV header gets its real sizes', () => {
  const header = Buffer.alloc(44);
  header.write('RIFF', 0, 'latin1');
  header.writeUInt32LE(0xffffffff, 4);
  header.write('WAVEfmt ', 8, 'latin1');
  header.writeUInt32LE(16, 16);
  header.writeUInt16LE(1, 20);
  header.writeUInt16LE(1, 22);
  header.writeUInt32LE(24000, 24);
  header.writeUInt32LE(48000, 28);
  header.writeUInt16LE(2, 32);
  header.writeUInt16LE(16, 34);
  header.write('data', 36, 'latin1');
  header.writeUInt32LE(0xffffffff, 40);
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'qwen3-tts-wav-')), 'x.wav');
  fs.writeFileSync(file, Buffer.concat([header, Buffer.alloc(100)]));
  const fd = fs.openSync(file, 'r+');
  try {
    assert.equal(patchWavSizes(fd), true);
  } finally {
    fs.closeSync(fd);
  }
  const patched = fs.readFileSync(file);
  assert.equal(patched.readUInt32LE(4), 144 - 8);
  assert.equal(patched.readUInt32LE(40), 100);
});

// A stand-in for grpc-js's duplex call: records what is written, and lets the test play the server.
class ScriptedCall extends EventEmitter {
  written = [];
  ended = false;
  write(message) { this.written.push(message); return true; }
  end() { this.ended = true; }
  cancel() { this.emit('error', { code: grpc.status.CANCELLED, details: 'Cancelled on client' }); }
  // A response as proto-loader gives it: every field present, absent messages null.
  respond(fields) {
    this.emit('data', { chunk: null, completion: null, flush_ack: null, utterance_id: '', words: null, ...fields });
  }
}

const chunk = (offset) => ({ audio: Buffer.alloc(4), offset_samples: offset, num_samples: 2, offset_seconds: 0, duration_seconds: 0 });
const completion = (reason, requestId) => ({ finish_reason: reason, usage: null, request_id: requestId });
const timing = (word, start, end) => ({ word, start_char: start, end_char: end, start_seconds: start / 10, end_seconds: end / 10 });

test('utterances are written with their ids, and the config\'s own utterance without one', () => {
  const call = new ScriptedCall();
  const stream = new SynthesisStream(call, { config: { utterance_id: 't1' } });
  stream.write('Hello ');
  stream.write('there.', 't1');
  stream.closeUtterance('t1');
  stream.write('And tomorrow', 't2');
  stream.flush('m', 't2');
  stream.cancelUtterance('t2');
  stream.end();
  assert.deepEqual(call.written, [
    { config: { utterance_id: 't1' } },
    { text: 'Hello ' },
    { text: 'there.', utterance_id: 't1' },
    { close_utterance: {}, utterance_id: 't1' },
    { text: 'And tomorrow', utterance_id: 't2' },
    { flush: { marker: 'm' }, utterance_id: 't2' },
    { cancel_utterance: {}, utterance_id: 't2' },
  ]);
  assert.ok(call.ended);
  assert.throws(() => stream.cancelUtterance(2), /cancelUtterance: the utterance id must be a string/);
});

test('events name their utterance, and each utterance\'s completion is kept and awaitable', async () => {
  const call = new ScriptedCall();
  const stream = new SynthesisStream(call, { config: { utterance_id: 'a', word_timestamps: true } });
  const seen = [];
  stream.on('audio', (audio, id) => seen.push(['audio', id, audio.offset_samples]));
  stream.on('words', (words, id) => seen.push(['words', id, words.map((w) => w.word).join(' ')]));
  stream.on('completion', (done, id) => seen.push(['completion', id, finishReasonName(done.finish_reason)]));
  const bDone = stream.utteranceDone('b');
  call.respond({ utterance_id: 'a', chunk: chunk(0) });
  call.respond({ utterance_id: 'b', chunk: chunk(0) });
  call.respond({ utterance_id: 'a', words: { words: [timing('Hi', 0, 2), timing('there', 3, 8)] } });
  call.respond({ utterance_id: 'b', completion: completion('FINISH_REASON_CANCELLED', 'rb') });
  call.respond({ utterance_id: 'a', completion: completion('FINISH_REASON_STOPPED', 'ra') });
  call.emit('end');
  assert.deepEqual(seen, [
    ['audio', 'a', 0], ['audio', 'b', 0], ['words', 'a', 'Hi there'],
    ['completion', 'b', 'cancelled'], ['completion', 'a', 'stopped'],
  ]);
  assert.equal((await bDone).request_id, 'rb');
  assert.equal((await stream.utteranceDone('a')).request_id, 'ra'); // already finished: answered at once
  const { completion: last, completions } = await stream.done;
  assert.equal(last.request_id, 'ra');
  assert.deepEqual([...completions.keys()], ['b', 'a']);
});

test('iteration yields each message with its utterance id and words', async () => {
  const call = new ScriptedCall();
  const stream = new SynthesisStream(call, { config: {} });
  call.respond({ chunk: chunk(0) });
  call.respond({ words: { words: [timing('Hi', 0, 2)] } });
  call.respond({ completion: completion('FINISH_REASON_STOPPED', 'r') });
  call.emit('end');
  const messages = [];
  for await (const message of stream) messages.push(message);
  assert.deepEqual(messages.map((m) => m.utterance_id), ['', '', '']);
  assert.deepEqual(messages[1].words.words.map((w) => [w.word, w.start_char, w.end_char]), [['Hi', 0, 2]]);
});

test('waiting on an utterance that never finishes fails with the call', async () => {
  const call = new ScriptedCall();
  const stream = new SynthesisStream(call, { config: {} });
  const pending = stream.utteranceDone('never');
  call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: 'utterance_id: bad' });
  await assert.rejects(pending, (error) => error instanceof TtsError && error.codeName === 'INVALID_ARGUMENT');
  await assert.rejects(stream.done, TtsError);
});

test('word_timestamps and utterance_id are request fields; the camelCase spelling is refused naming them', async () => {
  const tts = offline();
  try {
    await assert.rejects(tts.synthesize({ text: 'x', wordTimestamps: true }), /has no field 'wordTimestamps'.*word_timestamps/);
    assert.throws(() => tts.streamingSynthesize({ wordTimestamps: true }), /word_timestamps/);
    // Accepted locally; the call then fails to connect, as a TtsError.
    const stream = tts.streamingSynthesize({ utterance_id: 't1', word_timestamps: true });
    stream.write('Hi.', 't1');
    stream.end();
    await assert.rejects(stream.done, (error) => error instanceof TtsError && error.codeName === 'UNAVAILABLE');
    await assert.rejects(tts.synthesizeOnline({ text: 'x', word_timestamps: true }, () => {}), TtsError);
  } finally {
    tts.close();
  }
});
