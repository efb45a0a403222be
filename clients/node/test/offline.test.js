// Checks that need no server: `node --test test/` (Node 18+).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { patchWavSizes } from '../src/audio-file.js';
import { createClient, encodingName, finishReasonName, loadApi, PROTO_ENV, resolveProtoPath, TtsError } from '../src/client.js';

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
    await assert.rejects(tts.synthesize({ text: 'x', audio_format: { encoding: 'mp3' } }), /not a AudioEncoding/);
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
