"""Underruns: the time a listener spends hearing nothing in the middle of a stream.

The listener's player starts at the first chunk with no pre-roll and, whenever it runs out of audio, pauses until
the next chunk arrives and resumes from there. Each pause is a stall, counted once: a chunk that comes 0.5 s late
delays the rest of the stream by 0.5 s, and chunks that then arrive promptly add nothing to it. One arithmetic for
both sides of the wire: the server's metrics (chunks as they leave) and the load generator (chunks as they arrive).
Pure Python, so clients can use it without the server's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True)
class ChunkArrival:
    arrival_s: float  # when the chunk left (server) or arrived (client), on one monotonic clock
    offset_s: float  # where the chunk starts in the audio


@dataclass(frozen=True)
class Stalls:
    """How long each of a stream's stalls lasted, in order."""

    durations_s: tuple[float, ...] = ()

    @property
    def count(self) -> int:
        return len(self.durations_s)

    @property
    def total_s(self) -> float:
        """The time the listener was starved: the underrun of the stream."""
        return sum(self.durations_s)

    @property
    def max_s(self) -> float:
        return max(self.durations_s, default=0.0)

    def longer_than(self, threshold_s: float) -> Stalls:
        """Only the stalls longer than `threshold_s`: with 100 ms, the gaps vLLM-Omni counts."""
        return Stalls(tuple(duration for duration in self.durations_s if duration > threshold_s))


def stalls(chunks: list[ChunkArrival]) -> Stalls:
    """The stalls of a player fed `chunks`, in arrival order."""
    durations: list[float] = []
    playing_from = chunks[0].arrival_s if chunks else 0.0  # when the previous chunk started playing
    for previous, chunk in pairwise(chunks):
        runs_out = playing_from + chunk.offset_s - previous.offset_s  # when the previous chunk has been played
        if chunk.arrival_s > runs_out:
            durations.append(chunk.arrival_s - runs_out)
        playing_from = max(runs_out, chunk.arrival_s)
    return Stalls(tuple(durations))
