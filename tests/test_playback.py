"""Underruns as a listener hears them: a player that starts at the first chunk and pauses whenever it runs out of
audio, each pause counted once."""

from __future__ import annotations

import pytest

from observability.playback import ChunkArrival, Stalls, stalls

CHUNK_S = 0.08
AHEAD_S = 0.01  # an on-time chunk arrives this long before the player needs it


def chunks_with_one_late(late_by_s: float, late_index: int = 5, num_chunks: int = 10) -> list[ChunkArrival]:
    """80 ms chunks, each arriving just before the player needs it, except chunk `late_index`, which arrives
    `late_by_s` after the one before it has played out."""
    arrivals, needed_at = [ChunkArrival(1.0, 0.0)], 1.0 + CHUNK_S
    for index in range(1, num_chunks):
        arrival = needed_at + late_by_s if index == late_index else needed_at - AHEAD_S
        arrivals.append(ChunkArrival(arrival, index * CHUNK_S))
        needed_at = max(needed_at, arrival) + CHUNK_S
    return arrivals


def test_one_late_chunk_is_one_stall_of_its_lateness_not_one_per_chunk_behind_it() -> None:
    found = stalls(chunks_with_one_late(0.5))
    assert found.count == 1
    assert found.total_s == pytest.approx(0.5) and found.max_s == pytest.approx(0.5)


def test_chunks_that_arrive_before_they_are_needed_never_stall() -> None:
    all_at_once = [ChunkArrival(1.0, index * CHUNK_S) for index in range(10)]
    assert stalls(all_at_once) == Stalls()
    assert stalls(chunks_with_one_late(-AHEAD_S)) == Stalls()


def test_audio_held_in_hand_shortens_the_stall_of_a_late_chunk() -> None:
    # Two half-second chunks at once: the third, due when both have played (t=2.0), arrives at 2.2.
    timeline = [ChunkArrival(1.0, 0.0), ChunkArrival(1.0, 0.5), ChunkArrival(2.2, 1.0)]
    assert stalls(timeline).durations_s == pytest.approx((0.2,))


def test_each_pause_is_counted_once_and_the_threshold_applies_to_each_pause() -> None:
    # Two 60 ms pauses: the last chunk comes 120 ms behind the first schedule, yet no pause tops 100 ms.
    timeline = [ChunkArrival(1.0, 0.0), ChunkArrival(1.56, 0.5), ChunkArrival(2.12, 1.0)]
    found = stalls(timeline)
    assert found.durations_s == pytest.approx((0.06, 0.06))
    assert found.total_s == pytest.approx(0.12) and found.max_s == pytest.approx(0.06)
    assert found.longer_than(0.1) == Stalls()
    assert found.longer_than(0.05).count == 2


def test_a_150_ms_pause_is_over_the_100_ms_threshold() -> None:
    timeline = [ChunkArrival(1.0, 0.0), ChunkArrival(1.65, 0.5), ChunkArrival(2.15, 1.0)]
    long_ones = stalls(timeline).longer_than(0.1)
    assert long_ones.count == 1 and long_ones.total_s == pytest.approx(0.15)


@pytest.mark.parametrize("timeline", [[], [ChunkArrival(3.0, 0.0)]])
def test_a_stream_of_at_most_one_chunk_has_no_stall(timeline: list[ChunkArrival]) -> None:
    found = stalls(timeline)
    assert (found.count, found.total_s, found.max_s) == (0, 0.0, 0.0)
