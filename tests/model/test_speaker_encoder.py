"""The ECAPA-TDNN speaker encoder and its mel front end, against the official package on shared weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests import signals
from tests.reference import import_reference
from tts_service.model.configs import ModelConfig, SpeakerEncoderConfig
from tts_service.model.random_checkpoint import model_config_dict
from tts_service.model.speaker_encoder import SpeakerEncoder, log_mel_spectrogram

SMALL = SpeakerEncoderConfig(enc_dim=48, enc_channels=(64, 64, 64, 64, 192), enc_attention_channels=16,
                             enc_se_channels=16)
CONFIGS = {"small": SMALL, "default": SpeakerEncoderConfig()}
# Each 24 kHz frame of the front end is 256 samples; `embed` needs 5 frames at the default dilations.
MIN_SAMPLES = 1280


def sweep_signal(seconds: float = 3.0, seed: int = 0, base_hz: float = 200.0) -> np.ndarray:
    return signals.sweep_signal(int(seconds * 24000), seed, base_hz)


def random_encoder(config: SpeakerEncoderConfig, seed: int = 0) -> SpeakerEncoder:
    encoder = SpeakerEncoder(config).eval()
    encoder.randomize_(torch.Generator().manual_seed(seed))
    return encoder


def reference_encoder(config: SpeakerEncoderConfig) -> Any:
    import_reference()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    fields = {name: list(value) if isinstance(value, tuple) else value for name, value in vars(config).items()}
    return Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**fields)).eval()


def reference_mel(wav: np.ndarray) -> torch.Tensor:
    """The reference front end with the arguments `extract_speaker_embedding` passes: [1, 128, frames]."""
    import_reference()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    return mel_spectrogram(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                           hop_size=256, win_size=1024, fmin=0, fmax=12000)


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request: pytest.FixtureRequest) -> tuple[SpeakerEncoder, Any]:
    """Our randomised encoder and the reference module holding the same weights, per config."""
    config = CONFIGS[request.param]
    ours = random_encoder(config)
    reference = reference_encoder(config)
    reference.load_state_dict(ours.state_dict(), strict=True)
    return ours, reference


@pytest.mark.parity
def test_state_dict_loads_strictly_into_the_reference_and_back(pair: tuple[SpeakerEncoder, Any]) -> None:
    ours, reference = pair
    fresh = SpeakerEncoder(ours.config)
    fresh.load_state_dict(reference.state_dict(), strict=True)
    assert all(torch.equal(fresh.state_dict()[key], value) for key, value in ours.state_dict().items())


def test_parameter_names_are_the_checkpoint_names() -> None:
    names = set(SpeakerEncoder(SMALL).state_dict())
    expected = {"blocks.0.conv.weight", "blocks.1.tdnn1.conv.weight", "blocks.1.res2net_block.blocks.0.conv.weight",
                "blocks.3.se_block.conv2.bias", "mfa.conv.weight", "asp.tdnn.conv.weight", "asp.conv.bias",
                "fc.weight", "fc.bias"}
    assert expected <= names
    assert len(names) == 76


def test_mel_filterbank_matches_librosa_slaney() -> None:
    librosa = pytest.importorskip("librosa")
    from tts_service.model.speaker_encoder import front_end_tables

    expected = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    filters, _ = front_end_tables(torch.device("cpu"))
    # Both are computed in float64 and rounded to float32; they differ by at most an ulp or so.
    np.testing.assert_allclose(filters.numpy(), expected, rtol=0, atol=1e-8)


def test_the_gpus_product_path_gives_the_stfts_log_mel() -> None:
    """On a GPU the front end's transform is a matrix product instead of torch.stft (cuFFT): run here on the host,
    both give the same log-mel frames to float32 rounding."""
    from tts_service.model.speaker_encoder import (
        _LOG_FLOOR,
        _MAGNITUDE_EPS,
        _power_by_product,
        _power_by_stft,
        front_end_tables,
    )

    filters, _ = front_end_tables(torch.device("cpu"))
    wav = np.concatenate([sweep_signal(seconds=1.3), 1e-4 * np.random.default_rng(1).standard_normal(7001)])
    padded = torch.nn.functional.pad(torch.from_numpy(wav).float()[None, None], (384, 384), mode="reflect")[:, 0]

    def log_mel(power: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.clamp(filters @ torch.sqrt(power + _MAGNITUDE_EPS), min=_LOG_FLOOR))

    by_product, by_stft = _power_by_product(padded), _power_by_stft(padded)
    assert by_product.dtype == torch.float32 and by_product.shape == by_stft.shape
    torch.testing.assert_close(log_mel(by_product), log_mel(by_stft), rtol=0.0, atol=1e-4)


@pytest.mark.parity
def test_log_mel_matches_reference_front_end() -> None:
    wav = sweep_signal(seconds=1.3)
    ours = log_mel_spectrogram(torch.from_numpy(wav)[None])
    expected = reference_mel(wav)
    assert ours.shape == expected.shape == (1, 128, len(wav) // 256)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parity
def test_embedding_matches_reference_module_on_the_same_weights(pair: tuple[SpeakerEncoder, Any]) -> None:
    ours, reference = pair
    wav = sweep_signal()
    with torch.inference_mode():
        expected = reference(reference_mel(wav).transpose(1, 2))[0]
    embedding = ours.embed(torch.from_numpy(wav))
    assert embedding.shape == (ours.config.enc_dim,)
    torch.testing.assert_close(embedding, expected, rtol=1e-4, atol=1e-4)


def reference_base_model(dtype: torch.dtype) -> tuple[Any, SpeakerEncoder]:
    """The reference's tiny Base model in memory, its speaker encoder holding our random weights."""
    import_reference()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    raw = model_config_dict("tiny", "base")
    config = ModelConfig.parse(raw).speaker_encoder
    assert config is not None
    ours = random_encoder(config, seed=3)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**raw)).eval()
    model.speaker_encoder.load_state_dict(ours.state_dict(), strict=True)
    return model.to(dtype), ours.to(dtype)


