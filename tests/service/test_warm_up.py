"""The warm-up synthesis the server runs before it says SERVING."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.service.helpers import TEST_CONFIG
from tts_service.api.main import serve
from tts_service.api.server import TtsServer
from tts_service.engine.engine import Engine
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.warm_up import warm_up_input
from tts_service.model.checkpoint import LoadedModel


def test_warm_up_runs_one_short_synthesis_to_its_end_and_leaves_nothing_live(
        tiny_models: dict[str, LoadedModel]) -> None:
    model = tiny_models["custom_voice"]

    async def run() -> tuple[bool, Engine]:
        engine = Engine.create(model, TEST_CONFIG.engine)
        engine.start()
        try:
            return await engine.warm_up(), engine
        finally:
            await engine.stop()

    ran, engine = asyncio.run(run())
    assert ran and engine.stats.num_steps > 0 and engine.num_live_requests == 0


def test_every_model_type_but_voice_clone_has_a_warm_up_request(tiny_models: dict[str, LoadedModel]) -> None:
    def warm_up_input_of(kind: str):
        return warm_up_input(ModelInfo.of(tiny_models[kind]))

    custom_voice, voice_design = warm_up_input_of("custom_voice"), warm_up_input_of("voice_design")
    assert custom_voice is not None and custom_voice.speaker is not None
    assert voice_design is not None and voice_design.instruction
    assert warm_up_input_of("base") is None


@pytest.mark.parametrize("engine_process", [True, False], ids=["core-process", "one-process"])
def test_health_turns_serving_only_after_the_warm_up_synthesis_has_ended(monkeypatch: pytest.MonkeyPatch,
                                                                        engine_process: bool) -> None:
    """The real start-up path (`qwen3-tts-server`'s serve): health, asked over gRPC, at the moment serving begins."""
    seen: dict[str, Any] = {}
    original_serve = TtsServer.serve

    async def observed_serve(server: TtsServer, engine: Engine, *args: Any, **kwargs: Any) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            seen["before"] = (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status
            seen["stats"], seen["num_live"] = replace(engine.stats), engine.num_live_requests
            await original_serve(server, engine, *args, **kwargs)
            seen["after"] = (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status
        signal.raise_signal(signal.SIGTERM)  # serve()'s own shutdown path

    monkeypatch.setattr(TtsServer, "serve", observed_serve)
    assert asyncio.run(serve(replace(TEST_CONFIG, model="random:tiny-custom_voice", device="cpu",
                                           engine_process=engine_process))) == 0
    assert seen["before"] == health_pb2.HealthCheckResponse.NOT_SERVING
    assert seen["after"] == health_pb2.HealthCheckResponse.SERVING
    # By then one request had been admitted, its audio decoded, and it had ended.
    assert seen["stats"].num_prefills >= 1 and seen["stats"].num_codec_frames > 0 and seen["num_live"] == 0
