"""Pronunciation lexicons through the gRPC door: a request's lexicon changes what the model is told to say and
nothing else (the audio is that of the substituted text, sent whole or streamed in any fragments), word
timestamps name the words as sent, registered lexicons belong to their key and outlive the server with
--voice-store, and bad entries are refused naming the field.

The server runs the text-sensitive copy of the tiny model (see test_text_streaming), so that audio of another
text could not pass for the substituted one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import AudioFormat, TtsClient, tts_pb2
from clients.qwen3_tts_client.client import fragment_request, streaming_config
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server
from tests.service.test_text_streaming import differs, pcm16, text_sensitive
from tts_service.model.checkpoint import LoadedModel

PCM = AudioFormat("pcm16")
STREAMING_GREEDY = replace(GREEDY, non_streaming_text=False)
ENTRIES = [("SQL", "sequel"), ("e.g.", "for example")]
TEXT = "Try SQL, e.g. now."
SPOKEN = "Try sequel, for example now."


def lexicon(entries: list[tuple[str, str]]) -> Any:
    return tts_pb2.Lexicon(entries=[tts_pb2.LexiconEntry(grapheme=grapheme, alias=alias)
                                    for grapheme, alias in entries])


def request(text: str, **fields: Any) -> Any:
    return tts_pb2.SynthesizeRequest(text=text, voice=RYAN.to_proto(), audio_format=PCM.to_proto(),
                                     generation=STREAMING_GREEDY.to_proto(), **fields)


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(text_sensitive(tiny_models["custom_voice"]), aligner_model="random:tiny",
                           api_keys=frozenset({"key-alice", "key-bob"}))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> Iterator[TtsClient]:
    with server.client(api_key="key-alice") as client:
        yield client


def audio(client: TtsClient, message: Any) -> Any:
    return pcm16(client.stub.Synthesize(message, timeout=60, metadata=client.connection.metadata).audio)


def test_a_requests_lexicon_gives_the_audio_of_the_substituted_text(alice: TtsClient) -> None:
    with_lexicon = audio(alice, request(TEXT, lexicon=lexicon(ENTRIES)))
    assert not differs(with_lexicon, audio(alice, request(SPOKEN)))
    assert differs(with_lexicon, audio(alice, request(TEXT)))


@pytest.mark.parametrize("fragments", [["Try S", "QL, e", ".g", ". now."], list(TEXT)], ids=["pieces", "characters"])
def test_streamed_text_split_inside_graphemes_gives_the_substituted_texts_audio(alice: TtsClient,
                                                                                  fragments: list[str]) -> None:
    config = streaming_config(RYAN, PCM, GREEDY)
    config.config.lexicon.CopyFrom(lexicon(ENTRIES))
    messages = [config, *(fragment_request(fragment) for fragment in fragments)]
    responses = list(alice.stub.StreamingSynthesize(iter(messages), timeout=60, metadata=alice.connection.metadata))
    streamed = pcm16(b"".join(response.chunk.audio for response in responses))
    assert not differs(streamed, audio(alice, request(SPOKEN)))


def test_word_timestamps_name_the_words_as_sent_an_alias_as_its_grapheme(alice: TtsClient) -> None:
    response = alice.stub.Synthesize(request(TEXT, lexicon=lexicon(ENTRIES), word_timestamps=True), timeout=60,
                                     metadata=alice.connection.metadata)
    assert [(word.word, word.start_char, word.end_char) for word in response.words] == [
        ("Try", 0, 3), ("SQL", 4, 7), ("e.g.", 9, 13), ("now", 14, 17)]
    assert all(a.end_seconds <= b.start_seconds + 1e-9 for a, b in zip(response.words, response.words[1:],
                                                                        strict=False))


def test_a_registered_lexicon_belongs_to_its_key(server: RunningServer, alice: TtsClient) -> None:
    metadata = alice.connection.metadata
    created = alice.stub.CreateLexicon(tts_pb2.CreateLexiconRequest(lexicon=lexicon(ENTRIES)), metadata=metadata)
    assert created.lexicon_id.startswith("lex_") and len(created.lexicon.entries) == 2
    assert alice.stub.GetLexicon(tts_pb2.GetLexiconRequest(lexicon_id=created.lexicon_id), metadata=metadata) == created
    listed = alice.stub.ListLexicons(tts_pb2.ListLexiconsRequest(), metadata=metadata).lexicons
    assert created.lexicon_id in [item.lexicon_id for item in listed]
    assert not differs(audio(alice, request(TEXT, lexicon_ids=[created.lexicon_id])), audio(alice, request(SPOKEN)))
    with server.client(api_key="key-bob") as bob:
        for call in (lambda: bob.stub.GetLexicon(tts_pb2.GetLexiconRequest(lexicon_id=created.lexicon_id),
                                                 metadata=bob.connection.metadata),
                     lambda: audio(bob, request(TEXT, lexicon_ids=[created.lexicon_id]))):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    alice.stub.DeleteLexicon(tts_pb2.DeleteLexiconRequest(lexicon_id=created.lexicon_id), metadata=metadata)
    with pytest.raises(grpc.RpcError) as caught:
        alice.stub.GetLexicon(tts_pb2.GetLexiconRequest(lexicon_id=created.lexicon_id), metadata=metadata)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


def test_the_request_entries_win_over_a_registered_lexicon(alice: TtsClient) -> None:
    metadata = alice.connection.metadata
    created = alice.stub.CreateLexicon(tts_pb2.CreateLexiconRequest(lexicon=lexicon([("SQL", "squeal")])),
                                       metadata=metadata)
    both = audio(alice, request("Try SQL.", lexicon_ids=[created.lexicon_id], lexicon=lexicon([("SQL", "sequel")])))
    assert not differs(both, audio(alice, request("Try sequel.")))


@pytest.mark.parametrize(("fields", "expected"), [
    ({"lexicon": lexicon([("", "x")])}, "lexicon.entries[0].grapheme: is empty"),
    ({"lexicon": lexicon([("SQL", "a"), ("SQL", "b")])},
     "lexicon.entries[1].grapheme: matches the same text as lexicon.entries[0].grapheme"),
    ({"lexicon_ids": ["lex_nothing"]}, "lexicon_ids[0]"),
], ids=["empty grapheme", "twice", "unknown id"])
def test_bad_lexicons_are_refused_naming_the_field(alice: TtsClient, fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        audio(alice, request(TEXT, **fields))
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert expected in caught.value.details()


def test_a_registered_lexicon_survives_a_restart_with_the_voice_store(tiny_models: dict[str, LoadedModel],
                                                                      tmp_path: Path) -> None:
    first = start_server(tiny_models["custom_voice"], voice_store=tmp_path)
    try:
        with first.client() as client:
            created = client.stub.CreateLexicon(tts_pb2.CreateLexiconRequest(lexicon=lexicon(ENTRIES)))
    finally:
        first.stop()
    second = start_server(tiny_models["custom_voice"], voice_store=tmp_path)
    try:
        with second.client() as client:
            assert client.stub.GetLexicon(tts_pb2.GetLexiconRequest(lexicon_id=created.lexicon_id)) == created
    finally:
        second.stop()


def test_a_lexicon_id_of_the_wrong_form_is_not_echoed(alice: TtsClient) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        audio(alice, request(TEXT, lexicon_ids=["lex_" + "\u202e" * 2000]))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "lexicon_ids[0]: no lexicon of that id (it is not of the form lex_...)"
