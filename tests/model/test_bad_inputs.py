from __future__ import annotations

import re

import numpy as np
import pytest

from tts_service.audio.reference import ReferenceAudioError, decode_audio_file
from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.model.prompts import PromptError, SynthesisInput, VoiceClone


def builder(tiny_models, kind: str):
    return EagerSynthesizer(tiny_models[kind]).prompts


def expect_field(field: str):
    return pytest.raises(PromptError, match="^" + re.escape(field) + ": ")


def test_unknown_speaker_names_the_field(tiny_models) -> None:
    with expect_field("speaker"):
        builder(tiny_models, "custom_voice").build(SynthesisInput("hi", speaker="nobody"))


def test_unknown_language_names_the_field(tiny_models) -> None:
    with expect_field("language"):
        builder(tiny_models, "custom_voice").build(SynthesisInput("hi", language="klingon", speaker="ryan"))


def test_dialect_is_not_a_requestable_language(tiny_models) -> None:
    with expect_field("language"):
        builder(tiny_models, "custom_voice").build(SynthesisInput("hi", language="sichuan_dialect", speaker="ryan"))


def test_empty_text_is_rejected(tiny_models) -> None:
    with expect_field("text"):
        builder(tiny_models, "voice_design").build(SynthesisInput("   \n"))


def test_instruction_on_base_model_is_rejected(tiny_models) -> None:
    clone = VoiceClone(speaker_embedding=None, reference_codes=None)
    with expect_field("instruction"):
        builder(tiny_models, "base").build(SynthesisInput("hi", instruction="whisper", clone=clone))


def test_instruction_on_small_custom_voice_model_is_rejected(tiny_models) -> None:
    from dataclasses import replace

    prompts = builder(tiny_models, "custom_voice")
    prompts.config = replace(prompts.config, model_size="0b6")
    with expect_field("instruction"):
        prompts.build(SynthesisInput("hi", speaker="ryan", instruction="whisper"))


def test_voice_clone_on_non_base_model_is_rejected(tiny_models) -> None:
    clone = VoiceClone(speaker_embedding=None, reference_codes=None)
    with expect_field("voice.reference_audio"):
        builder(tiny_models, "custom_voice").build(SynthesisInput("hi", clone=clone))
    with expect_field("voice.reference_audio"):
        EagerSynthesizer(tiny_models["voice_design"]).clone_voice(np.zeros(24000, np.float32), "x", False)


def test_base_model_without_reference_audio_is_rejected(tiny_models) -> None:
    with expect_field("voice.reference_audio"):
        builder(tiny_models, "base").build(SynthesisInput("hi"))


def test_in_context_clone_without_reference_text_is_rejected(tiny_models) -> None:
    clone = VoiceClone(speaker_embedding=None, reference_codes=((1,) * 16,), reference_text="")
    with expect_field("voice.reference_text"):
        builder(tiny_models, "base").build(SynthesisInput("hi", clone=clone))


def test_speaker_on_voice_design_model_is_rejected(tiny_models) -> None:
    with expect_field("speaker"):
        builder(tiny_models, "voice_design").build(SynthesisInput("hi", speaker="ryan"))


@pytest.mark.parametrize("payload", [b"", b"this is plainly not audio at all" * 10])
def test_reference_audio_that_is_empty_or_not_audio_is_rejected(payload: bytes) -> None:
    with pytest.raises(ReferenceAudioError):
        decode_audio_file(payload)
