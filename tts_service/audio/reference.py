"""Reference audio from a client (encoded bytes) -> 24 kHz mono float32, as voice cloning needs it.

Accepted: anything libsndfile reads from memory (WAV, FLAC, OGG Vorbis/Opus, ...) or raw
little-endian PCM16 with a stated sample rate. The steps after decoding reproduce the reference
package exactly, so embeddings and codes agree with it on the same clip: samples as float32,
channels averaged, then soxr's "HQ" resampler to 24 kHz with librosa's output-length rule.
This module deliberately needs no torch.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

TARGET_SAMPLE_RATE = 24000
# librosa.resample's default, which the reference relies on.
_RESAMPLE_QUALITY = "soxr_hq"
_MAX_CHANNELS = 32
_BLOCK_FRAMES = 1 << 16


class ReferenceAudioError(ValueError):
    """The reference audio cannot be used; the message says why, in terms a client can act on."""


@dataclass(frozen=True)
class AudioLimits:
    max_seconds: float = 60.0
    # The speaker encoder needs about 53 ms; anything that short carries no usable voice anyway.
    min_seconds: float = 0.1
    min_sample_rate: int = 4000
    max_sample_rate: int = 384000


DEFAULT_LIMITS = AudioLimits()


def decode_audio_file(data: bytes, limits: AudioLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Encoded audio (WAV, FLAC, OGG, ...) -> float32 mono [T] at 24 kHz."""
    _require_bytes(data)
    try:
        with sf.SoundFile(io.BytesIO(data)) as stream:
            sample_rate, channels = stream.samplerate, stream.channels
            _check_format(sample_rate, channels, limits)
            # Checked before decoding so a small compressed upload cannot expand into gigabytes.
            _check_duration(stream.frames, sample_rate, limits)
            # Block by block, so that only the mono signal is ever held whole.
            blocks = stream.blocks(blocksize=_BLOCK_FRAMES, dtype="float32", always_2d=True)
            mono = np.concatenate([_mixdown(block) for block in blocks] or [np.zeros(0, np.float32)])
    except (sf.SoundFileError, RuntimeError) as error:
        # libsndfile's reason alone: soundfile's message names the in-memory file by its repr, a heap address.
        reason = error.error_string if isinstance(error, sf.LibsndfileError) else "it cannot be decoded"
        raise ReferenceAudioError(f"reference audio is not audio in a readable format: {reason}") from None
    return _to_model_rate(mono, sample_rate, limits)


def decode_pcm16(data: bytes, sample_rate: int, channels: int = 1,
                 limits: AudioLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Raw signed 16-bit little-endian PCM (channels interleaved) -> float32 mono [T] at 24 kHz."""
    _require_bytes(data)
    _check_format(sample_rate, channels, limits)
    frame_bytes = 2 * channels
    if len(data) % frame_bytes:
        raise ReferenceAudioError(f"raw PCM16 reference audio of {len(data)} bytes is not a whole number of "
                                  f"{channels}-channel frames ({frame_bytes} bytes each)")
    _check_duration(len(data) // frame_bytes, sample_rate, limits)
    pcm = np.frombuffer(data, dtype="<i2").reshape(-1, channels)
    # The same scaling libsndfile applies to PCM16 files, so raw and WAV uploads decode identically.
    samples = pcm.astype(np.float32) / np.float32(32768.0)
    return _to_model_rate(_mixdown(samples), sample_rate, limits)


def _require_bytes(data: bytes) -> None:
    if not data:
        raise ReferenceAudioError("reference audio is empty (0 bytes)")


def _check_format(sample_rate: int, channels: int, limits: AudioLimits) -> None:
    if not limits.min_sample_rate <= sample_rate <= limits.max_sample_rate:
        raise ReferenceAudioError(f"reference audio sample rate {sample_rate} Hz is outside the supported "
                                  f"{limits.min_sample_rate}-{limits.max_sample_rate} Hz")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise ReferenceAudioError(f"reference audio has {channels} channels; "
                                  f"1 to {_MAX_CHANNELS} are supported")


def _check_duration(frames: int, sample_rate: int, limits: AudioLimits) -> None:
    if frames <= 0:
        raise ReferenceAudioError("reference audio contains no samples")
    seconds = frames / sample_rate
    if seconds > limits.max_seconds:
        raise ReferenceAudioError(f"reference audio is {seconds:.1f} s long; "
                                  f"at most {limits.max_seconds:g} s is accepted")
    if seconds < limits.min_seconds:
        raise ReferenceAudioError(f"reference audio is {seconds * 1000:.0f} ms long; at least "
                                  f"{limits.min_seconds * 1000:.0f} ms is needed")


def _mixdown(samples: np.ndarray) -> np.ndarray:
    """[frames, channels] -> [frames]: the plain channel mean, in float32, as the reference takes it."""
    return samples.mean(axis=-1) if samples.shape[1] > 1 else samples[:, 0]


def _to_model_rate(mono: np.ndarray, sample_rate: int, limits: AudioLimits) -> np.ndarray:
    # A container's header may promise more frames than its body holds.
    _check_duration(mono.shape[0], sample_rate, limits)
    if not np.isfinite(mono).all():
        raise ReferenceAudioError("reference audio contains NaN or infinite samples")
    return np.ascontiguousarray(resample_to_model_rate(mono, sample_rate), dtype=np.float32)


def resample_to_model_rate(mono: np.ndarray, sample_rate: int) -> np.ndarray:
    """float32 [T] at `sample_rate` -> float32 at 24 kHz, sample-for-sample what librosa.resample gives."""
    if sample_rate == TARGET_SAMPLE_RATE:
        return mono
    resampled = soxr.resample(mono, sample_rate, TARGET_SAMPLE_RATE, quality=_RESAMPLE_QUALITY)
    # librosa pads or trims to ceil(T * ratio) with the ratio in floating point; 1 s at 44.1 kHz thus
    # becomes 24001 samples, not 24000. Matching it keeps the frame count equal to the reference's.
    length = math.ceil(mono.shape[0] * (float(TARGET_SAMPLE_RATE) / sample_rate))
    if resampled.shape[0] >= length:
        return resampled[:length]
    return np.pad(resampled, (0, length - resampled.shape[0]))
