"""Faults: a client gone mid-stream, deadlines at every stage, one request failing among others, SIGTERM
with streams in flight, an engine core killed or stopped, and a server started on a broken checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.qwen3_tts_client import AsyncTtsClient, Connection, Generation, TtsClient
from tests.service.helpers import RYAN, RunningServer, start_server, status_of, wait_until
from tests.service.processes import ROOT, server_process
from tts_service.engine.engine import Engine
from tts_service.model.checkpoint import LoadedModel
from tts_service.runner.runner import PrefillInput

LONG = Generation(temperature=0.0, max_audio_seconds=4.0)  # 50 frames: several seconds on a CPU
LONGEST = Generation(temperature=0.0, max_audio_seconds=12.0)
SHORT = Generation(temperature=0.0, max_audio_seconds=0.24)
FAILING_SEED = 666  # the seed that marks the request whose step input the fault breaks
# Short for a test, and still above the warm-up's first step on a busy CPU, which pays one-time costs (about 1 s).
STALL_TIMEOUT_S = 3.0
NOTICE_MARGIN_S = 5.0  # for the server to notice, kill and answer on a busy machine, beyond the timeout itself


@pytest.fixture(scope="module")
def one_slot_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], max_concurrent=1, max_waiting=8, max_audio_seconds=4.0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def roomy_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], max_concurrent=4, max_waiting=8, max_audio_seconds=12.0)
    yield running
    running.stop()


def assert_serves(server: RunningServer) -> None:
    with server.client() as client:
        assert client.synthesize("Still serving.", RYAN, generation=SHORT).completion.usage.audio_frames == 3


def test_a_client_gone_mid_stream_frees_its_request(roomy_server: RunningServer) -> None:
    channel = grpc.insecure_channel(roomy_server.target)
    client = TtsClient(Connection(target=roomy_server.target))
    client.channel, client.stub = channel, type(client.stub)(channel)
    responses = client.synthesize_online("Talk for a while, please.", RYAN, generation=LONG)
    next(responses)
    assert roomy_server.engine.num_live_requests == 1
    channel.close()  # the connection goes away without a cancel from the application
    assert wait_until(lambda: roomy_server.engine.num_live_requests == 0, timeout_s=5.0)
    assert_serves(roomy_server)


def test_a_deadline_passing_while_queued_ends_the_call_before_it_runs(one_slot_server: RunningServer) -> None:
    engine = one_slot_server.engine
    with one_slot_server.client() as client:
        occupying = client.synthesize_online("I hold the only slot.", RYAN, generation=LONG)
        next(occupying)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            client.synthesize("I wait in the queue.", RYAN, generation=SHORT, timeout=0.5)
        assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 2.0
        # Only the occupying request is left; the queued one never ran.
        assert wait_until(lambda: engine.num_live_requests == 1 and engine.scheduler.num_waiting == 0)
        occupying.cancel()
    assert wait_until(lambda: engine.num_live_requests == 0)
    assert_serves(one_slot_server)


def test_a_deadline_passing_during_the_prefill_ends_the_call_and_frees_the_request(
        roomy_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = roomy_server.engine.runner
    original = runner._prefill_inputs

    def slow(items: tuple[PrefillInput, ...]) -> Any:
        time.sleep(0.8)  # the deadline passes while the prefill runs
        return original(items)

    monkeypatch.setattr(runner, "_prefill_inputs", slow)
    with roomy_server.client() as client, pytest.raises(grpc.RpcError) as caught:
        client.synthesize("A slow prefill.", RYAN, generation=SHORT, timeout=0.4)
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    monkeypatch.undo()
    assert wait_until(lambda: roomy_server.engine.num_live_requests == 0, timeout_s=5.0)
    assert roomy_server.engine.scheduler.num_kv_blocks_used == 0
    assert_serves(roomy_server)


def test_a_deadline_passing_while_decoding_ends_the_stream_after_its_first_audio(
        roomy_server: RunningServer) -> None:
    with roomy_server.client() as client:
        # 150 frames: longer than the deadline even where a step takes only a few milliseconds.
        responses = client.synthesize_online("Talk past my deadline.", RYAN, generation=LONGEST, timeout=1.0)
        num_chunks = 0
        with pytest.raises(grpc.RpcError) as caught:
            for message in responses:
                num_chunks += message.HasField("chunk")
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert num_chunks >= 1
    assert wait_until(lambda: roomy_server.engine.num_live_requests == 0, timeout_s=5.0)
    assert_serves(roomy_server)


def test_one_requests_failing_step_ends_it_with_internal_while_the_others_finish(
        roomy_server: RunningServer, monkeypatch: pytest.MonkeyPatch, report_figure: Callable[[str], None]) -> None:
    engine: Engine = roomy_server.engine
    runner = engine.runner
    original = runner._prefill_embedding

    def fail_the_marked_request(item: PrefillInput, *inputs: Any) -> Any:
        if item.params.seed == FAILING_SEED:
            raise RuntimeError("injected fault")
        return original(item, *inputs)

    monkeypatch.setattr(runner, "_prefill_embedding", fail_the_marked_request)

    async def together() -> list[str]:
        async def call(seed: int) -> str:
            generation = Generation(temperature=0.9, max_audio_seconds=0.8, seed=seed)
            try:
                async for _ in client.synthesize_online("One of four at once.", RYAN, generation=generation):
                    pass
            except grpc.aio.AioRpcError as error:
                return error.code().name
            return "OK"

        async with AsyncTtsClient(Connection(target=roomy_server.target)) as client:
            return list(await asyncio.gather(*(call(seed) for seed in (1, 2, FAILING_SEED, 3))))

    statuses = asyncio.run(together())
    assert statuses == ["OK", "OK", "INTERNAL", "OK"]
    assert engine.is_running
    assert wait_until(lambda: engine.num_live_requests == 0)
    report_figure(f"fault in one of 4 concurrent requests' step: statuses {statuses}; the engine kept running")


def test_sigterm_lets_streams_in_flight_finish_then_exits_cleanly(tmp_path: Path) -> None:
    with server_process(tmp_path, "--max-audio-seconds", "2.0", "--drain-timeout-seconds", "30") as server:
        outcomes: list[str] = []
        first_chunks = threading.Barrier(4)

        def stream() -> None:
            with TtsClient(Connection(target=server.target)) as client:
                responses = client.synthesize_online("Finish me during the drain.", RYAN,
                                                     generation=Generation(temperature=0.0, max_audio_seconds=2.0))
                last = next(responses)
                first_chunks.wait(timeout=60)
                for last in responses:  # noqa: B007 (the last message is the one that matters)
                    pass
                outcomes.append("completed" if last.HasField("completion") else "cut short")

        threads = [threading.Thread(target=stream) for _ in range(3)]
        for thread in threads:
            thread.start()
        first_chunks.wait(timeout=60)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with TtsClient(Connection(target=server.target)) as client, pytest.raises(grpc.RpcError) as refused:
            client.synthesize("Too late.", RYAN, generation=SHORT, timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        for thread in threads:
            thread.join(timeout=60)
        assert server.process.wait(timeout=60) == 0
    assert outcomes == ["completed"] * 3
    # Objects frozen at start-up and never given back outlive the interpreter, and Triton's bindings list each.
    assert "nanobind: leaked" not in server.log_text()


def engine_core_pid(server_pid: int) -> int:
    """The server's engine core: its child started by multiprocessing's spawn (beside its resource tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    cores = [int(pid) for pid in children if "resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(cores) == 1, children
    return cores[0]


def test_the_engine_core_dying_mid_stream_ends_calls_unavailable_says_not_serving_and_exits_1(
        tmp_path: Path) -> None:
    with server_process(tmp_path, "--max-audio-seconds", "12.0", "--log-format", "text") as server:
        with TtsClient(Connection(target=server.target)) as client:
            watch = health_pb2_grpc.HealthStub(client.channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            responses = client.synthesize_online("Talk for a while, please.", RYAN, generation=LONGEST)
            next(responses)
            os.kill(engine_core_pid(server.process.pid), signal.SIGKILL)
            assert status_of(responses) is grpc.StatusCode.UNAVAILABLE  # retryable: the request did nothing wrong
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert server.process.wait(timeout=60) == 1
    assert "the engine stopped unexpectedly" in server.log_text()


def test_a_stopped_engine_core_ends_held_and_new_calls_unavailable_within_the_stall_timeout_and_exits_1(
        tmp_path: Path) -> None:
    with server_process(tmp_path, "--max-audio-seconds", "12.0", "--log-format", "text",
                        "--engine-stall-timeout-seconds", str(STALL_TIMEOUT_S)) as server:
        core_pid = engine_core_pid(server.process.pid)
        try:
            with TtsClient(Connection(target=server.target)) as client:
                watch = health_pb2_grpc.HealthStub(client.channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
                assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
                held = [client.synthesize_online("Talk for a while, please.", RYAN, generation=LONGEST)
                        for _ in range(3)]
                for responses in held:
                    next(responses)
                os.kill(core_pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    client.synthesize("A call after the stop.", RYAN, generation=SHORT, timeout=30)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                assert [status_of(responses) for responses in held] == [grpc.StatusCode.UNAVAILABLE] * 3
                assert time.monotonic() - stopped_at < STALL_TIMEOUT_S + NOTICE_MARGIN_S
                assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert server.process.wait(timeout=60) == 1
        finally:  # the server kills the stopped core; a test that fails before it must not leave it behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(core_pid, signal.SIGKILL)
    assert f"made no progress for {STALL_TIMEOUT_S:g} s (--engine-stall-timeout-seconds)" in server.log_text()


def broken_checkpoints(source: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Copies of a good checkpoint, each broken one way, with a word the error must contain."""
    broken: dict[str, tuple[Path, str]] = {}
    truncated = root / "truncated"
    shutil.copytree(source, truncated)
    weights = sorted(truncated.glob("*.safetensors"))[0]
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    broken["truncated weights"] = (truncated, weights.name)
    no_config = root / "no-config"
    shutil.copytree(source, no_config)
    (no_config / "config.json").unlink()
    broken["missing config.json"] = (no_config, "config.json")
    return broken


@pytest.mark.parametrize("case", ["truncated weights", "missing config.json"])
def test_a_broken_checkpoint_stops_the_server_with_a_clear_error_and_exit_code_1(
        tiny_checkpoints: dict[str, Path], tmp_path: Path, case: str) -> None:
    path, expected = broken_checkpoints(tiny_checkpoints["custom_voice"], tmp_path)[case]
    result = subprocess.run([sys.executable, "-m", "tts_service", "--model", str(path), "--device", "cpu",
                             "--host", "127.0.0.1", "--port", "0", "--log-format", "text"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "cannot load the model" in result.stderr and expected in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
