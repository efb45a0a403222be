"""ElevenLabs' multi-context stream-input protocol on the WebSocket door, spoken by a plain aiohttp client as Pipecat
and LiveKit speak it (docs/elevenlabs-compat-notes.md): contexts, flush, close_context as the end of a turn or a
barge-in, keep-alives, isFinal, output formats, refusals at the upgrade; and the alignment's time bases."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import soundfile as sf

from tests.service.helpers import RunningServer, start_server, wait_until
from tests.service.processes import free_port
from tts_service.api.elevenlabs_dialect import output_format
from tts_service.api.errors import ApiError
from tts_service.api.word_alignment import AlignmentCursor, align
from tts_service.audio.output import AudioEncoding
from tts_service.model.checkpoint import LoadedModel

KEY = "eleven-key"
PCM_QUERY = "model_id=eleven_flash_v2_5&output_format=pcm_24000"
PIPECAT_QUERY = f"{PCM_QUERY}&auto_mode=true"
LIVEKIT_QUERY = f"{PCM_QUERY}&enable_logging=true&inactivity_timeout=180&sync_alignment=true&auto_mode=true"


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], http_port=free_port(), api_keys=frozenset({KEY}),
                           max_audio_seconds=1.2)
    yield running
    running.stop()


def url(server: RunningServer, query: str = PIPECAT_QUERY, voice: str = "ryan") -> str:
    return f"http://127.0.0.1:{server.server.config.http_port}/v1/text-to-speech/{voice}/multi-stream-input?{query}"


@dataclass
class Heard:
    audio: dict[str, bytearray] = field(default_factory=dict)
    finals: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    audio_after_final: list[str] = field(default_factory=list)
    close_code: int | None = None

    def add(self, message: dict[str, Any]) -> None:
        context_id = message.get("contextId")
        if message.get("error"):
            self.errors.append(message)
        elif message.get("isFinal") is True:
            assert "audio" not in message
            self.finals.append(context_id)
        elif "audio" in message:
            if context_id in self.finals:
                self.audio_after_final.append(context_id)
            assert set(message) == {"audio", "alignment", "normalizedAlignment", "contextId"}
            self.audio.setdefault(context_id, bytearray()).extend(base64.b64decode(message["audio"] or ""))


async def converse(address: str, messages: list[dict[str, Any]], key: str | None = KEY, on_message: Any = None,
                   close_when_final: int | None = None) -> Heard:
    """Send `messages`, then read to the server's close (or close the socket ourselves, as LiveKit does, after
    `close_when_final` isFinal messages)."""
    heard = Heard()
    headers = {"xi-api-key": key} if key is not None else {}
    async with aiohttp.ClientSession() as session, session.ws_connect(address, headers=headers) as ws:
        for message in messages:
            await ws.send_json(message)
        async for frame in ws:
            heard.add(json.loads(frame.data))
            if on_message is not None:
                await on_message(ws, json.loads(frame.data))
            if close_when_final is not None and len(heard.finals) >= close_when_final:
                await ws.close()
        heard.close_code = ws.close_code
    return heard


def upgrade_status(address: str, headers: dict[str, str]) -> tuple[int, str]:
    async def attempt() -> tuple[int, str]:
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        async with aiohttp.ClientSession() as session, session.get(address, headers={**upgrade, **headers}) as reply:
            return reply.status, await reply.text()

    return asyncio.run(attempt())


def test_a_pipecat_turn_speaks_each_sentence_and_ends_with_is_final_after_its_audio(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [
        {"text": ""},  # a keep-alive before any context
        {"text": " ", "context_id": "turn-1"},
        {"text": "Hello there, this is the first sentence.", "context_id": "turn-1"},
        {"text": " ", "context_id": "turn-1"},  # a re-init of the open context
        {"text": "And here is the second.", "context_id": "turn-1"},
        {"text": "", "context_id": "turn-1"},  # a keep-alive naming the context
        {"context_id": "turn-1", "flush": True},
        {"context_id": "turn-1", "close_context": True},
        {"close_socket": True}]))
    assert not heard.errors and heard.close_code == 1000
    assert heard.finals == ["turn-1"] and not heard.audio_after_final
    assert len(heard.audio["turn-1"]) > 0 and len(heard.audio["turn-1"]) % 2 == 0


def test_a_livekit_stream_ends_with_is_final_and_the_client_closes_the_socket(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server, LIVEKIT_QUERY), [
        {"text": " ", "voice_settings": {}, "context_id": "900f80f9f91f"},
        {"text": "Hello there, this is the first sentence. ", "context_id": "900f80f9f91f", "flush": True},
        {"text": "", "context_id": "900f80f9f91f", "flush": True},
        {"context_id": "900f80f9f91f", "close_context": True}], close_when_final=1))
    assert not heard.errors and heard.finals == ["900f80f9f91f"] and heard.audio["900f80f9f91f"]
    assert wait_until(lambda: server.server.calls.num_active == 0)


def test_close_context_without_the_turns_end_flush_is_a_barge_in_and_the_socket_goes_on(
        server: RunningServer) -> None:
    sent_interruption = asyncio.Event()
    audio_when_interrupted = 0
    heard = Heard()

    async def interrupt_after_first_audio(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> None:
        nonlocal audio_when_interrupted
        if message.get("contextId") == "first" and message.get("audio") and not sent_interruption.is_set():
            sent_interruption.set()
            audio_when_interrupted = len(heard.audio.get("first", b"")) + len(base64.b64decode(message["audio"]))
            await ws.send_json({"context_id": "first", "close_context": True})
            for message in ({"text": " ", "context_id": "second"}, {"text": "A fresh turn.", "context_id": "second"},
                            {"context_id": "second", "flush": True}, {"context_id": "second", "close_context": True},
                            {"close_socket": True}):
                await ws.send_json(message)

    async def run() -> Heard:
        nonlocal heard
        heard = await converse(url(server), [
            {"text": " ", "context_id": "first"},
            {"text": "This turn goes on and on and on, until the user barges in.", "context_id": "first"}],
            on_message=interrupt_after_first_audio)
        return heard

    heard = asyncio.run(run())
    assert not heard.errors and heard.close_code == 1000
    assert sorted(heard.finals) == ["first", "second"]
    # Cancelled at once: the model makes 1.2 s (57,600 bytes) for a turn it is let finish.
    assert len(heard.audio["first"]) < 57_600 and audio_when_interrupted > 0
    assert heard.audio["second"]


def test_a_second_close_context_cancels_a_turn_that_was_ending(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [
        {"text": "A turn that ended, then was interrupted.", "context_id": "c"},
        {"context_id": "c", "flush": True}, {"context_id": "c", "close_context": True},
        {"context_id": "c", "close_context": True}, {"close_socket": True}]))
    assert heard.finals == ["c"] and not heard.errors and heard.close_code == 1000


def test_keep_alives_hold_a_socket_open_past_the_idle_limit(server: RunningServer) -> None:
    idle_s = server.server.config.stream_idle_timeout_seconds

    async def run() -> Heard:
        heard = Heard()
        async with aiohttp.ClientSession() as session, \
                session.ws_connect(url(server), headers={"xi-api-key": KEY}) as ws:
            for _ in range(3):
                await asyncio.sleep(idle_s * 0.6)
                await ws.send_json({"text": ""})
            for message in ({"text": "Still here.", "context_id": "k"}, {"context_id": "k", "flush": True},
                            {"context_id": "k", "close_context": True}, {"close_socket": True}):
                await ws.send_json(message)
            async for frame in ws:
                heard.add(json.loads(frame.data))
            heard.close_code = ws.close_code
        return heard

    heard = asyncio.run(run())
    assert heard.finals == ["k"] and heard.close_code == 1000


def test_a_silent_socket_is_closed_at_the_idle_limit_with_an_error(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), []))
    assert heard.errors[0]["error"] == "deadline_exceeded" and heard.close_code == 1008


def test_an_inactivity_timeout_shorter_than_the_servers_is_the_sockets_idle_limit(server: RunningServer) -> None:
    async def run() -> tuple[float, Heard]:
        started = asyncio.get_running_loop().time()
        heard = await converse(url(server, f"{PIPECAT_QUERY}&inactivity_timeout=0.3"), [])
        return asyncio.get_running_loop().time() - started, heard

    elapsed, heard = asyncio.run(run())
    assert heard.errors and elapsed < server.server.config.stream_idle_timeout_seconds


@pytest.mark.parametrize(("query", "rate", "bytes_per_sample"), [
    ("output_format=pcm_16000", 16000, 2), ("output_format=pcm_8000", 8000, 2), ("output_format=ulaw_8000", 8000, 1),
    ("output_format=pcm_44100", 44100, 2),
])
def test_pcm_and_g711_formats_stream_whole_samples_at_their_rate(server: RunningServer, query: str, rate: int,
                                                                  bytes_per_sample: int) -> None:
    heard = asyncio.run(converse(url(server, query), [
        {"text": "Hi.", "context_id": "f"}, {"context_id": "f", "flush": True},
        {"context_id": "f", "close_context": True}, {"close_socket": True}]))
    audio = heard.audio["f"]
    assert len(audio) % bytes_per_sample == 0
    seconds = len(audio) / bytes_per_sample / rate
    assert 0.08 <= seconds <= 1.2 + 0.01


@pytest.mark.parametrize(("query", "rate"), [("output_format=mp3_22050_32", 22050), ("model_id=x", 44100)])
def test_mp3_streams_frames_per_context_and_is_the_default(server: RunningServer, query: str, rate: int) -> None:
    """ElevenLabs' default format, and LiveKit's plugin's: MP3 frames as the audio comes, decodable as one stream."""
    heard = asyncio.run(converse(url(server, query), [
        {"text": "Hi.", "context_id": "m"}, {"context_id": "m", "flush": True},
        {"context_id": "m", "close_context": True}, {"close_socket": True}]))
    audio = bytes(heard.audio["m"])
    assert audio[0] == 0xFF and audio[1] & 0xE0 == 0xE0  # an MPEG audio frame's sync word, no tag before it
    samples, decoded_rate = sf.read(io.BytesIO(audio), dtype="float32")
    assert decoded_rate == rate and 0.08 <= len(samples) / rate <= 1.2 + 0.2


