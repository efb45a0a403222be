"""Word timestamps: every word of a request's text, once and in order, as character offsets into the text the
client sent, with times inside its audio; committed a sentence at a time as the audio arrives, the rest when the
request ends; on all three gRPC calls, each utterance of a streamed call with its own; refused clearly on a server
without an aligner and for languages the aligner cannot cut.

The tracker's rules are checked against a stand-in aligner that places words where the test says; the service
tests use the random tiny aligner (its timings are noise, but which words come, where, and when is the server's)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence

import grpc
import numpy as np
import pytest

from clients.qwen3_tts_client import AudioFormat, CloseUtterance, Say, TtsClient, tts_pb2
from clients.qwen3_tts_client.client import fragment_request
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server
from tts_service.api.word_timestamps import _ALPHANUMERIC, TimedWord, WordTracker
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.aligner_text import split_words
from tts_service.model.checkpoint import LoadedModel

RATE = 1000  # samples a second in the tracker's unit tests: one sample a millisecond
TEXT = "Hello there, friend. How are you today? Fine!"
PCM = AudioFormat("pcm16")


class PacedAligner:
    """Places each word of the window's text at `seconds_per_word`, from the window's start, as far as the audio
    goes; the words past the audio's end are squeezed onto its last instant (as a forced aligner does)."""

    def __init__(self, seconds_per_word: float = 0.5) -> None:
        self.seconds_per_word = seconds_per_word
        self.windows: list[tuple[str, float]] = []

    async def align(self, item: AlignmentItem) -> list[WordTiming]:
        duration = item.audio.shape[0] / item.sample_rate
        self.windows.append((item.text, duration))
        timings = []
        for index, word in enumerate(split_words(item.text)):
            start = min(index * self.seconds_per_word, duration)
            end = min(start + self.seconds_per_word * 0.8, duration)
            timings.append(WordTiming(word.start_char, word.end_char, start, end))
        return timings


def feed(tracker: WordTracker, seconds: float, step_s: float = 0.1) -> list[TimedWord]:
    words: list[TimedWord] = []
    for _ in range(round(seconds / step_s)):
        tracker.add_audio(np.zeros(round(step_s * RATE), dtype=np.float32))
        words += tracker.take_words()
    return words


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_the_letters_and_digits_a_tracker_counts_are_exactly_those_str_isalnum_accepts() -> None:
    every = [chr(code) for code in range(0x110000) if not 0xD800 <= code <= 0xDFFF]
    assert [char for char in every if _ALPHANUMERIC.fullmatch(char)] == [char for char in every if char.isalnum()]


def test_sentences_are_committed_once_spoken_and_the_rest_when_the_request_ends() -> None:
    async def scenario() -> tuple[list[TimedWord], list[TimedWord]]:
        aligner = PacedAligner()
        tracker = WordTracker(aligner.align, RATE, None, TEXT, is_text_closed=True)
        early = feed(tracker, 2.2)  # "Hello there, friend." is four words: spoken by 2.0 s
        for _ in range(20):
            await asyncio.sleep(0)
        early += tracker.take_words()
        await tracker.finish()
        return early, list(tracker.take_words())

    early, rest = run(scenario())  # type: ignore[misc]
    assert [word.word for word in early] == ["Hello", "there", "friend"]
    assert [word.word for word in rest] == ["How", "are", "you", "today", "Fine"]
    words = early + rest
    assert all(TEXT[word.start_char:word.end_char] == word.word for word in words)
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(words))


def test_open_text_holds_back_its_last_word_and_times_it_once_the_text_goes_on() -> None:
    aligner = PacedAligner()

    async def scenario() -> list[TimedWord]:
        tracker = WordTracker(aligner.align, RATE, None)
        tracker.add_text("Hi. Good mor")
        words = feed(tracker, 2.0)
        for _ in range(20):
            await asyncio.sleep(0)
        tracker.add_text("ning.")
        tracker.close_text()
        await tracker.finish()
        return words + list(tracker.take_words())

    words = run(scenario())
    assert aligner.windows and all("mor" not in text for text, _ in aligner.windows[:-1])
    assert [word.word for word in words] == ["Hi", "Good", "morning"]  # type: ignore[attr-defined]


