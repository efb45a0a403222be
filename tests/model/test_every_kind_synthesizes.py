"""Every model kind loads from its checkpoint files and synthesizes audio; a Base model also from a cloned voice.

These run on every transformers release the project allows (CI runs them again in a venv with the newest
one): the Base models' codec encoder is transformers' Mimi, and every kind's text tokenizer is loaded
through transformers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.signals import sweep_signal
from tts_service.eager.synthesize import EagerSynthesizer, SynthesisResult
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams

MAX_FRAMES = 10
PARAMS = GenerationParams(max_new_frames=MAX_FRAMES, seed=3)
TEXT = "Hello there, an iPhone on YouTube."
REQUESTS = {
    "custom_voice": SynthesisInput(TEXT, speaker="ryan"),
    "voice_design": SynthesisInput(TEXT, instruction="A calm, low voice."),
}
REFERENCE_AUDIO = sweep_signal(36000, seed=5)  # 1.5 s: a partial last frame
REFERENCE_TEXT = "Some words of the reference."


def assert_is_audio_of_its_codes(model: LoadedModel, result: SynthesisResult) -> None:
    frames, codebooks = result.codes.shape
    assert 1 <= frames <= MAX_FRAMES
    assert codebooks == model.config.talker.num_code_groups
    assert result.codes.dtype == torch.long
    assert int(result.codes.min()) >= 0
    assert int(result.codes.max()) < model.speech_config.decoder.codebook_size
    assert result.finish_reason in ("stop", "length")
    assert result.sample_rate == model.speech_config.output_sample_rate
    assert result.waveform.dtype == np.float32
    assert result.waveform.shape == (frames * model.speech_config.samples_per_frame,)
    assert np.isfinite(result.waveform).all()
    assert np.abs(result.waveform).max() > 0  # random weights give noise, not silence


@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_kind_without_voice_cloning_loads_and_synthesizes(tiny_models: dict[str, LoadedModel], kind: str) -> None:
    model = tiny_models[kind]
    assert model.speaker_encoder is None and model.codec_encoder is None
    result = EagerSynthesizer(model).synthesize([REQUESTS[kind]], [PARAMS])[0]
    assert_is_audio_of_its_codes(model, result)


def test_base_codec_encoder_holds_the_checkpoint_tensors_under_their_published_names(
        tiny_models: dict[str, LoadedModel], tiny_checkpoints: dict[str, Path]) -> None:
    encoder = tiny_models["base"].codec_encoder
    assert encoder is not None
    on_disk = load_file(tiny_checkpoints["base"] / "speech_tokenizer/model.safetensors")
    state = encoder.state_dict()
    assert {f"encoder.{name}" for name in state} == {name for name in on_disk if name.startswith("encoder.")}
    assert all(torch.equal(tensor, on_disk[f"encoder.{name}"]) for name, tensor in state.items())


def test_base_in_context_clone_takes_its_reference_codes_from_the_codec_encoder(
        tiny_models: dict[str, LoadedModel]) -> None:
    model = tiny_models["base"]
    synthesizer = EagerSynthesizer(model)
    clone = synthesizer.clone_voice(REFERENCE_AUDIO, REFERENCE_TEXT, x_vector_only=False)

    embedding = clone.speaker_embedding
    assert isinstance(embedding, torch.Tensor)
    assert embedding.shape == (model.config.talker.layers.hidden_size,)
    assert torch.isfinite(embedding).all()
    assert model.codec_encoder is not None
    encoded = model.codec_encoder.encode(torch.from_numpy(REFERENCE_AUDIO))
    assert clone.reference_codes == tuple(tuple(frame) for frame in encoded.tolist())
    assert len(clone.reference_codes) == math.ceil(len(REFERENCE_AUDIO) / model.speech_config.samples_per_frame)
    assert len(set(clone.reference_codes)) > 1  # a calibrated encoder: frames differ
    prompt = synthesizer.prompts.build(SynthesisInput(TEXT, clone=clone))
    assert prompt.reference_codes == clone.reference_codes


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in_context", "x_vector_only"])
def test_base_synthesizes_in_a_cloned_voice(tiny_models: dict[str, LoadedModel], x_vector_only: bool) -> None:
    model = tiny_models["base"]
    synthesizer = EagerSynthesizer(model)
    clone = synthesizer.clone_voice(REFERENCE_AUDIO, REFERENCE_TEXT, x_vector_only=x_vector_only)
    assert clone.is_in_context is not x_vector_only
    result = synthesizer.synthesize([SynthesisInput(TEXT, clone=clone)], [PARAMS])[0]
    assert_is_audio_of_its_codes(model, result)