def test_opus_streams_an_ogg_stream_per_context(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server, "output_format=opus_48000_64"), [
        {"text": "Hi.", "context_id": "o"}, {"context_id": "o", "flush": True},
        {"context_id": "o", "close_context": True}, {"close_socket": True}]))
    assert bytes(heard.audio["o"][:4]) == b"OggS"


@pytest.mark.parametrize(("path_voice", "query", "headers", "status", "named"), [
    ("ryan", PIPECAT_QUERY, {}, 401, "xi-api-key"),
    ("ryan", PIPECAT_QUERY, {"xi-api-key": "wrong"}, 401, "not valid"),
    ("ryan", PIPECAT_QUERY, {"xi-api-key": KEY, "Authorization": f"Bearer {KEY}"}, 401, "exactly one credential"),
    ("ryan", "output_format=pcm_32000", {"xi-api-key": KEY}, 400, "output_format"),
    ("ryan", "output_format=mp3_22050_192", {"xi-api-key": KEY}, 400, "output_format"),
    ("bob", PIPECAT_QUERY, {"xi-api-key": KEY}, 400, "voice_id"),
    ("ryan", f"{PIPECAT_QUERY}&language_code=nl", {"xi-api-key": KEY}, 400, "language_code"),
    ("ryan", "model_id=eleven_v3&output_format=pcm_24000", {"xi-api-key": KEY}, 400, "model_id"),
])
def test_what_cannot_be_served_is_refused_at_the_upgrade_with_an_http_status(
        server: RunningServer, path_voice: str, query: str, headers: dict[str, str], status: int, named: str) -> None:
    answer_status, body = upgrade_status(url(server, query, path_voice), headers)
    assert answer_status == status
    assert named in json.loads(body)["detail"]["message"]


