"""Model audio (24 kHz mono float32, arriving in chunks) -> the bytes a client asked for.

Encodings: headerless PCM16 (little-endian), WAV, Ogg/Opus, headerless G.711 mu-law / A-law, and MP3 as a stream
of frames (LAME through `lameenc`, constant bit rate, no LAME tag: a decoder hears the encoder's delay, about 50 ms,
as silence before the speech, as with any streamed MP3); MP3 with its LAME tag and FLAC as whole files only
(`FileEncoder`: written as the audio comes, readable once complete).
Every encoding goes through the same steps: soxr's streaming resampler to the requested rate,
clipping to [-1, 1], then libsndfile, written incrementally into a file object that hands each
encode() the bytes produced so far; PCM16 (and WAV's samples) are cast by numpy instead, to the
same bytes (`_Pcm16Sink`). soxr's stream carries its filter state across chunks, so
any chunking of an utterance gives the samples of one-shot resampling; the headerless encodings
are per-sample, so their streamed bytes equal the whole-utterance bytes exactly.
This module deliberately needs no torch.
"""

from __future__ import annotations

import enum
import io
import struct
import tempfile
import threading
import wave
from dataclasses import dataclass
from typing import BinaryIO, cast

import lameenc
import numpy as np
import soundfile as sf
import soxr

MODEL_SAMPLE_RATE = 24000
SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
# The rates libopus encodes at natively; libsndfile refuses to write Opus at any other.
OPUS_SAMPLE_RATES = (8000, 12000, 16000, 24000, 48000)
# The same quality the reference-audio input path uses.
_RESAMPLE_QUALITY = "HQ"
# libsndfile's default holds an Ogg page back for about a second, which a streaming client hears
# as a one-second stall; 80 ms is one codec frame, so pages keep pace with the model.
_OGG_PAGE_LATENCY_MS = 80.0
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # sndfile.h; soundfile exposes no wrapper for it
_STREAMING_WAV_SIZE = 0xFFFFFFFF
# An MP3 or FLAC file is kept in memory up to this size, on disk past it: the files of short calls never touch the
# disk, a long document's take a few megabytes of memory whatever its length.
FILE_SPOOL_BYTES = 8 * 1024 * 1024


class AudioFormatError(ValueError):
    """An output format the service cannot produce; `field` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class AudioEncoding(enum.Enum):
    PCM16 = "pcm16"
    WAV = "wav"
    OGG_OPUS = "ogg_opus"
    MULAW = "mulaw"
    ALAW = "alaw"
    MP3 = "mp3"


@dataclass(frozen=True)
class _Container:
    """How libsndfile writes one encoding's samples."""

    format: str
    subtype: str
    endian: str = "FILE"


_CONTAINERS = {
    AudioEncoding.OGG_OPUS: _Container("OGG", "OPUS"),
    AudioEncoding.MULAW: _Container("RAW", "ULAW"),
    AudioEncoding.ALAW: _Container("RAW", "ALAW"),
}

