"""The stand-in engine of the front door's benchmark (benchmarks/front_door.py): the engine's door as the core's
process serves it, without a model. Every running request gets a frame of noise each step, a step lasting what the
1.7B model's frame step takes on an H100 at that many rows, and a request ends at the frames it asked for, as
random weights do. Asked for word timings, it spreads a window's words evenly over its audio. It lives in a module
of its own so that the core's process, spawned, can import its entry point.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from observability.calls import RequestTimeline
from observability.metrics import StepObservation
from scheduler.request import FinishReason
from tts_service.engine import CoreSpec
from tts_service.engine.core_process import NewStream, run_core
from tts_service.engine.engine import Engine, EngineOccupancy, EngineStoppedError
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.aligner_text import split_words
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model

# The frame step on an H100 by rows (device time, ms; BENCHMARKS.md, "Frame step"), by the model stood in for (the
# CoreSpec's model, random:1.7b-custom_voice or random:0.6b-custom_voice): the stand-in's step lies between these.
FRAME_STEP_MS = {"1.7b": ((1, 3.61), (8, 5.34), (64, 6.71), (128, 8.17), (256, 11.50)),
                 "0.6b": ((1, 2.93), (8, 4.62), (64, 5.90), (128, 7.27), (256, 10.34))}
NUM_CODEBOOKS = 16
# Noise frames the stand-in cycles through (a frame's samples cost it nothing to make).
NUM_NOISE_FRAMES = 32
# What the stand-in's aligner takes for a window: the 0.6B aligner's smallest captured batch on an H100 (BENCHMARKS.md,
# "Voice agents").
ALIGN_S = 0.0036
# The stand-in core's model record: the tiny random checkpoint's (its frame rate and sample rate are the real ones).
RECORD_MODEL = "random:tiny-custom_voice"


def stood_in_model(size: str) -> str:
    return f"random:{size}-custom_voice"


def step_seconds(num_rows: int, size: str = "1.7b") -> float:
    """The `size` model's frame step at `num_rows`, linear between the measured row counts, flat past the last."""
    table = FRAME_STEP_MS[size]
    rows = [count for count, _ in table]
    index = bisect.bisect_left(rows, num_rows)
    if index == 0:
        return table[0][1] / 1e3
    if index == len(rows):
        return table[-1][1] / 1e3
    (low, low_ms), (high, high_ms) = table[index - 1], table[index]
    return (low_ms + (high_ms - low_ms) * (num_rows - low) / (high - low)) / 1e3


@dataclass
class _Paced:
    request: SynthesisRequest
    stream: RequestStream
    arrival: float
    admitted: float | None = None
    num_frames: int = 0
    is_text_closed: bool = True
    is_paused: bool = False

    @property
    def is_done(self) -> bool:
        return self.num_frames >= self.request.params.max_new_frames and self.is_text_closed

    @property
    def is_making(self) -> bool:
        return not self.is_paused and self.num_frames < self.request.params.max_new_frames


