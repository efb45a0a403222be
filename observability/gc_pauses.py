"""Python's garbage collector, kept out of the streams' way and watched.

A full collection walks every object the process tracks. With torch and transformers loaded that is
hundreds of thousands of objects, built at start-up and never freed, and the walk stops every thread:
in the engine core, every stream's next step; in the server, every write. `freeze_startup_objects`
moves what exists after start-up out of the collector's sight (gc.freeze), so later collections walk
only what serving allocates, and `thaw_startup_objects` gives them back once serving has stopped.
`watch_pauses` logs each collection that stops the process longer than a threshold, with its
generation, so that a stall seen by listeners can be matched to one.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)
# A collection that stops a serving process this long delays every stream's next step or write by about a frame
# step (3.6-8 ms): worth a log line.
LOGGED_PAUSE_S = 0.005


def freeze_startup_objects() -> int:
    """Collect once, then exempt every object that survived from later collections; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_startup_objects() -> None:
    """Give the frozen objects back to the collector, for a process that has stopped serving. The interpreter's last
    collections at exit skip frozen objects, so those kept alive only by reference cycles would outlive it, and
    extension modules that check for leaks at exit report each one: Triton's bindings (nanobind) print some fifty
    `nanobind: leaked ...` lines on every shutdown."""
    gc.unfreeze()


def watch_pauses(process: str, min_pause_s: float = LOGGED_PAUSE_S) -> Callable[[str, dict[str, Any]], None]:
    """Log every collection in this process that takes at least `min_pause_s`. Returns the callback, which
    gc.callbacks now holds (remove it from there to stop watching)."""
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        seconds = time.perf_counter() - started[0]
        if seconds >= min_pause_s:
            logger.warning("a generation-%d garbage collection paused the %s %.1f ms (%d objects collected)",
                           info.get("generation", -1), process, seconds * 1e3, info.get("collected", 0))

    gc.callbacks.append(callback)
    return callback
