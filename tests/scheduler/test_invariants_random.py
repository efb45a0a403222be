"""A seeded random workload (arrivals, text, aborts, deadlines, EOS, errors), checked every step."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import replace

import pytest

from scheduler.outputs import SchedulerOutput, StepResult
from scheduler.request import Request, RequestStatus
from scheduler.scheduler import QueueFullError, RequestTooLargeError, Scheduler, SchedulerConfig
from tests.scheduler.helpers import make_config

CONFIG = make_config(max_running=6, max_slots=8, max_waiting=12, max_prefill_positions_per_step=48,
                     block_size=4, num_kv_blocks=40, codec_chunk_schedule=(1, 2, 4, 8),
                     min_playback_slack_s=0.3)


class RunnerView:
    """What a runner would know: which request each slot holds, and each stream's codec progress."""

    def __init__(self) -> None:
        self.request_by_slot: dict[int, str] = {}
        self.next_codec_frame: dict[str, int] = {}
        self.closed_streams: set[str] = set()
        self.num_step_frame_chunks = 0

    def apply(self, output: SchedulerOutput, scheduler: Scheduler) -> None:
        for item in output.freed:
            if item.slot is not None:
                assert self.request_by_slot.pop(item.slot) == item.request_id
        for item in output.prefills:
            assert item.slot not in self.request_by_slot, "a prefill got a slot the runner still holds"
            self.request_by_slot[item.slot] = item.request_id
        for item in output.decodes:
            assert self.request_by_slot[item.slot] == item.request_id
        for chunk in output.codec_chunks:
            assert self.request_by_slot[chunk.slot] == chunk.request_id
            assert chunk.request_id not in self.closed_streams
            assert chunk.first_frame == self.next_codec_frame.get(chunk.request_id, 0)
            self.next_codec_frame[chunk.request_id] = chunk.first_frame + chunk.num_frames
            self.num_step_frame_chunks += chunk.is_step_frame
            # A step-frame chunk decodes the frame its own step makes, after that step's frames; a step scheduled
            # ahead counts the frames in flight.
            assert chunk.first_frame + chunk.num_frames <= scheduler.requests[chunk.request_id].next_frame_index
            if chunk.is_final:
                self.closed_streams.add(chunk.request_id)
                assert self.next_codec_frame[chunk.request_id] == scheduler.requests[chunk.request_id].num_frames

    def take_back(self, output: SchedulerOutput, scheduler: Scheduler) -> None:
        """A step-frame chunk whose frame turned out to be EOS or an error was never decoded."""
        for chunk in output.codec_chunks:
            request = scheduler.requests.get(chunk.request_id)
            if (chunk.is_step_frame and request is not None
                    and request.num_frames == chunk.first_frame + chunk.num_frames - 1):
                self.next_codec_frame[chunk.request_id] = chunk.first_frame


def check_output(output: SchedulerOutput, scheduler: Scheduler, config: SchedulerConfig, now: float) -> None:
    prefill_ids = [item.request_id for item in output.prefills]
    decode_ids = [item.request_id for item in output.decodes]
    assert len(set(prefill_ids)) == len(prefill_ids) and len(set(decode_ids)) == len(decode_ids)
    assert not set(prefill_ids) & set(decode_ids), "a request was both prefilled and decoded"
    assert output.num_running == len(prefill_ids) + len(decode_ids) <= config.max_running
    num_prefill_positions = sum(item.num_positions for item in output.prefills)
    assert len(output.prefills) <= 1 or num_prefill_positions <= config.max_prefill_positions_per_step
    if output.preempted:
        assert {item.request_id for item in output.freed if item.reason is None} == set(output.preempted)
        if output.prefills:  # room for admissions comes only from requests that could not go on
            assert not any(scheduler.requests[request_id].is_ready_to_decode for request_id in output.preempted)
    for item in output.decodes:  # the step's own frame is in flight now
        request = scheduler.requests[item.request_id]
        assert request.status is RequestStatus.RUNNING and request.num_frames_in_flight >= 1
        assert request.is_text_closed or request.num_text_tokens >= item.frame_index
        assert item.frame_index < request.max_frames
        assert (item.slot, item.block_ids, item.frame_index) == (request.slot, tuple(request.block_ids),
                                                                 request.next_frame_index - 1)
        assert item.position == request.num_prompt_positions + item.frame_index - 1
        assert item.position < len(item.block_ids) * config.block_size
    for item in output.prefills:
        request = scheduler.requests[item.request_id]
        assert item.num_positions == request.num_prompt_positions + item.num_resumed_frames
        assert item.num_resumed_frames == request.num_frames and request.num_frames_in_flight == 1
        assert len(item.block_ids) * config.block_size >= item.num_positions
    for item in output.freed:
        if item.reason is None:
            assert scheduler.requests[item.request_id].status is RequestStatus.WAITING
        else:
            assert item.request_id not in scheduler.requests
    for request in scheduler.requests.values():
        if request.status is RequestStatus.RUNNING:
            assert request.request_id in prefill_ids or request.request_id in decode_ids
        if request.status is RequestStatus.PARKED:
            assert (not request.has_text_for_next_frame or len(decode_ids) == config.max_running
                    or request.next_frame_index == request.max_frames)
        if request.deadline is not None and not request.is_finished:
            assert request.deadline > now, "a request outlived its deadline"