class PacedEngine:
    """The engine's door, as the core's process serves it, without a model (see the module's docstring)."""

    def __init__(self, model_info: ModelInfo, max_unread_frames: int, new_stream: NewStream, size: str = "1.7b",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model_info = model_info
        self.size = size
        self.max_unread_frames = max_unread_frames
        self.runner_call_since: float | None = None
        self._new_stream = new_stream
        self._clock = clock
        self._live: dict[str, _Paced] = {}
        self._observers: list[Callable[[StepObservation], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        noise = np.random.default_rng(0).standard_normal((NUM_NOISE_FRAMES, model_info.samples_per_frame))
        self._noise = (0.1 * noise).astype(np.float32)

    @classmethod
    def for_core(cls, spec: CoreSpec, new_stream: NewStream) -> Engine:
        size = next(size for size in FRAME_STEP_MS if spec.model == stood_in_model(size))
        model = load_model(RECORD_MODEL, LoadOptions.default_for("cpu"))
        # With --aligner-model, requests may ask for word timestamps; the stand-in times words itself.
        info = ModelInfo.of(model, aligner=spec.engine.aligner_model)
        return cast(Engine, cls(info, spec.engine.max_unread_frames(info.frame_rate_hz), new_stream, size))

    # -- the door's calls and notices ------------------------------------------------------------

    async def submit(self, request: SynthesisRequest) -> RequestStream:
        stream = self._new_stream(request.request_id)
        self._live[request.request_id] = _Paced(request, stream, self._clock(),
                                                is_text_closed=not request.is_text_open)
        self._wake.set()
        return stream

    def append_text(self, request_id: str, fragment: str) -> None:
        """The stand-in makes noise whatever the text."""

    def close_text(self, request_id: str) -> None:
        if (paced := self._live.get(request_id)) is not None:
            paced.is_text_closed = True
            self._finish_if_done(paced)

    def abort(self, request_id: str) -> None:
        if (paced := self._live.get(request_id)) is not None:
            self._finish(paced, FinishReason.ABORTED)

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        if (paced := self._live.get(request_id)) is not None:
            paced.is_paused = is_paused
            self._wake.set()

    async def clone_voice(self, *args: object) -> Any:
        raise RuntimeError("the paced stand-in engine has no voices")

    async def create_voice(self, *args: object) -> Any:
        raise RuntimeError("the paced stand-in engine has no voices")

    async def registered_voice(self, *args: object) -> Any:
        raise RuntimeError("the paced stand-in engine has no voices")

    async def registered_voices(self, *args: object) -> Any:
        return []

    async def delete_voice(self, *args: object) -> None:
        raise RuntimeError("the paced stand-in engine has no voices")

    async def align_words(self, item: AlignmentItem) -> list[WordTiming]:
        """The item's words spread evenly over its audio, after what a small batch of the aligner takes."""
        await asyncio.sleep(ALIGN_S)
        words = split_words(item.text, item.language)
        seconds = item.audio.shape[0] / item.sample_rate / max(1, len(words))
        return [WordTiming(word.start_char, word.end_char, index * seconds, (index + 1) * seconds)
                for index, word in enumerate(words)]

    # -- what the core's loop reads --------------------------------------------------------------

    def occupancy(self) -> EngineOccupancy:
        return EngineOccupancy(len(self._live), 0, 0, 0, 0, 1)

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        return {}

    def add_step_observer(self, observer: Callable[[StepObservation], None]) -> None:
        self._observers.append(observer)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def join(self) -> None:
        assert self._task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for paced in list(self._live.values()):
            del self._live[paced.request.request_id]
            paced.stream.fail(EngineStoppedError("the engine stopped"))

    # -- the steps -------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_step = self._clock()
        while True:
            rows = [paced for paced in self._live.values() if paced.is_making]
            if not rows:
                self._wake.clear()
                await self._wake.wait()
                next_step = self._clock()
                continue
            duration = step_seconds(len(rows), self.size)
            next_step = max(next_step + duration, self._clock())
            await asyncio.sleep(next_step - self._clock())
            self._step(rows, duration)

    def _step(self, rows: list[_Paced], duration: float) -> None:
        now = self._clock()
        num_prefills = 0
        for paced in rows:
            if paced.request.request_id not in self._live:
                continue
            if paced.admitted is None:
                paced.admitted = now
                num_prefills += 1
            samples = self._noise[paced.num_frames % NUM_NOISE_FRAMES]
            paced.stream.put_audio(AudioChunk(samples, paced.num_frames, 1))
            paced.num_frames += 1
            self._finish_if_done(paced)
        observation = StepObservation(num_decodes=len(rows) - num_prefills, num_prefills=num_prefills,
                                      num_codec_frames=len(rows), step_s=duration)
        for observer in self._observers:
            observer(observation)

    def _finish_if_done(self, paced: _Paced) -> None:
        if paced.is_done:
            self._finish(paced, FinishReason.LENGTH)

    def _finish(self, paced: _Paced, reason: FinishReason) -> None:
        del self._live[paced.request.request_id]
        now = self._clock()
        timeline = RequestTimeline(paced.arrival, paced.admitted, paced.admitted, paced.admitted, now)
        paced.stream.finish(SynthesisSummary(paced.request.request_id, reason, paced.num_frames, 0,
                                             np.zeros((paced.num_frames, NUM_CODEBOOKS), dtype=np.int64),
                                             timeline))


def run_paced_core(spec: CoreSpec, channels: list[socket.socket]) -> None:
    """The engine core's process with the stand-in engine (`EngineProcess.start`'s target)."""
    run_core(spec, channels, PacedEngine.for_core)
