"""No single client can lock the service out: streams that make no progress (text trickling in, readers that read
nothing) give their capacity to calls that can go on, one caller cannot hold more calls than its limit, and every
call shape ends at the server's lifetime limit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import AudioFormat, Generation
from clients.qwen3_tts_client.client import streaming_config, synthesize_request
from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc
from tests.service.helpers import RYAN, start_server, wait_until
from tts_service.model.checkpoint import LoadedModel

pb: Any = tts_pb2
ORDINARY = pb.SynthesizeRequest(text="An ordinary call.", voice=pb.VoiceSelection(speaker="ryan"),
                                generation=pb.GenerationConfig(temperature=0.0, max_audio_seconds=0.48))
# A client that stops reading: without BDP probing its HTTP/2 window stays at 64 KiB.
STALLED_READER_OPTIONS = [("grpc.http2.bdp_probe", 0)]


async def trickling_requests(release: asyncio.Event) -> AsyncIterator[Any]:
    """A config, a first fragment, then nothing until released (as if the next word took forever)."""
    yield streaming_config(RYAN, AudioFormat("pcm16"), Generation(temperature=0.0))
    yield pb.StreamingSynthesizeRequest(text="Hello there ")
    await release.wait()


async def requests_after(release: asyncio.Event) -> AsyncIterator[Any]:
    """A text call that sends nothing until released."""
    await release.wait()
    yield streaming_config(RYAN, AudioFormat("pcm16"), Generation(temperature=0.0))


async def synthesize_retrying_while_busy(stub: tts_pb2_grpc.TextToSpeechStub, deadline_s: float) -> Any:
    """An ordinary call from a well-behaved client: RESOURCE_EXHAUSTED (a full queue) is retried after a short
    pause, all within one deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await stub.Synthesize(ORDINARY, timeout=max(0.1, deadline - time.monotonic()))
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def outcome(call: Any) -> str:
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as error:
        return error.code().name
    except asyncio.CancelledError:  # grpc.aio's answer to reading a call this client cancelled
        return "CANCELLED"
    return "OK"


def test_trickling_streams_and_stalled_readers_cannot_lock_ordinary_calls_out(
        tiny_models: dict[str, LoadedModel], report_figure: Callable[[str], None]) -> None:
    # Four generating, sixteen waiting: the hostile calls alone could fill both many times over.
    server = start_server(tiny_models["custom_voice"], max_concurrent=4, max_waiting=16, max_audio_seconds=30.0,
                          max_unread_audio_seconds=0.4, stream_idle_timeout_seconds=120.0, max_stream_seconds=120.0,
                          max_calls_per_caller=1000)
    num_trickling, num_stalled, num_ordinary = 400, 20, 6

    async def scenario() -> tuple[list[float], Counter[str]]:
        release = asyncio.Event()
        async with grpc.aio.insecure_channel(server.target) as hostile, \
                grpc.aio.insecure_channel(server.target, options=STALLED_READER_OPTIONS) as stalling, \
                grpc.aio.insecure_channel(server.target) as ordinary:
            trickles = [tts_pb2_grpc.TextToSpeechStub(hostile).StreamingSynthesize(trickling_requests(release))
                        for _ in range(num_trickling)]
            long_audio = synthesize_request("Please read all of this, slowly.", RYAN, AudioFormat("pcm16"),
                                            Generation(temperature=0.0, max_audio_seconds=30.0))
            stalled = [tts_pb2_grpc.TextToSpeechStub(stalling).SynthesizeOnline(long_audio)
                       for _ in range(num_stalled)]
            hostile_outcomes = [asyncio.ensure_future(outcome(call)) for call in trickles]
            await asyncio.sleep(3.0)  # the hostile calls have taken what they could
            stub = tts_pb2_grpc.TextToSpeechStub(ordinary)
            latencies = []
            for _ in range(num_ordinary):
                started = time.monotonic()
                reply = await synthesize_retrying_while_busy(stub, deadline_s=15.0)
                latencies.append(time.monotonic() - started)
                assert reply.completion.usage.audio_frames == 6
            release.set()
            for call in (*trickles, *stalled):
                call.cancel()
            outcomes = Counter(await asyncio.gather(*hostile_outcomes))
            return latencies, outcomes

    try:
        latencies, outcomes = asyncio.run(scenario())
    finally:
        server.stop()
    assert set(outcomes) <= {"OK", "CANCELLED", "RESOURCE_EXHAUSTED"}
    report_figure(f"lock-out: {num_trickling} trickling streams and {num_stalled} stalled readers against 4 running "
                  f"and 16 waiting places; {num_ordinary} ordinary calls took at most {max(latencies):.2f} s "
                  f"(trickles ended {dict(outcomes)})")


