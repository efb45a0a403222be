"""A draining server ends long-lived streamed calls instead of waiting for them until the drain timeout: a call's
open utterances are spoken to their end, an utterance begun during the drain is not opened (the call's end names
it), an utterance that has had no text is cancelled, and then the call ends UNAVAILABLE for the client to
reconnect elsewhere; on gRPC and on the WebSocket door alike."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import grpc
import pytest

from clients.qwen3_tts_client import CloseUtterance, Say
from qwen3_tts.v1.protocol import tts_pb2
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server, wait_until
from tests.service.processes import free_port
from tts_service.model.checkpoint import LoadedModel

DRAIN_TIMEOUT_S = 30.0
# Far below the drain timeout: the drain did not wait for it.
PROMPT_S = 15.0


@pytest.fixture
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], drain_timeout_seconds=DRAIN_TIMEOUT_S, http_port=free_port())
    yield running
    running.stop()


def start_drain(server: RunningServer) -> Any:
    return asyncio.run_coroutine_threadsafe(server.server.drain(), server.loop)


def read_all(call: Any) -> tuple[list[Any], grpc.RpcError | None]:
    responses = []
    try:
        for response in call:
            responses.append(response)
    except grpc.RpcError as error:
        return responses, error
    return responses, None


def test_a_calls_open_utterance_is_spoken_to_its_end_a_new_one_is_refused_and_the_call_ends_unavailable(
        server: RunningServer) -> None:
    release, hold = threading.Event(), threading.Event()

    def items() -> Iterator[Any]:
        yield Say("a", "Hi ")
        release.wait(30)
        yield Say("a", "there.")
        yield CloseUtterance("a")
        yield Say("b", "A new turn.")
        hold.wait(30)  # the client keeps its side open: the server ends the call

    with server.client() as client:
        call = client.streaming_synthesize(items(), RYAN, generation=GREEDY, utterance_id="a")
        try:
            # Its first audio says its text reached the server: a drain cancels an utterance that has had none yet.
            first = next(call)
            started = time.monotonic()
            drained = start_drain(server)
            assert wait_until(lambda: server.server.state.is_draining)
            release.set()
            responses, error = read_all(call)
            responses = [first, *responses]
            assert drained.result(timeout=PROMPT_S) is True
            assert time.monotonic() - started < PROMPT_S
        finally:
            release.set()
            hold.set()
    completions = [response for response in responses if response.HasField("completion")]
    assert [response.utterance_id for response in completions] == ["a"]
    assert completions[0].completion.usage.audio_frames >= 2
    assert sum(len(response.chunk.audio) for response in responses if response.HasField("chunk")) > 0
    assert error is not None and error.code() is grpc.StatusCode.UNAVAILABLE
    assert "'b'" in error.details() and "new call" in error.details()
    assert server.engine.num_live_requests == 0


def test_a_call_whose_utterance_has_had_no_text_ends_at_once(server: RunningServer) -> None:
    hold = threading.Event()

    def silent() -> Iterator[Any]:
        hold.wait(30)
        yield from ()

    with server.client() as client:
        call = client.streaming_synthesize(silent(), RYAN, generation=GREEDY)
        try:
            assert wait_until(lambda: server.engine.num_live_requests == 1)
            drained = start_drain(server)
            responses, error = read_all(call)
            assert drained.result(timeout=PROMPT_S) is True
        finally:
            hold.set()
    assert error is not None and error.code() is grpc.StatusCode.UNAVAILABLE
    # The server cancelled the utterance that had nothing to say.
    assert [response.completion.finish_reason for response in responses if response.HasField("completion")] == [
        tts_pb2.FINISH_REASON_CANCELLED]


def test_an_idle_websocket_is_closed_with_try_again_later_when_the_server_drains(server: RunningServer) -> None:
    address = (f"http://127.0.0.1:{server.server.config.http_port}/v1/text-to-speech/ryan/multi-stream-input"
               "?model_id=eleven_flash_v2_5&output_format=pcm_24000")

    async def run() -> tuple[list[dict[str, Any]], int | None, bool]:
        async with aiohttp.ClientSession() as session, session.ws_connect(address) as ws:
            drained = asyncio.wrap_future(start_drain(server))
            messages = [json.loads(frame.data) async for frame in ws]
            return messages, ws.close_code, await asyncio.wait_for(drained, PROMPT_S)

    messages, close_code, is_idle = asyncio.run(run())
    assert is_idle is True
    assert close_code == 1013 and [message["error"] for message in messages] == ["unavailable"]
    assert "shutting down" in messages[0]["message"]
