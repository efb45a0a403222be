"""Client reference audio (bytes) -> 24 kHz mono float32: formats, mixdown, resampling, refusals."""

from __future__ import annotations

import base64
import io
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tts_service.audio.reference import (
    AudioLimits,
    ReferenceAudioError,
    decode_audio_file,
    decode_pcm16,
    resample_to_model_rate,
)

PCM16_STEP = 1 / 32768


def tone(seconds: float = 1.0, sample_rate: int = 24000, hz: float = 440.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    return (0.4 * np.sin(2 * np.pi * hz * t) + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def encoded(samples: np.ndarray, sample_rate: int, format: str, subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=format, subtype=subtype)
    return buffer.getvalue()


def test_float_wav_at_24k_comes_back_unchanged() -> None:
    samples = tone()
    np.testing.assert_array_equal(decode_audio_file(encoded(samples, 24000, "WAV", "FLOAT")), samples)


@pytest.mark.parametrize("format", ["WAV", "FLAC"])
def test_pcm16_wav_and_flac_round_trip_within_one_quantisation_step(format: str) -> None:
    samples = tone()
    decoded = decode_audio_file(encoded(samples, 24000, format, "PCM_16"))
    assert decoded.dtype == np.float32 and decoded.shape == samples.shape
    np.testing.assert_allclose(decoded, samples, rtol=0, atol=PCM16_STEP)


def test_ogg_vorbis_decodes_to_a_close_copy() -> None:
    samples = tone(hz=300.0)
    decoded = decode_audio_file(encoded(samples, 24000, "OGG", "VORBIS"))
    assert decoded.shape == samples.shape
    assert np.corrcoef(decoded, samples)[0, 1] > 0.95


def test_stereo_is_mixed_down_to_the_channel_mean() -> None:
    left, right = tone(hz=300.0), tone(hz=700.0, seed=1)
    decoded = decode_audio_file(encoded(np.stack([left, right], axis=1), 24000, "WAV", "FLOAT"))
    np.testing.assert_array_equal(decoded, np.stack([left, right], axis=1).mean(axis=-1))


@pytest.mark.parametrize("sample_rate, seconds, expected_length", [
    (16000, 1.5, 36000),
    (8000, 0.5, 12000),
    # librosa's length rule, ceil(T * float(24000 / sr)), gives one sample more here; so must we.
    (44100, 1.0, 24001),
    (48000, 1.0, 24000),
])
def test_other_rates_are_resampled_to_24k_with_the_reference_length(
        sample_rate: int, seconds: float, expected_length: int) -> None:
    decoded = decode_audio_file(encoded(tone(seconds, sample_rate), sample_rate, "WAV", "FLOAT"))
    assert decoded.dtype == np.float32
    assert decoded.shape == (expected_length,)


@pytest.mark.parity
@pytest.mark.parametrize("sample_rate", [16000, 22050, 44100])
def test_resampling_equals_librosa_resample_sample_for_sample(sample_rate: int) -> None:
    librosa = pytest.importorskip("librosa")
    samples = tone(1.3, sample_rate)
    expected = librosa.resample(samples, orig_sr=sample_rate, target_sr=24000)
    np.testing.assert_array_equal(resample_to_model_rate(samples, sample_rate), expected)


def test_raw_pcm16_decodes_exactly_like_the_same_samples_in_a_wav() -> None:
    pcm = (tone(0.5, 16000) * 32767).astype("<i2")
    from_wav = decode_audio_file(encoded(pcm, 16000, "WAV", "PCM_16"))
    np.testing.assert_array_equal(decode_pcm16(pcm.tobytes(), 16000), from_wav)


def test_raw_interleaved_stereo_pcm16_is_mixed_down() -> None:
    left, right = np.full(2400, 1000, "<i2"), np.full(2400, -3000, "<i2")
    interleaved = np.stack([left, right], axis=1).tobytes()
    np.testing.assert_array_equal(decode_pcm16(interleaved, 24000, channels=2), np.full(2400, -1000 / 32768,
                                                                                     np.float32))


def silent_wav_with_nan() -> bytes:
    samples = np.zeros(4800, np.float32)
    samples[100] = np.nan
    return encoded(samples, 24000, "WAV", "FLOAT")


def inf_wav() -> bytes:
    samples = np.zeros((4800, 2), np.float32)
    samples[7, 1] = np.inf
    return encoded(samples, 24000, "WAV", "FLOAT")


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"this is a text file, not a recording" * 10, "not audio"),
    (encoded(np.zeros(0, np.float32), 24000, "WAV", "PCM_16"), "no samples"),
    (silent_wav_with_nan(), "NaN or infinite"),
    (inf_wav(), "NaN or infinite"),
    (encoded(np.zeros(1000, np.float32), 1000, "WAV", "PCM_16"), "sample rate 1000 Hz"),
    (encoded(np.zeros(240, np.float32), 24000, "WAV", "PCM_16"), "10 ms long; at least 100 ms"),
], ids=["empty", "not-audio", "zero-length", "nan", "inf", "absurd-rate", "too-short"])
def test_unusable_files_are_refused_with_the_reason(data: bytes, message: str) -> None:
    with pytest.raises(ReferenceAudioError, match=message):
        decode_audio_file(data)