def test_every_word_comes_once_in_order_with_its_offsets_for_cjk_and_mixed_text() -> None:
    text = "今天天气很好。We go out! 明天见。"

    async def scenario() -> list[TimedWord]:
        tracker = WordTracker(PacedAligner(0.3).align, RATE, None, text, is_text_closed=True)
        words = feed(tracker, 4.0)
        for _ in range(20):
            await asyncio.sleep(0)
        await tracker.finish()
        return words + list(tracker.take_words())

    words = run(scenario())
    assert [word.word for word in words] == [word.text for word in split_words(text)]
    assert all(text[word.start_char:word.end_char] == word.word for word in words)


def test_a_document_is_aligned_a_few_sentences_at_a_time_and_every_word_comes_once_in_order() -> None:
    sentences = [f"Sentence number {index} says a few words more." for index in range(400)]
    text = " ".join(sentences)  # about 18,000 characters: twenty minutes of speech
    aligner = PacedAligner(0.3)

    buffered: list[float] = []

    async def scenario() -> list[TimedWord]:
        tracker = WordTracker(aligner.align, RATE, None, text, is_text_closed=True)
        words = []
        for _ in range(300):  # 30 s of audio, then the request ends
            words += feed(tracker, 0.1)
            await asyncio.sleep(0)
            buffered.append(tracker.buffered_seconds)
        await tracker.finish()
        return words + list(tracker.take_words())

    words = run(scenario())
    # Only the open window's audio is kept, never the document's.
    assert max(buffered) < 5.0
    # Each window's text is what its audio could say and a look-ahead, never the document: a few sentences.
    assert max(len(window_text) for window_text, _ in aligner.windows) < 2000
    assert max(duration for _, duration in aligner.windows) <= 30.0
    # 0.3 s a word (a little less: each window paces from the last word's end), so about a hundred words in 30 s.
    # When the request ends, the words its audio could still have said are squeezed onto its end (as the aligner
    # places them); the rest of the document gets none.
    expected = split_words(text)
    assert [word.start_char for word in words] == [word.start_char for word in expected[:len(words)]]
    spoken = [word for word in words if word.end_s < 30.0]
    assert 95 <= len(spoken) <= 110 and len(words) < 200 < len(expected)
    assert all(word.end_s == 30.0 for word in words[len(spoken):])
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(words))


def test_a_window_that_never_commits_is_cut_at_its_longest_and_its_first_sentence_committed() -> None:
    """Random weights place words anywhere: the tracker must not wait for a commit that never comes."""
    text = " ".join(f"Sentence {index} runs on." for index in range(200))
    windows: list[float] = []

    async def late(item: AlignmentItem) -> list[WordTiming]:  # every word at the window's very end
        duration = item.audio.shape[0] / item.sample_rate
        windows.append(duration)
        return [WordTiming(word.start_char, word.end_char, duration, duration) for word in split_words(item.text)]

    async def scenario() -> list[TimedWord]:
        tracker = WordTracker(late, RATE, None, text, is_text_closed=True)
        words = []
        for _ in range(900):  # 90 s
            words += feed(tracker, 0.1)
            await asyncio.sleep(0)
        return words

    words = run(scenario())
    assert max(windows) <= 30.0
    assert words and [word.word for word in words[:4]] == ["Sentence", "0", "runs", "on"]


@pytest.mark.parametrize("seed", range(12))
def test_whether_a_window_is_worth_aligning_is_what_scanning_the_open_text_again_would_say(seed: int) -> None:
    """The tracker scans its open text for the first sentence only when the text has changed (see
    `_is_worth_aligning`): at every chunk, text arriving in fragments, sentences committed, short and long texts, its
    answer is the one a fresh scan gives."""
    rng = np.random.default_rng(seed)
    sentences = ["Hi.", "Sure, that works for me.", "No!", "Well… maybe later?", "你好。", "我们明天见！",
                 " ".join(["A long sentence that runs on and on"] * 40) + "."]
    text = " ".join(str(rng.choice(sentences)) for _ in range(int(rng.integers(1, 60))))
    cuts = sorted(int(cut) for cut in rng.integers(0, len(text), size=int(rng.integers(0, 8))))
    fragments = [text[start:end] for start, end in itertools.pairwise([0, *cuts, len(text)])]
    aligner = PacedAligner(seconds_per_word=float(rng.uniform(0.05, 0.6)))
    answers = set()

    async def slow_align(item: AlignmentItem) -> list[WordTiming]:  # in flight over a few chunks, as on a server
        for _ in range(int(rng.integers(0, 30))):
            await asyncio.sleep(0)
        return await aligner.align(item)

    async def scenario() -> None:
        tracker = WordTracker(slow_align, RATE, None)
        pending = list(fragments)
        for _ in range(600):  # 60 s
            if pending and rng.random() < 0.1:
                tracker.add_text(pending.pop(0))
                if not pending and rng.random() < 0.5:
                    tracker.close_text()
            tracker.add_audio(np.zeros(round(0.1 * RATE), dtype=np.float32))
            tracker.take_words()
            await asyncio.sleep(0)
            window = tracker._num_samples - tracker._window_start
            scanned, _ = tracker._worth_aligning_from(window)
            expected = window >= tracker._next_attempt_samples and scanned is not None and window >= scanned
            assert tracker._is_worth_aligning() == expected
            answers.add(expected)

    run(scenario())
    assert answers == {False, True} and len(aligner.windows) > 0


