"""Long text in one request: a 50,000-character text streams to its end over gRPC, every segment accounted for and
the audio contiguous across their boundaries; the HTTP door speaks a long text whole; a text over the document
limit is refused naming it; word timestamps time a long text's spoken words in order. (tests/engine/test_segmented.py
proves the audio equals each segment spoken alone.)"""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from clients.qwen3_tts_client import AudioFormat, TtsClient
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server
from tests.service.processes import free_port
from tts_service.model.aligner_text import split_words
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.segments import FIRST_SEGMENT_SHARE, split_segments

SAMPLES_PER_FRAME = 1920
SEGMENT_CHARS = 1000
FRAMES_PER_SEGMENT = 2  # --max-audio-seconds 0.16: the random model never ends a segment itself
SENTENCES = ["The lighthouse keeper counted the ships that passed in the night.",
             "她每天早上都去公园散步，然后回家做早饭。",
             "Numbers like 1,024 and 3.14 are read aloud, too!",
             "A sentence without an end runs on through the line break\n",
             "Mixed text 混合文本 sits in one sentence; it ends here."]


def num_segments_of(text: str) -> int:
    """As the engine cuts it: the first segment a quarter of the budget, each next twice the one before."""
    return len(split_segments(text, SEGMENT_CHARS, SEGMENT_CHARS // FIRST_SEGMENT_SHARE))


def long_text(num_chars: int) -> str:
    text = ""
    for sentence in itertools.cycle(SENTENCES):
        if len(text) + len(sentence) + 1 > num_chars:
            return text
        text += sentence + " "
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], http_port=free_port(), max_document_chars=60_000,
                           max_text_chars=SEGMENT_CHARS, max_segment_chars=SEGMENT_CHARS, max_audio_seconds=0.16,
                           max_stream_seconds=600.0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[TtsClient]:
    with server.client() as tts:
        yield tts


def test_a_50000_character_text_streams_every_segment_contiguously_as_one_request(client: TtsClient) -> None:
    text = long_text(50_000)
    num_segments = num_segments_of(text)
    assert len(text) > 49_000 and num_segments >= 50
    call = client.synthesize_online(text, RYAN, AudioFormat("pcm16", 24000), GREEDY)
    responses = list(call)
    position = 0
    for chunk in (response.chunk for response in responses if response.HasField("chunk")):
        assert chunk.offset_samples == position and len(chunk.audio) == 2 * chunk.num_samples
        position += chunk.num_samples
    (completion,) = [response.completion for response in responses if response.HasField("completion")]
    assert completion.request_id == dict(call.initial_metadata())["x-request-id"]
    assert completion.usage.audio_frames == FRAMES_PER_SEGMENT * num_segments
    assert position == completion.usage.audio_frames * SAMPLES_PER_FRAME


def test_the_http_door_speaks_a_long_text_whole(server: RunningServer) -> None:
    text = long_text(4_500)
    num_segments = num_segments_of(text)
    body = json.dumps({"model": "tts-1", "input": text, "voice": "ryan", "response_format": "pcm"}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.server.config.http_port}/v1/audio/speech", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        audio = response.read()
    assert len(audio) == 2 * SAMPLES_PER_FRAME * FRAMES_PER_SEGMENT * num_segments


def test_a_text_over_the_document_limit_is_refused_naming_the_field_and_the_limit(client: TtsClient) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        client.synthesize("x " * 30_001, RYAN, generation=GREEDY)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "text: is 60002 characters long; at most 60000" in refused.value.details()


def test_a_text_longer_than_a_segment_gets_its_spoken_words_timed_in_order(tiny_models: dict[str, LoadedModel]) -> None:
    running = start_server(tiny_models["custom_voice"], aligner_model="random:tiny", max_document_chars=5_000,
                           max_text_chars=SEGMENT_CHARS, max_segment_chars=SEGMENT_CHARS, max_audio_seconds=0.16)
    text = long_text(SEGMENT_CHARS + 200)
    try:
        with running.client() as tts:
            response = tts.synthesize(text, RYAN, AudioFormat("pcm16"), GREEDY, word_timestamps=True)
    finally:
        running.stop()
    words = list(response.words)
    audio_s = len(response.audio) / 2 / 24000
    expected = [(word.start_char, word.end_char) for word in split_words(text)]
    # Two frames a segment say only the first words; those that are timed come in the text's order, none twice.
    assert words and [(word.start_char, word.end_char) for word in words] == expected[:len(words)]
    assert all(text[word.start_char:word.end_char] == word.word for word in words)
    assert all(0.0 <= word.start_seconds <= word.end_seconds <= audio_s + 1e-6 for word in words)


def test_a_streamed_utterance_longer_than_a_segment_streams_to_its_end_as_one(client: TtsClient) -> None:
    text = long_text(3 * SEGMENT_CHARS)  # three times --max-text-chars: one generation could not hold it
    fragments = [text[start:start + 17] for start in range(0, len(text), 17)]
    offsets, completion = [], None
    for response in client.streaming_synthesize(fragments, RYAN, AudioFormat("pcm16"), GREEDY, timeout=120):
        if response.chunk.num_samples:
            offsets.append((response.chunk.offset_samples, response.chunk.num_samples))
        if response.HasField("completion"):
            completion = response.completion
    assert completion is not None
    # Each segment runs to its two frames (--max-audio-seconds 0.16); at least three segments, back to back.
    frames = completion.usage.audio_frames
    assert frames % FRAMES_PER_SEGMENT == 0 and frames >= 3 * FRAMES_PER_SEGMENT
    assert offsets[0][0] == 0 and sum(count for _, count in offsets) == frames * SAMPLES_PER_FRAME
    assert all(start + count == following for (start, count), (following, _) in itertools.pairwise(offsets))