def test_audio_over_the_configured_maximum_is_refused_before_decoding() -> None:
    data = encoded(tone(3.0, 16000), 16000, "FLAC", "PCM_16")
    assert decode_audio_file(data, AudioLimits(max_seconds=3.0)).shape == (72000,)
    with pytest.raises(ReferenceAudioError, match=r"3\.0 s long; at most 2\.5 s"):
        decode_audio_file(data, AudioLimits(max_seconds=2.5))


def test_truncated_flac_is_refused_as_not_audio() -> None:
    data = encoded(tone(), 24000, "FLAC", "PCM_16")
    with pytest.raises(ReferenceAudioError, match="not audio"):
        decode_audio_file(data[: len(data) // 3])


@pytest.mark.parametrize("data, kwargs, message", [
    (b"", {"sample_rate": 24000}, "empty"),
    (b"\x00\x01\x02", {"sample_rate": 24000}, "whole number of 1-channel frames"),
    (b"\x00" * 4802, {"sample_rate": 24000, "channels": 2}, "whole number of 2-channel frames"),
    (b"\x00" * 4800, {"sample_rate": 0}, "sample rate 0 Hz"),
    (b"\x00" * 4800, {"sample_rate": 10_000_000}, "sample rate 10000000 Hz"),
    (b"\x00" * 4800, {"sample_rate": 24000, "channels": 0}, "0 channels"),
    (b"\x00" * 480_000, {"sample_rate": 8000, "limits": AudioLimits(max_seconds=10)}, "30.0 s long"),
], ids=["empty", "odd-bytes", "partial-stereo-frame", "zero-rate", "absurd-rate", "no-channels", "too-long"])
def test_unusable_raw_pcm_is_refused_with_the_reason(data: bytes, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ReferenceAudioError, match=message):
        decode_pcm16(data, **kwargs)


def test_reference_audio_error_is_a_value_error() -> None:
    assert issubclass(ReferenceAudioError, ValueError)


def test_module_imports_without_torch() -> None:
    probe = "import sys, tts_service.audio.reference; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


@pytest.mark.parity
def test_uploaded_stereo_16k_wav_gives_the_reference_voice_clone_prompt() -> None:
    """End to end: the same WAV upload through the reference `create_voice_clone_prompt` and through ours."""
    torch = pytest.importorskip("torch")
    from tests.reference import import_reference

    import_reference()
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import EncodecFeatureExtractor

    from tts_service.model.codec_encoder import CodecEncoder
    from tts_service.model.configs import ModelConfig, SpeechTokenizerConfig
    from tts_service.model.random_checkpoint import model_config_dict, speech_tokenizer_config_dict
    from tts_service.model.speaker_encoder import SpeakerEncoder

    raw, speech_raw = model_config_dict("tiny", "base"), speech_tokenizer_config_dict("tiny")
    speaker_config = ModelConfig.parse(raw).speaker_encoder
    assert speaker_config is not None
    speaker_encoder = SpeakerEncoder(speaker_config)
    codec_encoder = CodecEncoder(SpeechTokenizerConfig.parse(speech_raw))
    speaker_encoder.randomize_(torch.Generator().manual_seed(1))
    codec_encoder.randomize_(torch.Generator().manual_seed(2))

    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**raw)).eval()
    model.speaker_encoder.load_state_dict(speaker_encoder.state_dict(), strict=True)
    tokenizer = Qwen3TTSTokenizer()
    tokenizer.model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**speech_raw)).eval()
    tokenizer.model.encoder.load_state_dict(codec_encoder.state_dict(), strict=True)
    tokenizer.config, tokenizer.device = tokenizer.model.config, torch.device("cpu")
    tokenizer.feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0,
                                                          chunk_length_s=None, overlap=None,
                                                          return_attention_mask=True)
    model.load_speech_tokenizer(tokenizer)

    upload = encoded(np.stack([tone(2.5, 16000, 180.0), tone(2.5, 16000, 900.0, seed=3)], axis=1), 16000,
                     "WAV", "PCM_16")
    data_url = "data:audio/wav;base64," + base64.b64encode(upload).decode()
    (expected,) = Qwen3TTSModel(model=model, processor=None).create_voice_clone_prompt(
        ref_audio=data_url, ref_text="reference words", x_vector_only_mode=False)

    wav = torch.from_numpy(decode_audio_file(upload))
    codes = codec_encoder.encode(wav)
    assert codes.shape == (math.ceil(2.5 * 24000 / 1920), 16)
    assert torch.equal(codes, expected.ref_code)
    torch.testing.assert_close(speaker_encoder.embed(wav), expected.ref_spk_embedding, rtol=1e-4, atol=1e-4)
