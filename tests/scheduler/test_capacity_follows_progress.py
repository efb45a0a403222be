"""A request that cannot make progress (its text has run dry, or its reader has stopped reading) gives its slot
and KV to a waiting request that can, and takes them back, recomputed, once it can go on."""

from __future__ import annotations

import pytest

from scheduler.request import RequestStatus
from scheduler.scheduler import QueueFullError, Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def full_of_stalled_requests(num_slots: int = 2) -> Scheduler:
    """Every slot held by a request whose text has run dry after three frames."""
    scheduler = Scheduler(make_config(max_running=num_slots))
    for index in range(num_slots):
        scheduler.add(make_request(f"trickle-{index}", is_text_closed=False, num_text_tokens=2))
    for _ in range(4):
        run_step(scheduler)
    assert scheduler.num_parked == num_slots and scheduler.num_slots_used == num_slots
    return scheduler


def test_a_waiting_request_takes_the_slot_of_a_request_whose_text_ran_dry() -> None:
    scheduler = full_of_stalled_requests()
    scheduler.add(make_request("ordinary"))
    output, _ = run_step(scheduler)
    assert ids(output.prefills) == ["ordinary"]
    # The newest admission gives way first; the other keeps its slot and KV.
    assert output.preempted == ("trickle-1",)
    assert scheduler.requests["trickle-1"].status is RequestStatus.WAITING
    assert scheduler.requests["trickle-1"].slot is None and not scheduler.requests["trickle-1"].block_ids
    assert scheduler.requests["trickle-0"].status is RequestStatus.PARKED


def test_a_waiting_request_takes_the_slot_of_a_request_whose_reader_stopped_reading() -> None:
    scheduler = Scheduler(make_config(max_running=1))
    scheduler.add(make_request("stalled-reader"))
    run_step(scheduler)
    run_step(scheduler)
    scheduler.set_output_paused("stalled-reader", True)
    scheduler.add(make_request("ordinary"))
    output, _ = run_step(scheduler)
    assert (ids(output.prefills), output.preempted) == (["ordinary"], ("stalled-reader",))


def test_a_preempted_stalled_request_resumes_with_its_frames_once_its_text_arrives() -> None:
    scheduler = full_of_stalled_requests()
    scheduler.add(make_request("ordinary", max_frames=2))
    run_step(scheduler)
    assert scheduler.append_text("trickle-1", 5)
    resumed = []
    for _ in range(4):
        output, _ = run_step(scheduler)
        resumed += [item for item in output.prefills if item.request_id == "trickle-1"]
    # Recomputed from its prompt and the three frames it had made: its audio goes on where it stopped.
    assert [(item.num_resumed_frames, item.num_positions) for item in resumed] == [(3, 8 + 3)]
    assert scheduler.requests["trickle-1"].status in (RequestStatus.RUNNING, RequestStatus.PARKED)


def test_a_waiting_request_that_still_cannot_go_on_takes_no_ones_slot() -> None:
    scheduler = full_of_stalled_requests()
    scheduler.add(make_request("ordinary", max_frames=50))
    first, _ = run_step(scheduler)
    assert first.preempted == ("trickle-1",)
    # trickle-1 waits for its text at the front of the queue; it must not push trickle-0 out for nothing.
    for _ in range(3):
        output, _ = run_step(scheduler)
        assert output.preempted == () and output.prefills == ()
    assert scheduler.requests["trickle-0"].status is RequestStatus.PARKED


def test_preempted_requests_that_wait_for_their_client_take_no_waiting_place() -> None:
    scheduler = Scheduler(make_config(max_running=2, max_waiting=2))
    for index in range(2):
        scheduler.add(make_request(f"trickle-{index}", is_text_closed=False, num_text_tokens=2))
    for _ in range(4):
        run_step(scheduler)
    scheduler.add(make_request("ordinary-0"))
    output, _ = run_step(scheduler)
    assert output.preempted == ("trickle-1",)  # it waits for its text now, not for room
    scheduler.add(make_request("ordinary-1"))
    scheduler.add(make_request("ordinary-2"))  # both waiting places are still free for these two
    with pytest.raises(QueueFullError):
        scheduler.add(make_request("ordinary-3"))


def test_no_stalled_request_is_preempted_when_all_of_them_would_not_make_room() -> None:
    # A running request holds part of the KV: even with both stalled requests' KV back, the long prompt would
    # not fit, so neither is made to recompute for nothing.
    scheduler = Scheduler(make_config(max_running=3, num_kv_blocks=12))
    for index in range(2):
        scheduler.add(make_request(f"trickle-{index}", max_frames=8, is_text_closed=False, num_text_tokens=2))
    scheduler.add(make_request("running", max_frames=30))
    for _ in range(4):
        run_step(scheduler)
    stalled_blocks = sum(len(scheduler.requests[f"trickle-{index}"].block_ids) for index in range(2))
    scheduler.add(make_request("too-long", num_prompt_positions=40, max_frames=4))
    assert scheduler.num_kv_blocks_total - scheduler.num_kv_blocks_used + stalled_blocks < 11  # 41 positions
    output, _ = run_step(scheduler)
    assert output.preempted == () and output.prefills == ()
    assert scheduler.num_parked == 2


def test_stalled_requests_keep_their_slots_while_nobody_waits() -> None:
    scheduler = full_of_stalled_requests()
    for _ in range(3):
        output, _ = run_step(scheduler)
        assert output.preempted == ()
    assert scheduler.num_slots_used == 2
