from __future__ import annotations

import pytest

from scheduler.outputs import RequestOutcome, StepResult
from scheduler.request import FinishReason, RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def test_reaching_max_frames_finishes_with_length() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", max_frames=3))
    finishing_events = []
    for _ in range(3):
        _, events = run_step(scheduler)
        finishing_events.extend(event for event in events if event.finish_reason is not None)
    assert [(event.request_id, event.num_frames, event.finish_reason) for event in finishing_events] == [
        ("a", 3, FinishReason.LENGTH)]
    assert scheduler.requests["a"].status is RequestStatus.FINISHED
    assert scheduler.num_kv_blocks_used == 0  # the talker KV goes as soon as the last frame is out
    output, _ = run_step(scheduler)
    assert ids(output.decodes) == []


def test_eos_finishes_with_stopped_and_adds_no_frame() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    run_step(scheduler)
    run_step(scheduler)
    _, events = run_step(scheduler, eos_ids={"a"})
    assert [(event.num_frames, event.is_new_frame, event.finish_reason) for event in events] == [
        (2, False, FinishReason.STOPPED)]


def test_eos_from_the_prefill_finishes_with_no_frames_and_an_empty_final_chunk() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    run_step(scheduler, eos_ids={"a"})
    output, _ = run_step(scheduler)
    chunks = [(chunk.first_frame, chunk.num_frames, chunk.is_final) for chunk in output.codec_chunks]
    assert chunks == [(0, 0, True)]


def test_an_error_finishes_only_the_failing_request() -> None:
    scheduler = Scheduler(make_config())
    for name in ("a", "b", "c"):
        scheduler.add(make_request(name))
    run_step(scheduler)
    _, events = run_step(scheduler, errors={"b": "nan in logits"})
    by_id = {event.request_id: event for event in events}
    assert (by_id["b"].finish_reason, by_id["b"].error) == (FinishReason.ERROR, "nan in logits")
    assert by_id["a"].finish_reason is None and by_id["c"].finish_reason is None
    output, _ = run_step(scheduler)
    assert [(item.request_id, item.reason) for item in output.freed] == [("b", FinishReason.ERROR)]
    assert ids(output.decodes) == ["a", "c"]
    # A failed stream gets no final chunk.
    assert all(chunk.request_id != "b" for chunk in output.codec_chunks)


def test_a_codec_error_finishes_the_request_with_error() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,)))
    scheduler.add(make_request("a"))
    run_step(scheduler)  # frame 0, decoded in its step
    output = scheduler.schedule(1.0)  # frame 1, and its chunk
    assert ids(output.decodes) == ["a"] and ids(output.codec_chunks) == ["a"]
    scheduler.update(StepResult((RequestOutcome("a", error="codec failed"),)), 1.0)
    assert scheduler.requests["a"].finish_reason is FinishReason.ERROR
    assert scheduler.requests["a"].num_audio_frames == 1  # the failed chunk's audio does not count
    freeing, _ = run_step(scheduler, 2.0)
    assert [(item.request_id, item.reason) for item in freeing.freed] == [("a", FinishReason.ERROR)]


def test_finished_request_keeps_its_slot_until_its_final_chunk_has_run() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", max_frames=2))
    run_step(scheduler)
    run_step(scheduler)  # frame 1 is the last
    final, _ = run_step(scheduler)
    assert [chunk.is_final for chunk in final.codec_chunks] == [True]
    assert final.freed == ()
    assert scheduler.num_slots_used == 1
    freeing, _ = run_step(scheduler)
    assert [(item.request_id, item.reason) for item in freeing.freed] == [("a", FinishReason.LENGTH)]
    assert scheduler.num_slots_used == 0
    assert not scheduler.has_unfinished_requests


def test_everything_finished_leaves_no_blocks_slots_or_requests() -> None:
    scheduler = Scheduler(make_config(max_running=4, num_kv_blocks=64, max_waiting=32))
    for index in range(12):
        scheduler.add(make_request(f"r{index}", max_frames=3 + index % 5))
    now = 0.0
    while scheduler.has_unfinished_requests:
        now += 0.01
        run_step(scheduler, now, eos_ids={f"r{index}" for index in range(0, 12, 4)})
        assert now < 10.0, "the scheduler stopped making progress"
    assert (scheduler.num_kv_blocks_used, scheduler.num_slots_used) == (0, 0)
    assert (scheduler.num_waiting, scheduler.num_running, scheduler.num_parked) == (0, 0, 0)
    assert scheduler.schedule(now + 1).is_empty


def test_update_rejects_a_result_that_misses_a_scheduled_request() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    output = scheduler.schedule(0.0)
    with pytest.raises(ValueError):
        scheduler.update(StepResult((RequestOutcome("a"),)), 0.0)
    with pytest.raises(ValueError):
        scheduler.update(StepResult((RequestOutcome("a"), RequestOutcome("b"), RequestOutcome("x"))), 0.0)
    scheduler.update(StepResult.for_output(output), 0.0)  # the step is still open after a rejected result


def test_schedule_and_update_must_alternate() -> None:
    scheduler = Scheduler(make_config())
    with pytest.raises(RuntimeError):
        scheduler.update(StepResult(()), 0.0)
    scheduler.add(make_request("a"))
    scheduler.schedule(0.0)
    with pytest.raises(RuntimeError):
        scheduler.schedule(0.0)


def test_an_outcome_cannot_be_both_eos_and_error() -> None:
    with pytest.raises(ValueError):
        RequestOutcome("a", is_eos=True, error="boom")
