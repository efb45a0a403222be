"""Device time of a step's phases, for the step profiler (off unless `EngineConfig.profile_steps`).

On CUDA each mark records an event on the current stream, and the time between two marks is what the
device spent on the work queued between them. Events are read only after the step's own device-to-host
copy has waited for the stream, so profiling adds no synchronisation. Off CUDA the work runs as it is
queued, so wall-clock marks measure it.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self._is_cuda = device.type == "cuda"
        self._spans: list[tuple[str, object, object]] = []
        self._start: object | None = None

    def start(self) -> None:
        """Begin a span; `mark(phase)` ends it, charging what ran in between to `phase`."""
        self._start = self._now()

    def mark(self, phase: str) -> None:
        assert self._start is not None, "mark() without start()"
        end = self._now()
        self._spans.append((phase, self._start, end))
        self._start = end

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last take(); call only once the device has finished that work."""
        totals: dict[str, float] = defaultdict(float)
        if self._is_cuda and self._spans:
            # Done already after a step's copy to the host; after a step that failed before it, wait here.
            self._spans[-1][2].synchronize()  # type: ignore[attr-defined]
        for phase, start, end in self._spans:
            if self._is_cuda:
                totals[phase] += start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
            else:
                totals[phase] += end - start  # type: ignore[operator]
        self._spans.clear()
        self._start = None
        return dict(totals)

    def _now(self) -> object:
        if not self._is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
