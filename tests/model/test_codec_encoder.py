"""The speech-tokenizer encoder (reference audio -> codes), against the official package on shared weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from tests.reference import import_reference
from tests.signals import sweep_signal
from tts_service.audio.reference import resample_to_model_rate
from tts_service.model.codec_encoder import CodecEncoder
from tts_service.model.configs import ConfigError, SpeechTokenizerConfig
from tts_service.model.random_checkpoint import speech_tokenizer_config_dict

TINY_RAW = speech_tokenizer_config_dict("tiny")
TINY = SpeechTokenizerConfig.parse(TINY_RAW)
# The released checkpoints' encoder: Mimi's defaults.
DEFAULT_RAW = {"encoder_config": {}}
DEFAULT = SpeechTokenizerConfig.parse(DEFAULT_RAW)
# A whole number of frames, a partial last frame, a single sample and less than one frame.
LENGTHS = (72000, 50000, 1, 1921)


def random_encoder(config: SpeechTokenizerConfig, seed: int = 0) -> CodecEncoder:
    encoder = CodecEncoder(config).eval()
    encoder.randomize_(torch.Generator().manual_seed(seed))
    return encoder


def reference_tokenizer_model(raw: dict[str, Any], ours: CodecEncoder) -> Any:
    """The reference `Qwen3TTSTokenizerV2Model` with our encoder weights; its decoder is shrunk to save time."""
    import_reference()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from transformers.modeling_utils import no_init_weights

    tiny_decoder = speech_tokenizer_config_dict("tiny")["decoder_config"]
    config = Qwen3TTSTokenizerV2Config(**{**raw, "decoder_config": tiny_decoder})
    # Its initialiser would run three times over the full Mimi; every tensor is overwritten anyway.
    with no_init_weights():
        model = Qwen3TTSTokenizerV2Model(config).eval()
    model.encoder.load_state_dict(ours.state_dict(), strict=True)
    return model


def reference_wrapper(model: Any) -> Any:
    """The reference `Qwen3TTSTokenizer` around `model`, assembled as `from_pretrained` would.

    Its feature extractor is the one every released `speech_tokenizer/preprocessor_config.json` names.
    """
    from qwen_tts import Qwen3TTSTokenizer
    from transformers import EncodecFeatureExtractor

    wrapper = Qwen3TTSTokenizer()
    wrapper.model, wrapper.config, wrapper.device = model, model.config, torch.device("cpu")
    wrapper.feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0,
                                                        chunk_length_s=None, overlap=None,
                                                        return_attention_mask=True)
    return wrapper


def reference_model_encode(model: Any, wav: np.ndarray) -> torch.Tensor:
    """`Qwen3TTSTokenizerV2Model.encode` on one unpadded clip, as the wrapper calls it."""
    with torch.inference_mode():
        codes = model.encode(torch.from_numpy(wav)[None], torch.ones(1, len(wav), dtype=torch.long))
    return codes.audio_codes[0]


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[CodecEncoder, Any]:
    ours = random_encoder(TINY)
    return ours, reference_tokenizer_model(TINY_RAW, ours)


@pytest.mark.parity
def test_default_mimi_keys_equal_the_checkpoint_encoder_keys_and_codes_match() -> None:
    ours = random_encoder(DEFAULT)
    reference = reference_tokenizer_model(DEFAULT_RAW, ours)
    expected_keys = {key.removeprefix("encoder.") for key in reference.state_dict() if key.startswith("encoder.")}
    assert set(ours.state_dict()) == expected_keys
    assert len(expected_keys) == 225
    wav = sweep_signal(50000)
    assert torch.equal(ours.encode(torch.from_numpy(wav)), reference_model_encode(reference, wav))


@pytest.mark.parity
@pytest.mark.parametrize("num_samples", LENGTHS)
def test_codes_equal_reference_model_encode(tiny_pair: tuple[CodecEncoder, Any], num_samples: int) -> None:
    ours, reference = tiny_pair
    wav = sweep_signal(num_samples)
    codes = ours.encode(torch.from_numpy(wav))
    assert codes.dtype == torch.long
    assert codes.shape == (math.ceil(num_samples / 1920), 16)
    assert torch.equal(codes, reference_model_encode(reference, wav))


@pytest.mark.parity
@pytest.mark.parametrize("sample_rate", [24000, 16000, 44100])
def test_codes_equal_reference_tokenizer_wrapper(tiny_pair: tuple[CodecEncoder, Any], sample_rate: int) -> None:
    """The wrapper's own preprocessing included: librosa resampling for other rates, the feature extractor."""
    ours, reference = tiny_pair
    wav = sweep_signal(int(2.2 * sample_rate), seed=4, sample_rate=sample_rate)
    expected = reference_wrapper(reference).encode(wav, sr=sample_rate).audio_codes[0]
    codes = ours.encode(torch.from_numpy(resample_to_model_rate(wav, sample_rate)))
    assert torch.equal(codes, expected)


