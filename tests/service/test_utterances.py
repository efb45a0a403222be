"""Several utterances on one StreamingSynthesize call: each named, fed, closed or cancelled on its own, each with
the audio it would have alone; a cancelled one stops without ending the call; limits name their flag.

The server runs the text-sensitive copy of the tiny model (see test_text_streaming), so that an utterance given
another's audio could not pass for itself."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest

from clients.qwen3_tts_client import AudioFormat, CancelUtterance, CloseUtterance, Flush, Say, TtsClient, tts_pb2
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server, wait_until
from tests.service.test_text_streaming import differs, pcm16, text_sensitive
from tts_service.model.checkpoint import LoadedModel

PCM = AudioFormat("pcm16")
TEXTS = {"a": "Hello there, friend.", "b": "This one goes on and on, and it is cut short", "c": "Goodbye now, enemies!"}


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(text_sensitive(tiny_models["custom_voice"]), max_utterances_per_call=3,
                           max_calls_per_caller=4)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[TtsClient]:
    with server.client() as tts:
        yield tts


@dataclass
class Heard:
    """A call's responses, by utterance."""

    audio: dict[str, bytearray] = field(default_factory=dict)
    completions: dict[str, Any] = field(default_factory=dict)
    acks: list[tuple[str, str]] = field(default_factory=list)
    completions_with_audio: set[str] = field(default_factory=set)

    def add(self, response: Any) -> None:
        utterance_id = response.utterance_id
        if response.HasField("flush_ack"):
            self.acks.append((utterance_id, response.flush_ack.marker))
        self.audio.setdefault(utterance_id, bytearray()).extend(response.chunk.audio)
        if response.HasField("completion"):
            assert utterance_id not in self.completions, f"two completions for {utterance_id!r}"
            self.completions[utterance_id] = response.completion
            if response.chunk.audio:
                self.completions_with_audio.add(utterance_id)


def alone(client: TtsClient, text: str) -> tuple[np.ndarray, Any]:
    responses = list(client.streaming_synthesize([text], RYAN, PCM, GREEDY))
    return pcm16(b"".join(response.chunk.audio for response in responses)), responses[-1].completion


def heard(responses: Any) -> Heard:
    result = Heard()
    for response in responses:
        result.add(response)
    return result


def test_three_utterances_with_one_cancelled_midway_leave_the_other_two_as_they_are_alone(client: TtsClient) -> None:
    requests: queue.Queue[Any] = queue.Queue()
    for item in (Say("a", TEXTS["a"]), CloseUtterance("a"), Say("b", TEXTS["b"]), Say("c", TEXTS["c"]),
                 CloseUtterance("c")):
        requests.put(item)

    def items() -> Iterator[Any]:
        while (item := requests.get()) is not None:
            yield item

    result = Heard()
    cancelled = threading.Event()
    call = client.streaming_synthesize(items(), RYAN, PCM, GREEDY, timeout=120, utterance_id="a")
    for response in call:
        result.add(response)
        # "b" has open text, so it cannot end by itself: cancel it once it has spoken.
        if response.utterance_id == "b" and response.chunk.audio and not cancelled.is_set():
            cancelled.set()
            for item in (CancelUtterance("b"), Say("b", " and text that comes too late"), None):
                requests.put(item)
    assert cancelled.is_set()
    assert result.completions["b"].finish_reason == tts_pb2.FINISH_REASON_CANCELLED
    assert result.completions["b"].usage.audio_frames > 0
    for utterance_id in ("a", "c"):
        audio, completion = alone(client, TEXTS[utterance_id])
        assert result.completions[utterance_id].finish_reason == completion.finish_reason
        assert result.completions[utterance_id].usage.audio_frames == completion.usage.audio_frames
        assert not differs(pcm16(bytes(result.audio[utterance_id])), audio)
    assert differs(pcm16(bytes(result.audio["a"])), pcm16(bytes(result.audio["c"])))
    assert len({completion.request_id for completion in result.completions.values()}) == 3


def test_a_cancelled_utterances_completion_carries_no_resampler_tail_of_the_dropped_audio(client: TtsClient) -> None:
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(Say("b", TEXTS["b"]))

    def items() -> Iterator[Any]:
        while (item := requests.get()) is not None:
            yield item

    last = None
    for response in client.streaming_synthesize(items(), RYAN, AudioFormat("pcm16", 16000), GREEDY, timeout=60,
                                                utterance_id="b"):
        if last is None and response.chunk.audio:
            requests.put(CancelUtterance("b"))
            requests.put(None)
        last = response
    assert last is not None and last.completion.finish_reason == tts_pb2.FINISH_REASON_CANCELLED
    assert not last.chunk.audio


