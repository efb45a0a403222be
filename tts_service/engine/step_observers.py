"""What the engine keeps alike on both sides of its door, in this process or before a core of its own: the
observers of its steps and the clock its deadlines are on."""

from __future__ import annotations

import time
from collections.abc import Callable

from observability.metrics import StepObservation


class StepObservers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # CLOCK_MONOTONIC is one clock for every process of the host: a deadline set here holds in the core too.
        self.clock = clock
        self._step_observers: list[Callable[[StepObservation], None]] = []

    def add_step_observer(self, observer: Callable[[StepObservation], None]) -> None:
        """Call `observer` on the loop after every step, with host-side numbers only."""
        self._step_observers.append(observer)

    def remove_step_observer(self, observer: Callable[[StepObservation], None]) -> None:
        self._step_observers.remove(observer)

    def deadline_in(self, seconds: float) -> float:
        """A request deadline `seconds` from now, on the engine's clock."""
        return self.clock() + seconds