@pytest.mark.parity
def test_bf16_weights_encode_bf16_audio_like_the_reference() -> None:
    ours_bf16 = random_encoder(TINY).to(torch.bfloat16)
    reference_bf16 = reference_tokenizer_model(TINY_RAW, ours_bf16).to(torch.bfloat16)
    wav = sweep_signal(40000, seed=2)
    expected = reference_wrapper(reference_bf16).encode(wav, sr=24000).audio_codes[0]
    assert torch.equal(ours_bf16.encode(torch.from_numpy(wav)), expected)


def test_random_weights_give_varied_codes() -> None:
    encoder = random_encoder(TINY, seed=1)
    codes = encoder.encode(torch.from_numpy(sweep_signal()))
    frames = codes.shape[0]
    distinct_per_codebook = [len(set(column.tolist())) for column in codes.T]
    assert min(distinct_per_codebook) >= frames // 2
    assert len({tuple(column.tolist()) for column in codes.T}) == codes.shape[1]
    other = encoder.encode(torch.from_numpy(sweep_signal(seed=0, base_hz=120.0)))
    assert (codes != other).float().mean() > 0.5


def test_randomize_is_reproducible_from_the_generator_seed() -> None:
    first, again = random_encoder(TINY, seed=5).state_dict(), random_encoder(TINY, seed=5).state_dict()
    assert all(torch.equal(value, again[key]) for key, value in first.items())


def test_weights_loaded_after_an_encode_are_used() -> None:
    """Mimi caches codebook centroids on first use; new weights must not be shadowed by that cache."""
    wav = torch.from_numpy(sweep_signal(30000))
    encoder = random_encoder(TINY, seed=1)
    encoder.encode(wav)
    replacement = random_encoder(TINY, seed=2)
    encoder.load_state_dict(replacement.state_dict(), strict=True)
    assert torch.equal(encoder.encode(wav), replacement.encode(wav))


def test_encode_refuses_empty_or_multichannel_audio() -> None:
    encoder = CodecEncoder(TINY)
    with pytest.raises(ValueError, match="non-empty mono"):
        encoder.encode(torch.zeros(0))
    with pytest.raises(ValueError, match="non-empty mono"):
        encoder.encode(torch.zeros(2, 1920))


@pytest.mark.parametrize("change, message", [
    ({"encoder_config": {**TINY_RAW["encoder_config"], "upsampling_ratios": [8, 5, 4, 3]}}, "960 samples"),
    ({"encoder_config": {**TINY_RAW["encoder_config"], "sampling_rate": 16000}}, "input_sample_rate"),
    ({"encoder_valid_num_quantizers": 17}, "encoder_valid_num_quantizers 17"),
])
def test_inconsistent_encoder_configs_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CodecEncoder(SpeechTokenizerConfig.parse({**TINY_RAW, **change}))
