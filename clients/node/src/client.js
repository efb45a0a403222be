// A small Node.js client for the Qwen3-TTS gRPC service (package qwen3_tts.v1, service TextToSpeech).
//
//   import { createClient } from 'qwen3-tts-client';
//   const tts = createClient({ address: 'localhost:50051' });
//   const { audio, completion } = await tts.synthesize({ text: 'Hello.', voice: { speaker: 'ryan' } });
//
// Messages are plain objects whose field names are the proto's own (snake_case: `audio_format`,
// `sample_rate`), enums are their names as strings ('AUDIO_ENCODING_WAV', 'FINISH_REASON_STOPPED'), 64-bit integers
// are Numbers, and unset fields of a response hold their defaults (absent messages are null).
// A request with a field or enum value the proto does not have is refused with a TypeError before
// anything is sent, rather than having the field silently dropped.
//
// Word timestamps: set `word_timestamps: true` on a request or a streaming config (the server needs
// --aligner-model); timed words come as WordTiming objects ({word, start_char, end_char, start_seconds,
// end_seconds}). Utterances: one streamingSynthesize call carries several, each named by an id
// (write(text, id), closeUtterance(id), cancelUtterance(id)); every event names the utterance it is for.

import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const PROTO_ENV = 'QWEN3_TTS_PROTO';
const PROTO_RELATIVE = path.join('qwen3_tts', 'v1', 'tts.proto');
const PACKAGE = 'qwen3_tts.v1';
const SERVICE = `${PACKAGE}.TextToSpeech`;
const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

export const LOADER_OPTIONS = Object.freeze({
  keepCase: true, // field names as the proto and the server's error messages spell them
  longs: Number, // uint64 seed / sample offsets: well inside 2^53
  enums: String,
  defaults: true,
  oneofs: true,
});

// Audio responses can be large (Synthesize returns the whole file in one message).
const DEFAULT_CHANNEL_OPTIONS = Object.freeze({
  'grpc.max_receive_message_length': 256 * 1024 * 1024,
});

/**
 * Where the .proto is read from: the `protoPath` option, else $QWEN3_TTS_PROTO, else a `proto/`
 * directory inside this package (for a copy shipped with the proto next to it), else the
 * repository's `proto/` two levels up (clients/node -> repository root).
 */
export function resolveProtoPath(protoPath) {
  const candidates = protoPath
    ? [protoPath]
    : process.env[PROTO_ENV]
      ? [process.env[PROTO_ENV]]
      : [path.join(PACKAGE_ROOT, 'proto', PROTO_RELATIVE), path.join(PACKAGE_ROOT, '..', '..', 'proto', PROTO_RELATIVE)];
  for (const candidate of candidates) {
    if (existsSync(candidate)) return path.resolve(candidate);
  }
  throw new Error(`qwen3-tts: cannot find the API proto (${PROTO_RELATIVE}); looked at ${candidates.join(', ')}. `
    + `Set ${PROTO_ENV} or the protoPath option to the path of tts.proto.`);
}

const loaded = new Map();

/** Load the proto (once per path): { packageDefinition, Client, methods }. */
export function loadApi(protoPath) {
  const file = resolveProtoPath(protoPath);
  if (!loaded.has(file)) {
    // Load it by its import path under its proto root, so that imports between API files resolve.
    const root = file.endsWith(PROTO_RELATIVE) ? file.slice(0, -PROTO_RELATIVE.length) : path.dirname(file);
    const name = file.endsWith(PROTO_RELATIVE) ? PROTO_RELATIVE : path.basename(file);
    const packageDefinition = protoLoader.loadSync(name, { ...LOADER_OPTIONS, includeDirs: [root] });
    if (!packageDefinition[SERVICE]) throw new Error(`qwen3-tts: ${file} does not define ${SERVICE}`);
    const Client = grpc.makeClientConstructor(packageDefinition[SERVICE], 'TextToSpeech');
    loaded.set(file, { packageDefinition, Client, file });
  }
  return loaded.get(file);
}

// ---------------------------------------------------------------------------------------------
// Errors

const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

/** A failed call: `code` is the gRPC status number, `codeName` its name, `details` the server's message. */
export class TtsError extends Error {
  constructor({ code, details, metadata, requestId }) {
    const codeName = CODE_NAMES[code] ?? `CODE_${code}`;
    super(`${codeName}: ${details}`);
    this.name = 'TtsError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.metadata = metadata;
    this.requestId = requestId ?? null;
    // RESOURCE_EXHAUSTED from a full queue carries google.rpc.RetryInfo in the status details.
    this.retryDelaySeconds = retryDelayFrom(metadata);
  }
}

