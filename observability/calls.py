"""What one call did, gathered while it runs, into the RequestObservation the metrics take."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import pairwise

from observability.metrics import RequestObservation
from observability.playback import ChunkArrival, underruns


@dataclass
class CallRecord:
    rpc: str
    started: float = field(default_factory=time.monotonic)
    finish_reason: str = ""
    queue_s: float | None = None
    time_to_first_audio_s: float | None = None  # the engine's: arrival to the first chunk in the stream
    num_frames: int = 0
    num_input_tokens: int = 0
    audio_s: float = 0.0
    chunks_sent: list[ChunkArrival] = field(default_factory=list)

    def add_chunk(self, offset_s: float) -> None:
        self.chunks_sent.append(ChunkArrival(time.monotonic(), offset_s))

    def finish(self, finish_reason: str, queue_s: float | None, time_to_first_audio_s: float | None,
               num_frames: int, num_input_tokens: int, audio_s: float) -> None:
        self.finish_reason, self.queue_s, self.time_to_first_audio_s = finish_reason, queue_s, time_to_first_audio_s
        self.num_frames, self.num_input_tokens, self.audio_s = num_frames, num_input_tokens, audio_s

    def observation(self, status: str) -> RequestObservation:
        sent = [chunk.arrival_s for chunk in self.chunks_sent]
        return RequestObservation(
            rpc=self.rpc, status=status, finish_reason=self.finish_reason, queue_s=self.queue_s,
            time_to_first_audio_s=self.time_to_first_audio_s, end_to_end_s=time.monotonic() - self.started,
            audio_s=self.audio_s, num_frames=self.num_frames, num_input_tokens=self.num_input_tokens,
            chunk_gaps_s=tuple(later - earlier for earlier, later in pairwise(sent)),
            # Playback from the first chunk; None for calls that streamed no chunks.
            underrun_s=underruns(self.chunks_sent).total_s if self.chunks_sent else None)
