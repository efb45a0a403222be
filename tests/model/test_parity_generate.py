"""End-to-end parity with the official qwen-tts package on identical random weights.

Both sides load the same checkpoint directory (written once by our random-checkpoint builder),
decode greedily (talker and code predictor), and must produce identical codes for every prompt
layout and matching waveforms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.reference import import_reference
from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams, SamplingParams

pytestmark = pytest.mark.parity

NUM_FRAMES = 12
GREEDY = GenerationParams(talker=SamplingParams(temperature=0.0), predictor=SamplingParams(temperature=0.0),
                          max_new_frames=NUM_FRAMES)


@pytest.fixture(scope="module")
def reference_models(tiny_checkpoints: dict[str, Path]) -> dict[str, Any]:
    import_reference()
    from qwen_tts import Qwen3TTSModel

    return {kind: Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)
            for kind, path in tiny_checkpoints.items()}


def reference_speech(seconds: float = 2.0, sample_rate: int = 24000) -> np.ndarray:
    """A voiced-sounding test signal: a gliding harmonic tone with noise, deterministic."""
    rng = np.random.default_rng(7)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    return (0.3 * voiced + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


@dataclass(frozen=True)
class Case:
    model_type: str
    inputs: tuple[SynthesisInput, ...]
    non_streaming: bool = False


CASES = {
    "custom_voice_streaming_text": Case(
        "custom_voice", (SynthesisInput("Hello there, how are you?", "english", "ryan"),)),
    "custom_voice_dialect_instruction_non_streaming": Case(
        "custom_voice", (SynthesisInput("今天天气很好。", "auto", "eric", instruction="Speak slowly and warmly.",
                                        non_streaming_mode=True),), non_streaming=True),
    "custom_voice_batch_of_three_lengths": Case("custom_voice", (
        SynthesisInput("Short.", "english", "vivian"),
        SynthesisInput("A somewhat longer sentence, with a comma.", "auto", "dylan"),
        SynthesisInput("Une phrase en français, bien plus longue que les deux autres réunies.", "french", "serena"),
    )),
    "voice_design_streaming_text": Case("voice_design", (
        SynthesisInput("Design me a voice.", "auto", instruction="A deep, calm narrator."),)),
    "voice_design_non_streaming": Case("voice_design", (
        SynthesisInput("Guten Tag!", "german", instruction="Fröhlich.", non_streaming_mode=True),),
        non_streaming=True),
}


def run_ours(model: LoadedModel, inputs: tuple[SynthesisInput, ...]):
    return EagerSynthesizer(model).synthesize(list(inputs), [GREEDY] * len(inputs))


def run_reference_codes(reference: Any, inputs: tuple[SynthesisInput, ...], non_streaming: bool,
                        voice_clone_prompt: dict | None = None, ref_texts: list[str | None] | None = None):
    """The reference's inner generate, fed exactly as its public wrappers feed it."""
    input_ids = reference._tokenize_texts([reference._build_assistant_text(i.text) for i in inputs])
    instruct_ids = [reference._tokenize_texts([reference._build_instruct_text(i.instruction)])[0]
                    if i.instruction else None for i in inputs]
    ref_ids = None
    if ref_texts is not None:
        ref_ids = [reference._tokenize_texts([reference._build_ref_text(t)])[0] if t else None for t in ref_texts]
    codes, _ = reference.model.generate(
        input_ids=input_ids, instruct_ids=instruct_ids, ref_ids=ref_ids, voice_clone_prompt=voice_clone_prompt,
        languages=[i.language for i in inputs], speakers=[i.speaker for i in inputs] if voice_clone_prompt is None
        else None, non_streaming_mode=non_streaming, max_new_tokens=NUM_FRAMES + 1, do_sample=False,
        subtalker_dosample=False, repetition_penalty=GREEDY.repetition_penalty)
    return [c.cpu() for c in codes]


@pytest.mark.parametrize("name", sorted(CASES))
def test_codes_match_reference_for_prompt_layout(name: str, tiny_models, reference_models) -> None:
    case = CASES[name]
    ours = run_ours(tiny_models[case.model_type], case.inputs)
    theirs = run_reference_codes(reference_models[case.model_type], case.inputs, case.non_streaming)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.codes.shape == reference.shape
        assert torch.equal(mine.codes, reference)
        # Random weights must still exercise the whole codebook range, or equality proves little.
        assert len(set(mine.codes[:, 0].tolist())) > 1 and len(set(mine.codes[0].tolist())) > 1


def test_waveform_matches_reference_custom_voice(tiny_models, reference_models) -> None:
    item = SynthesisInput("Hello there, how are you?", "english", "aiden", non_streaming_mode=True)
    ours = run_ours(tiny_models["custom_voice"], (item,))[0]
    wavs, rate = reference_models["custom_voice"].generate_custom_voice(
        item.text, speaker="aiden", language="english", non_streaming_mode=True, do_sample=False,
        subtalker_dosample=False, max_new_tokens=NUM_FRAMES + 1)
    assert rate == ours.sample_rate
    assert ours.waveform.shape == wavs[0].shape
    assert np.abs(ours.waveform - wavs[0]).max() <= 1e-4
    assert np.abs(ours.waveform).max() > 1e-3


@pytest.mark.parametrize("mode", ["x_vector_only", "in_context_streaming", "in_context_non_streaming",
                                  "in_context_text_longer_than_reference"])
def test_voice_clone_matches_reference(mode: str, tiny_models, reference_models) -> None:
    model, reference = tiny_models["base"], reference_models["base"]
    seconds = 0.4 if mode == "in_context_text_longer_than_reference" else 2.0
    audio = reference_speech(seconds)
    x_vector_only = mode == "x_vector_only"
    non_streaming = mode == "in_context_non_streaming"
    ref_text = "This is the reference transcript."
    text = ("A long target sentence that has clearly more tokens than the short reference clip has frames, "
            "so text keeps flowing after the prompt." if mode == "in_context_text_longer_than_reference"
            else "Clone this voice.")

    items = reference.create_voice_clone_prompt(ref_audio=(audio, 24000), ref_text=ref_text,
                                                x_vector_only_mode=x_vector_only)
    clone = EagerSynthesizer(model).clone_voice(audio, ref_text, x_vector_only)
    torch.testing.assert_close(clone.speaker_embedding, items[0].ref_spk_embedding, atol=1e-4, rtol=1e-4)
    if not x_vector_only:
        assert torch.equal(torch.tensor(clone.reference_codes), items[0].ref_code.cpu())

    item = SynthesisInput(text, "english", clone=clone, non_streaming_mode=non_streaming)
    ours = run_ours(model, (item,))
    theirs = run_reference_codes(reference, (item,), non_streaming,
                                 reference._prompt_items_to_voice_clone_prompt(items), [items[0].ref_text])
    assert torch.equal(ours[0].codes, theirs[0])
