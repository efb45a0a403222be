from __future__ import annotations

from scheduler.outputs import StepResult
from scheduler.request import FinishReason, RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def test_abort_frees_blocks_and_slot_at_the_next_schedule_and_reports_the_slot() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    first, _ = run_step(scheduler)
    slot_of_a = first.prefills[0].slot
    blocks_of_b = len(scheduler.requests["b"].block_ids)
    scheduler.abort("a")
    # Nothing is released inside abort(): the runner may still be using a's blocks.
    assert scheduler.requests["a"].block_ids
    assert scheduler.num_slots_used == 2
    output, _ = run_step(scheduler)
    assert [(item.request_id, item.slot, item.reason) for item in output.freed] == [
        ("a", slot_of_a, FinishReason.ABORTED)]
    assert ids(output.decodes) == ["b"]
    assert "a" not in scheduler.requests
    assert scheduler.num_slots_used == 1
    assert scheduler.num_kv_blocks_used == blocks_of_b


def test_abort_while_the_step_runs_discards_that_steps_result() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    run_step(scheduler)
    output = scheduler.schedule(1.0)
    scheduler.abort("a")
    events = scheduler.update(StepResult.for_output(output), 1.0)
    assert events == []
    assert scheduler.requests["a"].num_frames == 1
    freeing, _ = run_step(scheduler, 2.0)
    assert ids(freeing.freed) == ["a"]


def test_abort_of_a_waiting_request_removes_it_and_reports_no_slot() -> None:
    scheduler = Scheduler(make_config(max_prefill_positions_per_step=8))
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    run_step(scheduler)
    assert scheduler.requests["b"].status is RequestStatus.WAITING
    scheduler.abort("b")
    output, _ = run_step(scheduler)
    assert [(item.request_id, item.slot, item.reason) for item in output.freed] == [
        ("b", None, FinishReason.ABORTED)]
    assert ids(output.prefills) == []
    assert scheduler.num_waiting == 0


def test_abort_of_an_unknown_or_finished_request_changes_nothing() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", max_frames=1))
    run_step(scheduler)  # the prefill's frame is the last one: finished with LENGTH
    scheduler.abort("a")
    scheduler.abort("never-added")
    output, _ = run_step(scheduler)  # runs the final codec chunk
    assert [chunk.is_final for chunk in output.codec_chunks] == [True]
    assert output.freed == ()
    output, _ = run_step(scheduler)
    assert [(item.request_id, item.reason) for item in output.freed] == [("a", FinishReason.LENGTH)]


def test_abort_with_error_reason_reports_error() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    run_step(scheduler)
    scheduler.abort("a", FinishReason.ERROR)
    output, _ = run_step(scheduler)
    assert [(item.request_id, item.reason) for item in output.freed] == [("a", FinishReason.ERROR)]


def test_deadline_expiry_aborts_running_and_waiting_requests_at_schedule_time() -> None:
    scheduler = Scheduler(make_config(max_running=2, max_prefill_positions_per_step=8))
    scheduler.add(make_request("running", deadline=5.0))
    scheduler.add(make_request("patient", deadline=50.0))
    scheduler.add(make_request("waiting", deadline=5.0))
    run_step(scheduler, now=1.0)
    before, _ = run_step(scheduler, now=4.9)
    assert before.freed == ()
    assert scheduler.requests["waiting"].status is RequestStatus.WAITING
    after, _ = run_step(scheduler, now=5.0)
    assert sorted((item.request_id, item.reason) for item in after.freed) == [
        ("running", FinishReason.ABORTED), ("waiting", FinishReason.ABORTED)]
    assert ids(after.decodes) == ["patient"]
    assert scheduler.num_kv_blocks_used == len(scheduler.requests["patient"].block_ids)


def test_next_deadline_is_the_earliest_live_deadline() -> None:
    scheduler = Scheduler(make_config())
    assert scheduler.next_deadline() is None
    scheduler.add(make_request("a", deadline=9.0))
    scheduler.add(make_request("b", deadline=3.0))
    scheduler.add(make_request("c"))
    assert scheduler.next_deadline() == 3.0
    scheduler.abort("b")
    assert scheduler.next_deadline() == 9.0
