// Writing streamed audio to a file (or stdout) as it arrives.

import fs from 'node:fs';

/**
 * A streamed WAV starts with a header whose RIFF and data sizes are 0xFFFFFFFF ("unknown length").
 * Once the whole stream is in `fd`, write the real sizes. Returns false when the file is no WAV.
 */
export function patchWavSizes(fd) {
  const size = fs.fstatSync(fd).size;
  const header = Buffer.alloc(Math.min(size, 4096));
  fs.readSync(fd, header, 0, header.length, 0);
  if (header.length < 12 || header.toString('latin1', 0, 4) !== 'RIFF' || header.toString('latin1', 8, 12) !== 'WAVE') {
    return false;
  }
  // Walk the chunks to the data chunk (a 'data' byte pattern inside another chunk must not fool us).
  let at = 12;
  while (at + 8 <= header.length) {
    const id = header.toString('latin1', at, at + 4);
    if (id === 'data') {
      const sizes = Buffer.alloc(4);
      sizes.writeUInt32LE(Math.min(size - 8, 0xffffffff));
      fs.writeSync(fd, sizes, 0, 4, 4);
      sizes.writeUInt32LE(Math.min(size - at - 8, 0xffffffff));
      fs.writeSync(fd, sizes, 0, 4, at + 4);
      return true;
    }
    const length = header.readUInt32LE(at + 4);
    at += 8 + length + (length % 2);
  }
  return false;
}

/**
 * Audio bytes to `output` ('-' for stdout) as they arrive. The file is created on the first write,
 * so a call that fails before any audio leaves no empty file behind.
 */
export class AudioSink {
  constructor(output, { patchWav = false } = {}) {
    this.output = output;
    this.patchWav = patchWav;
    this.bytes = 0;
    this.fd = null;
  }

  get toStdout() {
    return this.output === '-';
  }

  write(data) {
    if (!data || data.length === 0) return;
    if (this.toStdout) {
      process.stdout.write(data);
    } else {
      if (this.fd === null) this.fd = fs.openSync(this.output, 'w+');
      fs.writeSync(this.fd, data);
    }
    this.bytes += data.length;
  }

  /** Finish the file; `streamed` says whether a WAV arrived with unknown sizes that need patching. */
  async close(streamed) {
    if (this.toStdout) {
      await new Promise((resolve) => process.stdout.write('', resolve));
      return;
    }
    if (this.fd === null) return;
    if (streamed && this.patchWav) patchWavSizes(this.fd);
    fs.closeSync(this.fd);
    this.fd = null;
  }
}