# -- the service, with the random tiny aligner --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], aligner_model="random:tiny")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[TtsClient]:
    with server.client() as tts:
        yield tts


def check_words(words: Sequence[object], text: str, audio_s: float) -> None:
    expected = [(word.start_char, word.end_char) for word in split_words(text)]
    assert [(word.start_char, word.end_char) for word in words] == expected  # type: ignore[attr-defined]
    for word in words:
        assert text[word.start_char:word.end_char] == word.word  # type: ignore[attr-defined]
        assert 0.0 <= word.start_seconds <= word.end_seconds <= audio_s + 1e-6  # type: ignore[attr-defined]


def synthesize_request(text: str, **fields: object) -> object:
    return tts_pb2.SynthesizeRequest(text=text, voice=RYAN.to_proto(), audio_format=PCM.to_proto(),
                                     generation=GREEDY.to_proto(), **fields)


def test_a_unary_call_answers_every_word_of_its_text(client: TtsClient) -> None:
    response = client.stub.Synthesize(synthesize_request(TEXT, word_timestamps=True), timeout=60)
    check_words(response.words, TEXT, response.completion.usage.audio_seconds)


def test_a_server_streamed_call_sends_its_words_before_the_completion(client: TtsClient) -> None:
    responses = list(client.stub.SynthesizeOnline(synthesize_request(TEXT, word_timestamps=True), timeout=60))
    words = [word for response in responses for word in response.words.words]
    assert responses[-1].HasField("completion") and not responses[-1].words.words
    check_words(words, TEXT, responses[-1].completion.usage.audio_seconds)


def test_each_utterance_of_a_streamed_call_gets_the_words_of_its_own_text(client: TtsClient) -> None:
    texts = {"a": "Good morning. It is sunny", "b": "Bye now."}
    config = tts_pb2.StreamingSynthesizeConfig(voice=RYAN.to_proto(), audio_format=PCM.to_proto(),
                                               generation=GREEDY.to_proto(), utterance_id="a", word_timestamps=True)
    def requests() -> Iterator[object]:
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        for item in (Say("a", "Good morn"), Say("a", "ing. It is sunny"), CloseUtterance("a"), Say("b", texts["b"])):
            yield fragment_request(item)

    words: dict[str, list[object]] = {"a": [], "b": []}
    completions = {}
    for response in client.stub.StreamingSynthesize(requests(), timeout=60):
        words[response.utterance_id] += list(response.words.words)
        if response.HasField("completion"):
            completions[response.utterance_id] = response.completion
    for utterance_id, text in texts.items():
        check_words(words[utterance_id], text, completions[utterance_id].usage.audio_seconds)


def test_without_an_aligner_word_timestamps_are_a_failed_precondition_naming_the_flag(
        tiny_models: dict[str, LoadedModel]) -> None:
    bare = start_server(tiny_models["custom_voice"])
    try:
        with bare.client() as plain, pytest.raises(grpc.RpcError) as caught:
            plain.stub.Synthesize(synthesize_request(TEXT, word_timestamps=True), timeout=60)
    finally:
        bare.stop()
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details().startswith("word_timestamps:") and "--aligner-model" in caught.value.details()


def test_word_timestamps_for_japanese_text_are_refused_naming_the_field(client: TtsClient) -> None:
    request = synthesize_request(TEXT, word_timestamps=True)
    request.voice.language = "japanese"
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.Synthesize(request, timeout=60)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("word_timestamps: word timestamps are not available for japanese")
