"""Continuous batching for streaming TTS: which requests prefill, decode and reach the codec each step.

The engine loop alternates strictly:

    output = scheduler.schedule(now)      # decide; mutates only scheduler state
    if not output.is_empty:
        result = ...                      # the engine has the runner execute it (order: scheduler.outputs)
        events = scheduler.update(result, now)

or, pipelined, with the next step scheduled while the last one still runs:

    output = scheduler.schedule(now)              # nothing in flight
    ahead = scheduler.schedule_ahead(now)         # one step in flight; None: it declines, schedule in order
    events = scheduler.update(result, now)        # answers the oldest step in flight

A step scheduled ahead counts each request's frame in flight as made (`Request.num_frames_in_flight`):
its positions, frame indices and text checks are those of the frame after it. It never preempts (a victim's
frame could be in flight), so it declines when a decode would need a KV block only a preemption frees, or
when stalled requests hold room that waiting ones need (the next step in order makes it); and it runs with
one-frame codec chunks only, so that no chunk needs a frame still in flight. When a frame in flight ends
its request (EOS, an error, an abort), the frame the step ahead makes for it follows the end of its stream:
update() drops it with its chunk, and the engine drops its audio. KV blocks and slots freed meanwhile are
safe to hand out again, since the device runs every step's work in the order it was queued.

add(), append_text() and abort() may be called between any two of these calls, including while the
runner executes a step, but from the engine loop's thread only: the scheduler takes no locks.
When an output is empty the loop should sleep until add/append_text/abort is called or until
`next_deadline()`, never poll.

One schedule() does, in order:
  1. Deadlines and aborts. Requests whose deadline has passed are aborted (reason ABORTED), and
     every aborted request releases its KV blocks and slot now, not in abort(), because abort() may
     run while the runner still uses them. Finished requests whose final codec chunk ran last step
     release their slot. All of these are reported in `freed`.
  2. Decodes. Every admitted request whose next frame has its text (or whose text input is closed)
     and whose reader keeps up (see set_output_paused) is decoded, oldest admission first, up to
     max_running; the rest are PARKED and keep their KV and slot. A decode that crosses a block
     boundary takes one more block. When none is free the scheduler preempts: parked requests first
     (they are idle, so preempting them stalls no audio), then the most recently admitted decoding
     request, and as a last resort the request itself. A preempted request frees its blocks and
     slot, keeps its frames and waits at the front of the queue; it is resumed by prefilling prompt
     + frames. "Most recently admitted" means by first admission, so a resumed request keeps its
     seniority and is not the next victim again.
  3. Admission, only in a step that preempted nothing (preempting to make room and then filling
     the room with new work would thrash). Waiting requests are taken in order, preempted ones
     first (oldest admission first), then new ones in add() order, while the step's prefill
     positions stay within max_prefill_positions_per_step (the first admission of a step is exempt,
     so a long prompt cannot starve), a slot is free, KV for the prefill plus one decode position
     can be allocated, and the batch stays within max_running. When the slot or the KV is missing,
     stalled requests (PARKED because their text has run dry or their reader has fallen behind, not
     for batch room) are preempted for it, newest admission first: capacity follows progress, so
     clients that stall cannot lock others out. They resume, recomputed, once they can go on. The
     first request that does not fit stops admission: skipping ahead to smaller requests would
     starve large ones. The one exception
     is a resumed request whose next text token has not arrived or whose reader is behind: it is not
     blocked by capacity, so it keeps its place and the requests behind it may go.
  4. Deadline protection. Prefills make a step slower, and a slower step delivers less audio per
     second to every running stream. When any decodable request's playback slack (audio seconds
     delivered minus seconds since its first audio) is below min_playback_slack_s, the step's
     prefill budget shrinks to max_prefill_positions_at_risk (its first admission still exempt).
     The policy favours time-to-first-audio for new requests while streams are healthy and
     playback deadlines for running streams when one is at risk; new arrivals still get in, a
     small prefill's worth per step, so they are slowed, never starved. Streams parked for lack
     of text or for a slow reader are not counted: more GPU time would not help them. A stream's slack starts at one
     small chunk of audio, so every new stream counts as at risk for its first few steps; that is
     intended, since the start of playback is when an underrun is most likely. The budget is in
     positions, not requests, because a burst of short streaming prompts costs little: admitting
     them one per step would leave the batch, and so the throughput, small for a long time.
  5. Codec chunks. Each admitted request whose frames not yet sent to the codec reach its next
     chunk size gets a chunk; each request that finished (STOPPED or LENGTH) since the last step
     gets its final chunk with whatever is left (possibly no frames: it still marks end of stream).
     A request prefilled or decoded this step whose pending frames plus the frame this step makes
     fill its next chunk gets that chunk now (`is_step_frame`): the engine decodes every chunk after
     the step's frames, in one batched call, so a frame reaches the codec in the step that made it.
     With the one-frame chunks the engine uses, that is every frame, and a new stream's first audio
     leaves at the end of its admission step. update() takes such a chunk back when the frame turned
     out to be EOS or failed; the frames before it then go out with the final chunk.

update() folds codec-chunk completion in: the chunks of the step it answers count as audio delivered
at `now`, so there is no separate call to forget. (The engine hands a step's audio out while the
next step's frames run, about one codec call after update(): a stream's slack reads that much high.)
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from scheduler.codec_chunks import chunk_size, plan_chunk_sizes
from scheduler.kv_blocks import BlockAllocator, SlotAllocator
from scheduler.outputs import (
    CodecChunk,
    DecodeItem,
    FreedItem,
    PrefillItem,
    RequestEvent,
    SchedulerOutput,
    StepResult,
)
from scheduler.request import FinishReason, Request, RequestStatus


class QueueFullError(RuntimeError):
    """The waiting queue is at max_waiting; the server answers RESOURCE_EXHAUSTED."""


class RequestTooLargeError(ValueError):
    """The request could not fit in the KV cache even if it ran alone."""


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's sizes and policy. The engine derives them (`EngineConfig.scheduler_config`), which
    is where every default lives; the sizes of the runner's memory come from the runner."""

    max_running: int  # requests decoded per step: the largest captured graph batch
    max_waiting: int  # queued requests (new and preempted) before add() refuses
    max_prefill_positions_per_step: int  # a step's prefill budget; its first admission is exempt
    block_size: int  # KV positions per block
    num_kv_blocks: int
    codec_chunk_schedule: tuple[int, ...]
    min_playback_slack_s: float  # below this, admissions shrink to the at-risk prefill budget
    max_prefill_positions_at_risk: int  # a step's prefill budget while a stream is at risk
    frame_duration_s: float  # audio seconds per frame (the 12 Hz codec: 0.08)
    # Runner rows; more than max_running lets parked requests keep state without shrinking the
    # decode batch. None means max_running.
    max_slots: int | None = None
    # The runner's block-table width, in positions; None means only the whole cache limits a request.
    max_positions_per_request: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_running", "max_waiting", "max_prefill_positions_per_step", "block_size",
                     "num_kv_blocks", "max_prefill_positions_at_risk"):
            if not _is_positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not (self.codec_chunk_schedule and all(map(_is_positive_int, self.codec_chunk_schedule))):
            raise ValueError(f"codec_chunk_schedule must be positive ints, got {self.codec_chunk_schedule!r}")
        if not math.isfinite(self.min_playback_slack_s):
            raise ValueError(f"min_playback_slack_s must be finite, got {self.min_playback_slack_s}")
        if not (math.isfinite(self.frame_duration_s) and self.frame_duration_s > 0):
            raise ValueError(f"frame_duration_s must be > 0, got {self.frame_duration_s}")
        if self.max_slots is not None and not (_is_positive_int(self.max_slots)
                                               and self.max_slots >= self.max_running):
            raise ValueError(f"max_slots must be an int >= max_running ({self.max_running}), "
                             f"got {self.max_slots!r}")
        max_positions = self.max_positions_per_request
        if max_positions is not None and not _is_positive_int(max_positions):
            raise ValueError(f"max_positions_per_request must be a positive int, got {max_positions!r}")

    @property
    def num_slots(self) -> int:
        return self.max_running if self.max_slots is None else self.max_slots


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._blocks = BlockAllocator(config.num_kv_blocks, config.block_size)
        self._slots = SlotAllocator(config.num_slots)
        self._requests: dict[str, Request] = {}
        self._preempted: list[Request] = []  # WAITING after a preemption, by admission order
        self._waiting: deque[Request] = deque()  # WAITING, never admitted, in add() order
        self._admitted: list[Request] = []  # RUNNING or PARKED, by admission order
        self._finished: list[Request] = []  # FINISHED, still holding a slot
        self._abort_reasons: dict[str, FinishReason] = {}
        # Steps scheduled and not yet answered by update(), oldest first: one, or two with a step scheduled ahead.
        self._in_flight: deque[SchedulerOutput] = deque()
        # A step scheduled ahead found capacity held by stalled requests, which only a step scheduled in order
        # may preempt: the next schedule_ahead() declines, so that the engine schedules in order.
        self._needs_step_in_order = False
        self._num_admissions = 0
        self.num_preemptions_total = 0

    # Gauges and lookups for the server and the metrics layer.

    @property
    def num_waiting(self) -> int:
        return len(self._preempted) + len(self._waiting)

    @property
    def num_running(self) -> int:
        return sum(request.status is RequestStatus.RUNNING for request in self._admitted)

    @property
    def num_parked(self) -> int:
        return sum(request.status is RequestStatus.PARKED for request in self._admitted)

    @property
    def num_kv_blocks_used(self) -> int:
        return self._blocks.num_used_blocks

    @property
    def num_kv_blocks_total(self) -> int:
        return self._blocks.num_blocks

    @property
    def num_slots_used(self) -> int:
        return self._slots.num_used_slots

    @property
    def requests(self) -> Mapping[str, Request]:
        """Every request not yet freed, by id. Read-only for callers."""
        return MappingProxyType(self._requests)

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def next_deadline(self) -> float | None:
        """The earliest deadline among live requests: when an idle engine loop must schedule again."""
        deadlines = [request.deadline for request in self._requests.values()
                     if request.deadline is not None and not request.is_finished
                     and request.request_id not in self._abort_reasons]
        return min(deadlines, default=None)

    # Calls from the server.

    def add(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise ValueError(f"request {request.request_id!r} is already scheduled")
        if request.status is not RequestStatus.WAITING or request.admission_order is not None:
            raise ValueError(f"request {request.request_id!r} was scheduled before; make a new one")
        num_blocks_needed = self._blocks.blocks_needed(request.max_kv_positions, 0)
        if num_blocks_needed > self._blocks.num_blocks:
            raise RequestTooLargeError(
                f"request {request.request_id!r} needs {num_blocks_needed} KV blocks "
                f"({request.max_kv_positions} positions), the cache has {self._blocks.num_blocks}")
        max_positions = self.config.max_positions_per_request
        if max_positions is not None and request.max_kv_positions > max_positions:
            raise RequestTooLargeError(
                f"request {request.request_id!r} needs {request.max_kv_positions} positions, "
                f"a request may hold {max_positions}")
        num_waiting = self._num_waiting_to_run()
        if num_waiting >= self.config.max_waiting:
            raise QueueFullError(f"{num_waiting} requests are already waiting")
        self._requests[request.request_id] = request
        self._waiting.append(request)

    def _num_waiting_to_run(self) -> int:
        """Requests waiting for capacity. Not counted: those already aborted (they leave at the next schedule(),
        and clients that give up fast must not fill the queue with requests nobody waits for), and preempted
        ones that could not run anyway (their text has run dry or their reader is behind: they wait for their
        client, not for room, and clients that stall must not fill the queue either)."""
        aborted = self._abort_reasons
        return (sum(request.is_ready_to_decode and request.request_id not in aborted for request in self._preempted)
                + sum(request.request_id not in aborted for request in self._waiting))

    def append_text(self, request_id: str, num_tokens: int, is_closed: bool = False) -> bool:
        """Record newly arrived trailing text tokens. Returns False when the request is gone or done."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        request = self._requests.get(request_id)
        if request is None or request.is_finished or request_id in self._abort_reasons:
            return False
        if request.is_text_closed and num_tokens:
            raise ValueError(f"request {request_id!r}: text arrived after its input was closed")
        request.num_text_tokens += num_tokens
        request.is_text_closed = request.is_text_closed or is_closed
        # schedule() has the final word (the batch may be full); this keeps the gauges current.
        if request.status is RequestStatus.PARKED and request.is_ready_to_decode:
            request.status = RequestStatus.RUNNING
        return True

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        """Pause a request whose reader has fallen behind (it keeps its KV and slot, parked), or resume it.
        Frames already made still reach the codec. Unknown or finished ids are ignored."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return
        request.is_output_paused = is_paused
        if request.status is RequestStatus.PARKED and request.is_ready_to_decode:
            request.status = RequestStatus.RUNNING

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORTED) -> None:
        """Mark a request for removal at the next schedule(); unknown or finished ids are ignored."""
        if reason not in (FinishReason.ABORTED, FinishReason.ERROR):
            raise ValueError(f"abort reason must be ABORTED or ERROR, got {reason}")
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return
        self._abort_reasons.setdefault(request_id, reason)

    # The engine step.

    def schedule(self, now: float) -> SchedulerOutput:
        if self._in_flight:
            raise RuntimeError("schedule() called again before update() answered the previous step")
        self._needs_step_in_order = False
        return self._schedule(now, is_ahead=False)

    def schedule_ahead(self, now: float) -> SchedulerOutput | None:
        """The next step while the last one still runs (update() not yet called for it), as if every frame in
        flight were made: the engine queues it on the device before the last step's frames are back, so that
        the device never waits for the host between steps. update() then answers the steps in order; a frame
        made after its request ended (its frame in flight was EOS) is dropped there, with its codec chunk.

        Such a step never preempts: its victims' frames could be in flight. None (nothing changed, schedule
        in order once the last step is answered) when a decode would need a preemption for its KV block, when
        stalled requests hold capacity that waiting ones need, or when chunks are longer than one frame (a
        longer chunk could need a frame still in flight)."""
        if len(self._in_flight) != 1:
            raise RuntimeError("schedule_ahead() needs exactly one step in flight")
        if (self.config.codec_chunk_schedule != (1,) or self._needs_step_in_order
                or not self._has_blocks_for_decodes()):
            return None
        return self._schedule(now, is_ahead=True)

    def _schedule(self, now: float, is_ahead: bool) -> SchedulerOutput:
        self._expire_deadlines(now)
        freed = self._release_aborted()
        freed += self._release_finished()
        decodes, preempted = self._schedule_decodes()
        assert not (is_ahead and preempted), "a step scheduled ahead found KV blocks it had checked for missing"
        freed += preempted
        is_at_risk = self._is_playback_at_risk(now)
        prefills: list[PrefillItem] = []
        if not preempted:
            prefills, preempted = self._admit(now, num_decodes=len(decodes), is_at_risk=is_at_risk,
                                              may_preempt=not is_ahead)
            freed += preempted
        codec_chunks = self._plan_codec_chunks()
        codec_chunks += self._plan_step_frame_chunks((*decodes, *prefills))
        output = SchedulerOutput(
            prefills=tuple(prefills),
            decodes=tuple(decodes),
            codec_chunks=tuple(codec_chunks),
            freed=tuple(freed),
            preempted=tuple(item.request_id for item in preempted),
            num_waiting=self.num_waiting,
            num_running=len(decodes) + len(prefills),
            num_parked=self.num_parked,
        )
        if not output.is_empty:
            for item in (*output.prefills, *output.decodes):
                self._requests[item.request_id].num_frames_in_flight += 1
            self._in_flight.append(output)
        return output

    def _has_blocks_for_decodes(self) -> bool:
        """Whether the free KV blocks cover every block the next decodes could need, so that none preempts."""
        num_needed = num_decodes = 0
        for request in self._admitted:
            if num_decodes == self.config.max_running:
                break
            if self._is_decodable(request):
                num_decodes += 1
                num_needed += self._blocks.blocks_needed(request.num_positions_for_next_decode,
                                                         len(request.block_ids))
        return self._blocks.can_allocate(num_needed)

    def update(self, result: StepResult, now: float) -> list[RequestEvent]:
        """Answer the oldest step in flight."""
        if not self._in_flight:
            raise RuntimeError("update() called without a scheduled, non-empty step")
        output = self._in_flight[0]
        result.check_answers(output)
        self._in_flight.popleft()
        events: list[RequestEvent] = []
        failed_ids: set[str] = set()
        step_frame_ids = {chunk.request_id: chunk.num_frames for chunk in output.codec_chunks if chunk.is_step_frame}
        scheduled_ids = output.scheduled_request_ids
        chunks_taken_back: set[str] = set()
        for outcome in result.outcomes:
            request = self._requests.get(outcome.request_id)
            # An abort that arrived mid-step wins: the request is released at the next schedule().
            if request is None or outcome.request_id in self._abort_reasons:
                continue
            if outcome.request_id in scheduled_ids:
                if request.is_finished:
                    # Scheduled ahead while its frame before was in flight, and that frame ended it: this frame
                    # follows the end of its stream. Its chunk was taken back when the request ended.
                    chunks_taken_back.add(request.request_id)
                    continue
                request.num_frames_in_flight -= 1
            was_finished = request.is_finished
            num_frames_before = request.num_frames
            if outcome.error is not None:
                self._fail(request, outcome.error)
                failed_ids.add(request.request_id)
            elif outcome.is_eos:
                self._finish(request, FinishReason.STOPPED)
            else:
                request.num_frames += 1
                if request.num_frames >= request.max_frames:
                    self._finish(request, FinishReason.LENGTH)
            is_new_frame = request.num_frames > num_frames_before
            if request.request_id in step_frame_ids and not is_new_frame:
                # The step made EOS or failed: its chunk lacks its last frame. Any frames before it go out
                # with the final chunk.
                request.num_codec_frames -= step_frame_ids[request.request_id]
                request.num_codec_chunks -= 1
                chunks_taken_back.add(request.request_id)
            if request.is_finished and not was_finished:
                self._take_back_steps_ahead(request)
            events.append(RequestEvent(request.request_id, request.num_frames, is_new_frame=is_new_frame,
                                       finish_reason=request.finish_reason, error=request.error))
        for chunk in output.codec_chunks:
            request = self._requests.get(chunk.request_id)
            if request is not None and chunk.is_final:
                request.is_final_chunk_answered = True
            if (request is None or chunk.request_id in failed_ids or chunk.request_id in self._abort_reasons
                    or chunk.request_id in chunks_taken_back):
                continue
            request.num_audio_frames += chunk.num_frames
            if request.first_audio_time is None and chunk.num_frames > 0:
                request.first_audio_time = now
        return events

    def _take_back_steps_ahead(self, request: Request) -> None:
        """A request that just ended has no more frames: the steps scheduled ahead for it make none, and their
        chunks for it decode nothing it will hear."""
        for output in self._in_flight:
            for chunk in output.codec_chunks:
                if chunk.request_id == request.request_id and chunk.is_step_frame:
                    request.num_codec_frames -= chunk.num_frames
                    request.num_codec_chunks -= 1
        request.num_frames_in_flight = 0

    # Step 1: releases.

    def _expire_deadlines(self, now: float) -> None:
        for request in self._requests.values():
            if request.deadline is not None and now >= request.deadline and not request.is_finished:
                self._abort_reasons.setdefault(request.request_id, FinishReason.ABORTED)

    def _release_aborted(self) -> list[FreedItem]:
        freed = [self._release(self._requests[request_id], reason)
                 for request_id, reason in self._abort_reasons.items()]
        self._abort_reasons.clear()
        return freed

    def _release_finished(self) -> list[FreedItem]:
        # A STOPPED/LENGTH request keeps its slot (the codec state lives there) until its final
        # chunk has run: the step that held it has been answered.
        done = [request for request in self._finished
                if request.finish_reason is FinishReason.ERROR or request.is_final_chunk_answered]
        return [self._release(request, request.finish_reason) for request in done]

    def _release(self, request: Request, reason: FinishReason | None) -> FreedItem:
        slot = request.slot
        self._free_resources(request)
        if request in self._preempted:
            self._preempted.remove(request)
        elif request.status is RequestStatus.WAITING:
            self._waiting.remove(request)
        elif request.is_finished:
            self._finished.remove(request)
        else:
            self._admitted.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self._requests[request.request_id]
        return FreedItem(request.request_id, slot, reason)

    def _free_resources(self, request: Request) -> None:
        if request.block_ids:
            self._blocks.free(request.block_ids)
            request.block_ids = []
        if request.slot is not None:
            self._slots.free(request.slot)
            request.slot = None

    # Step 2: decodes, block growth, preemption.

    def _schedule_decodes(self) -> tuple[list[DecodeItem], list[FreedItem]]:
        ready: deque[Request] = deque()
        parked: list[Request] = []
        for request in self._admitted:
            if self._is_decodable(request) and len(ready) < self.config.max_running:
                ready.append(request)
            else:
                request.status = RequestStatus.PARKED
                parked.append(request)
        decodes: list[DecodeItem] = []
        preempted: list[FreedItem] = []
        while ready:
            request = ready.popleft()
            num_new_blocks = self._blocks.blocks_needed(request.num_positions_for_next_decode,
                                                        len(request.block_ids))
            if num_new_blocks:  # most decodes stay within their last block
                while not self._blocks.can_allocate(num_new_blocks) and (parked or ready):
                    # Lists are in admission order, so pop() takes the newest.
                    victim = parked.pop() if parked else ready.pop()
                    preempted.append(self._preempt(victim))
                if not self._blocks.can_allocate(num_new_blocks):
                    preempted.append(self._preempt(request))
                    continue
                request.block_ids.extend(self._blocks.allocate(num_new_blocks))
            request.status = RequestStatus.RUNNING
            decodes.append(DecodeItem(request.request_id, _slot_of(request), tuple(request.block_ids),
                                      position=request.num_positions_for_next_decode - 1,
                                      frame_index=request.next_frame_index))
        return decodes, preempted

    @staticmethod
    def _is_decodable(request: Request) -> bool:
        """Ready, and not at its last frame already (one in flight may be it)."""
        return request.is_ready_to_decode and request.next_frame_index < request.max_frames

    def _preempt(self, request: Request) -> FreedItem:
        slot = request.slot
        self._free_resources(request)
        self._admitted.remove(request)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        bisect.insort(self._preempted, request, key=_admission_order)
        return FreedItem(request.request_id, slot, None)

    # Steps 3 and 4: admission under the prefill budget and deadline protection.

    def _admit(self, now: float, num_decodes: int, is_at_risk: bool,
               may_preempt: bool = True) -> tuple[list[PrefillItem], list[FreedItem]]:
        """This step's admissions, and the stalled requests preempted to make room for them (none unless
        `may_preempt`: then the next step is to be scheduled in order, where it may)."""
        max_positions = self.config.max_prefill_positions_per_step
        if is_at_risk:
            max_positions = min(max_positions, self.config.max_prefill_positions_at_risk)
        prefills: list[PrefillItem] = []
        preempted: list[FreedItem] = []
        num_positions_this_step = 0
        for request in [*self._preempted, *self._waiting]:
            if num_decodes + len(prefills) >= self.config.max_running:
                break
            if not request.is_ready_to_decode:
                continue
            num_positions = request.num_prefill_positions
            if prefills and num_positions_this_step + num_positions > max_positions:
                break
            # One position past the prefill, so the first decode after it needs no new block.
            num_blocks = self._blocks.blocks_needed(min(num_positions + 1, request.max_kv_positions), 0)
            if may_preempt:
                preempted += self._make_room(num_blocks)
            if not (self._slots.can_allocate() and self._blocks.can_allocate(num_blocks)):
                self._needs_step_in_order = not may_preempt and any(
                    not item.is_ready_to_decode for item in self._admitted)
                break
            prefills.append(self._admit_one(request, num_blocks, now))
            num_positions_this_step += num_positions
        return prefills, preempted

    def _make_room(self, num_blocks: int) -> list[FreedItem]:
        """Preempt stalled requests (waiting for text or for their reader), newest admission first, until a
        slot and `num_blocks` are free or none is left: a request that cannot go on gives its capacity to one
        that can, and takes it back, recomputed, once it can go on."""
        preempted: list[FreedItem] = []
        if self._slots.can_allocate() and self._blocks.can_allocate(num_blocks):
            return preempted
        stalled = [request for request in self._admitted if not request.is_ready_to_decode]
        # Only when giving everything back would be enough: a preemption that admits nobody costs a recompute.
        num_free_slots = self._slots.num_free_slots + len(stalled)
        num_free_blocks = self._blocks.num_free_blocks + sum(len(request.block_ids) for request in stalled)
        if num_free_slots < 1 or num_free_blocks < num_blocks:
            return preempted
        while not (self._slots.can_allocate() and self._blocks.can_allocate(num_blocks)):
            preempted.append(self._preempt(stalled.pop()))
        return preempted

    def _is_playback_at_risk(self, now: float) -> bool:
        for request in self._admitted:
            if not request.is_ready_to_decode:
                continue
            slack = request.playback_slack_s(now, self.config.frame_duration_s)
            if slack is not None and slack < self.config.min_playback_slack_s:
                return True
        return False

    def _admit_one(self, request: Request, num_blocks: int, now: float) -> PrefillItem:
        if request in self._preempted:
            self._preempted.remove(request)
        else:
            self._waiting.remove(request)
        request.slot = self._slots.allocate()
        request.block_ids = self._blocks.allocate(num_blocks)
        if request.admission_order is None:
            request.admission_order = self._num_admissions
            self._num_admissions += 1
            request.admitted_time = now
        request.status = RequestStatus.RUNNING
        bisect.insort(self._admitted, request, key=_admission_order)
        return PrefillItem(request.request_id, request.slot, tuple(request.block_ids),
                           num_positions=request.num_prefill_positions,
                           num_resumed_frames=request.num_frames,
                           num_codec_frames=request.num_codec_frames)

    # Step 5: codec chunks.

    def _plan_codec_chunks(self) -> list[CodecChunk]:
        chunks: list[CodecChunk] = []
        for request in (*self._admitted, *self._finished):
            if request.is_finished and (request.finish_reason is FinishReason.ERROR
                                        or request.is_final_chunk_scheduled):
                continue
            if not request.is_finished and request.num_frames_pending_codec == 0:
                continue  # nothing to cut (with one-frame chunks, every running stream every step)
            sizes = plan_chunk_sizes(self.config.codec_chunk_schedule, request.num_codec_chunks,
                                     request.num_frames_pending_codec, is_end_of_stream=request.is_finished)
            for index, num_frames in enumerate(sizes):
                is_final = request.is_finished and index == len(sizes) - 1
                chunks.append(CodecChunk(request.request_id, _slot_of(request), request.num_codec_frames,
                                         num_frames, is_final))
                request.num_codec_frames += num_frames
                request.num_codec_chunks += 1
            request.is_final_chunk_scheduled = request.is_finished
        return chunks

    def _plan_step_frame_chunks(self, items: tuple[DecodeItem | PrefillItem, ...]) -> list[CodecChunk]:
        """A chunk ending with the frame this step makes, for each scheduled request whose pending frames and
        that frame fill its next chunk."""
        chunks: list[CodecChunk] = []
        for item in items:
            request = self._requests[item.request_id]
            num_frames = request.num_frames_pending_codec + 1
            if chunk_size(self.config.codec_chunk_schedule, request.num_codec_chunks) != num_frames:
                continue
            chunks.append(CodecChunk(request.request_id, item.slot, first_frame=request.num_codec_frames,
                                     num_frames=num_frames, is_final=False, is_step_frame=True))
            request.num_codec_frames += num_frames
            request.num_codec_chunks += 1
        return chunks

    # update() helpers.

    def _finish(self, request: Request, reason: FinishReason) -> None:
        # The step is over, so the talker KV can go now; the slot stays for the codec.
        if request.block_ids:
            self._blocks.free(request.block_ids)
            request.block_ids = []
        self._admitted.remove(request)
        self._finished.append(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def _fail(self, request: Request, message: str) -> None:
        if request.is_finished:
            request.finish_reason = FinishReason.ERROR  # its final chunk failed
        else:
            self._finish(request, FinishReason.ERROR)
        request.error = message


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _admission_order(request: Request) -> int:
    assert request.admission_order is not None, "only admitted requests are ordered"
    return request.admission_order


def _slot_of(request: Request) -> int:
    assert request.slot is not None, f"{request.request_id} holds no slot"
    return request.slot

