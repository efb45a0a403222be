"""Streamed text of any length: a request whose text arrives in fragments (an LLM's answer, a bidirectional call's
utterance) is spoken segment by segment once its text runs past one segment, as one request with one stream.

The running segment takes the text as it comes while it holds less than half of `--max-segment-chars`; past that,
a whole sentence at a time, as long as the sentence keeps it within the budget. The first sentence that would not
is the next segment's: the running one's text is closed there, at a sentence end, and the next starts once it has
been generated (a sentence longer than a whole segment is cut between words, as a whole text's is). So the model
never holds more than one segment's text, a request holds one decode slot at a time, and its KV memory comes back
segment by segment. Text that never passes half the budget is one segment, the request as it always was: same id,
same summary, every character handed on as it comes. Each segment's audio goes straight into the request's stream
as the engine makes it, its frames numbered on from the segment before. Every segment streams live, for the text
is still arriving: a segment that runs away is cut at its generation limit but never held back or made again
(whole texts are guarded, `segmented.py`). Seeds are the whole text's, `model/segments.segment_seed`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scheduler.request import FinishReason
from tts_service.engine.segmented import SEGMENT_ID_SEPARATOR, RunningSegments, joined_summary
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.model.segments import segment_seed, sentence_ends


class SegmentOutput(RequestStream):
    """A segment's stream: its audio goes on into the request's stream, numbered on from `frame_offset`; its end
    stays here, for the request's run to read."""

    def __init__(self, segment_id: str, target: RequestStream, frame_offset: int) -> None:
        super().__init__(segment_id)
        self._target = target
        self._frame_offset = frame_offset

    def put_audio(self, chunk: AudioChunk) -> None:
        self._target.put_audio(AudioChunk(chunk.samples, chunk.first_frame + self._frame_offset, chunk.num_frames))


@dataclass(frozen=True)
class StreamedSegmentDoor:
    """What the runs need of the engine: one live segment's calls, by the segment's id."""

    submit: Callable[[SynthesisRequest, RequestStream, int], Awaitable[RequestStream]]  # into a stream, from a frame
    append_text: Callable[[str, str], None]
    close_text: Callable[[str], None]
    abort: Callable[[str], None]
    set_output_paused: Callable[[str, bool], None]
    max_frames: int  # one generation's frame limit


@dataclass
class _Run:
    request: SynthesisRequest
    stream: RequestStream  # the caller's
    index: int = 0  # the running segment's
    current_id: str | None = None  # None while a segment is being queued, or waits for text
    segment_text: str = ""  # what the running segment has been given
    held: str = ""  # received for the running segment, not yet given: the sentence being written
    is_cut: bool = False  # the running segment takes no more text
    pending: str = ""  # text for the segments after the running one
    is_text_closed: bool = False
    is_aborted: bool = False
    is_paused: bool = False
    summaries: list[SynthesisSummary] = field(default_factory=list)
    has_text: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @property
    def num_frames(self) -> int:
        return sum(summary.num_frames for summary in self.summaries)