def test_the_voice_is_case_insensitive_and_any_model_id_is_accepted(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server, "model_id=anything-at-all&output_format=pcm_24000", "Ryan"), [
        {"text": "Hi.", "context_id": "v"}, {"context_id": "v", "flush": True},
        {"context_id": "v", "close_context": True}, {"close_socket": True}]))
    assert heard.finals == ["v"] and heard.audio["v"]


def test_text_without_a_context_id_is_an_error_then_a_close(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [{"text": "Who am I for?"}]))
    assert "context_id" in heard.errors[0]["message"] and heard.close_code == 1008


def test_a_field_of_the_wrong_type_is_named(server: RunningServer) -> None:
    heard = asyncio.run(converse(url(server), [{"text": "Hi.", "context_id": "x", "flush": "yes"}]))
    assert heard.errors[0]["message"].startswith("flush: ") and heard.close_code == 1008


# -- formats and alignment, as pure functions ------------------------------------------------------


@pytest.mark.parametrize(("name", "encoding", "rate"), [
    ("pcm_24000", AudioEncoding.PCM16, 24000), ("pcm_22050", AudioEncoding.PCM16, 22050),
    ("ulaw_8000", AudioEncoding.MULAW, 8000), ("alaw_8000", AudioEncoding.ALAW, 8000),
    ("opus_48000_128", AudioEncoding.OGG_OPUS, 48000), ("mp3_22050_32", AudioEncoding.MP3, 22050),
    ("mp3_44100_192", AudioEncoding.MP3, 44100), (None, AudioEncoding.MP3, 44100)])
