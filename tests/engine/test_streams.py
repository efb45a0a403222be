"""A request's stream: chunks waiting are taken as one, a reader well ahead can wait for more audio, and a reader
that falls behind pauses its request."""

from __future__ import annotations

import asyncio

import numpy as np

from observability.calls import RequestTimeline
from scheduler.request import FinishReason
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisSummary

SAMPLES_PER_FRAME = 4


def frames(first: int, count: int = 1) -> AudioChunk:
    samples = np.arange(first * SAMPLES_PER_FRAME, (first + count) * SAMPLES_PER_FRAME, dtype=np.float32)
    return AudioChunk(samples, first, count)


def summary(num_frames: int) -> SynthesisSummary:
    return SynthesisSummary("r", FinishReason.LENGTH, num_frames, 0, np.zeros((num_frames, 16), dtype=np.int64),
                            RequestTimeline(0.0, 0.0, 0.0, 0.0, 1.0))


async def next_or_none(stream: RequestStream) -> AudioChunk | None:
    """The stream's next chunk if the reader would wake now, else None (its wait is cancelled)."""
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    if not reading.done():
        reading.cancel()
        return None
    return reading.result()


def test_chunks_that_waited_are_taken_as_one_in_order() -> None:
    async def run() -> AudioChunk:
        stream = RequestStream("r")
        for first in range(3):
            stream.put_audio(frames(first))
        return await anext(stream)

    chunk = asyncio.run(run())
    assert (chunk.first_frame, chunk.num_frames) == (0, 3)
    np.testing.assert_array_equal(chunk.samples, np.arange(3 * SAMPLES_PER_FRAME, dtype=np.float32))


def test_a_reader_that_takes_at_least_n_frames_wakes_only_when_they_wait_or_the_stream_ends() -> None:
    async def run() -> list[tuple[int, int] | None]:
        stream = RequestStream("r")
        stream.put_audio(frames(0))
        seen: list[tuple[int, int] | None] = []
        first = await next_or_none(stream)
        assert first is not None
        seen.append((first.first_frame, first.num_frames))
        stream.take_at_least(3)
        stream.put_audio(frames(1))
        stream.put_audio(frames(2))
        seen.append(None if (held := await next_or_none(stream)) is None else (held.first_frame, held.num_frames))
        stream.put_audio(frames(3))
        three = await next_or_none(stream)
        seen.append(None if three is None else (three.first_frame, three.num_frames))
        stream.put_audio(frames(4))
        stream.finish(summary(5))  # the end releases what is left, however short
        last = await next_or_none(stream)
        seen.append(None if last is None else (last.first_frame, last.num_frames))
        assert [chunk async for chunk in stream] == [] and stream.summary is not None
        return seen

    assert asyncio.run(run()) == [(0, 1), None, (1, 3), (4, 1)]


def test_lowering_the_threshold_wakes_a_reader_that_waits_for_more() -> None:
    async def run() -> int:
        stream = RequestStream("r")
        stream.take_at_least(4)
        stream.put_audio(frames(0, 2))
        reading = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        assert not reading.done()
        stream.take_at_least(1)
        return (await asyncio.wait_for(reading, 1)).num_frames

    assert asyncio.run(run()) == 2


def test_a_reader_that_falls_behind_asks_for_a_pause_and_for_the_resume_at_half_the_limit() -> None:
    calls: list[bool] = []

    async def run() -> None:
        stream = RequestStream("r", max_unread_frames=4, on_backlog=calls.append)
        for first in range(5):
            stream.put_audio(frames(first))
        assert calls == [True]
        await anext(stream)
        assert calls == [True, False]

    asyncio.run(run())
