"""The warm-up synthesis the server runs before it says SERVING."""

from __future__ import annotations

import asyncio

from tests.service.helpers import TEST_CONFIG
from tts_service.engine import Engine
from tts_service.model.checkpoint import LoadedModel
from tts_service.server import create_engine
from tts_service.warm_up import warm_up, warm_up_input


def test_warm_up_runs_one_short_synthesis_to_its_end_and_leaves_nothing_live(
        tiny_models: dict[str, LoadedModel]) -> None:
    model = tiny_models["custom_voice"]

    async def run() -> tuple[bool, Engine]:
        engine = create_engine(model, TEST_CONFIG)
        engine.start()
        try:
            return await warm_up(model, engine), engine
        finally:
            await engine.stop()

    ran, engine = asyncio.run(run())
    assert ran and engine.stats.num_steps > 0 and engine.num_live_requests == 0


def test_every_model_type_but_voice_clone_has_a_warm_up_request(tiny_models: dict[str, LoadedModel]) -> None:
    custom_voice, voice_design = warm_up_input(tiny_models["custom_voice"]), warm_up_input(tiny_models["voice_design"])
    assert custom_voice is not None and custom_voice.speaker is not None
    assert voice_design is not None and voice_design.instruction
    assert warm_up_input(tiny_models["base"]) is None
