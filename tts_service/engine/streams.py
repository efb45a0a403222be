"""What a caller of the engine hands in and gets back: requests, audio chunks, the closing summary."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from observability.calls import RequestTimeline
from scheduler.request import FinishReason
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams


@dataclass(frozen=True)
class SynthesisRequest:
    request_id: str
    synthesis: SynthesisInput  # with is_text_open, `synthesis.text` is ignored: text comes through append_text
    params: GenerationParams
    is_text_open: bool = False
    deadline: float | None = None  # on the engine's clock (time.monotonic by default)


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # float32 mono at the model's output sample rate
    first_frame: int
    num_frames: int


@dataclass(frozen=True)
class SynthesisSummary:
    request_id: str
    finish_reason: FinishReason
    num_frames: int
    num_text_tokens: int  # tokens of the request's own text (not the chat template or the voice prompt)
    codes: np.ndarray  # [num_frames, G] int64: every generated frame
    timeline: RequestTimeline
    error: str | None = None
    # A long text's segments made again, by why (segmented.py's guards: early_end, runaway).
    segment_retries: tuple[str, ...] = ()

    @property
    def queue_time_s(self) -> float | None:
        return self.timeline.queue_s

    @property
    def time_to_first_audio_s(self) -> float | None:
        return self.timeline.time_to_first_audio_s


class RequestFailed(RuntimeError):
    """The engine could not finish a request (its step or its audio failed); the engine itself goes on."""

    def __init__(self, summary: SynthesisSummary) -> None:
        super().__init__(summary.error or "request failed")
        self.summary = summary


class RequestStream:
    """Async iterator over a request's audio chunks; `summary` is set once the stream has ended.

    Ends normally for STOPPED, LENGTH and ABORTED; raises RequestFailed for ERROR, and the
    request's own exception (for example a PromptError when open text closes empty).

    The stream counts the frames of audio put in and not yet taken out. When that backlog passes
    `max_unread_frames` it calls `on_backlog(True)`, and `on_backlog(False)` once the reader has
    taken it down to half, so that the engine can pause a request whose reader has fallen behind
    instead of buffering its audio without bound.

    A reader that comes back to find several chunks waiting takes them as one (the engine decodes
    audio every step; a reader who is slower than that, gRPC's writes under load say, then sends
    fewer, larger messages instead of falling further behind). A reader whose listener is well
    ahead may also ask to be woken only once `take_at_least(n)` frames are waiting.
    """

    def __init__(self, request_id: str, max_unread_frames: int | None = None,
                 on_backlog: Callable[[bool], None] | None = None) -> None:
        self.request_id = request_id
        self.summary: SynthesisSummary | None = None
        self.num_unread_frames = 0
        self.is_backlogged = False
        # time.monotonic() when the first audio reached this stream, in this process: with the engine core in
        # a process of its own, later than the core's own first_audio by the crossing between the two.
        self.first_audio_time: float | None = None
        self._max_unread_frames = max_unread_frames
        self._on_backlog = on_backlog
        self._is_done = False
        self._min_take_frames = 1
        self._items: deque[AudioChunk | SynthesisSummary | Exception] = deque()
        self._has_items = asyncio.Event()

    # Engine side.

    def put_audio(self, chunk: AudioChunk) -> None:
        if self.first_audio_time is None:
            self.first_audio_time = time.monotonic()
        self.num_unread_frames += chunk.num_frames
        self._put(chunk)
        limit = self._max_unread_frames
        if limit is not None and not self.is_backlogged and self.num_unread_frames > limit:
            self._set_backlogged(True)

    def _set_backlogged(self, is_backlogged: bool) -> None:
        self.is_backlogged = is_backlogged
        if self._on_backlog is not None:
            self._on_backlog(is_backlogged)

    def finish(self, summary: SynthesisSummary) -> None:
        self._put(summary)

    def fail(self, error: Exception) -> None:
        self._put(error)

    def _put(self, item: AudioChunk | SynthesisSummary | Exception) -> None:
        self._items.append(item)
        if self._is_ready():
            self._has_items.set()

    def _is_ready(self) -> bool:
        """Something for the reader: the stream's end, or enough audio."""
        items = self._items
        if not items:
            return False
        return not isinstance(items[-1], AudioChunk) or self.num_unread_frames >= self._min_take_frames

    # Caller side.

    def take_at_least(self, num_frames: int) -> None:
        """Wake the reader only once `num_frames` frames of audio are waiting, or the stream has ended (a reader
        whose listener holds plenty of audio sends fewer, larger messages). 1 undoes it."""
        self._min_take_frames = max(1, num_frames)
        if self._is_ready():
            self._has_items.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._is_done:
            raise StopAsyncIteration
        while not self._is_ready():
            self._has_items.clear()
            await self._has_items.wait()
        if isinstance(self._items[0], AudioChunk):
            chunk = self._take_audio()
            self.num_unread_frames -= chunk.num_frames
            limit = self._max_unread_frames
            if self.is_backlogged and limit is not None and self.num_unread_frames <= limit // 2:
                self._set_backlogged(False)
            return chunk
        item = self._items.popleft()
        self._is_done = True
        if isinstance(item, Exception):
            self.summary = getattr(item, "summary", None)
            raise item
        self.summary = item
        if item.finish_reason is FinishReason.ERROR:
            raise RequestFailed(item)
        raise StopAsyncIteration

    def _take_audio(self) -> AudioChunk:
        """Every chunk waiting at the front, as one."""
        chunks = []
        while self._items and isinstance(self._items[0], AudioChunk):
            chunks.append(self._items.popleft())
        if len(chunks) == 1:
            return chunks[0]
        return AudioChunk(np.concatenate([chunk.samples for chunk in chunks]), chunks[0].first_frame,
                          sum(chunk.num_frames for chunk in chunks))

    async def collect(self) -> tuple[np.ndarray, SynthesisSummary]:
        """The whole waveform and the summary (for unary calls and tests)."""
        pieces = [chunk.samples async for chunk in self]
        assert self.summary is not None
        waveform = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return waveform, self.summary
