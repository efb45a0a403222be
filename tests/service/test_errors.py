"""Bad input and failures become the documented status codes, and the server keeps serving after each."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import AudioFormat, Generation, TtsClient, Voice, tts_pb2
from clients.qwen3_tts_client.client import streaming_config
from tests.service.helpers import GREEDY, RYAN, RunningServer, wait_until
from tts_service.api.errors import answering_errors
from tts_service.model.prompts import PromptError

pb = tts_pb2
ONE_FRAME = Generation(temperature=0.0, max_audio_seconds=0.08)
# What no status message may carry: a Python class name, or an object's repr with its heap address.
PYTHON_INTERNALS = re.compile(r"<class '|object at 0x|Traceback")
# A field tag whose varint never ends: these bytes parse as no protobuf message at all.
NOT_PROTOBUF = b"\xff\xff\xff"


def assert_still_serving(client: TtsClient) -> None:
    response = client.synthesize("Still here.", RYAN, generation=ONE_FRAME)
    assert response.completion.usage.audio_frames == 1


def raw_stream(client: TtsClient, requests: list[Any]) -> list[Any]:
    """A StreamingSynthesize call with hand-made request messages."""
    return list(client.stub.StreamingSynthesize(iter(requests), timeout=10))


def text(fragment: str) -> Any:
    return pb.StreamingSynthesizeRequest(text=fragment)


INVALID_REQUESTS: dict[str, tuple[Callable[[TtsClient], object], str]] = {
    "empty text": (lambda c: c.synthesize("", RYAN), "text: must not be empty"),
    "blank text": (lambda c: c.synthesize("  \n ", RYAN), "text: must not be empty"),
    "over-long text": (lambda c: c.synthesize("x" * 401, RYAN), "text: is 401 characters long"),
    "over-long instruction": (lambda c: c.synthesize("Hi.", Voice(speaker="ryan", instruction="y" * 401)),
                              "voice.instruction: is 401 characters long"),
    "unknown speaker": (lambda c: c.synthesize("Hi.", Voice(speaker="bob")), "voice.speaker: unknown speaker 'bob'"),
    "unknown language": (lambda c: c.synthesize("Hi.", Voice(speaker="ryan", language="klingon")),
                         "voice.language: unknown language 'klingon'"),
    "temperature out of range": (lambda c: c.synthesize("Hi.", RYAN, generation=Generation(temperature=101.0)),
                                 "generation.temperature must be in [0, 100]"),
    "top_p out of range": (lambda c: c.synthesize("Hi.", RYAN, generation=Generation(top_p=0.0)),
                           "generation.top_p must be in (0, 1]"),
    "repetition penalty out of range": (
        lambda c: c.synthesize("Hi.", RYAN, generation=Generation(repetition_penalty=0.0)),
        "generation.repetition_penalty"),
    "seed out of range": (lambda c: c.synthesize("Hi.", RYAN, generation=Generation(seed=2**32)),
                          "generation.seed must be in [0, 2**32)"),
    "too much audio": (lambda c: c.synthesize("Hi.", RYAN, generation=Generation(max_audio_seconds=5.0)),
                       "generation.max_audio_seconds: must be in (0, 0.48]"),
    "unsupported sample rate": (lambda c: c.synthesize("Hi.", RYAN, AudioFormat("wav", 12345)),
                                "audio_format.sample_rate"),
    "opus at a rate it lacks": (lambda c: list(c.synthesize_online("Hi.", RYAN, AudioFormat("ogg_opus", 44100))),
                                "audio_format.sample_rate: Opus cannot encode at 44100 Hz"),
    "mp3 at a bit rate it lacks": (
        lambda c: list(c.synthesize_online("Hi.", RYAN, AudioFormat("mp3", 8000, bit_rate_kbps=4_000_000_000))),
        "audio_format.bit_rate_kbps: 4000000000 kbps is not an MP3 bit rate at 8000 Hz"),
    "a bit rate for pcm16": (lambda c: c.synthesize("Hi.", RYAN, AudioFormat("pcm16", 24000, bit_rate_kbps=64)),
                             "audio_format.bit_rate_kbps: applies to MP3 only"),
    "unknown encoding number": (lambda c: c.stub.Synthesize(pb.SynthesizeRequest(
        text="Hi.", voice=RYAN.to_proto(), audio_format=pb.AudioFormat(encoding=42))), "audio_format.encoding"),
    "feature the model lacks: cloning": (
        lambda c: c.synthesize("Hi.", Voice(reference_audio=b"RIFF....", reference_text="Hello.")),
        "voice.reference_audio: the loaded custom_voice model cannot clone voices"),
    "config not first": (lambda c: raw_stream(c, [text("Hello."), streaming_config(RYAN)]),
                         "config: the first message must carry the config"),
    "no message at all": (lambda c: raw_stream(c, []), "config: the request stream ended before its first message"),
    "second config": (lambda c: raw_stream(c, [streaming_config(RYAN), text("Hello "), streaming_config(RYAN)]),
                      "config: only the first message may carry the config"),
    "empty message after the config": (lambda c: raw_stream(c, [streaming_config(RYAN),
                                                                pb.StreamingSynthesizeRequest()]),
                                       "request: every message after the config carries text, a flush, "
                                       "close_utterance or cancel_utterance"),
    "streamed text closed empty": (lambda c: list(c.streaming_synthesize([" ", "\n"], RYAN)),
                                   "text: must not be empty"),
    "streamed text too long": (lambda c: list(c.streaming_synthesize(["word " * 50, "word " * 50], RYAN)),
                               "text: the streamed text of utterance '' exceeds 400 characters"),
    "bad voice in a stream's config": (lambda c: list(c.streaming_synthesize(["Hi."], Voice(speaker="bob"))),
                                       "voice.speaker: unknown speaker"),
}


@pytest.mark.parametrize("case", INVALID_REQUESTS, ids=list(INVALID_REQUESTS))
def test_invalid_requests_get_invalid_argument_naming_the_field(custom_voice_server: RunningServer,
                                                                client: TtsClient, case: str) -> None:
    call, message = INVALID_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as caught:
        call(client)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert message in caught.value.details()
    assert not PYTHON_INTERNALS.search(caught.value.details())
    assert wait_until(lambda: custom_voice_server.engine.num_live_requests == 0, timeout_s=2.0)
    assert_still_serving(client)


def tts_method(name: str) -> str:
    return f"/{pb.DESCRIPTOR.package}.TextToSpeech/{name}"


# Calls that send NOT_PROTOBUF where a request message belongs (no serializer: the bytes go as they are), each
# with the type that message should have. Health and reflection stand for handlers that are not the servicer's.
MALFORMED_CALLS: dict[str, tuple[Callable[[grpc.Channel], object], str]] = {
    "ListVoices": (lambda channel: channel.unary_unary(tts_method("ListVoices"), request_serializer=None)(
        NOT_PROTOBUF, timeout=10), "qwen3_tts.v1.ListVoicesRequest"),
    "Synthesize": (lambda channel: channel.unary_unary(tts_method("Synthesize"), request_serializer=None)(
        NOT_PROTOBUF, timeout=10), "qwen3_tts.v1.SynthesizeRequest"),
    "SynthesizeOnline": (lambda channel: list(channel.unary_stream(tts_method("SynthesizeOnline"),
                                                                   request_serializer=None)(NOT_PROTOBUF, timeout=10)),
                         "qwen3_tts.v1.SynthesizeRequest"),
    "StreamingSynthesize, first message": (
        lambda channel: list(channel.stream_stream(tts_method("StreamingSynthesize"), request_serializer=None)(
            iter([NOT_PROTOBUF]), timeout=10)), "qwen3_tts.v1.StreamingSynthesizeRequest"),
    "StreamingSynthesize, after the config": (
        lambda channel: list(channel.stream_stream(tts_method("StreamingSynthesize"), request_serializer=None)(
            iter([streaming_config(RYAN).SerializeToString(), text("Hello ").SerializeToString(), NOT_PROTOBUF]),
            timeout=10)), "qwen3_tts.v1.StreamingSynthesizeRequest"),
    "health Check": (lambda channel: channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None)(
        NOT_PROTOBUF, timeout=10), "grpc.health.v1.HealthCheckRequest"),
    "health Watch": (lambda channel: list(channel.unary_stream("/grpc.health.v1.Health/Watch",
                                                               request_serializer=None)(NOT_PROTOBUF, timeout=10)),
                     "grpc.health.v1.HealthCheckRequest"),
    "reflection": (lambda channel: list(channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", request_serializer=None)(
        iter([NOT_PROTOBUF]), timeout=10)), "grpc.reflection.v1alpha.ServerReflectionRequest"),
}


@pytest.mark.parametrize("case", MALFORMED_CALLS, ids=list(MALFORMED_CALLS))
def test_a_message_whose_bytes_are_not_protobuf_gets_invalid_argument_naming_its_type(client: TtsClient,
                                                                                     case: str) -> None:
    call, message_type = MALFORMED_CALLS[case]
    with pytest.raises(grpc.RpcError) as caught:
        call(client.channel)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert caught.value.details() == f"request: the bytes are not a valid {message_type} message"
    assert_still_serving(client)


def test_unreadable_reference_audio_is_refused_with_libsndfiles_reason_and_no_object_repr(
        base_client: TtsClient) -> None:
    voice = Voice(reference_audio=b"this is not audio", reference_text="Hello.")
    with pytest.raises(grpc.RpcError) as caught:
        base_client.synthesize("Hi.", voice, generation=GREEDY)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details()
    prefix = "voice.reference_audio: reference audio is not audio in a readable format: "
    assert details.startswith(prefix) and details != prefix, details
    assert not PYTHON_INTERNALS.search(details), details


def test_a_request_failing_inside_the_engine_gets_internal_and_the_server_goes_on(
        custom_voice_server: RunningServer, client: TtsClient, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = custom_voice_server.engine.runner
    original = runner.start_step
    has_failed = threading.Event()

    def fail_once(step: Any) -> Any:
        if not has_failed.is_set():
            has_failed.set()
            raise RuntimeError("injected fault")
        return original(step)

    monkeypatch.setattr(runner, "start_step", fail_once)
    with pytest.raises(grpc.RpcError) as caught:
        list(client.synthesize_online("Hello there.", RYAN, generation=GREEDY))
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert "injected fault" not in caught.value.details()  # internals stay in the server's log
    assert has_failed.is_set()
    assert_still_serving(client)


class _EndedCall:
    """A call that has already ended under its handler: gRPC can no longer write anything to it."""

    def __init__(self) -> None:
        self.num_aborts = 0

    async def abort(self, *args: object) -> None:
        self.num_aborts += 1
        raise grpc.aio.InternalError("Failed \"execute_batch\"")


@pytest.mark.parametrize("failure", [grpc.aio.InternalError("Failed \"execute_batch\""),
                                     PromptError("text", "must not be empty")])
def test_a_call_that_ended_under_its_handler_ends_quietly_as_cancelled(
        failure: Exception, caplog: pytest.LogCaptureFixture) -> None:
    call = _EndedCall()

    async def handler() -> None:
        async with answering_errors(call):  # type: ignore[arg-type]
            raise failure

    with pytest.raises(asyncio.CancelledError), caplog.at_level(logging.INFO, logger="tts_service.api.server"):
        asyncio.run(handler())
    # A failed write is not answered again; a bad input still tries to answer (and finds the call gone).
    assert call.num_aborts == (0 if isinstance(failure, grpc.aio.InternalError) else 1)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert "the call ended before it could be answered" in caplog.text