def test_a_call_that_names_no_utterance_is_one_utterance_with_the_empty_id(client: TtsClient) -> None:
    audio, completion = alone(client, TEXTS["a"])
    result = heard(client.streaming_synthesize(["Hello there, ", Flush("m"), "friend."], RYAN, PCM, GREEDY))
    assert set(result.completions) == {""}
    assert result.acks == [("", "m")]
    assert result.completions[""].usage.audio_frames == completion.usage.audio_frames
    assert not differs(pcm16(bytes(result.audio[""])), audio)


def test_each_utterance_ends_with_its_own_completion_and_flush_acks_name_theirs(client: TtsClient) -> None:
    result = heard(client.streaming_synthesize(
        [Say("one", "Hi."), Flush("x", "one"), CloseUtterance("one"), Say("two", "Bye."), Flush("y", "two")],
        RYAN, PCM, GREEDY, utterance_id="one"))
    assert set(result.completions) == {"one", "two"}
    assert sorted(result.acks) == [("one", "x"), ("two", "y")]
    assert all(completion.finish_reason in (tts_pb2.FINISH_REASON_STOPPED, tts_pb2.FINISH_REASON_LENGTH)
               and completion.usage.audio_frames > 0 for completion in result.completions.values())


def invalid_details(client: TtsClient, items: list[Any], utterance_id: str = "") -> str:
    with pytest.raises(grpc.RpcError) as caught:
        list(client.streaming_synthesize(items, RYAN, PCM, GREEDY, timeout=60, utterance_id=utterance_id))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return caught.value.details()


def test_more_open_utterances_than_the_limit_end_the_call_naming_the_flag(client: TtsClient) -> None:
    details = invalid_details(client, [Say("1", "One"), Say("2", "Two"), Say("3", "Three")], utterance_id="0")
    assert details.startswith("utterance_id:") and "--max-utterances-per-call" in details


def test_open_utterances_together_hold_at_most_the_document_limit_naming_the_flag(client: TtsClient) -> None:
    """Each of these is within --max-document-chars (400 here), the two together are not."""
    details = invalid_details(client, [Say("1", "word " * 50), Say("2", "word " * 50)], utterance_id="0")
    assert details.startswith("text: the open utterances of this call hold more than 400 characters")
    assert "--max-document-chars" in details


def test_utterances_that_completed_free_their_places_under_the_limit(client: TtsClient) -> None:
    items: list[Any] = []
    for index in range(6):  # twice the limit, one at a time
        items += [Say(str(index), "Hi."), CloseUtterance(str(index))]
    result = heard(client.streaming_synthesize(_paced(items), RYAN, PCM, GREEDY, timeout=120, utterance_id="0"))
    assert set(result.completions) == {str(index) for index in range(6)}


def _paced(items: list[Any]) -> Iterator[Any]:
    """Each utterance's items only once the one before has had time to complete: a client waiting its turn."""
    for item in items:
        if isinstance(item, Say) and item.utterance_id != "0":
            time.sleep(1.0)
        yield item


@pytest.mark.parametrize(("items", "expected"), [
    ([Say("bad id!", "Hi.")], "utterance_id: may hold only letters, digits and '-_.:'"),
    ([Say("x" * 129, "Hi.")], "utterance_id: is 129 characters; at most 128"),
    ([CloseUtterance("never")], "utterance_id: no utterance 'never' has been opened on this call"),
    ([CancelUtterance("never")], "utterance_id: no utterance 'never' has been opened on this call"),
    ([Say("", "Hi."), CloseUtterance(""), Say("", "again")], "utterance_id: utterance '' is closed"),
], ids=["characters", "length", "close unknown", "cancel unknown", "text after close"])
def test_bad_utterance_messages_get_invalid_argument_naming_the_field(client: TtsClient, items: list[Any],
                                                                      expected: str) -> None:
    assert expected in invalid_details(client, items)


def test_each_utterance_beyond_the_first_takes_a_place_of_its_caller(server: RunningServer,
                                                                      client: TtsClient) -> None:
    # The limit is 4 calls a caller: two calls of two open utterances fill it.
    gate = threading.Event()

    def held(first: str) -> Iterator[Any]:
        yield Say(first + "2", "Wait here ")
        gate.wait(30)

    calls = [client.streaming_synthesize(held(name), RYAN, PCM, GREEDY, timeout=60, utterance_id=name + "1")
             for name in ("p", "q")]
    try:
        for call in calls:
            next(iter(call))  # the call has started: its first utterance has spoken
        assert wait_until(lambda: server.server.calls.num_active == 4)
        with pytest.raises(grpc.RpcError) as caught:
            client.synthesize("Hi.", RYAN, PCM, GREEDY, timeout=30)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-calls-per-caller" in caught.value.details()
    finally:
        gate.set()
        for call in calls:
            call.cancel()
