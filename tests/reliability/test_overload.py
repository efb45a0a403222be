"""Overload: calls beyond the waiting limit are refused at once, admitted ones finish, a reader that stops
reading pauses its request instead of making the server buffer its audio, and a client that floods a
bidirectional call with flushes is held back instead of making the server queue their acks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import AsyncTtsClient, AudioFormat, Connection, Generation
from clients.qwen3_tts_client.client import streaming_config, synthesize_request
from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc
from tests.service.helpers import RYAN, RunningServer, start_server, wait_until
from tts_service.engine.engine import Engine
from tts_service.model.checkpoint import LoadedModel

FRAME_S = 0.08
pb: Any = tts_pb2


@pytest.fixture(scope="module")
def small_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # Two generating, four waiting; a reader may leave 5 frames (0.4 s) of audio unread.
    running = start_server(tiny_models["custom_voice"], max_concurrent=2, max_waiting=4, max_audio_seconds=8.0,
                           max_unread_audio_seconds=0.4)
    yield running
    running.stop()


def test_calls_beyond_the_waiting_limit_are_refused_at_once_and_the_admitted_finish(
        small_server: RunningServer, report_figure: Callable[[str], None]) -> None:
    num_calls = 16
    generation = Generation(temperature=0.0, max_audio_seconds=0.8)

    async def one(client: AsyncTtsClient) -> tuple[str, float, int]:
        started = time.monotonic()
        try:
            num_chunks = 0
            async for message in client.synthesize_online("A request among many.", RYAN, generation=generation):
                num_chunks += message.HasField("chunk")
            return "OK", time.monotonic() - started, num_chunks
        except grpc.aio.AioRpcError as error:
            return error.code().name, time.monotonic() - started, 0

    async def burst() -> list[tuple[str, float, int]]:
        async with AsyncTtsClient(Connection(target=small_server.target)) as client:
            return list(await asyncio.gather(*(one(client) for _ in range(num_calls))))

    results = asyncio.run(burst())
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}
    refused = [seconds for status, seconds, _ in results if status == "RESOURCE_EXHAUSTED"]
    completed = [chunks for status, _, chunks in results if status == "OK"]
    # A simultaneous burst finds the 4 waiting places (and the 2 running ones once the first admissions
    # have emptied them); the rest is refused.
    assert len(completed) >= 4 and refused
    assert max(refused) < 1.0, "a refusal waits for nothing"
    assert all(chunks > 0 for chunks in completed)
    assert wait_until(lambda: small_server.engine.num_live_requests == 0)
    report_figure(f"overload: {num_calls} simultaneous calls with room for 2 running and 4 waiting: "
                  f"{len(completed)} completed, {len(refused)} refused with RESOURCE_EXHAUSTED "
                  f"in at most {max(refused) * 1e3:.0f} ms")


def _start_call(stub: tts_pb2_grpc.TextToSpeechStub, rpc: str, text: str, audio_format: AudioFormat,
                generation: Generation) -> Any:
    """A SynthesizeOnline call, or a StreamingSynthesize call that sends `text` and half-closes."""
    if rpc == "SynthesizeOnline":
        return stub.SynthesizeOnline(synthesize_request(text, RYAN, audio_format, generation))
    return stub.StreamingSynthesize(iter([streaming_config(RYAN, audio_format, generation),
                                          pb.StreamingSynthesizeRequest(text=text)]))


@pytest.mark.parametrize("rpc", ["SynthesizeOnline", "StreamingSynthesize"])
def test_a_reader_that_stops_reading_pauses_its_request_with_bounded_audio_held(
        small_server: RunningServer, rpc: str, report_figure: Callable[[str], None]) -> None:
    engine = small_server.engine
    num_frames = 100  # 8 s of 48 kHz PCM16: 770 kB, more than gRPC's flow-control window lets through

    async def stalled_reader() -> tuple[int, int, int]:
        # Without BDP probing the client's HTTP/2 window stays at its initial 64 KiB instead of growing.
        async with grpc.aio.insecure_channel(small_server.target, options=[("grpc.http2.bdp_probe", 0)]) as channel:
            call = _start_call(tts_pb2_grpc.TextToSpeechStub(channel), rpc, "Read me slowly, please.",
                               AudioFormat("pcm16", 48000),
                               Generation(temperature=0.0, max_audio_seconds=num_frames * FRAME_S))
            request_id = dict(await call.initial_metadata())["x-request-id"]
            messages = call.__aiter__()
            await anext(messages)
            # Stop reading until the request has paused; it must stay paused.
            assert await _eventually(lambda: _is_paused(engine, request_id))
            # Settled: the step in flight when it paused adds its frame, and audio still on its way into gRPC's
            # window (slow on a loaded machine) may let it resume briefly before the window is full.
            frames_when_paused = await _settled_frames(engine, request_id)
            await asyncio.sleep(1.0)
            assert engine.scheduler.requests[request_id].num_frames == frames_when_paused < num_frames
            held = engine.num_unread_frames(request_id)
            # Read the rest: the request resumes and nothing is lost.
            num_audio_bytes = 0
            async for message in messages:
                num_audio_bytes += len(message.chunk.audio)
                if message.HasField("completion"):
                    assert message.completion.usage.audio_frames == num_frames
            return frames_when_paused, held, num_audio_bytes

    frames_when_paused, held, num_audio_bytes = asyncio.run(stalled_reader())
    # In the engine's stream: at most the limit (5 frames) plus one codec chunk (12 frames).
    assert held <= 5 + 12
    assert num_audio_bytes > 0
    report_figure(f"slow reader ({rpc}): paused after {frames_when_paused} of {num_frames} frames with {held} "
                  "unread frames held by the engine (limit 5 + one chunk); the rest delivered once it read again")


def test_a_client_that_sends_flushes_and_reads_nothing_is_held_back_and_loses_no_ack(
        small_server: RunningServer, report_figure: Callable[[str], None]) -> None:
    # Each flush is answered with its 1 KB marker. If the server queued acks without bound it would read
    # all of them; bounded, it stops reading once its unsent acks and both directions' HTTP/2 windows are
    # full, and the client's writes stall far earlier.
    num_flushes = 60_000
    markers = [f"{index:06d}" + "x" * 1000 for index in range(num_flushes)]
    # More audio than "Hello there." covers: the request parks for text (it cannot end) until the half-close.
    generation = Generation(temperature=0.0, max_audio_seconds=1.0)

    async def flood() -> tuple[int, list[str], Any]:
        async with grpc.aio.insecure_channel(small_server.target) as channel:
            call = tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize()
            await call.write(streaming_config(RYAN, AudioFormat(), generation))
            await call.write(pb.StreamingSynthesizeRequest(text="Hello there."))
            num_written = 0

            async def write_all() -> None:
                nonlocal num_written
                for marker in markers:
                    await call.write(pb.StreamingSynthesizeRequest(flush=pb.Flush(marker=marker)))
                    num_written += 1
                await call.done_writing()

            writer = asyncio.create_task(write_all())
            num_seen = -1
            while num_written != num_seen:  # until the writes stall for a whole second
                num_seen = num_written
                await asyncio.sleep(1.0)
            assert not writer.done(), "every flush was taken while nothing was read"
            acks, last = [], None
            async for message in call:
                if message.HasField("flush_ack"):
                    acks.append(message.flush_ack.marker)
                last = message
            await writer
            return num_seen, acks, last

    num_taken, acks, last = asyncio.run(flood())
    assert num_taken < num_flushes // 2
    assert acks == markers
    assert last is not None and last.HasField("completion")
    assert wait_until(lambda: small_server.engine.num_live_requests == 0)
    report_figure(f"flush flood: a client that read nothing could send {num_taken} flushes of 1 KB before its writes "
                  f"stalled; once it read, all {num_flushes} acks arrived in order")


def _is_paused(engine: Engine, request_id: str) -> bool:
    request = engine.scheduler.requests.get(request_id)
    return request is not None and request.is_output_paused


async def _settled_frames(engine: Engine, request_id: str, quiet_s: float = 0.5, timeout_s: float = 20.0) -> int:
    """The request's frame count once it has not changed for `quiet_s`, with the request paused."""
    deadline = time.monotonic() + timeout_s
    num_frames = engine.scheduler.requests[request_id].num_frames
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        latest = engine.scheduler.requests[request_id].num_frames
        if latest == num_frames and _is_paused(engine, request_id):
            return latest
        num_frames = latest
    raise AssertionError(f"{request_id} did not stay paused: {num_frames} frames after {timeout_s} s")


async def _eventually(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()
