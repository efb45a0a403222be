"""A server in front of two engine cores (`--device cuda:0,cuda:1`; here two cores on the CPU): its calls go to both,
and a core killed mid-call fails its own call UNAVAILABLE while the other core's call completes, health stays
SERVING and the metrics say one core runs; with every core down at once health says NOT_SERVING until one runs."""

from __future__ import annotations

import dataclasses
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.qwen3_tts_client import Generation
from observability.metrics import ServiceMetrics
from tests.service.helpers import RYAN, RunningServer, start_server, status_of
from tests.service.test_metrics import samples, value
from tts_service.engine import CoreSpec, EngineCores, EngineProcess, cores
from tts_service.engine.cores import core_specs

LONG = Generation(temperature=0.0, max_audio_seconds=12.0)
SHORT = Generation(temperature=0.0, max_audio_seconds=0.24)


def serve_on_two_cores(running: RunningServer, checkpoint: Path, processes: list[EngineProcess]) -> ServiceMetrics:
    """`running` serving two CPU cores of `checkpoint`; every core process started, again too, goes in `processes`."""
    async def start_core(spec: CoreSpec) -> EngineProcess:
        process = await EngineProcess.start(spec)
        processes.append(process)
        return process

    async def serve() -> ServiceMetrics:
        spec = CoreSpec(str(checkpoint), "cpu", running.server.config.engine, "WARNING", "text", 0.005, 30.0)
        specs = [dataclasses.replace(item, device="cpu") for item in core_specs(spec, ["cuda:0", "cuda:1"])]
        door = await EngineCores.start(specs, start_core)
        metrics = ServiceMetrics("tiny", "custom_voice")
        await running.server.serve(door, metrics)
        return metrics

    return running.run(serve())


def test_a_dead_core_fails_only_its_own_call_and_the_server_serves_on_with_the_other(
        tiny_checkpoints: dict[str, Path]) -> None:
    running = start_server(None, with_engine=False, max_audio_seconds=12.0)
    processes: list[EngineProcess] = []
    try:
        metrics = serve_on_two_cores(running, tiny_checkpoints["custom_voice"], processes)
        assert value(samples(metrics), "qwen3_tts_engine_cores_running") == 2
        with running.client() as client, ThreadPoolExecutor(max_workers=2) as calls:
            first, second = (client.synthesize_online(f"Talk for a while, caller {n}.", RYAN, generation=LONG)
                             for n in (1, 2))
            next(first)
            next(second)
            assert [process.num_live_requests for process in processes] == [1, 1]
            os.kill(processes[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
            statuses = sorted(call.result(timeout=120).name for call in
                              (calls.submit(status_of, first), calls.submit(status_of, second)))
            assert statuses == ["OK", "UNAVAILABLE"]
            health = health_pb2_grpc.HealthStub(client.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert client.synthesize("And one more.", RYAN, generation=SHORT).completion.usage.audio_frames >= 2
        # Killed a moment after its start, the core is left down rather than started again.
        assert value(samples(metrics), "qwen3_tts_engine_cores_running") == 1
    finally:
        running.stop()


def test_health_says_not_serving_while_every_core_starts_again_and_serving_once_one_runs(
        tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "MIN_UPTIME_S", 0.0)
    running = start_server(None, with_engine=False)
    processes: list[EngineProcess] = []
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        metrics = serve_on_two_cores(running, tiny_checkpoints["custom_voice"], processes)
        with running.client() as client:
            # Watch sends the status now, then each change.
            changes = health_pb2_grpc.HealthStub(client.channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)
            assert next(changes).status == serving
            for process in processes:
                os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            assert next(changes).status == not_serving
            assert next(changes).status == serving
            changes.cancel()
            assert len(processes) >= 3  # one started again, at least
            assert client.synthesize("Back again.", RYAN, generation=SHORT).completion.usage.audio_frames >= 2
        assert value(samples(metrics), "qwen3_tts_engine_cores_running") >= 1
    finally:
        running.stop()
