"""Underruns: when each audio chunk had to be in the listener's hands, and how late it was.

One arithmetic for both sides of the wire: the server's metrics (chunks as they leave) and the load
generator (chunks as they arrive). Pure Python, so clients can use it without the server's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkArrival:
    arrival_s: float  # when the chunk left (server) or arrived (client), on one monotonic clock
    offset_s: float  # where the chunk starts in the audio


@dataclass(frozen=True)
class Underruns:
    num_late_chunks: int
    total_s: float
    max_s: float


def underruns(chunks: list[ChunkArrival]) -> Underruns:
    """Playback starts when the first chunk arrives, with no pre-roll: the strictest reading."""
    if not chunks:
        return Underruns(0, 0.0, 0.0)
    playback_start = chunks[0].arrival_s - chunks[0].offset_s
    lateness = [max(0.0, chunk.arrival_s - (playback_start + chunk.offset_s)) for chunk in chunks[1:]]
    late = [value for value in lateness if value > 0]
    return Underruns(len(late), sum(late), max(late, default=0.0))