export const Status = grpc.status;

function toTtsError(error, requestId) {
  if (error instanceof TtsError) return error;
  if (error && typeof error.code === 'number') {
    return new TtsError({ code: error.code, details: error.details ?? error.message, metadata: error.metadata, requestId });
  }
  return error;
}

// Just enough protobuf to read google.rpc.Status{details: [Any{type_url, value}]} and
// google.rpc.RetryInfo{retry_delay: Duration{seconds, nanos}} from the grpc-status-details-bin trailer.
function* protoFields(buffer) {
  let at = 0;
  const varint = () => {
    let value = 0;
    let scale = 1;
    for (;;) {
      if (at >= buffer.length) throw new RangeError('truncated');
      const byte = buffer[at++];
      value += (byte & 0x7f) * scale;
      scale *= 128;
      if (byte < 0x80) return value;
    }
  };
  while (at < buffer.length) {
    const key = varint();
    const wire = key % 8;
    const field = Math.floor(key / 8);
    if (wire === 0) yield [field, varint()];
    else if (wire === 2) {
      const length = varint();
      yield [field, buffer.subarray(at, at + length)];
      at += length;
    } else if (wire === 1) at += 8;
    else if (wire === 5) at += 4;
    else return;
  }
}

function retryDelayFrom(metadata) {
  try {
    const raw = metadata?.get?.('grpc-status-details-bin')?.[0];
    if (!raw) return null;
    for (const [field, any] of protoFields(Buffer.from(raw))) {
      if (field !== 3) continue;
      let typeUrl = '';
      let value = null;
      for (const [f, v] of protoFields(any)) {
        if (f === 1) typeUrl = v.toString();
        else if (f === 2) value = v;
      }
      if (!typeUrl.endsWith('/google.rpc.RetryInfo') || !value) continue;
      let seconds = 0;
      for (const [f, duration] of protoFields(value)) {
        if (f !== 1) continue;
        for (const [g, n] of protoFields(duration)) {
          if (g === 1) seconds += n;
          else if (g === 2) seconds += n / 1e9;
        }
      }
      return seconds;
    }
  } catch {
    // A malformed detail is no reason to hide the error itself.
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// Request checking: proto-loader drops unknown fields and unknown enum names without a word.

function checkMessage(definition, typeName, value, where) {
  const entry = definition[`${PACKAGE}.${typeName}`];
  if (value === null || value === undefined) return value;
  if (typeof value !== 'object' || Array.isArray(value) || Buffer.isBuffer(value)) {
    throw new TypeError(`${where || typeName}: expected an object (${typeName})`);
  }
  const fields = new Map(entry.type.field.map((f) => [f.name, f]));
  const out = {};
  for (const [key, fieldValue] of Object.entries(value)) {
    const field = fields.get(key);
    const at = where ? `${where}.${key}` : key;
    if (!field) {
      throw new TypeError(`${at}: ${typeName} has no field '${key}' (fields: ${[...fields.keys()].join(', ')})`);
    }
    if (fieldValue === undefined || fieldValue === null) continue;
    if (field.type === 'TYPE_MESSAGE') out[key] = checkMessage(definition, field.typeName, fieldValue, at);
    else if (field.type === 'TYPE_ENUM') out[key] = checkEnum(definition, field.typeName, fieldValue, at);
    else out[key] = fieldValue;
  }
  return out;
}

function checkEnum(definition, typeName, value, where) {
  const values = definition[`${PACKAGE}.${typeName}`].type.value;
  if (typeof value === 'number' && values.some((v) => v.number === value)) return value;
  if (typeof value === 'string') {
    // Short names ('wav') stand for the prefixed ones ('AUDIO_ENCODING_WAV'), in any case.
    const name = value.toUpperCase();
    const prefixed = enumPrefix(typeName) + name;
    for (const candidate of [name, prefixed]) {
      if (values.some((v) => v.name === candidate)) return candidate;
    }
  }
  throw new TypeError(`${where}: '${value}' is not a ${typeName} (one of ${values.map((v) => v.name).join(', ')})`);
}

// ---------------------------------------------------------------------------------------------
// The client

/**
 * @param {object} options
 * @param {string} [options.address='localhost:50051'] host:port of the server
 * @param {true|{ca?: Buffer|string, cert?: Buffer|string, key?: Buffer|string}} [options.tls]
 *        TLS (system roots unless `ca`); `cert` + `key` for mutual TLS. Omitted: plaintext.
 * @param {string} [options.apiKey] sent as `authorization: Bearer KEY` on every call
 * @param {string} [options.protoPath] the tts.proto to load (default: see resolveProtoPath)
 * @param {number} [options.timeoutMs] default deadline of every call
 * @param {object} [options.channelOptions] extra gRPC channel options
 */
export function createClient(options = {}) {
  const { address = 'localhost:50051', tls, apiKey, protoPath, timeoutMs, channelOptions } = options;
  const { packageDefinition, Client } = loadApi(protoPath);
  const stub = new Client(address, channelCredentials(tls), { ...DEFAULT_CHANNEL_OPTIONS, ...channelOptions });

  const callMetadata = () => {
    const metadata = new grpc.Metadata();
    if (apiKey) metadata.set('authorization', `Bearer ${apiKey}`);
    return metadata;
  };
  const callOptions = (opts = {}) => {
    const ms = opts.timeoutMs ?? timeoutMs;
    return ms ? { deadline: new Date(Date.now() + ms) } : {};
  };
  const check = (typeName, request) => checkMessage(packageDefinition, typeName, request ?? {}, '');

  /** Run a unary call; resolves with [response, requestId]. */
  const unary = (method, request, opts) => new Promise((resolve, reject) => {
    let requestId = null;
    const call = stub[method](request, callMetadata(), callOptions(opts), (error, response) => {
      if (error) reject(toTtsError(error, requestId));
      else resolve([response, requestId]);
    });
    call.on('metadata', (metadata) => { requestId = headerRequestId(metadata) ?? requestId; });
  });

  return {
    address,
    /** The underlying @grpc/grpc-js client, for anything this wrapper does not cover. */
    grpcClient: stub,

    /** ListVoicesResponse: the model, its speakers, languages, output formats, limits and the caller's voices. */
    async listVoices(opts) {
      const [response] = await unary('ListVoices', {}, opts);
      return response;
    },

    /**
     * Clone a voice once and keep it (Base models): `request` is a CreateVoiceRequest ({reference_audio: Buffer,
     * reference_text, x_vector_only}). Resolves with the RegisteredVoice; speak with it as voice: {voice_id}.
     */
    async createVoice(request, opts) {
      const [response] = await unary('CreateVoice', check('CreateVoiceRequest', request), opts);
      return response;
    },

    /** The RegisteredVoice `voiceId` (NOT_FOUND for an unknown id or another key's voice). */
    async getVoice(voiceId, opts) {
      const [response] = await unary('GetVoice', check('GetVoiceRequest', { voice_id: voiceId }), opts);
      return response;
    },

    /** Forget the registered voice `voiceId`. */
    async deleteVoice(voiceId, opts) {
      await unary('DeleteVoice', check('DeleteVoiceRequest', { voice_id: voiceId }), opts);
    },

    /**
     * One request, one response. Resolves with { audio: Buffer, audio_format, mime_type, completion, words,
     * requestId }; `words` (WordTiming[]) is empty unless the request set word_timestamps.
     */
    async synthesize(request, opts) {
      const [response, requestId] = await unary('Synthesize', check('SynthesizeRequest', request), opts);
      return { ...response, requestId: requestId ?? response.completion?.request_id ?? null };
    },

    /**
     * One request, audio streamed back. `onChunk(chunk)` gets every AudioChunk (with `audio` bytes) in
     * order as it arrives; with word_timestamps, `opts.onWords(words)` gets each batch of WordTiming as it
     * arrives. Resolves with { completion, requestId, chunks, bytes, words } after the last message.
     */
    synthesizeOnline(request, onChunk, opts) {
      const message = check('SynthesizeRequest', request);
      return new Promise((resolve, reject) => {
        const call = stub.SynthesizeOnline(message, callMetadata(), callOptions(opts));
        let requestId = null;
        let completion = null;
        let chunks = 0;
        let bytes = 0;
        const words = [];
        let failed = false;
        // A handler of the caller's that throws stops the generation, and its error is the call's.
        const handle = (handler, value) => {
          try {
            handler?.(value);
            return true;
          } catch (error) {
            failed = true;
            call.cancel();
            reject(error);
            return false;
          }
        };
        call.on('metadata', (metadata) => { requestId = headerRequestId(metadata) ?? requestId; });
        call.on('data', (response) => {
          if (failed) return;
          if (response.chunk) {
            chunks += 1;
            bytes += response.chunk.audio.length;
            if (!handle(onChunk, response.chunk)) return;
          }
          if (response.words?.words.length) {
            words.push(...response.words.words);
            if (!handle(opts?.onWords, response.words.words)) return;
          }
          if (response.completion) completion = response.completion;
        });
        call.on('error', (error) => { if (!failed) { failed = true; reject(toTtsError(error, requestId)); } });
        call.on('end', () => {
          if (failed) return;
          if (!completion) {
            reject(new TtsError({ code: grpc.status.INTERNAL, details: 'the stream ended without a completion', requestId }));
          } else resolve({ completion, requestId: requestId ?? completion.request_id, chunks, bytes, words });
        });
      });
    },

    /**
     * Text in, audio out. `config` is a StreamingSynthesizeConfig ({voice, audio_format, generation,
     * utterance_id, word_timestamps}). Returns a SynthesisStream: write() text fragments (of one utterance
     * or several), end() the text, read audio with `for await (const message of stream)` or with 'audio'
     * events; `stream.done` resolves with { completion, completions, requestId } when the server has finished.
     */
    streamingSynthesize(config, opts) {
      const first = { config: check('StreamingSynthesizeConfig', config) };
      const call = stub.StreamingSynthesize(callMetadata(), callOptions(opts));
      return new SynthesisStream(call, first);
    },

    /** Close the channel. */
    close() {
      stub.close();
    },
  };
}

function channelCredentials(tls) {
  if (!tls) return grpc.credentials.createInsecure();
  const asBuffer = (value) => (value === undefined || value === null ? null : Buffer.from(value));
  const { ca, cert, key } = tls === true ? {} : tls;
  if (Boolean(cert) !== Boolean(key)) throw new TypeError('tls: mutual TLS needs both cert and key');
  return grpc.credentials.createSsl(asBuffer(ca), asBuffer(key), asBuffer(cert));
}

function headerRequestId(metadata) {
  const value = metadata?.get?.('x-request-id')?.[0];
  return value === undefined ? null : String(value);
}

/**
 * A StreamingSynthesize call. Events: 'audio' (AudioChunk), 'words' (WordTiming[]), 'flushAck' (marker),
 * 'completion' (Completion), each with the utterance id as a second argument; 'error' (TtsError; only
 * emitted when someone listens), 'end'. Async iteration yields every StreamingSynthesizeResponse
 * ({chunk, completion, flush_ack, words, utterance_id}) and throws the call's error. Use events or
 * iteration: messages are buffered for iteration unless 'audio' listeners are attached before the first
 * message arrives.
 *
 * Utterances (an agent's turns): write(text, id) opens utterance `id` with the call's config, or adds to
 * it; closeUtterance(id) ends its text; cancelUtterance(id) stops it at once (barge-in), its completion
 * then saying FINISH_REASON_CANCELLED. The id '' is the config's own (its utterance_id), so a caller that
 * never names one has a single utterance, as before.
 */
export class SynthesisStream extends EventEmitter {
  #call;
  #utteranceWaiters = new Map();
  #queue = [];
  #waiters = [];
  #iterating = false;
  #finished = false;
  #error = null;
  #resolveDone;
  #rejectDone;

  constructor(call, firstMessage) {
    super();
    this.#call = call;
    this.requestId = null;
    this.completion = null;
    /** Each finished utterance's Completion, by utterance id, in the order they finished. */
    this.completions = new Map();
    this.done = new Promise((resolve, reject) => {
      this.#resolveDone = resolve;
      this.#rejectDone = reject;
    });
    this.done.catch(() => {}); // rejection is reported to whoever awaits it, never as "unhandled"

    call.on('metadata', (metadata) => { this.requestId = headerRequestId(metadata) ?? this.requestId; });
    call.on('data', (response) => this.#onMessage(response));
    call.on('error', (error) => this.#finish(toTtsError(error, this.requestId)));
    call.on('end', () => {
      if (this.completion) this.#finish(null);
      else this.#finish(new TtsError({ code: grpc.status.INTERNAL, details: 'the stream ended without a completion', requestId: this.requestId }));
    });
    call.on('drain', () => this.emit('drain'));
    call.write(firstMessage);
  }

  /**
   * Send the next text fragment (any size; may end inside a word) of utterance `utteranceId` (default: the
   * config's); a new id opens a new utterance. Returns false when the caller should wait for 'drain'.
   */
  write(text, utteranceId = '') {
    if (typeof text !== 'string') throw new TypeError('write(text): text must be a string');
    if (text === '') return true;
    return this.#call.write({ text, ...utteranceField('write', utteranceId) });
  }

  /** Send a Flush; the server answers with a FlushAck carrying `marker` (a 'flushAck' event). */
  flush(marker = '', utteranceId = '') {
    return this.#call.write({ flush: { marker: String(marker) }, ...utteranceField('flush', utteranceId) });
  }

  /** The utterance's text is complete: it is spoken to its end, then its completion comes. */
  closeUtterance(utteranceId = '') {
    return this.#call.write({ close_utterance: {}, ...utteranceField('closeUtterance', utteranceId) });
  }

  /**
   * Stop the utterance now (barge-in): audio not yet sent is dropped and its completion says
   * FINISH_REASON_CANCELLED; the call and its other utterances go on.
   */
  cancelUtterance(utteranceId = '') {
    return this.#call.write({ cancel_utterance: {}, ...utteranceField('cancelUtterance', utteranceId) });
  }

  /** Resolves with the utterance's Completion once it has finished; rejects if the call fails first. */
  utteranceDone(utteranceId = '') {
    const id = String(utteranceId);
    if (this.completions.has(id)) return Promise.resolve(this.completions.get(id));
    if (this.#finished) {
      return Promise.reject(this.#error ?? new Error(`the call ended without a completion for utterance '${id}'`));
    }
    return new Promise((resolve, reject) => {
      if (!this.#utteranceWaiters.has(id)) this.#utteranceWaiters.set(id, []);
      this.#utteranceWaiters.get(id).push({ resolve, reject });
    });
  }

  /** The text is complete: the server speaks what is left, then ends with the completion. */
  end() {
    this.#call.end();
  }

  /** Abandon the call; generation stops at once and the stream fails with CANCELLED. */
  cancel() {
    this.#call.cancel();
  }

  #onMessage(response) {
    const id = response.utterance_id ?? '';
    if (response.chunk) this.emit('audio', response.chunk, id);
    if (response.words?.words.length) this.emit('words', response.words.words, id);
    if (response.flush_ack) this.emit('flushAck', response.flush_ack.marker, id);
    if (response.completion) {
      this.completion = response.completion;
      this.completions.set(id, response.completion);
      if (!this.requestId) this.requestId = response.completion.request_id || null;
      this.emit('completion', response.completion, id);
      for (const waiter of this.#utteranceWaiters.get(id) ?? []) waiter.resolve(response.completion);
      this.#utteranceWaiters.delete(id);
    }
    if (this.#iterating || this.listenerCount('audio') === 0) this.#push({ value: response, done: false });
  }

  #finish(error) {
    if (this.#finished) return;
    this.#finished = true;
    this.#error = error;
    if (error) {
      if (this.listenerCount('error') > 0) this.emit('error', error);
      this.#rejectDone(error);
    } else {
      this.#resolveDone({ completion: this.completion, completions: this.completions, requestId: this.requestId });
    }
    for (const [id, waiters] of this.#utteranceWaiters) {
      const reason = error ?? new Error(`the call ended without a completion for utterance '${id}'`);
      for (const waiter of waiters) waiter.reject(reason);
    }
    this.#utteranceWaiters.clear();
    this.#push(null);
    this.emit('end');
  }

  #push(item) {
    const waiter = this.#waiters.shift();
    if (!waiter) {
      this.#queue.push(item);
      return;
    }
    if (item) waiter.resolve(item);
    else if (this.#error) waiter.reject(this.#error);
    else waiter.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() {
    this.#iterating = true;
    return {
      next: () => {
        if (this.#queue.length > 0) {
          const item = this.#queue.shift();
          if (item) return Promise.resolve(item);
          this.#queue.unshift(null); // stay finished for later calls
          return this.#error ? Promise.reject(this.#error) : Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
      },
      return: () => {
        if (!this.#finished) this.cancel();
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() { return this; },
    };
  }
}

/** The utterance_id field of a request message; none for '' (the config's utterance), as before utterances. */
function utteranceField(method, utteranceId) {
  if (typeof utteranceId !== 'string') throw new TypeError(`${method}: the utterance id must be a string`);
  return utteranceId === '' ? {} : { utterance_id: utteranceId };
}

/** 'AudioEncoding' -> 'AUDIO_ENCODING_': the prefix every value of a proto enum carries. */
function enumPrefix(typeName) {
  return `${typeName.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase()}_`;
}

/** 'ogg_opus' -> 'AUDIO_ENCODING_OGG_OPUS', the AudioEncoding enum's name. */
export function encodingName(encoding) {
  const name = String(encoding).toUpperCase();
  return name.startsWith('AUDIO_ENCODING_') ? name : `AUDIO_ENCODING_${name}`;
}

/** 'AUDIO_ENCODING_OGG_OPUS' -> 'ogg_opus'. */
export function shortEncoding(encoding) {
  return String(encoding).replace(/^AUDIO_ENCODING_/, '').toLowerCase();
}

/** 'FINISH_REASON_STOPPED' -> 'stopped'. */
export function finishReasonName(reason) {
  return String(reason).replace(/^FINISH_REASON_/, '').toLowerCase();
}