class StreamedSegmentedRequests(RunningSegments):
    """The engine's requests with streamed text (see the module's docstring)."""

    def __init__(self, max_segment_chars: int, door: StreamedSegmentDoor) -> None:
        super().__init__(door.abort, door.set_output_paused)
        self.max_segment_chars = max_segment_chars
        self._door = door

    async def submit(self, request: SynthesisRequest, stream: RequestStream) -> RequestStream:
        """Queue the request's first segment, raising what the engine raises for it with nothing queued."""
        run = _Run(request, stream)
        first = await self._start_segment(run)
        self._runs[request.request_id] = run
        run.task = asyncio.get_running_loop().create_task(self._speak_to_the_end(run, self._speak(run, first)),
                                                          name=f"streamed {request.request_id}")
        return stream

    def append_text(self, request_id: str, fragment: str) -> None:
        run = self._runs.get(request_id)
        if run is None or not fragment:
            return
        if run.is_text_closed:
            raise ValueError(f"request {request_id!r} takes no more text")
        if run.is_cut or run.current_id is None:
            run.pending += fragment
            run.has_text.set()
            return
        self._say(run, fragment)

    def close_text(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is None or run.is_text_closed:
            return
        run.is_text_closed = True
        run.has_text.set()
        if run.current_id is not None and not run.is_cut:
            self._say(run, "")
            if not run.is_cut:
                self._door.close_text(run.current_id)

    def abort(self, request_id: str) -> None:
        super().abort(request_id)
        run = self._runs.get(request_id)
        if run is not None:
            run.has_text.set()  # a run waiting for its next segment's text ends

    async def close(self) -> None:
        """The engine stops: every run ends (its running segment has failed with the engine)."""
        for run in self._runs.values():
            run.is_aborted = True
            run.has_text.set()
        await asyncio.gather(*(run.task for run in self._runs.values() if run.task is not None),
                             return_exceptions=True)

    def _say(self, run: _Run, text: str) -> None:
        """Text for the running segment: handed on as it comes while the segment is short, then sentence by
        sentence while they fit; the first that does not starts the next segment (see the module's docstring)."""
        assert run.current_id is not None
        budget = self.max_segment_chars
        run.held += text
        while run.held and not run.is_cut:
            num_sent = len(run.segment_text)
            if num_sent + len(run.held) <= (budget if run.is_text_closed else budget // 2):
                self._give(run, len(run.held))
                return
            ends = sentence_ends(run.held)
            fitting = [end for end in ends if num_sent + end <= budget]
            if fitting:
                self._give(run, fitting[-1])
                continue
            if not ends and num_sent + len(run.held) <= budget and not run.is_text_closed:
                return  # the sentence being written may still fit
            if not _ends_a_sentence(run.segment_text):  # a sentence begun here, or longer than a segment, does not
                self._give(run, _word_break_within(run.held, budget - num_sent))  # fit: end it between words
            self._cut(run)

    def _give(self, run: _Run, num_chars: int) -> None:
        assert run.current_id is not None
        text, run.held = run.held[:num_chars], run.held[num_chars:]
        if text:
            run.segment_text += text
            self._door.append_text(run.current_id, text)

    def _cut(self, run: _Run) -> None:
        """The running segment takes no more text; what it holds back opens the next."""
        assert run.current_id is not None
        run.is_cut = True
        run.pending, run.held = run.held + run.pending, ""
        self._door.close_text(run.current_id)

    async def _start_segment(self, run: _Run) -> RequestStream:
        """Queue the next segment (the first keeps the request's own id) and give it the text waiting for it."""
        request = run.request
        index = run.index
        segment_id = request.request_id if index == 0 else f"{request.request_id}{SEGMENT_ID_SEPARATOR}{index}"
        cap = max(1, min(request.params.max_new_frames - run.num_frames, self._door.max_frames))
        segment = await self._door.submit(dataclasses.replace(
            request, request_id=segment_id,
            params=dataclasses.replace(request.params, seed=segment_seed(request.params.seed, index, 0),
                                       max_new_frames=cap, min_new_frames=min(request.params.min_new_frames, cap))),
            run.stream, run.num_frames)
        run.current_id, run.segment_text, run.is_cut = segment_id, "", False
        if run.is_paused:
            self._door.set_output_paused(segment_id, True)
        if run.is_aborted:  # aborted while the segment was being queued
            self._door.abort(segment_id)
        text, run.pending = run.pending, ""
        self._say(run, text)
        if run.is_text_closed and not run.is_cut:
            self._door.close_text(segment_id)
        return segment

    async def _speak(self, run: _Run, segment: RequestStream) -> None:
        while True:
            async for _ in segment:  # a segment's audio has gone on into the request's stream
                pass
            assert segment.summary is not None
            run.summaries.append(segment.summary)
            run.current_id = None
            if not await self._has_more(run, segment.summary):
                return
            run.index += 1
            segment = await self._start_segment(run)

    async def _has_more(self, run: _Run, summary: SynthesisSummary) -> bool:
        """Whether another segment follows the one that just ended: it was cut, the request may still speak, and
        text for it has come (waiting for that text, or for the text's end, as long as it takes)."""
        if (not run.is_cut or run.is_aborted or summary.finish_reason is FinishReason.ABORTED
                or run.num_frames >= run.request.params.max_new_frames):
            return False
        while not (run.pending.strip() or run.is_text_closed or run.is_aborted):
            run.has_text.clear()
            await run.has_text.wait()
        return bool(run.pending.strip()) and not run.is_aborted

    def _summary(self, run: _Run) -> SynthesisSummary:
        if len(run.summaries) == 1:
            return run.summaries[0]
        return joined_summary(run.request.request_id, run.summaries, [], run.is_aborted)


def _ends_a_sentence(text: str) -> bool:
    """Whether `text` has words and ends where a sentence does."""
    ends = sentence_ends(text)
    return bool(text.strip()) and bool(ends) and ends[-1] == len(text)


def _word_break_within(text: str, max_chars: int) -> int:
    """The longest start of `text` within `max_chars` that ends between words (between any two characters of a
    text without spaces, such as Chinese), and at least one character."""
    limit = max(1, min(max_chars, len(text)))
    space = text.rfind(" ", 0, limit)
    return space + 1 if space > 0 else limit