def check_state(scheduler: Scheduler) -> None:
    requests = list(scheduler.requests.values())
    blocks = [block for request in requests for block in request.block_ids]
    assert len(blocks) == len(set(blocks)) == scheduler.num_kv_blocks_used
    slots = [request.slot for request in requests if request.slot is not None]
    assert len(slots) == len(set(slots)) == scheduler.num_slots_used
    for request in requests:
        if request.status is RequestStatus.WAITING:
            assert request.slot is None and not request.block_ids
        elif request.status is RequestStatus.FINISHED:
            assert not request.block_ids and request.slot is not None
        else:
            assert request.slot is not None and request.block_ids
    num_finished = sum(request.is_finished for request in requests)
    num_live = scheduler.num_waiting + scheduler.num_running + scheduler.num_parked
    assert num_live + num_finished == len(requests)


def random_request(rng: random.Random, request_id: str, now: float) -> Request:
    return Request(request_id, num_prompt_positions=rng.randint(1, 60), max_frames=rng.randint(1, 60),
                   arrival_time=now, deadline=now + rng.uniform(0.3, 8.0) if rng.random() < 0.3 else None,
                   num_text_tokens=rng.randint(0, 5), is_text_closed=rng.random() < 0.4)


def run_random_step(scheduler: Scheduler, runner: RunnerView, rng: random.Random, now: float,
                    in_flight: deque[SchedulerOutput], is_ahead: bool) -> bool:
    """Schedule a step (ahead of the one in flight, when `is_ahead` and the scheduler takes it), then answer the
    oldest step in flight, as the engine does. Whether a step was scheduled ahead."""
    is_step_ahead = False
    if not in_flight:
        output: SchedulerOutput | None = scheduler.schedule(now)
    else:
        output = scheduler.schedule_ahead(now) if is_ahead and rng.random() < 0.8 else None
        is_step_ahead = output is not None and not output.is_empty
    if output is not None:
        check_output(output, scheduler, scheduler.config, now)
        runner.apply(output, scheduler)
        if not output.is_empty:
            in_flight.append(output)
    if not in_flight or (output is not None and len(in_flight) == 1 and is_ahead and rng.random() < 0.5):
        return is_step_ahead  # the step just scheduled stays in flight, for the next one to be scheduled ahead
    oldest = in_flight.popleft()
    if rng.random() < 0.05:  # a client hangs up while the step runs
        scheduler.abort(rng.choice(sorted(oldest.scheduled_request_ids | {"unknown"})))
    scheduled = sorted(oldest.scheduled_request_ids)
    eos_ids = {request_id for request_id in scheduled if rng.random() < 0.06}
    errors = {request_id: "injected" for request_id in scheduled
              if rng.random() < 0.01 and request_id not in eos_ids}
    scheduler.update(StepResult.for_output(oldest, eos_ids, errors), now)
    runner.take_back(oldest, scheduler)
    check_state(scheduler)
    return is_step_ahead


@pytest.mark.parametrize("is_ahead", [False, True], ids=["in-order", "ahead"])
@pytest.mark.parametrize("codec_chunk_schedule", [(1, 2, 4, 8), (1,)])
@pytest.mark.parametrize("seed", range(8))
def test_random_workload_keeps_every_invariant_and_drains_to_zero(seed: int, codec_chunk_schedule: tuple[int, ...],
                                                                  is_ahead: bool) -> None:
    """With `is_ahead`, steps are scheduled while the one before still runs, whenever the scheduler takes it."""
    rng = random.Random(seed)
    scheduler = Scheduler(replace(CONFIG, codec_chunk_schedule=codec_chunk_schedule))
    runner = RunnerView()
    in_flight: deque[SchedulerOutput] = deque()
    now = 0.0
    num_added = num_steps_ahead = 0
    for step in range(400):
        now += rng.uniform(0.005, 0.05)
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            try:
                scheduler.add(random_request(rng, f"s{seed}-r{step}-{num_added}", now))
                num_added += 1
            except (QueueFullError, RequestTooLargeError):
                pass
        for request in list(scheduler.requests.values()):
            if not request.is_text_closed and rng.random() < 0.3:
                scheduler.append_text(request.request_id, rng.randint(0, 3), is_closed=rng.random() < 0.1)
        if scheduler.requests and rng.random() < 0.03:
            scheduler.abort(rng.choice(sorted(scheduler.requests)))
        num_steps_ahead += run_random_step(scheduler, runner, rng, now, in_flight, is_ahead)
    assert num_added > 100
    if is_ahead and codec_chunk_schedule == (1,):
        assert num_steps_ahead > 100
    assert scheduler.num_preemptions_total > 0, "the workload should be tight enough to preempt"
    for request_id in list(scheduler.requests):
        scheduler.append_text(request_id, 0, is_closed=True)
    for _ in range(2000):
        if not (scheduler.has_unfinished_requests or in_flight):
            break
        now += 0.01
        run_random_step(scheduler, runner, rng, now, in_flight, is_ahead)
    assert not scheduler.has_unfinished_requests
    assert (scheduler.num_kv_blocks_used, scheduler.num_slots_used) == (0, 0)
    assert runner.request_by_slot == {}
    assert runner.num_step_frame_chunks > 0