_MIME_TYPES = {
    AudioEncoding.WAV: "audio/wav",
    AudioEncoding.OGG_OPUS: "audio/ogg;codecs=opus",
    AudioEncoding.MP3: "audio/mpeg",
}
# MP3's bit rate where the request names none: well above what the model's 12 kHz of bandwidth needs at each rate.
_DEFAULT_MP3_KBPS = {8000: 32, 16000: 48, 22050: 64, 24000: 64, 44100: 96, 48000: 96}
# The bit rates MPEG audio has at each rate's MPEG version (MPEG-1 from 32 kHz, MPEG-2 from 16, MPEG-2.5 below).
_MP3_KBPS = {
    "mpeg1": (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    "mpeg2": (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    "mpeg2.5": (8, 16, 24, 32, 40, 48, 56, 64),
}
# Headerless bytes say nothing about their rate, so the MIME type must.
_HEADERLESS_MIME_TYPES = {
    AudioEncoding.PCM16: "audio/L16",
    AudioEncoding.MULAW: "audio/PCMU",
    AudioEncoding.ALAW: "audio/PCMA",
}


@dataclass(frozen=True)
class OutputFormat:
    encoding: AudioEncoding
    sample_rate: int
    # MP3 only: its constant bit rate; None takes a default for the sample rate.
    bit_rate_kbps: int | None = None

    def __post_init__(self) -> None:
        _check_encoding(self.encoding)
        _check_sample_rate(self.encoding, self.sample_rate)
        _check_bit_rate(self.encoding, self.sample_rate, self.bit_rate_kbps)

    @property
    def mp3_kbps(self) -> int:
        return self.bit_rate_kbps or _DEFAULT_MP3_KBPS[self.sample_rate]

    @property
    def mime_type(self) -> str:
        if self.encoding in _HEADERLESS_MIME_TYPES:
            return f"{_HEADERLESS_MIME_TYPES[self.encoding]};rate={self.sample_rate}"
        return _MIME_TYPES[self.encoding]


def _check_encoding(encoding: object) -> None:
    if not isinstance(encoding, AudioEncoding):
        names = ", ".join(member.name for member in AudioEncoding)
        raise AudioFormatError("audio_format.encoding", f"{encoding!r} is not an audio encoding; use one of {names}")


def _check_sample_rate(encoding: AudioEncoding, sample_rate: object) -> None:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate not in SUPPORTED_SAMPLE_RATES:
        raise AudioFormatError("audio_format.sample_rate", f"{sample_rate!r} Hz is not supported; use one of "
                               f"{', '.join(map(str, SUPPORTED_SAMPLE_RATES))}")
    if encoding is AudioEncoding.OGG_OPUS and sample_rate not in OPUS_SAMPLE_RATES:
        usable = [rate for rate in SUPPORTED_SAMPLE_RATES if rate in OPUS_SAMPLE_RATES]
        raise AudioFormatError("audio_format.sample_rate", f"Opus cannot encode at {sample_rate} Hz; use one of "
                               f"{', '.join(map(str, usable))}")


def mp3_bit_rates(sample_rate: int) -> tuple[int, ...]:
    """The bit rates (kbps) MP3 has at `sample_rate`."""
    version = "mpeg1" if sample_rate >= 32000 else "mpeg2" if sample_rate >= 16000 else "mpeg2.5"
    return _MP3_KBPS[version]


def _check_bit_rate(encoding: AudioEncoding, sample_rate: int, bit_rate_kbps: object) -> None:
    if bit_rate_kbps is None:
        return
    if encoding is not AudioEncoding.MP3:
        raise AudioFormatError("audio_format.bit_rate_kbps", f"applies to MP3 only, not {encoding.name}")
    usable = mp3_bit_rates(sample_rate)
    if isinstance(bit_rate_kbps, bool) or bit_rate_kbps not in usable:
        raise AudioFormatError("audio_format.bit_rate_kbps", f"{bit_rate_kbps!r} kbps is not an MP3 bit rate at "
                               f"{sample_rate} Hz; use one of {', '.join(map(str, usable))}")


class StreamEncoder:
    """Encodes one utterance chunk by chunk. encode() any number of times, then finish() exactly once."""

    def __init__(self, output: OutputFormat, source_rate: int = MODEL_SAMPLE_RATE) -> None:
        self._resampler = _Resampler(source_rate, output.sample_rate)
        # WAV's samples are PCM16; its header is written here, not by libsndfile, which would seek back to fix it.
        self._sink: _Pcm16Sink | _Mp3Sink | _LibsndfileSink = (
            _Pcm16Sink() if output.encoding in (AudioEncoding.PCM16, AudioEncoding.WAV)
            else _Mp3Sink(output.sample_rate, output.mp3_kbps) if output.encoding is AudioEncoding.MP3
            else _LibsndfileSink(_CONTAINERS[output.encoding], output.sample_rate))
        self._header = _streaming_wav_header(output.sample_rate) if output.encoding is AudioEncoding.WAV else b""
        self._num_output_samples = 0
        self._is_finished = False

    @property
    def num_output_samples(self) -> int:
        """Samples at the output rate handed to the encoder so far (Opus may not have emitted their bytes yet)."""
        return self._num_output_samples

    def encode(self, samples: np.ndarray) -> bytes:
        """float32 mono [T] at the source rate -> the bytes ready so far (b"" while the resampler or Ogg buffers)."""
        self._require_unfinished()
        return self._take_header() + self._write(self._resampler.push(_as_mono_float32(samples)))

    def finish(self) -> bytes:
        """Flushes the resampler's delay line and the container; returns the last bytes of the stream."""
        self._require_unfinished()
        self._is_finished = True
        return self._take_header() + self._write(self._resampler.flush()) + self._sink.close()

    def _write(self, samples: np.ndarray) -> bytes:
        self._num_output_samples += samples.shape[0]
        # Resampler ringing and model overshoot can both exceed full scale; saturate rather than wrap.
        return self._sink.write(np.clip(samples, -1.0, 1.0))

    def _take_header(self) -> bytes:
        header, self._header = self._header, b""
        return header

    def _require_unfinished(self) -> None:
        if self._is_finished:
            raise RuntimeError("this audio stream is already finished")


def encode_whole(samples: np.ndarray, output: OutputFormat, source_rate: int = MODEL_SAMPLE_RATE) -> bytes:
    """A whole utterance -> one encoded file; for WAV, with a header that states the exact sizes."""
    if output.encoding is AudioEncoding.WAV:
        pcm16 = _encode_at_once(samples, OutputFormat(AudioEncoding.PCM16, output.sample_rate), source_rate)
        return _wav_file(pcm16, output.sample_rate)
    return _encode_at_once(samples, output, source_rate)


class FileEncoding(enum.Enum):
    """Containers libsndfile completes by seeking back to their start when it closes them (FLAC's stream length in
    its header): sent whole, once the audio is complete."""

    FLAC = "flac"


_FILE_CONTAINERS = {
    FileEncoding.FLAC: _Container("FLAC", "PCM_16"),
}


class FileEncoder:
    """A FLAC file written by libsndfile as the audio comes, into a temporary file held in memory up to
    `spool_bytes` and on disk past it: a long document is never held as samples (an hour of them is 345 MB of
    float32), nor as a file in memory (an hour of FLAC is some 80 MB).

    Writes run in worker threads while the call is torn down on the event loop (a client gone mid-call): close()
    waits for a write in progress, since libsndfile closing a file another thread writes would free what that write
    uses. A write after close() raises."""

    def __init__(self, encoding: FileEncoding, sample_rate: int = MODEL_SAMPLE_RATE,
                 spool_bytes: int = FILE_SPOOL_BYTES) -> None:
        container = _FILE_CONTAINERS[encoding]
        self._file = tempfile.SpooledTemporaryFile(max_size=spool_bytes)  # noqa: SIM115 (closed by close())
        self._sound = sf.SoundFile(self._file, mode="w", samplerate=sample_rate, channels=1,
                                   format=container.format, subtype=container.subtype)
        self._lock = threading.Lock()

    def write(self, samples: np.ndarray) -> None:
        """The next samples (the model's rate, mono float32), clipped to [-1, 1]."""
        clipped = np.clip(_as_mono_float32(samples), -1.0, 1.0)
        with self._lock:
            self._sound.write(clipped)

    def finish(self) -> BinaryIO:
        """The complete file, read from its start; it lives until close()."""
        with self._lock:
            self._sound.close()
            self._file.seek(0)
        return cast(BinaryIO, self._file)

    def close(self) -> None:
        with self._lock:
            if not self._sound.closed:
                self._sound.close()
            self._file.close()


def _encode_at_once(samples: np.ndarray, output: OutputFormat, source_rate: int) -> bytes:
    encoder = StreamEncoder(output, source_rate)
    return encoder.encode(samples) + encoder.finish()


def _as_mono_float32(samples: np.ndarray) -> np.ndarray:
    mono = np.ascontiguousarray(samples, dtype=np.float32)
    if mono.ndim != 1:
        raise ValueError(f"expected mono samples of shape [T], got shape {mono.shape}")
    return mono


class _Resampler:
    """soxr's streaming resampler, or a pass-through when the rates already agree."""

    def __init__(self, source_rate: int, target_rate: int) -> None:
        self._stream = None
        if source_rate != target_rate:
            self._stream = soxr.ResampleStream(source_rate, target_rate, 1, dtype="float32",
                                               quality=_RESAMPLE_QUALITY)

    def push(self, samples: np.ndarray) -> np.ndarray:
        return samples if self._stream is None else self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        empty = np.zeros(0, dtype=np.float32)
        return empty if self._stream is None else self._stream.resample_chunk(empty, last=True)


class _Pcm16Sink:
    """Little-endian PCM16 cast by numpy, by libsndfile's own rule (since 1.1: floor(x * 32768), saturated), so its
    bytes are what libsndfile writes for the same samples (tests/service/test_audio_output.py). Every audio chunk
    of the default encoding comes through here: libsndfile's Python file callbacks cost about six times the cast,
    a fifth of the front door's host time under load (BENCHMARKS.md, "Several GPUs behind one server")."""

    def write(self, samples: np.ndarray) -> bytes:
        scaled = np.floor(samples * np.float32(32768))
        return np.clip(scaled, -32768, 32767).astype("<i2").tobytes()

    def close(self) -> bytes:
        return b""


class _Mp3Sink:
    """MP3 frames by LAME, as the samples come (its PCM16 input cast as `_Pcm16Sink` casts). A frame holds 1,152
    samples (576 below 32 kHz), so a call returns the frames completed so far; close() flushes the rest."""

    def __init__(self, sample_rate: int, bit_rate_kbps: int) -> None:
        self._pcm16 = _Pcm16Sink()
        self._encoder = lameenc.Encoder()
        self._encoder.set_channels(1)
        self._encoder.set_in_sample_rate(sample_rate)
        self._encoder.set_out_sample_rate(sample_rate)
        self._encoder.set_bit_rate(bit_rate_kbps)
        self._encoder.set_quality(2)  # LAME's "high quality" (0 best, 9 fastest)

    def write(self, samples: np.ndarray) -> bytes:
        return bytes(self._encoder.encode(self._pcm16.write(samples))) if samples.shape[0] else b""

    def close(self) -> bytes:
        return bytes(self._encoder.flush())


class _LibsndfileSink:
    """libsndfile writing one container into a forward-only file; each call returns the bytes it produced."""

    def __init__(self, container: _Container, sample_rate: int) -> None:
        self._file = _ForwardOnlyFile()
        self._sound_file = sf.SoundFile(self._file, "w", samplerate=sample_rate, channels=1,
                                        format=container.format, subtype=container.subtype, endian=container.endian)
        if container.format == "OGG":
            _set_ogg_page_latency(self._sound_file, _OGG_PAGE_LATENCY_MS)

    def write(self, samples: np.ndarray) -> bytes:
        if samples.shape[0]:
            self._sound_file.write(samples)
        return self._file.take()

    def close(self) -> bytes:
        self._sound_file.close()
        return self._file.take()


def _set_ogg_page_latency(sound_file: sf.SoundFile, milliseconds: float) -> None:
    latency = sf._ffi.new("double *", milliseconds)
    # A libsndfile older than 1.1 refuses the command; its pages then come about a second apart, still valid.
    sf._snd.sf_command(sound_file._file, _SFC_SET_OGG_PAGE_LATENCY_MS, latency, sf._ffi.sizeof("double"))


class _ForwardOnlyFile:
    """A write-only file object that passes on what was written and keeps nothing.

    libsndfile writes RAW and Ogg strictly forward. A seek anywhere else would mean rewriting bytes
    a client already has; exceptions cannot cross libsndfile's callbacks, so it is remembered and
    raised at the next take().
    """

    def __init__(self) -> None:
        self._position = 0
        self._pending = bytearray()
        self._refused_seek: int | None = None

    def write(self, data: bytes) -> int:
        self._pending += data
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._position + offset
        if target != self._position:
            self._refused_seek = target
        return self._position

    def take(self) -> bytes:
        if self._refused_seek is not None:
            raise RuntimeError(f"the encoder tried to seek back to byte {self._refused_seek} of a stream "
                               f"already {self._position} bytes long")
        data, self._pending = bytes(self._pending), bytearray()
        return data


def _streaming_wav_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header whose sizes say 'unknown', as streaming servers send before the length is known."""
    header = bytearray(_wav_file(b"", sample_rate))
    struct.pack_into("<I", header, 4, _STREAMING_WAV_SIZE)  # the RIFF chunk's size
    struct.pack_into("<I", header, len(header) - 4, _STREAMING_WAV_SIZE)  # the data chunk's size, the header's end
    return bytes(header)


def _wav_file(pcm16: bytes, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm16)
    return buffer.getvalue()
