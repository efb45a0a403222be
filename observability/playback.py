"""Underruns: when each audio chunk had to be in the listener's hands, and how late it was.

One arithmetic for both sides of the wire: the server's metrics (chunks as they leave) and the load
generator (chunks as they arrive). Pure Python, so clients can use it without the server's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise


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


def continuity_underruns(chunks: list[ChunkArrival], threshold_s: float = 0.1) -> Underruns:
    """Gaps in playback longer than `threshold_s` (vLLM-Omni's definition, 100 ms by default).

    The player starts at the first chunk and, whenever it runs out of audio, pauses until the next
    chunk arrives and resumes from there: a gap is one such pause, so a chunk arriving 60 ms late
    delays the rest by 60 ms instead of making every later chunk late against the first schedule, as
    `underruns` does. Counts, sums and takes the maximum of only the gaps longer than the threshold.
    """
    gaps: list[float] = []
    playing_from = chunks[0].arrival_s if chunks else 0.0  # when the previous chunk started playing
    for previous, chunk in pairwise(chunks):
        due = playing_from + chunk.offset_s - previous.offset_s  # when the previous chunk runs out
        gaps.append(max(0.0, chunk.arrival_s - due))
        playing_from = max(due, chunk.arrival_s)
    long_gaps = [gap for gap in gaps if gap > threshold_s]
    return Underruns(len(long_gaps), sum(long_gaps), max(long_gaps, default=0.0))