@pytest.mark.parity
def test_embedding_matches_reference_extract_speaker_embedding() -> None:
    model, ours = reference_base_model(torch.float32)
    wav = sweep_signal(seconds=2.0, seed=5)
    expected = model.extract_speaker_embedding(wav, 24000)
    torch.testing.assert_close(ours.embed(torch.from_numpy(wav)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parity
def test_bf16_weights_take_an_fp32_spectrogram_like_the_reference() -> None:
    model, ours = reference_base_model(torch.bfloat16)
    wav = sweep_signal(seconds=2.0, seed=6)
    expected = model.extract_speaker_embedding(wav, 24000)
    embedding = ours.embed(torch.from_numpy(wav))
    assert embedding.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(embedding.float(), expected.float(), rtol=0, atol=4e-3)


def test_random_weights_give_embeddings_that_tell_inputs_apart() -> None:
    encoder = random_encoder(SMALL)
    chirp = encoder.embed(torch.from_numpy(sweep_signal(seed=0)))
    same = encoder.embed(torch.from_numpy(sweep_signal(seed=0)))
    noise = encoder.embed(torch.from_numpy(np.random.default_rng(1).standard_normal(72000).astype(np.float32) * 0.1))
    lower = encoder.embed(torch.from_numpy(sweep_signal(seed=0, base_hz=120.0)))
    assert torch.isfinite(chirp).all()
    assert torch.equal(chirp, same)
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(chirp, noise, dim=0) < 0.8
    assert cosine(chirp, lower, dim=0) < 0.99


def test_randomize_is_reproducible_from_the_generator_seed() -> None:
    first, again, other = random_encoder(SMALL, 7), random_encoder(SMALL, 7), random_encoder(SMALL, 8)
    assert all(torch.equal(value, again.state_dict()[key]) for key, value in first.state_dict().items())
    assert not torch.equal(first.fc.weight, other.fc.weight)


def test_shortest_accepted_clip_embeds_and_one_sample_less_is_refused() -> None:
    encoder = random_encoder(SMALL)
    assert encoder.min_samples == MIN_SAMPLES
    wav = torch.from_numpy(sweep_signal(seconds=0.1))
    assert torch.isfinite(encoder.embed(wav[:MIN_SAMPLES])).all()
    with pytest.raises(ValueError, match="too short for the speaker encoder: 1279 samples"):
        encoder.embed(wav[: MIN_SAMPLES - 1])


def test_embed_refuses_multichannel_input() -> None:
    with pytest.raises(ValueError, match="mono"):
        random_encoder(SMALL).embed(torch.zeros(2, 24000))


@pytest.mark.parametrize("change, message", [
    ({"sample_rate": 16000}, "fixed at 24000 Hz"),
    ({"enc_channels": (64, 64, 64, 64, 128)}, "aggregation layer"),
    ({"enc_channels": (64, 32, 32, 32, 96)}, "residual"),
    ({"enc_res2net_scale": 5}, "not divisible"),
])
def test_unusable_configs_are_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    fields = {**vars(SMALL), **change}
    with pytest.raises(ValueError, match=message):
        SpeakerEncoder(SpeakerEncoderConfig(**fields))
