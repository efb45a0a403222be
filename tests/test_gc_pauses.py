"""The garbage collector's pauses are logged past a threshold, and start-up objects can be frozen out of its walks."""

from __future__ import annotations

import gc
import logging

import pytest

from observability.gc_pauses import freeze_startup_objects, thaw_startup_objects, watch_pauses


def messages_of_a_full_collection(min_pause_s: float, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the watcher logs while the collector walks every generation once."""
    callback = watch_pauses("test process", min_pause_s)
    try:
        with caplog.at_level(logging.WARNING, logger="observability.gc_pauses"):
            gc.collect(2)
    finally:
        gc.callbacks.remove(callback)
    return [record.getMessage() for record in caplog.records]


def test_a_collection_longer_than_the_threshold_is_logged_with_its_generation_and_process(
        caplog: pytest.LogCaptureFixture) -> None:
    messages = messages_of_a_full_collection(0.0, caplog)
    assert any("generation-2 garbage collection paused the test process" in message for message in messages)


def test_a_collection_under_the_threshold_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert messages_of_a_full_collection(60.0, caplog) == []


def test_freezing_takes_the_objects_alive_now_out_of_later_collections() -> None:
    try:
        num_frozen = freeze_startup_objects()
        assert num_frozen > 1000 and gc.get_freeze_count() == num_frozen
    finally:
        gc.unfreeze()


def test_thawing_gives_every_frozen_object_back_to_the_collector() -> None:
    try:
        freeze_startup_objects()
        thaw_startup_objects()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
