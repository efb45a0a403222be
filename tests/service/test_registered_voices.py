"""Registered voices through a real gRPC server on the tiny Base model: CreateVoice, GetVoice, ListVoices,
DeleteVoice, synthesis by voice id, limits, ownership under API keys, and the errors that name the field."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients.qwen3_tts_client import AudioFormat, Connection, TtsClient, Voice, VoiceReference, tts_pb2
from tests.service.helpers import GREEDY, RunningServer, start_server
from tests.service.processes import ROOT, free_port, server_process
from tests.service.test_voice_clone import REFERENCE_TEXT, pcm16_samples, wav_file
from tts_service.model.checkpoint import LoadedModel

pb = tts_pb2
UNKNOWN_ID = "voice_" + "0" * 24


def reference(seed: int = 0, seconds: float = 1.0, x_vector_only: bool = False) -> VoiceReference:
    return VoiceReference(audio=wav_file(pcm16_samples(seed=seed, seconds=seconds)),
                          text="" if x_vector_only else REFERENCE_TEXT, x_vector_only=x_vector_only)


def inline_voice(voice: VoiceReference) -> Voice:
    return Voice(reference_audio=voice.audio, reference_text=voice.text, x_vector_only=voice.x_vector_only)


def pcm16(client: TtsClient, voice: Voice) -> bytes:
    response = client.synthesize("Cloned speech.", voice, AudioFormat("pcm16"), GREEDY)
    assert response.completion.usage.audio_frames >= 2
    return bytes(response.audio)


def status_of(call: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return call.code(), call.details()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def voice_server(tiny_models: dict[str, LoadedModel], store_dir: Path) -> Iterator[RunningServer]:
    running = start_server(tiny_models["base"], voice_store=store_dir)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def voices(voice_server: RunningServer) -> Iterator[TtsClient]:
    with voice_server.client() as tts:
        yield tts


def test_a_created_voice_is_got_listed_and_deleted(voices: TtsClient, store_dir: Path) -> None:
    created = voices.create_voice(reference(seconds=1.0))
    assert created.kind == pb.VOICE_KIND_IN_CONTEXT and created.reference_text == REFERENCE_TEXT
    assert created.reference_seconds == pytest.approx(1.0) and created.create_time.seconds > 0
    assert voices.get_voice(created.voice_id) == created
    assert created in voices.list_voices().registered_voices
    assert (store_dir / f"{created.voice_id}.safetensors").is_file()

    voices.delete_voice(created.voice_id)
    with pytest.raises(grpc.RpcError) as caught:
        voices.get_voice(created.voice_id)
    assert status_of(caught.value) == (grpc.StatusCode.NOT_FOUND, f"voice_id: no voice {created.voice_id!r}")
    assert created not in voices.list_voices().registered_voices
    assert not (store_dir / f"{created.voice_id}.safetensors").exists()


def test_an_x_vector_voice_stores_no_transcript(voices: TtsClient) -> None:
    created = voices.create_voice(VoiceReference(audio=reference().audio, text="ignored", x_vector_only=True))
    assert created.kind == pb.VOICE_KIND_X_VECTOR and created.reference_text == ""


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
def test_synthesis_by_voice_id_equals_synthesis_with_the_reference_sent_inline_and_encodes_nothing(
        voices: TtsClient, voice_server: RunningServer, monkeypatch: pytest.MonkeyPatch, x_vector_only: bool) -> None:
    sent = reference(seed=2, x_vector_only=x_vector_only)
    inline = pcm16(voices, inline_voice(sent))
    voice_id = voices.create_voice(sent).voice_id

    def no_encoding(*args: object) -> None:
        raise AssertionError("a registered voice was encoded again")

    monkeypatch.setattr(voice_server.engine, "clone_voice", no_encoding)
    assert pcm16(voices, Voice(voice_id=voice_id)) == inline
    streamed = voices.streaming_synthesize(["Cloned ", "speech."], Voice(voice_id=voice_id), AudioFormat("pcm16"),
                                           GREEDY)
    assert b"".join(response.chunk.audio for response in streamed) == inline


def test_a_damaged_voice_file_is_logged_and_never_served(voices: TtsClient, store_dir: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    created = voices.create_voice(reference(seed=1, x_vector_only=True))
    path = store_dir / f"{created.voice_id}.safetensors"
    path.write_bytes(path.read_bytes()[:-10])  # as a disk fault or a half-copied backup would leave it
    with caplog.at_level(logging.ERROR, logger="tts_service.engine.voice_store"):
        with pytest.raises(grpc.RpcError) as caught:
            voices.synthesize("Hi.", Voice(voice_id=created.voice_id), generation=GREEDY)
        assert created.voice_id not in {voice.voice_id for voice in voices.list_voices().registered_voices}
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert f"skipping voice {created.voice_id}" in caplog.text


@pytest.fixture(scope="module")
def limited_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # An x-vector voice of the tiny model takes about 700 bytes; an in-context one of 2 s, more than 2000.
    running = start_server(tiny_models["base"], max_voices=2, max_voice_bytes=1500)
    yield running
    running.stop()


def test_voices_past_the_count_or_size_limit_get_resource_exhausted(limited_server: RunningServer) -> None:
    with limited_server.client() as tts:
        with pytest.raises(grpc.RpcError) as too_large:
            tts.create_voice(reference(seconds=2.0))
        first = tts.create_voice(reference(x_vector_only=True))
        tts.create_voice(reference(seed=1, x_vector_only=True))
        with pytest.raises(grpc.RpcError) as too_many:
            tts.create_voice(reference(seed=2, x_vector_only=True))
        tts.delete_voice(first.voice_id)
        tts.create_voice(reference(seed=2, x_vector_only=True))
        limits = tts.list_voices().limits
    assert too_large.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-voice-bytes" in too_large.value.details()
    assert too_many.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "already stores 2 voices" in too_many.value.details()
    assert (limits.max_voices, limits.max_voice_bytes, limits.voices_are_persistent) == (2, 1500, False)


@pytest.fixture(scope="module")
def keyed_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["base"], api_keys=frozenset({"key-alice", "key-bob"}))
    yield running
    running.stop()


def test_a_voice_belongs_to_its_key_and_another_key_is_told_it_does_not_exist(keyed_server: RunningServer) -> None:
    with keyed_server.client(api_key="key-alice") as alice, keyed_server.client(api_key="key-bob") as bob:
        voice_id = alice.create_voice(reference(x_vector_only=True)).voice_id
        refusals = []
        for call in (lambda: bob.get_voice(voice_id), lambda: bob.delete_voice(voice_id),
                     lambda: bob.synthesize("Hi.", Voice(voice_id=voice_id), generation=GREEDY)):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            refusals.append(caught.value.code())
        assert refusals == [grpc.StatusCode.NOT_FOUND] * 3
        assert [voice.voice_id for voice in bob.list_voices().registered_voices] == []
        assert [voice.voice_id for voice in alice.list_voices().registered_voices] == [voice_id]
        assert pcm16(alice, Voice(voice_id=voice_id))


def test_one_key_cannot_keep_more_voices_than_its_share_and_another_key_still_can(
        tiny_models: dict[str, LoadedModel]) -> None:
    server = start_server(tiny_models["base"], api_keys=frozenset({"key-alice", "key-bob"}), max_voices_per_caller=1)
    try:
        with server.client(api_key="key-alice") as alice, server.client(api_key="key-bob") as bob:
            alice.create_voice(reference(x_vector_only=True))
            with pytest.raises(grpc.RpcError) as refused:
                alice.create_voice(reference(seed=1, x_vector_only=True))
            assert bob.create_voice(reference(seed=2, x_vector_only=True)).voice_id
            limits = bob.list_voices().limits
    finally:
        server.stop()
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-voices-per-caller" in refused.value.details()
    assert limits.max_voices_per_caller == 1


BAD_REQUESTS = {
    "voice id with reference audio": (
        lambda tts: tts.synthesize("Hi.", Voice(voice_id=UNKNOWN_ID, reference_audio=b"x", x_vector_only=True)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "voice.voice_id: names a registered voice, so voice.reference_audio, voice.x_vector_only must not be set"),
    "malformed voice id": (lambda tts: tts.synthesize("Hi.", Voice(voice_id="../../etc/passwd")),
                           grpc.StatusCode.INVALID_ARGUMENT, "voice.voice_id: is not a voice id"),
    "unknown voice id": (lambda tts: tts.synthesize("Hi.", Voice(voice_id=UNKNOWN_ID)),
                         grpc.StatusCode.NOT_FOUND, f"voice.voice_id: no voice {UNKNOWN_ID!r}"),
    "get without an id": (lambda tts: tts.get_voice(""), grpc.StatusCode.INVALID_ARGUMENT, "voice_id: is required"),
    "delete a malformed id": (lambda tts: tts.delete_voice("voice_XYZ"), grpc.StatusCode.INVALID_ARGUMENT,
                              "voice_id: is not a voice id"),
    "create without audio": (lambda tts: tts.create_voice(VoiceReference(audio=b"", text="Hi.")),
                             grpc.StatusCode.INVALID_ARGUMENT, "reference_audio: is required"),
    "create from unreadable audio": (lambda tts: tts.create_voice(VoiceReference(audio=b"not audio", text="Hi.")),
                                     grpc.StatusCode.INVALID_ARGUMENT,
                                     "reference_audio: reference audio is not audio in a readable format"),
    "create in context without a transcript": (
        lambda tts: tts.create_voice(VoiceReference(audio=reference().audio)), grpc.StatusCode.INVALID_ARGUMENT,
        "reference_text: in-context cloning needs the transcript"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_voice_requests_name_the_field(voices: TtsClient, case: str) -> None:
    call, code, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as caught:
        call(voices)
    assert caught.value.code() is code
    assert caught.value.details().startswith(message)


def test_a_model_that_cannot_clone_refuses_to_create_or_use_voices(client: TtsClient) -> None:
    with pytest.raises(grpc.RpcError) as create:
        client.create_voice(reference(x_vector_only=True))
    with pytest.raises(grpc.RpcError) as use:
        client.synthesize("Hi.", Voice(voice_id=UNKNOWN_ID))
    assert create.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "CreateVoice needs a server running a Base checkpoint" in create.value.details()
    assert status_of(use.value)[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert use.value.details().startswith("voice.voice_id: the loaded custom_voice model cannot clone voices")
    assert list(client.list_voices().registered_voices) == []


def test_a_voice_survives_a_server_restart_with_the_same_store(tmp_path: Path) -> None:
    store = tmp_path / "voices"
    flags = ("--voice-store", str(store), "--max-audio-seconds", "0.48")
    with server_process(tmp_path, *flags, model="random:tiny-base") as first, \
            TtsClient(Connection(target=first.target)) as tts:
        created = tts.create_voice(reference(seed=3))
        before = pcm16(tts, Voice(voice_id=created.voice_id))
        assert tts.list_voices().limits.voices_are_persistent
    with server_process(tmp_path, *flags, model="random:tiny-base") as second, \
            TtsClient(Connection(target=second.target)) as tts:
        assert tts.get_voice(created.voice_id) == created
        assert pcm16(tts, Voice(voice_id=created.voice_id)) == before
        assert "voice store: 1 voice(s)" in second.log_text()


def test_a_voice_store_that_cannot_be_made_stops_the_server_naming_the_flag(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("QWEN3_TTS_", "OTEL_"))}
    command = [sys.executable, "-m", "tts_service", "--model", "random:tiny-base", "--device", "cpu", "--host",
               "127.0.0.1", "--port", str(free_port()), "--voice-store", str(blocker / "voices")]
    ended = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 1, ended.stderr[-4000:]
    assert f"cannot use the voice store: --voice-store {blocker / 'voices'}" in ended.stderr
