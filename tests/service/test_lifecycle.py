"""Start-up and shutdown: health follows the engine, draining refuses new calls and lets running ones finish, and
a server refuses to start on a port that another one holds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.qwen3_tts_client import Connection, Generation, TtsClient
from qwen3_tts.v1.protocol import SERVICE_NAME
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server, wait_until
from tests.service.processes import ROOT, ServerProcess, free_port, server_process
from tts_service.model.checkpoint import LoadedModel

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The random model never stops on its own: a short limit keeps a call short.
TWO_FRAMES = Generation(temperature=0.0, max_audio_seconds=0.16)
SECOND_SERVER_TIMEOUT_S = 120.0
# How long a call held open waits for the rest of its text: past anything a busy CI machine takes between the steps
# of a test, so that the call never ends by itself while the test holds it (nor by the server's idle limit, nor
# by the drain's timeout, which the drained server's fixture sets as long).
HELD_CALL_S = 120.0


def health(client: TtsClient, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(client.channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                            timeout=5).status


def assert_unavailable(client: TtsClient) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        client.synthesize("Hello.", RYAN, generation=GREEDY)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def responses_noting_audio(responses: Iterator[Any], first_audio: threading.Event) -> list[Any]:
    """Every response of a streamed call, `first_audio` set once one carries audio."""
    received = []
    for response in responses:
        received.append(response)
        if response.HasField("chunk"):
            first_audio.set()
    return received


def ending_of(call: Future[list[Any]]) -> str:
    if not call.done():
        return "the call still runs"
    error = call.exception()
    return f"the call ended with {error!r}" if error is not None else f"the call completed: {call.result()[-1]}"


def text_until(release: threading.Event, before: str, after: str) -> Iterator[str]:
    yield before
    release.wait(timeout=HELD_CALL_S)
    yield after


@pytest.fixture
def fresh_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # The drain must find the held call still running, ended neither by the idle limit (the tests' usual 1.5 s)
    # nor by the drain's own timeout, however long a busy machine takes between the test's steps.
    running = start_server(tiny_models["custom_voice"], with_engine=False, drain_timeout_seconds=HELD_CALL_S,
                           stream_idle_timeout_seconds=HELD_CALL_S)
    yield running
    running.stop()


def test_health_is_not_serving_and_speech_is_unavailable_until_the_engine_runs(fresh_server: RunningServer) -> None:
    with fresh_server.client() as client:
        assert health(client) == NOT_SERVING and health(client, SERVICE_NAME) == NOT_SERVING
        assert_unavailable(client)
        fresh_server.attach_engine()
        assert health(client) == SERVING and health(client, SERVICE_NAME) == SERVING
        assert client.synthesize("Hello.", RYAN, generation=GREEDY).completion.usage.audio_frames >= 2


def test_draining_refuses_new_calls_and_lets_running_ones_finish(fresh_server: RunningServer) -> None:
    fresh_server.attach_engine()
    release = threading.Event()
    first_audio = threading.Event()
    with fresh_server.client() as client, ThreadPoolExecutor(max_workers=1) as calls:
        running = calls.submit(responses_noting_audio, client.streaming_synthesize(
            text_until(release, "Hi ", "there."), RYAN, generation=GREEDY), first_audio)
        # Its first audio says its text reached the server: an utterance with no text yet is cancelled by a drain,
        # as a call's utterances are meant to be (a busy machine began the drain before the text had arrived).
        assert first_audio.wait(timeout=HELD_CALL_S)
        drained = asyncio.run_coroutine_threadsafe(fresh_server.server.drain(), fresh_server.loop)
        assert wait_until(lambda: health(client) == NOT_SERVING)
        assert health(client, SERVICE_NAME) == NOT_SERVING
        assert_unavailable(client)
        # Still waiting for the running call; if not, say why it ended.
        assert not drained.done(), (f"the drain ended ({drained.result()}) before the held call was released: "
                                    f"{ending_of(running)}")
        release.set()
        assert running.result(timeout=30)[-1].completion.usage.audio_frames >= 2
        assert drained.result(timeout=10) is True


def test_shutdown_cancels_calls_still_running_after_the_drain_timeout_and_stops_the_engine(
        tiny_models: dict[str, LoadedModel]) -> None:
    server = start_server(tiny_models["custom_voice"], drain_timeout_seconds=0.2)
    release = threading.Event()
    try:
        with server.client() as client, ThreadPoolExecutor(max_workers=1) as calls:
            stuck = calls.submit(list, client.streaming_synthesize(text_until(release, "Hi ", "there."), RYAN))
            assert wait_until(lambda: server.engine.num_live_requests == 1)
            server.stop()
            with pytest.raises(grpc.RpcError):
                stuck.result(timeout=10)
    finally:
        release.set()
    assert server.engine.num_live_requests == 0 and not server.engine.is_running


@pytest.fixture(scope="module")
def first_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, int]]]:
    """A serving server process with all four listeners, and its port for each flag."""
    metrics_port, health_port, http_port = free_port(), free_port(), free_port()
    with server_process(tmp_path_factory.mktemp("first-server"), "--metrics-port", str(metrics_port),
                        "--health-port", str(health_port), "--http-port", str(http_port)) as running:
        port = int(running.target.rsplit(":", 1)[1])
        yield running, {"--port": port, "--metrics-port": metrics_port, "--health-port": health_port,
                        "--http-port": http_port}


def run_second_server(ports: dict[str, int]) -> subprocess.CompletedProcess[str]:
    """`python -m tts_service` on 127.0.0.1 with these ports, run until it exits."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("QWEN3_TTS_", "OTEL_"))}
    flags = [str(part) for flag, port in ports.items() for part in (flag, port)]
    command = [sys.executable, "-m", "tts_service", "--model", "random:tiny-custom_voice", "--device", "cpu",
               "--host", "127.0.0.1", *flags]
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=SECOND_SERVER_TIMEOUT_S)


@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--health-port", "--http-port"])
def test_a_second_server_on_a_port_in_use_exits_naming_the_flag_and_the_first_keeps_serving(
        first_server: tuple[ServerProcess, dict[str, int]], flag: str) -> None:
    first, ports = first_server
    busy = ports[flag]
    second = run_second_server({"--port": free_port(), flag: busy})
    assert second.returncode == 1, second.stderr[-4000:]
    assert f"{flag} {busy}: cannot listen on 127.0.0.1:{busy}" in second.stderr
    with TtsClient(Connection(target=first.target)) as client:
        assert health(client) == SERVING
        assert client.synthesize("Hello.", RYAN, generation=TWO_FRAMES).completion.usage.audio_frames == 2
    with grpc.insecure_channel(f"127.0.0.1:{ports['--health-port']}") as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == SERVING
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['--metrics-port']}/metrics", timeout=10) as response:
        assert b"qwen3_tts_build_info" in response.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['--http-port']}/v1/models", timeout=10) as response:
        assert json.loads(response.read())["data"][0]["id"] == "random:tiny-custom_voice"
