"""What a request that sets nothing gets: the checkpoint's generation_config.json and qwen-tts's per-kind default
for non-streaming text."""

from __future__ import annotations

import pytest

from tts_service.engine.model_info import ModelInfo
from tts_service.runner.params import GenerationParams, SamplingParams, params_from_generation_config


def test_absent_keys_keep_the_references_hard_defaults() -> None:
    assert params_from_generation_config({}) == GenerationParams()


def test_the_checkpoints_generation_config_sets_talker_and_predictor_defaults() -> None:
    params = params_from_generation_config({
        "do_sample": False, "top_k": 30, "repetition_penalty": 1.2,
        "subtalker_dosample": True, "subtalker_temperature": 0.7, "subtalker_top_p": 0.8, "max_new_tokens": 100})
    assert params.talker == SamplingParams(temperature=0.0, top_k=30, top_p=1.0)
    assert params.predictor == SamplingParams(temperature=0.7, top_k=50, top_p=0.8)
    assert params.repetition_penalty == 1.2
    assert params.max_new_frames == GenerationParams().max_new_frames  # the server's audio limit decides


@pytest.mark.parametrize(("raw", "complaint"), [
    ({"top_k": "50"}, "top_k must be a number"), ({"do_sample": 1}, "do_sample must be true or false"),
    ({"subtalker_temperature": 500}, "subtalker_temperature must be in"), ({"top_k": 2.5}, "whole number"),
    ({"repetition_penalty": 0}, "repetition_penalty must be in"),
])
def test_a_bad_generation_config_names_the_file_and_the_key(raw: dict, complaint: str) -> None:
    with pytest.raises(ValueError, match=f"^generation_config.json: .*{complaint}"):
        params_from_generation_config(raw)


def test_whole_text_defaults_to_non_streaming_except_for_voice_clone_models(tiny_models) -> None:
    assert ModelInfo.of(tiny_models["custom_voice"]).default_non_streaming_text
    assert ModelInfo.of(tiny_models["voice_design"]).default_non_streaming_text
    assert not ModelInfo.of(tiny_models["base"]).default_non_streaming_text
