"""Time of a step's phases, for the step profiler (off unless `EngineConfig.profile_steps`).

On CUDA each mark records an event on the current stream, and the time between two marks is what the
device spent on the work queued between them. Only events the device has passed are read (a step's codec
calls are still running when the loop takes its times; they count in a later take), so profiling adds no
synchronisation. Off CUDA the work runs as it is
queued, so wall-clock marks measure it. Each mark also takes the host's clock: how long the host took to
queue a phase's work (Python, the CUDA API, and any wait for the GIL) is a separate figure from how long
the device took to run it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PhaseTimes:
    device: dict[str, float]  # seconds the device ran each phase's work
    host: dict[str, float]  # seconds the host took to queue it


@dataclass(frozen=True)
class _Span:
    phase: str
    start: object
    end: object
    host_s: float


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self._is_cuda = device.type == "cuda"
        self._spans: list[_Span] = []
        self._start: object | None = None
        self._host_start = 0.0

    def start(self) -> None:
        """Begin a span; `mark(phase)` ends it, charging what ran in between to `phase`."""
        self._start = self._now()
        self._host_start = time.perf_counter()

    def mark(self, phase: str) -> None:
        assert self._start is not None, "mark() without start()"
        end = self._now()
        host_end = time.perf_counter()
        self._spans.append(_Span(phase, self._start, end, host_end - self._host_start))
        self._start, self._host_start = end, host_end

    def take(self) -> PhaseTimes:
        """Seconds per phase of the spans the device has finished since the last take(), in the order queued;
        the rest wait for a later take()."""
        device: dict[str, float] = defaultdict(float)
        host: dict[str, float] = defaultdict(float)
        num_done = 0
        for span in self._spans:
            if self._is_cuda:
                if not span.end.query():  # type: ignore[attr-defined]
                    break
                device[span.phase] += span.start.elapsed_time(span.end) / 1e3  # type: ignore[attr-defined]
            else:
                device[span.phase] += span.end - span.start  # type: ignore[operator]
            host[span.phase] += span.host_s
            num_done += 1
        del self._spans[:num_done]
        self._start = None
        return PhaseTimes(dict(device), dict(host))

    def _now(self) -> object:
        if not self._is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
