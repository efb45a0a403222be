"""A whole text longer than one segment, spoken segment by segment as one request with one stream.

The text is cut at sentences (`model/segments.py`, `--max-segment-chars`): the first segment a quarter of
the budget, each next one at most twice the one before. Each segment is a request of its own inside the engine:
the same voice (speaker, instruction, clone prompt) and sampling settings, a seed derived from the request's and
the segment's index (so that the whole is reproducible), and at most the audio the request has left. Segment k+1
is submitted when segment k has been generated, long before its audio has played (generation runs many times
faster than real time, and a segment is at most twice the one before), so a long request holds one decode slot
at a time, its KV memory is released segment by segment, and short requests that arrive meanwhile take their
turn between its segments.

Guards against the model's failure modes, with real weights: a segment that ends far too early for its text
(`SegmentBounds.min_frames`), or runs far past what its text can need (`max_frames`, where it is cut), is made
again once with the next seed. The first segment streams as it is made, for first audio's sake, so it is cut but
never made again; every later one is held back until it is complete and accepted, so a retry is never heard. A
request's retries are named in its summary (`segment_retries`, counted by the server's metrics).

The caller sees one request: one stream, whose audio is every accepted segment's in order, sample for sample (the
frame offsets run on across segments), one summary, and one id for abort and for pausing a reader that fell
behind; these reach whichever segment is running. A segment that fails fails the request; an aborted or
deadline-ended one ends it there.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from observability.calls import RequestTimeline
from scheduler.request import FinishReason
from tts_service.engine.streams import AudioChunk, RequestFailed, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.model.segments import Segment, SegmentBounds, document_segments, segment_seed

# Joins a request's id and its segment's index into the segment's id inside the engine.
SEGMENT_ID_SEPARATOR = "~"


@dataclass
class _Run:
    """One segmented request: its segments, the one running, and what the finished ones made."""

    request: SynthesisRequest
    stream: RequestStream
    segments: list[Segment]
    current_id: str | None = None
    is_aborted: bool = False
    is_paused: bool = False
    summaries: list[SynthesisSummary] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    @property
    def num_frames(self) -> int:
        return sum(summary.num_frames for summary in self.summaries)

    def text_of(self, index: int) -> str:
        return self.segments[index].of(self.request.synthesis.text)


@dataclass(frozen=True)
class SegmentDoor:
    """What the runs need of the engine, for one segment at a time."""

    submit: Callable[[SynthesisRequest], Awaitable[RequestStream]]  # queue one request, its stream read here
    abort: Callable[[str], None]
    set_output_paused: Callable[[str, bool], None]
    # The frames a segment of this text may take at most, before what the request has left (without guards).
    frames_for: Callable[[str], int]
    # The guards' bounds for a segment's text; None: no guards (random weights never end speech themselves).
    bounds_for: Callable[[str], SegmentBounds] | None


class RunningSegments(abc.ABC):
    """The runs of one kind of segmented request, by request id, with abort and pausing routed to a run's running
    segment (`_segment_abort`, `_segment_pause`: the engine's calls for one segment). A run has `current_id` (None
    between segments), `is_aborted` and `is_paused`."""

    def __init__(self, segment_abort: Callable[[str], None],
                 segment_pause: Callable[[str, bool], None]) -> None:
        self._segment_abort = segment_abort
        self._segment_pause = segment_pause
        self._runs: dict[str, Any] = {}

    def owns(self, request_id: str) -> bool:
        return request_id in self._runs

    def abort(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is None or run.is_aborted:
            return
        run.is_aborted = True
        if run.current_id is not None:
            self._segment_abort(run.current_id)

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        run = self._runs.get(request_id)
        if run is None:
            return
        run.is_paused = is_paused
        if run.current_id is not None:
            self._segment_pause(run.current_id, is_paused)

    async def _speak_to_the_end(self, run: Any, segments: Awaitable[None]) -> None:
        """Speak the run's segments (`segments` adds each one's summary to `run.summaries`), then end the request's
        stream with their summary, or with what failed one of them."""
        try:
            await segments
            run.stream.finish(self._summary(run))
        except RequestFailed as error:
            run.summaries.append(error.summary)
            run.stream.fail(RequestFailed(self._summary(run)))
        except Exception as error:  # the engine refused a later segment, or stopped: the request ends with it
            run.stream.fail(error)
        finally:
            run.current_id = None
            self._runs.pop(run.request.request_id, None)

    @abc.abstractmethod
    def _summary(self, run: Any) -> SynthesisSummary:
        """The request's summary from its segments'."""


class SegmentedRequests(RunningSegments):
    """The engine's segmented requests (see the module's docstring)."""

    def __init__(self, max_segment_chars: int, door: SegmentDoor) -> None:
        super().__init__(door.abort, door.set_output_paused)
        self.max_segment_chars = max_segment_chars
        self._door = door

    def is_segmented(self, request: SynthesisRequest) -> bool:
        return not request.is_text_open and len(request.synthesis.text) > self.max_segment_chars

    async def submit(self, request: SynthesisRequest, stream: RequestStream) -> RequestStream:
        """Queue the request's first segment (raising what the engine raises for it, with nothing queued) and
        speak the rest after it into `stream`."""
        # Cutting 200,000 characters takes Python a good part of a second: off the engine's event loop.
        segments = await asyncio.to_thread(document_segments, request.synthesis.text, self.max_segment_chars)
        if request.request_id in self._runs:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        run = _Run(request, stream, segments)
        first, _ = await self._start_segment(run, 0, attempt=0)
        self._runs[request.request_id] = run
        run.task = asyncio.get_running_loop().create_task(self._speak_to_the_end(run, self._speak(run, first)),
                                                          name=f"segmented {request.request_id}")
        return stream

    async def close(self) -> None:
        """The engine stops: every run ends (its running segment has failed with the engine)."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _start_segment(self, run: _Run, index: int, attempt: int) -> tuple[RequestStream, int]:
        """Queue segment `index` (its `attempt`-th making): its stream, and the frame cap it was given."""
        request, door = run.request, self._door
        text = run.text_of(index)
        params = request.params
        frames_left = params.max_new_frames - run.num_frames
        own_cap = door.frames_for(text) if door.bounds_for is None else door.bounds_for(text).max_frames
        cap = max(1, min(frames_left, own_cap))
        seed = segment_seed(params.seed, index, attempt)
        retry = f".{attempt}" if attempt else ""
        stream = await self._door.submit(dataclasses.replace(
            request, request_id=f"{request.request_id}{SEGMENT_ID_SEPARATOR}{index}{retry}",
            synthesis=dataclasses.replace(request.synthesis, text=text),
            params=dataclasses.replace(params, seed=seed, max_new_frames=cap,
                                       min_new_frames=min(params.min_new_frames, cap))))
        run.current_id = stream.request_id
        if run.is_paused:
            self._door.set_output_paused(run.current_id, True)
        if run.is_aborted:  # aborted while the segment was being queued
            self._door.abort(run.current_id)
        return stream, cap

    async def _speak(self, run: _Run, first: RequestStream) -> None:
        for index in range(len(run.segments)):
            summary = await (self._relay(run, first) if index == 0 else self._made_and_accepted(run, index))
            run.summaries.append(summary)
            if summary.finish_reason is FinishReason.ABORTED or run.is_aborted:
                break
            if run.num_frames >= run.request.params.max_new_frames:
                break

    async def _made_and_accepted(self, run: _Run, index: int) -> SynthesisSummary:
        """A later segment, held back until it is complete; made again once if a guard refuses it. Its audio goes
        out once accepted (the retry's, whatever its verdict)."""
        bounds_for = self._door.bounds_for
        bounds = None if bounds_for is None else bounds_for(run.text_of(index))
        for attempt in (0, 1):
            segment, cap = await self._start_segment(run, index, attempt)
            chunks = [chunk async for chunk in segment]
            assert segment.summary is not None
            summary = segment.summary
            reason = None if bounds is None or run.is_aborted or attempt == 1 else bounds.verdict(
                summary.finish_reason is FinishReason.STOPPED, summary.finish_reason is FinishReason.LENGTH,
                summary.num_frames, cap)
            if reason is None:
                offset = run.num_frames
                for chunk in chunks:
                    run.stream.put_audio(AudioChunk(chunk.samples, chunk.first_frame + offset, chunk.num_frames))
                return summary
            run.retries.append(reason)
        raise AssertionError("unreachable: the second making is always accepted")

    async def _relay(self, run: _Run, segment: RequestStream) -> SynthesisSummary:
        """The first segment's audio into the request's stream as it comes."""
        async for chunk in segment:
            run.stream.put_audio(chunk)
        assert segment.summary is not None
        return segment.summary

    def _summary(self, run: _Run) -> SynthesisSummary:
        return joined_summary(run.request.request_id, run.summaries, run.retries, run.is_aborted)


def joined_summary(request_id: str, summaries: list[SynthesisSummary], retries: list[str],
                   is_aborted: bool) -> SynthesisSummary:
    """The segments' summaries as their request's: the last one's ending, every frame, the whole timeline."""
    first, last = summaries[0], summaries[-1]
    codes = [summary.codes for summary in summaries if summary.codes.size]
    timeline = RequestTimeline(arrival=first.timeline.arrival, admitted=first.timeline.admitted,
                               first_frame=first.timeline.first_frame, first_audio=first.timeline.first_audio,
                               finished=last.timeline.finished)
    finish_reason = last.finish_reason
    if is_aborted and finish_reason is not FinishReason.ERROR:
        finish_reason = FinishReason.ABORTED
    return SynthesisSummary(
        request_id=request_id, finish_reason=finish_reason, num_frames=sum(summary.num_frames for summary in summaries),
        num_text_tokens=sum(summary.num_text_tokens for summary in summaries),
        codes=np.concatenate(codes) if codes else first.codes, timeline=timeline, error=last.error,
        segment_retries=tuple(retries))
