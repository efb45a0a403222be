"""Streamed text of any length (engine/streamed_segments.py): text within a segment is one request as it always
was; past it, the running segment is cut at a sentence within the budget and the rest waits for the next, which
starts once the one before has been generated, with the whole text's seed for it and its frames numbered on; text,
closing, abort and pausing reach whichever segment runs. Checked against a stand-in engine, then through the real
one with the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from observability.calls import RequestTimeline
from scheduler.request import FinishReason
from tests.engine.test_segmented import CONFIG, SAMPLED, run
from tts_service.engine.engine import Engine
from tts_service.engine.streamed_segments import SegmentOutput, StreamedSegmentDoor, StreamedSegmentedRequests
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.model.prompts import SynthesisInput
from tts_service.model.segments import segment_seed

BUDGET = 40
SENTENCES = ["The first sentence is here. ", "A second one follows it. ", "Then a third, short. ",
             "And a fourth sentence ends the text."]


@dataclass
class _Segment:
    request: SynthesisRequest
    stream: SegmentOutput
    frame_offset: int
    text: str = ""
    is_closed: bool = False
    is_aborted: bool = False
    paused: list[bool] = field(default_factory=list)

    def speak(self, num_frames: int) -> None:
        """Generate `num_frames` frames, then end as the engine ends a request."""
        for frame in range(num_frames):
            self.stream.put_audio(AudioChunk(np.zeros(4, np.float32), frame, 1))
        reason = FinishReason.ABORTED if self.is_aborted else FinishReason.STOPPED
        self.stream.finish(SynthesisSummary(self.request.request_id, reason, num_frames, len(self.text),
                                            np.zeros((num_frames, 2), np.int64),
                                            RequestTimeline(0.0, 0.0, 0.0, 0.0, 1.0)))


class StandInEngine:
    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.by_id: dict[str, _Segment] = {}

    async def submit(self, request: SynthesisRequest, into: RequestStream, frame_offset: int) -> RequestStream:
        segment = _Segment(request, SegmentOutput(request.request_id, into, frame_offset), frame_offset)
        self.segments.append(segment)
        self.by_id[request.request_id] = segment
        return segment.stream

    def door(self) -> StreamedSegmentDoor:
        def append(segment_id: str, text: str) -> None:
            assert not self.by_id[segment_id].is_closed
            self.by_id[segment_id].text += text

        def close(segment_id: str) -> None:
            self.by_id[segment_id].is_closed = True

        def abort(segment_id: str) -> None:
            self.by_id[segment_id].is_aborted = True

        def pause(segment_id: str, is_paused: bool) -> None:
            self.by_id[segment_id].paused.append(is_paused)

        return StreamedSegmentDoor(self.submit, append, close, abort, pause, max_frames=1000)


def open_request(request_id: str = "r") -> SynthesisRequest:
    return SynthesisRequest(request_id, SynthesisInput("", "english", "ryan"), SAMPLED, is_text_open=True)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def is_contiguous(chunks: list[AudioChunk]) -> bool:
    return all(a.first_frame + a.num_frames == b.first_frame for a, b in itertools.pairwise(chunks))


async def read_all(stream: RequestStream) -> list[AudioChunk]:
    return [chunk async for chunk in stream]


def test_text_within_a_segment_is_one_request_with_its_own_id_and_summary() -> None:
    async def scenario() -> None:
        engine = StandInEngine()
        runs = StreamedSegmentedRequests(BUDGET, engine.door())
        stream = await runs.submit(open_request("short"), RequestStream("short"))
        runs.append_text("short", "Hello there. ")
        runs.append_text("short", "Bye.")
        runs.close_text("short")
        (segment,) = engine.segments
        assert segment.request.request_id == "short" and segment.text == "Hello there. Bye." and segment.is_closed
        segment.speak(3)
        chunks = await read_all(stream)
        assert chunks[0].first_frame == 0 and sum(chunk.num_frames for chunk in chunks) == 3
        assert stream.summary is not None and stream.summary.request_id == "short"
        assert stream.summary.num_frames == 3 and not runs.owns("short")

    asyncio.run(scenario())


def test_text_past_the_budget_is_cut_at_sentences_and_spoken_segment_after_segment() -> None:
    async def scenario() -> None:
        engine = StandInEngine()
        runs = StreamedSegmentedRequests(BUDGET, engine.door())
        stream = await runs.submit(open_request(), RequestStream("r"))
        reading = asyncio.create_task(read_all(stream))
        text = "".join(SENTENCES)
        for start in range(0, len(text), 7):  # fragments cut anywhere, as an LLM's tokens come
            runs.append_text("r", text[start:start + 7])
        runs.close_text("r")
        for index in range(len(SENTENCES)):
            await settle()
            assert len(engine.segments) == index + 1  # the next starts only once this one is generated
            engine.segments[index].speak(2 + index)
        chunks = await reading
        assert [segment.text for segment in engine.segments] == SENTENCES
        assert all(segment.is_closed and len(segment.text) <= BUDGET for segment in engine.segments)
        assert [segment.request.request_id for segment in engine.segments] == ["r", "r~1", "r~2", "r~3"]
        assert [segment.request.params.seed for segment in engine.segments] == [
            segment_seed(SAMPLED.seed, index, 0) for index in range(4)]
        assert [segment.frame_offset for segment in engine.segments] == [0, 2, 5, 9]
        assert chunks[0].first_frame == 0 and sum(chunk.num_frames for chunk in chunks) == 14
        assert is_contiguous(chunks)  # across the segments' boundaries
        assert stream.summary is not None and stream.summary.request_id == "r" and stream.summary.num_frames == 14

    asyncio.run(scenario())


def test_the_next_segment_waits_for_text_and_ends_with_the_text_when_none_comes() -> None:
    async def scenario() -> None:
        engine = StandInEngine()
        runs = StreamedSegmentedRequests(BUDGET, engine.door())
        stream = await runs.submit(open_request(), RequestStream("r"))
        reading = asyncio.create_task(read_all(stream))
        runs.append_text("r", SENTENCES[0] + SENTENCES[1])  # past the budget: the first is cut after one sentence
        engine.segments[0].speak(2)
        await settle()
        assert len(engine.segments) == 2 and engine.segments[1].text == SENTENCES[1]
        assert not engine.segments[1].is_closed  # still open: more text may come
        runs.append_text("r", "Last one.")
        runs.close_text("r")
        assert engine.segments[1].text == SENTENCES[1] + "Last one." and engine.segments[1].is_closed
        engine.segments[1].speak(1)
        await reading
        assert stream.summary is not None and stream.summary.num_frames == 3

    asyncio.run(scenario())


def test_abort_and_pausing_reach_the_running_segment_and_nothing_follows_an_abort() -> None:
    async def scenario() -> None:
        engine = StandInEngine()
        runs = StreamedSegmentedRequests(BUDGET, engine.door())
        stream = await runs.submit(open_request(), RequestStream("r"))
        reading = asyncio.create_task(read_all(stream))
        runs.append_text("r", "".join(SENTENCES))
        engine.segments[0].speak(2)
        await settle()
        runs.set_output_paused("r", True)
        runs.abort("r")
        second = engine.segments[1]
        assert second.paused == [True] and second.is_aborted
        second.speak(1)
        await reading
        assert len(engine.segments) == 2
        assert stream.summary is not None and stream.summary.finish_reason is FinishReason.ABORTED

    asyncio.run(scenario())


def test_through_the_engine_a_long_streamed_text_holds_one_slot_and_streams_contiguously(tiny_models) -> None:
    engine = Engine.create(tiny_models["custom_voice"], dataclasses.replace(CONFIG, max_running=2))
    text = "".join(SENTENCES) * 2

    async def body() -> tuple[list[AudioChunk], RequestStream, int]:
        stream = await engine.submit(open_request("long"))
        most_running = 0

        async def feed() -> None:
            nonlocal most_running
            for start in range(0, len(text), 5):
                engine.append_text("long", text[start:start + 5])
                most_running = max(most_running, engine.scheduler.num_running)
                await asyncio.sleep(0)
            engine.close_text("long")

        feeding = asyncio.create_task(feed())
        chunks = [chunk async for chunk in stream]
        await feeding
        return chunks, stream, most_running

    chunks, stream, most_running = run(engine, body)
    assert stream.summary is not None and stream.summary.request_id == "long"
    assert stream.summary.finish_reason is FinishReason.LENGTH  # random weights: each segment runs to its cap
    # Three frames a segment (--max-audio-seconds 0.24), eight segments of one sentence each.
    assert stream.summary.num_frames == 3 * 8 == sum(chunk.num_frames for chunk in chunks)
    assert chunks[0].first_frame == 0 and is_contiguous(chunks)
    assert most_running <= 1


def test_a_sentence_longer_than_a_segment_is_cut_between_words_within_the_budget() -> None:
    async def scenario() -> list[str]:
        engine = StandInEngine()
        runs = StreamedSegmentedRequests(BUDGET, engine.door())
        stream = await runs.submit(open_request(), RequestStream("r"))
        reading = asyncio.create_task(read_all(stream))
        words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen."
        for word in words.split(" "):
            runs.append_text("r", word + " ")
        runs.close_text("r")
        for index in range(10):
            await settle()
            if index == len(engine.segments):
                break
            engine.segments[index].speak(1)
        await reading
        return [segment.text for segment in engine.segments]

    texts = asyncio.run(scenario())
    assert "".join(texts) == "one two three four five six seven eight nine ten eleven twelve thirteen fourteen " \
                             "fifteen. "
    assert len(texts) > 2 and all(len(text) <= BUDGET and text.endswith(" ") for text in texts)
