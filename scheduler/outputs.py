"""The small frozen records that cross the scheduler/engine boundary each step.

schedule() -> SchedulerOutput -> the engine has it executed -> StepResult -> update() -> RequestEvents.

The engine executes one SchedulerOutput in this order:
    1. end the requests of the `freed` items that were aborted or failed (their slots may be reused by a
       prefill below: a prefill assigns its slot's decoding state afresh),
    2. restart the codec stream of every prefill's slot,
    3. run `prefills` then `decodes` in one runner call (each yields one frame, or EOS),
    4. run the `codec_chunks`, batched across requests (a request's own chunks are listed in frame order and
       decoded in that order); an `is_step_frame` chunk ends with the frame its request's prefill or decode
       made in step 3 and is skipped when that frame is EOS or failed.
Every chunk runs after the step's frames, so that a frame, a new stream's first one included, reaches the
codec in the step that made it, in the step's one batched codec call. The engine hands the chunks' audio to
the listeners while the next step's frames run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scheduler.request import FinishReason


@dataclass(frozen=True, slots=True)
class PrefillItem:
    request_id: str
    slot: int
    block_ids: tuple[int, ...]
    num_positions: int  # num_prompt_positions + num_resumed_frames
    # > 0 after a preemption: the runner re-feeds these frames' codes (with their text tokens)
    # after the prompt, and the prefill yields frame `num_resumed_frames`.
    num_resumed_frames: int
    # Frames the codec already turned into audio; a resumed request's codec state must be
    # rebuilt up to here because its old slot (and the state in it) is gone.
    num_codec_frames: int


@dataclass(frozen=True, slots=True)
class DecodeItem:
    request_id: str
    slot: int
    block_ids: tuple[int, ...]
    position: int  # KV position this frame's input (previous frame + its text token) is written at
    frame_index: int  # the frame this decode produces


@dataclass(frozen=True, slots=True)
class CodecChunk:
    request_id: str
    slot: int
    first_frame: int
    num_frames: int  # 0 only for a final chunk whose request had no frames left to decode
    is_final: bool  # the last chunk of the stream: flush the codec, close the audio
    # The chunk ends with the frame this step's prefill or decode makes.
    is_step_frame: bool = False


@dataclass(frozen=True, slots=True)
class FreedItem:
    request_id: str
    slot: int | None  # None: the request never held a slot (aborted while waiting)
    reason: FinishReason | None  # None: preempted; it waits again and will be re-prefilled


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    prefills: tuple[PrefillItem, ...]
    decodes: tuple[DecodeItem, ...]
    codec_chunks: tuple[CodecChunk, ...]
    freed: tuple[FreedItem, ...]
    preempted: tuple[str, ...]
    num_waiting: int
    num_running: int  # decoded or prefilled this step
    num_parked: int

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner to do; the caller should not call update() for it."""
        return not (self.prefills or self.decodes or self.codec_chunks or self.freed)

    @property
    def scheduled_request_ids(self) -> frozenset[str]:
        """Requests that produce a frame (or EOS) this step and must appear in the StepResult."""
        return frozenset(item.request_id for item in (*self.prefills, *self.decodes))


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request's step produced: a frame, EOS (no frame), or an error."""

    request_id: str
    is_eos: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        if self.is_eos and self.error is not None:
            raise ValueError(f"{self.request_id}: an outcome is either EOS or an error, not both")


@dataclass(frozen=True, slots=True)
class StepResult:
    """Every prefilled/decoded request's outcome; a request that only ran codec chunks may report an error."""

    outcomes: tuple[RequestOutcome, ...]

    @classmethod
    def for_output(cls, output: SchedulerOutput, eos_ids: Collection[str] = (),
                   errors: Mapping[str, str] | None = None) -> StepResult:
        """Outcomes for `output`: a frame for every scheduled request unless it is in eos_ids or errors."""
        errors = errors or {}
        scheduled = sorted(output.scheduled_request_ids)
        codec_only_errors = sorted(set(errors) - set(scheduled))
        return cls(tuple(
            RequestOutcome(request_id, is_eos=request_id in eos_ids, error=errors.get(request_id))
            for request_id in (*scheduled, *codec_only_errors)))

    def check_answers(self, output: SchedulerOutput) -> None:
        """Raise ValueError unless this is a complete answer to `output`: a runner bug otherwise
        leaves a request silently stuck at the same frame."""
        reported = [outcome.request_id for outcome in self.outcomes]
        if len(set(reported)) != len(reported):
            raise ValueError("a request appears twice in the step result")
        scheduled = output.scheduled_request_ids
        missing = scheduled - set(reported)
        if missing:
            raise ValueError(f"step result lacks scheduled requests: {sorted(missing)}")
        codec_only_ids = {chunk.request_id for chunk in output.codec_chunks} - scheduled
        for outcome in self.outcomes:
            if outcome.request_id in scheduled:
                continue
            if outcome.request_id not in codec_only_ids:
                raise ValueError(f"step result reports {outcome.request_id!r}, which was not scheduled")
            if outcome.error is None:
                raise ValueError(f"{outcome.request_id!r} only ran codec chunks: it may report an error only")


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """What update() learned about one request, for the server to act on."""

    request_id: str
    num_frames: int  # frames generated so far
    is_new_frame: bool
    finish_reason: FinishReason | None
    error: str | None = None