def test_one_caller_cannot_hold_more_calls_than_its_limit(tiny_models: dict[str, LoadedModel],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    server = start_server(tiny_models["custom_voice"], max_calls_per_caller=3, stream_idle_timeout_seconds=30.0,
                          api_keys=frozenset({"hostile-key", "other-key"}))

    async def scenario() -> tuple[list[str], str]:
        release = asyncio.Event()
        hostile_key = (("authorization", "Bearer hostile-key"),)
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            held = [stub.StreamingSynthesize(trickling_requests(release), metadata=hostile_key) for _ in range(3)]
            for call in held:
                await call.initial_metadata()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Synthesize(ORDINARY, metadata=hostile_key, timeout=15)
            # The streaming shapes are refused alike (grpc once logged each such refusal as a server error). The
            # refused text call sends nothing before its answer: a client still writing when the server ends the
            # call can see its own failed write (INTERNAL) in place of the server's status, a race in the client.
            online = stub.SynthesizeOnline(ORDINARY, metadata=hostile_key, timeout=15)
            streamed = stub.StreamingSynthesize(requests_after(release), metadata=hostile_key, timeout=15)
            for call in (online, streamed):
                with pytest.raises(grpc.aio.AioRpcError) as streaming_refused:
                    async for _ in call:
                        pass
                assert streaming_refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Another caller is not affected.
            reply = await stub.Synthesize(ORDINARY, metadata=(("x-api-key", "other-key"),), timeout=15)
            release.set()
            for call in held:
                call.cancel()
            assert reply.completion.usage.audio_frames == 6
            return [refused.value.code().name, refused.value.details()], "ok"

    try:
        (code, details), _ = asyncio.run(scenario())
    finally:
        server.stop()
    assert code == "RESOURCE_EXHAUSTED" and "--max-calls-per-caller" in details
    # The server's and grpc's loggers (this process also runs the client, whose grpc poller sometimes logs an
    # asyncio callback error of its own: not what this test is about).
    errors = [record.getMessage() for record in caplog.records
              if record.levelno >= logging.ERROR and record.name.startswith(("grpc", "tts_service"))]
    assert not errors, errors


def test_a_unary_call_ends_at_the_servers_lifetime_limit(tiny_models: dict[str, LoadedModel]) -> None:
    server = start_server(tiny_models["custom_voice"], max_stream_seconds=1.0, max_audio_seconds=60.0)
    request = synthesize_request("A long one.", RYAN, AudioFormat("pcm16"),
                                 Generation(temperature=0.0, max_audio_seconds=60.0))
    try:
        with server.client() as client, pytest.raises(grpc.RpcError) as caught:
            client.stub.Synthesize(request)
    finally:
        server.stop()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "limit of 1 s" in caught.value.details()


def test_a_stalled_readers_call_is_let_go_at_the_servers_lifetime_limit(tiny_models: dict[str, LoadedModel]) -> None:
    """A reader that reads nothing cannot even receive a status (it would wait behind the audio it has not read),
    but the server lets go of the call at the limit: its handler, its request and its caller's place end."""
    server = start_server(tiny_models["custom_voice"], max_stream_seconds=1.0, max_audio_seconds=60.0,
                          max_unread_audio_seconds=0.4)
    request = synthesize_request("A long one.", RYAN, AudioFormat("pcm16"),
                                 Generation(temperature=0.0, max_audio_seconds=60.0))

    async def scenario() -> tuple[bool, bool]:
        async with grpc.aio.insecure_channel(server.target, options=STALLED_READER_OPTIONS) as channel:
            call = tts_pb2_grpc.TextToSpeechStub(channel).SynthesizeOnline(request)
            await anext(call.__aiter__())
            was_holding = server.server.calls.num_active == 1
            let_go = await asyncio.to_thread(wait_until, lambda: server.server.calls.num_active == 0
                                             and server.engine.num_live_requests == 0, 15.0)
            call.cancel()
            return was_holding, let_go

    try:
        was_holding, let_go = asyncio.run(scenario())
    finally:
        server.stop()
    assert was_holding and let_go
