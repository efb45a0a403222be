"""One engine configuration: every number has one default, and the runner and the scheduler derive theirs from it."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from tts_service.api.config import load_config
from tts_service.engine.config import PROMPT_OVERHEAD_POSITIONS, EngineConfig
from tts_service.engine.engine import Engine

FRAME_RATE_HZ = 12.5


def test_the_runner_and_the_scheduler_agree_on_every_size_they_share() -> None:
    config = EngineConfig(max_running=8, num_slots=12, block_size=16, codec_chunk_schedule=(1, 3, 6))
    runner = config.runner_config(FRAME_RATE_HZ)
    scheduler = config.scheduler_config(num_kv_blocks=100, frame_rate_hz=FRAME_RATE_HZ)
    assert runner.block_size == scheduler.block_size == 16
    assert runner.max_num_slots == scheduler.num_slots == 12 and scheduler.max_running == 8
    assert runner.codec_graph_chunk_sizes == scheduler.codec_chunk_schedule == (1, 3, 6)
    assert runner.max_positions_per_request == scheduler.max_positions_per_request
    assert scheduler.frame_duration_s == pytest.approx(0.08)


def test_a_request_has_room_for_the_longest_text_audio_and_reference_the_limits_allow() -> None:
    config = EngineConfig(max_text_chars=100, max_reference_text_chars=30, max_audio_s=10.0, max_reference_audio_s=4.0)
    expected = (math.ceil(10.0 * FRAME_RATE_HZ) + math.ceil(4.0 * FRAME_RATE_HZ) + 2 * 100 + 30
                + PROMPT_OVERHEAD_POSITIONS)
    assert config.positions_per_request(FRAME_RATE_HZ) == expected
    assert EngineConfig(max_positions_per_request=300).runner_config(FRAME_RATE_HZ).max_positions_per_request == 300


def test_the_servers_flags_default_to_the_engines_defaults() -> None:
    from_flags = load_config([], {}).engine
    defaults = EngineConfig()
    assert [(item.name, getattr(from_flags, item.name)) for item in fields(EngineConfig)] == [
        (item.name, getattr(defaults, item.name)) for item in fields(EngineConfig)]


@pytest.mark.parametrize("settings", [
    {"max_running": 0}, {"max_running": 8, "num_slots": 4}, {"max_waiting": 0}, {"max_audio_s": 0.0},
    {"max_unread_audio_s": float("inf")}, {"max_positions_per_request": 0}, {"max_text_chars": 0},
    {"max_reference_text_chars": 0},
])
def test_invalid_settings_are_refused_with_their_name(settings: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(reversed(settings)))):
        EngineConfig(**settings)


def test_engine_load_builds_the_codec_decoder_in_the_configured_dtype() -> None:
    engine = Engine.load("random:tiny-custom_voice", "cpu", EngineConfig(max_running=2, codec_dtype="bfloat16"))
    assert engine.runner.model.codec_decoder.pre_conv.conv.weight.dtype == torch.bfloat16
    assert engine.runner.codec_state.keys.dtype == torch.bfloat16
    assert engine.runner.model.talker.codec_head.weight.dtype == torch.float32


def test_an_unknown_codec_dtype_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"EngineConfig\.codec_dtype must be one of float32, bfloat16"):
        EngineConfig(codec_dtype="float16")


def test_engine_load_runs_the_codec_residual_units_in_fp16_when_asked() -> None:
    config = EngineConfig(max_running=2, codec_convolution_dtype="float16")
    engine = Engine.load("random:tiny-custom_voice", "cpu", config)
    decoder = engine.runner.model.codec_decoder
    assert decoder.pre_conv.conv.weight.dtype == torch.float32
    _, first_block, *_ = decoder.decoder
    _, upsample, first_unit, *_ = first_block.block  # snake, upsampling, residual units
    assert first_unit.conv1.stored_dtype() == first_unit.conv2.stored_dtype() == torch.float16
    assert upsample.stored_dtype() == decoder.pre_conv.stored_dtype() == torch.float32
    assert {state.dtype for state in engine.runner.codec_state.conv} == {torch.float16, torch.float32}


def test_engine_load_keeps_the_codec_convolutions_fp32_on_the_cpu_by_default() -> None:
    engine = Engine.load("random:tiny-custom_voice", "cpu", EngineConfig(max_running=2))
    assert EngineConfig().codec_convolution_dtype == "auto"
    assert {state.dtype for state in engine.runner.codec_state.conv} == {torch.float32}


@pytest.mark.parametrize(("settings", "message"), [
    ({"codec_convolution_dtype": "bfloat16"}, r"codec_convolution_dtype must be one of auto, float32, float16"),
    ({"codec_convolution_dtype": "float16", "codec_dtype": "bfloat16"},
     r"codec_convolution_dtype must be auto or float32 with codec_dtype 'bfloat16'"),
])
def test_a_codec_convolution_dtype_the_decoder_cannot_run_is_refused(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=rf"EngineConfig\.{message}"):
        EngineConfig(**settings)
