"""The scheduler's view of one synthesis request: sizes, text progress, frame progress, resources.

Position arithmetic (one talker KV position per frame input):
    prefill of P prompt positions             -> frame 0
    decode of frame f (f >= 1) writes its input (frame f-1 codes + trailing text token f-1)
    at position P + f - 1                     -> frame f
so before decoding frame f the request needs P + f positions of KV, and a request resumed after
preemption with n frames re-prefills P + n positions (prompt + every frame input) to get frame n.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued (new or preempted); holds no KV and no slot
    RUNNING = "running"  # admitted and decoded this step
    PARKED = "parked"  # admitted (keeps KV and slot) but not decoded: waits for text, its reader or batch room
    FINISHED = "finished"  # no more frames; may still hold its slot until its last codec chunk has run


class FinishReason(enum.Enum):
    STOPPED = "stopped"  # the model produced EOS
    LENGTH = "length"  # max_frames reached
    ABORTED = "aborted"  # cancelled by the caller or its deadline passed
    ERROR = "error"  # the runner failed this request


@dataclass(eq=False)
class Request:
    """Created by the server and handed to Scheduler.add(); afterwards only the scheduler mutates it."""

    request_id: str
    num_prompt_positions: int
    max_frames: int
    arrival_time: float
    deadline: float | None = None  # absolute time, same clock as schedule(now)
    num_text_tokens: int = 0  # trailing text tokens available so far (not counting the prompt)
    is_text_closed: bool = False  # no more text will come; the model feeds padding from here on
    is_output_paused: bool = False  # its reader has fallen behind: no more frames until it catches up

    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)
    num_frames: int = field(default=0, init=False)
    # Frames scheduled and not yet answered by update(): 1 while a step scheduled ahead runs before the step
    # before it has been answered (Scheduler.schedule_ahead), 0 otherwise between steps.
    num_frames_in_flight: int = field(default=0, init=False)
    num_codec_frames: int = field(default=0, init=False)  # frames handed to the codec in chunks
    num_codec_chunks: int = field(default=0, init=False)
    num_audio_frames: int = field(default=0, init=False)  # frames whose audio the runner has delivered
    is_final_chunk_scheduled: bool = field(default=False, init=False)
    is_final_chunk_answered: bool = field(default=False, init=False)  # the step holding it has been updated
    block_ids: list[int] = field(default_factory=list, init=False)
    slot: int | None = field(default=None, init=False)
    admitted_time: float | None = field(default=None, init=False)  # first admission
    first_audio_time: float | None = field(default=None, init=False)
    num_preemptions: int = field(default=0, init=False)
    # Fixed at first admission; "newest" for preemption means the largest value, so a resumed
    # request keeps its seniority instead of becoming the next victim again.
    admission_order: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        for name, minimum in (("num_prompt_positions", 1), ("max_frames", 1), ("num_text_tokens", 0)):
            value = getattr(self, name)
            if value < minimum:
                raise ValueError(f"{self.request_id}: {name} must be >= {minimum}, got {value}")

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def next_frame_index(self) -> int:
        """The frame the request's next prefill or decode makes, counting the one in flight."""
        return self.num_frames + self.num_frames_in_flight

    @property
    def has_text_for_next_frame(self) -> bool:
        # Frame 0 comes from the prefill, which needs only the prompt; frame f needs text token f-1.
        index = self.next_frame_index
        return index == 0 or self.is_text_closed or self.num_text_tokens >= index

    @property
    def is_ready_to_decode(self) -> bool:
        """It has the text for its next frame and a reader keeping up with its audio."""
        return self.has_text_for_next_frame and not self.is_output_paused

    @property
    def num_prefill_positions(self) -> int:
        """Positions an admission prefills: the prompt, plus every frame input when resuming."""
        return self.num_prompt_positions + self.num_frames

    @property
    def num_positions_for_next_decode(self) -> int:
        """KV positions that must exist once frame `next_frame_index` has written its input."""
        return self.num_prompt_positions + self.next_frame_index

    @property
    def max_kv_positions(self) -> int:
        """KV positions the request can ever occupy: the last frame's codes are never fed back."""
        return self.num_prompt_positions + self.max_frames - 1

    @property
    def num_frames_pending_codec(self) -> int:
        """Frames made (or in flight, whose chunk was planned with them) not yet handed to the codec."""
        return self.next_frame_index - self.num_codec_frames

    @property
    def queue_time_s(self) -> float | None:
        """Seconds from arrival to first admission; None until admitted."""
        if self.admitted_time is None:
            return None
        return self.admitted_time - self.arrival_time

    def playback_slack_s(self, now: float, frame_duration_s: float) -> float | None:
        """Audio the client holds beyond what it has played, if playback started at first audio."""
        if self.first_audio_time is None:
            return None
        return self.num_audio_frames * frame_duration_s - (now - self.first_audio_time)