def test_elevenlabs_output_formats_map_to_ours(name: str | None, encoding: AudioEncoding, rate: int) -> None:
    output = output_format(name)
    assert (output.encoding, output.sample_rate) == (encoding, rate)
    if encoding is AudioEncoding.MP3:
        assert output.mp3_kbps == (128 if name is None else int(name.rsplit("_", 1)[1]))


@pytest.mark.parametrize("name", ["pcm_32000", "mp3_32000_64", "mp3_8000_128", "mp3_44100_100", "ulaw_16000", "pcm_"])
def test_unsupported_output_formats_are_refused_naming_the_parameter(name: str | None) -> None:
    with pytest.raises(ApiError) as refused:
        output_format(name)
    assert refused.value.field == "output_format"


@dataclass(frozen=True)
class Word:
    start_char: int
    end_char: int
    start_s: float
    end_s: float


TEXT = "Hello there, you. "
# "Hello" 0.10-0.40, "there" 0.50-0.80 (the comma belongs to no word), "you" 1.00-1.30.
WORDS = (Word(0, 5, 0.10, 0.40), Word(6, 11, 0.50, 0.80), Word(13, 16, 1.00, 1.30))


def messages_of(text: str, batches: list[tuple[Word, ...]], cumulative: bool) -> list[Any]:
    cursor, out = AlignmentCursor(), []
    for index, batch in enumerate(batches):
        alignment, cursor = align(batch, text, cursor, cumulative, is_last=index == len(batches) - 1)
        if alignment is not None:
            out.append(alignment)
    return out


def absolute_starts(messages: list[Any], cumulative: bool) -> list[int]:
    """What each plugin computes: LiveKit takes the times as they are; Pipecat adds up each message's end."""
    starts, clock = [], 0
    for message in messages:
        base = 0 if cumulative else clock
        starts += [base + start for start in message.start_times_ms]
        clock = base + message.start_times_ms[-1] + message.durations_ms[-1]
    return starts


def test_every_character_is_sent_once_in_order_with_its_word_start() -> None:
    (alignment,) = messages_of(TEXT, [WORDS], cumulative=True)
    assert "".join(alignment.chars) == TEXT and all(len(char) == 1 for char in alignment.chars)
    starts = dict(zip(range(len(TEXT)), alignment.start_times_ms, strict=True))
    assert (starts[0], starts[6], starts[13]) == (100, 500, 1000)
    assert all(duration >= 0 for duration in alignment.durations_ms)
    assert alignment.start_times_ms[4] + alignment.durations_ms[4] == 400  # "o" ends where "Hello" ends
    assert alignment.start_times_ms == tuple(sorted(alignment.start_times_ms))


@pytest.mark.parametrize("batches", [[WORDS], [WORDS[:1], WORDS[1:]], [WORDS[:1], (), WORDS[1:2], WORDS[2:], ()]])
def test_relative_and_cumulative_times_give_both_plugins_the_same_absolute_times(batches: list[Any]) -> None:
    relative = messages_of(TEXT, batches, cumulative=False)
    cumulative = messages_of(TEXT, batches, cumulative=True)
    assert absolute_starts(relative, cumulative=False) == absolute_starts(cumulative, cumulative=True)
    assert all(start >= 0 for message in relative for start in message.start_times_ms)
    assert [message.chars for message in relative] == [message.chars for message in cumulative]
    assert "".join("".join(message.chars) for message in relative) == TEXT


def test_words_that_trail_the_audio_are_sent_once_and_the_tail_closes_the_last_word() -> None:
    cursor = AlignmentCursor()
    first, cursor = align(WORDS[:2], TEXT, cursor, cumulative=False)
    again, cursor = align(WORDS[:2], TEXT, cursor, cumulative=False)  # the same words again: nothing new
    assert first is not None and again is None
    last, cursor = align(WORDS[2:], TEXT, cursor, cumulative=False, is_last=True)
    assert last is not None and "".join(last.chars) == ", you. " and cursor.next_char == len(TEXT)
    assert last.durations_ms[-1] == 0


def test_no_words_means_no_alignment() -> None:
    assert align((), TEXT, AlignmentCursor(), cumulative=True, is_last=True) == (None, AlignmentCursor())
