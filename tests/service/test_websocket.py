"""The WebSocket door's own JSON dialect (GET /v1/speech/stream): StreamingSynthesize over a WebSocket, with the same
audio, utterances, flush acks, checks and limits as the gRPC call.

The server runs the text-sensitive copy of the tiny model (see test_text_streaming), so that an utterance given
another's audio could not pass for itself."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from clients.qwen3_tts_client import AudioFormat
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server, wait_until
from tests.service.processes import free_port
from tests.service.test_text_streaming import differs, pcm16, text_sensitive
from tts_service.api.websocket_door import own_request
from tts_service.model.checkpoint import LoadedModel

PCM = AudioFormat("pcm16")
CONFIG = {"type": "config", "voice": {"speaker": "ryan", "language": "english"},
          "audio_format": {"encoding": "AUDIO_ENCODING_PCM16"}, "generation": {"temperature": 0.0}}
TEXTS = {"a": "Hello there, friend.", "b": "This one goes on and on, and it is cut short", "c": "Goodbye now, enemies!"}


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(text_sensitive(tiny_models["custom_voice"]), http_port=free_port(),
                           max_utterances_per_call=3, max_calls_per_caller=4)
    yield running
    running.stop()


def url(server: RunningServer, path: str = "/v1/speech/stream") -> str:
    return f"http://127.0.0.1:{server.server.config.http_port}{path}"


@dataclass
class Heard:
    """A socket's messages, by utterance, and how it closed."""

    audio: dict[str, bytearray] = field(default_factory=dict)
    completions: dict[str, dict[str, Any]] = field(default_factory=dict)
    acks: list[tuple[str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    close_code: int | None = None

    def add(self, message: dict[str, Any]) -> None:
        kind, utterance_id = message["type"], message.get("utterance_id", "")
        self.order.append(f"{kind}:{utterance_id}")
        if kind == "audio":
            self.audio.setdefault(utterance_id, bytearray()).extend(base64.b64decode(message["audio"]))
        elif kind == "completion":
            assert utterance_id not in self.completions, f"two completions for {utterance_id!r}"
            self.completions[utterance_id] = message
        elif kind == "flush_ack":
            self.acks.append((utterance_id, message["marker"]))
        elif kind == "error":
            self.errors.append(message)


async def converse(address: str, messages: list[Any], headers: dict[str, str] | None = None,
                   on_message: Any = None) -> Heard:
    """Send `messages` (dicts as JSON, str as they are, bytes as a binary frame), then read to the close.
    `on_message(ws, message)` may send more as the answers come."""
    heard = Heard()
    async with aiohttp.ClientSession() as session, session.ws_connect(address, headers=headers) as ws:
        for message in messages:
            await send(ws, message)
        async for frame in ws:
            if frame.type is aiohttp.WSMsgType.TEXT:
                body = json.loads(frame.data)
                heard.add(body)
                if on_message is not None:
                    await on_message(ws, body)
        heard.close_code = ws.close_code
    return heard


async def send(ws: aiohttp.ClientWebSocketResponse, message: Any) -> None:
    if isinstance(message, bytes):
        await ws.send_bytes(message)
    elif isinstance(message, str):
        await ws.send_str(message)
    else:
        await ws.send_json(message)


def say(utterance_id: str, text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "utterance_id": utterance_id}


def test_one_utterance_is_the_audio_that_streaming_synthesize_gives_for_the_same_text(server: RunningServer) -> None:
    with server.client() as client:
        responses = list(client.streaming_synthesize([TEXTS["a"]], RYAN, PCM, GREEDY))
    grpc_audio = pcm16(b"".join(response.chunk.audio for response in responses))
    heard = asyncio.run(converse(url(server), [CONFIG, say("", TEXTS["a"]), {"type": "end"}]))
    assert heard.close_code == 1000 and not heard.errors
    assert not differs(pcm16(bytes(heard.audio[""])), grpc_audio)
    completion = heard.completions[""]
    assert completion["usage"]["audio_frames"] == responses[-1].completion.usage.audio_frames
    assert completion["finish_reason"] in ("FINISH_REASON_STOPPED", "FINISH_REASON_LENGTH")
    assert heard.order[-1] == "completion:"


def test_audio_messages_carry_their_offsets_as_audio_chunks_do(server: RunningServer) -> None:
    offsets: list[tuple[int, int]] = []

    async def collect(_: Any, message: dict[str, Any]) -> None:
        if message["type"] == "audio":
            offsets.append((message["offset_samples"], message["num_samples"]))
            assert len(base64.b64decode(message["audio"])) == 2 * message["num_samples"]

    asyncio.run(converse(url(server), [CONFIG, say("", "Hi."), {"type": "end"}], on_message=collect))
    assert offsets and offsets[0][0] == 0
    assert all(start + length == following for (start, length), (following, _) in itertools.pairwise(offsets))


def test_three_utterances_with_one_cancelled_leave_the_other_two_as_they_are_alone(server: RunningServer) -> None:
    cancelled = asyncio.Event()

    async def cancel_b_once_it_speaks(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> None:
        if message["type"] == "audio" and message["utterance_id"] == "b" and not cancelled.is_set():
            cancelled.set()
            for item in ({"type": "cancel", "utterance_id": "b"}, say("b", " and text that comes too late"),
                         {"type": "end"}):
                await send(ws, item)

    heard = asyncio.run(converse(url(server), [
        {**CONFIG, "utterance_id": "a"}, say("a", TEXTS["a"]), {"type": "close", "utterance_id": "a"},
        say("b", TEXTS["b"]), say("c", TEXTS["c"]), {"type": "close", "utterance_id": "c"}],
        on_message=cancel_b_once_it_speaks))
    assert cancelled.is_set() and not heard.errors and heard.close_code == 1000
    assert heard.completions["b"]["finish_reason"] == "FINISH_REASON_CANCELLED"
    for utterance_id in ("a", "c"):
        alone = asyncio.run(converse(url(server), [CONFIG, say("", TEXTS[utterance_id]), {"type": "end"}]))
        assert not differs(pcm16(bytes(heard.audio[utterance_id])), pcm16(bytes(alone.audio[""])))
        assert (heard.completions[utterance_id]["usage"]["audio_frames"]
                == alone.completions[""]["usage"]["audio_frames"])
    assert len({completion["request_id"] for completion in heard.completions.values()}) == 3


def test_flushes_are_acked_in_order_naming_their_utterance(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [
        {**CONFIG, "utterance_id": "one"}, say("one", "Hi."), {"type": "flush", "marker": "x", "utterance_id": "one"},
        {"type": "close", "utterance_id": "one"}, say("two", "Bye."),
        {"type": "flush", "marker": "y", "utterance_id": "two"}, {"type": "end"}]))
    assert heard.acks == [("one", "x"), ("two", "y")]
    assert set(heard.completions) == {"one", "two"}
    assert heard.order.index("flush_ack:one") < heard.order.index("flush_ack:two")


@pytest.mark.parametrize(("messages", "field", "close_code"), [
    ([{**CONFIG, "voice": {"speaker": "bob"}}, say("", "Hi.")], "voice.speaker", 1008),
    ([{**CONFIG, "voice": {"spk": "ryan"}}], "voice.spk", 1007),
    ([{**CONFIG, "audio_format": {"encoding": "AUDIO_ENCODING_PCM16", "sample_rate": 12345}}],
     "audio_format.sample_rate", 1008),
    ([{**CONFIG, "generation": {"temperature": "hot"}}], "generation.temperature", 1007),
    ([CONFIG, {"type": "text", "text": 5}], "text", 1007),
    ([CONFIG, {"type": "shout", "text": "Hi."}], "type", 1008),
    ([CONFIG, {"type": "text", "text": "Hi.", "volume": 11}], "volume", 1008),
    ([CONFIG, say("bad id!", "Hi.")], "utterance_id", 1008),
    ([CONFIG, "{not json"], "message", 1007),
    ([CONFIG, b"\x00\x01"], "message", 1003),
    ([say("", "Hi.")], "config", 1008),
    ([CONFIG, CONFIG], "config", 1008),
])
def test_a_refused_message_gets_an_error_naming_its_field_and_a_close_code(
        server: RunningServer, messages: list[Any], field: str, close_code: int) -> None:
    heard = asyncio.run(converse(url(server), messages))
    assert [error["field"] for error in heard.errors] == [field]
    assert heard.errors[0]["message"].startswith(f"{field}: ")
    assert heard.close_code == close_code


def test_more_open_utterances_than_the_limit_are_refused_naming_the_flag(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [CONFIG, say("", "One and"), say("b", "two and"), say("c", "three and"),
                                               say("d", "four.")]))
    assert heard.errors[0]["field"] == "utterance_id" and "--max-utterances-per-call" in heard.errors[0]["message"]
    assert heard.close_code == 1008


def test_a_socket_that_sends_no_text_ends_at_the_idle_limit(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [CONFIG, say("", "Hello")]))
    assert heard.errors[0]["code"] == "DEADLINE_EXCEEDED" and "no text arrived" in heard.errors[0]["message"]
    assert heard.close_code == 1008
    assert wait_until(lambda: server.server.calls.num_active == 0 and server.engine.num_live_requests == 0)


def test_the_upgrade_answers_a_plain_get_with_400(server: RunningServer) -> None:
    async def get() -> int:
        async with aiohttp.ClientSession() as session, session.get(url(server)) as response:
            return response.status

    assert asyncio.run(get()) == 400


def test_a_message_is_parsed_by_the_protos_json_rules() -> None:
    request = own_request({"type": "flush", "utterance_id": "u", "marker": "m"})
    assert request.WhichOneof("request") == "flush" and request.flush.marker == "m" and request.utterance_id == "u"
    config = own_request({"type": "config", "audioFormat": {"sampleRate": 16000}})
    assert config.config.audio_format.sample_rate == 16000
    assert own_request({"type": "end"}) is None
