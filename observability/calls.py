"""What one call did, gathered while it runs: the record that metrics, traces and logs read at its end."""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from itertools import pairwise

from observability.playback import ChunkArrival, stalls


def elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


_ENDED_BY_TIME_OR_CLIENT = frozenset({"CANCELLED", "DEADLINE_EXCEEDED"})


@dataclass(frozen=True)
class RequestTimeline:
    """When a request reached each stage inside the engine, on the engine's clock (time.monotonic in the
    server); None for a stage it never reached. `arrival` is the submit, or for open text the moment its
    prompt could first run."""

    arrival: float
    admitted: float | None  # first admission to a decode slot
    first_frame: float | None  # its prefill produced frame 0
    first_audio: float | None  # its first chunk reached the stream
    finished: float

    @property
    def queue_s(self) -> float | None:
        return elapsed(self.arrival, self.admitted)

    @property
    def prefill_s(self) -> float | None:
        """First admission to frame 0: the prefill and the step that carried it."""
        return elapsed(self.admitted, self.first_frame)

    @property
    def time_to_first_audio_s(self) -> float | None:
        return elapsed(self.arrival, self.first_audio)


@dataclass(frozen=True)
class CallResult:
    """What the engine reported when the request ended."""

    finish_reason: str  # stopped, length, aborted, error
    timeline: RequestTimeline
    num_frames: int
    num_input_tokens: int
    audio_s: float
    segment_retries: tuple[str, ...] = ()  # a long text's segments made again, by why (early_end, runaway)


@dataclass
class CallRecord:
    rpc: str
    request_id: str
    # A call through the HTTP API: its method and route ("POST /v1/audio/speech"); None for a gRPC call.
    http_route: str | None = None
    started: float = field(default_factory=time.monotonic)
    num_text_chars: int = 0
    voice_clone: tuple[float, float] | None = None  # monotonic start and end of the reference audio's encoding
    result: CallResult | None = None  # None when the call ended before the engine finished it
    is_submitted: bool = False  # the engine took the request
    first_audio_received: float | None = None  # monotonic: the request's first audio reached the server's stream
    # When each chunk left, and where it starts in the audio: float arrays, which the garbage collector does not
    # walk (a call in flight holds two objects here, not one a chunk; a full collection's pause grows with the
    # objects the calls in flight hold).
    sent_at_s: array[float] = field(default_factory=lambda: array("d"))
    sent_offset_s: array[float] = field(default_factory=lambda: array("d"))

    def finish_reason(self, status: str) -> str:
        """How the request ended, for a call that ended with `status`: stopped, length, aborted or error;
        "" for a request that never ran (refused before or at the engine's door).

        A call that ends before its request does (the client left, a deadline passed) aborts the
        request in the engine, so it is "aborted" although no summary comes back."""
        if self.result is not None:
            return self.result.finish_reason
        return "aborted" if self.is_submitted and status in _ENDED_BY_TIME_OR_CLIENT else ""

    def add_chunk(self, offset_s: float, sent_at_s: float | None = None) -> None:
        """A chunk starting `offset_s` into the audio left now (or at `sent_at_s`, monotonic)."""
        self.sent_at_s.append(time.monotonic() if sent_at_s is None else sent_at_s)
        self.sent_offset_s.append(offset_s)

    @property
    def timeline(self) -> RequestTimeline | None:
        return self.result.timeline if self.result is not None else None

    def chunk_gaps_s(self) -> list[float]:
        return [later - earlier for earlier, later in pairwise(self.sent_at_s)]

    def underrun_s(self) -> float | None:
        """How long a listener playing from the first chunk was starved, each stall once; None for calls that
        streamed no chunks."""
        if not self.sent_at_s:
            return None
        return stalls([ChunkArrival(at, offset) for at, offset in zip(self.sent_at_s, self.sent_offset_s,
                                                                      strict=True)]).total_s
