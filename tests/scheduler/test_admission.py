from __future__ import annotations

import pytest

from scheduler.request import RequestStatus
from scheduler.scheduler import QueueFullError, RequestTooLargeError, Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def test_admission_fills_the_prefill_budget_and_leaves_the_rest_waiting() -> None:
    scheduler = Scheduler(make_config(max_prefill_positions_per_step=20))
    for name in ("a", "b", "c"):
        scheduler.add(make_request(name, num_prompt_positions=8))
    first, _ = run_step(scheduler)
    assert ids(first.prefills) == ["a", "b"]  # 16 positions; a third would make 24 > 20
    assert [item.num_positions for item in first.prefills] == [8, 8]
    assert first.num_waiting == 1
    second, _ = run_step(scheduler)
    assert ids(second.prefills) == ["c"]
    assert ids(second.decodes) == ["a", "b"]


def test_prompt_longer_than_the_budget_is_admitted_alone_in_its_own_step() -> None:
    scheduler = Scheduler(make_config(max_prefill_positions_per_step=16))
    scheduler.add(make_request("short", num_prompt_positions=4))
    scheduler.add(make_request("long", num_prompt_positions=40))
    scheduler.add(make_request("after", num_prompt_positions=4))
    first, _ = run_step(scheduler)
    assert ids(first.prefills) == ["short"]  # "long" does not fit next to it, and "after" may not jump ahead
    second, _ = run_step(scheduler)
    assert ids(second.prefills) == ["long"]
    assert second.prefills[0].num_positions == 40
    third, _ = run_step(scheduler)
    assert ids(third.prefills) == ["after"]


def test_add_raises_queue_full_at_max_waiting_and_accepts_again_after_admission() -> None:
    scheduler = Scheduler(make_config(max_waiting=2, max_prefill_positions_per_step=8))
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    with pytest.raises(QueueFullError):
        scheduler.add(make_request("c"))
    assert "c" not in scheduler.requests
    run_step(scheduler)  # admits "a" only (8 positions fill the budget)
    scheduler.add(make_request("c"))
    assert scheduler.num_waiting == 2


def test_an_aborted_waiting_request_no_longer_counts_against_max_waiting() -> None:
    scheduler = Scheduler(make_config(max_waiting=2))
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    scheduler.abort("a")  # released only at the next schedule(), but its client is gone
    scheduler.add(make_request("c"))
    with pytest.raises(QueueFullError, match="2 requests"):
        scheduler.add(make_request("d"))
    output, _ = run_step(scheduler)
    assert [item.request_id for item in output.freed] == ["a"]
    assert scheduler.num_waiting + scheduler.num_running == 2


def test_add_rejects_a_request_that_could_not_fit_in_kv_even_alone() -> None:
    # 10 blocks of 4 positions = 40 positions; a request occupies prompt + max_frames - 1 positions.
    scheduler = Scheduler(make_config(num_kv_blocks=10, block_size=4))
    scheduler.add(make_request("fits", num_prompt_positions=20, max_frames=21))
    with pytest.raises(RequestTooLargeError):
        scheduler.add(make_request("too-large", num_prompt_positions=20, max_frames=22))
    assert list(scheduler.requests) == ["fits"]


def test_add_rejects_a_request_longer_than_the_runner_allows_per_request() -> None:
    scheduler = Scheduler(make_config(num_kv_blocks=1000, max_positions_per_request=64))
    scheduler.add(make_request("fits", num_prompt_positions=30, max_frames=35))  # 64 positions
    with pytest.raises(RequestTooLargeError):
        scheduler.add(make_request("too-long", num_prompt_positions=30, max_frames=36))


def test_add_rejects_a_duplicate_request_id() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    with pytest.raises(ValueError):
        scheduler.add(make_request("a"))


def test_kv_admission_check_refuses_until_blocks_are_freed_then_admits() -> None:
    # "big" holds 8 of 10 blocks (prompt 28 + 1 reserved position = 29 -> 8 blocks);
    # "small" needs 3 (prompt 8 + 1 -> 3 blocks) and must wait.
    scheduler = Scheduler(make_config(num_kv_blocks=10, block_size=4))
    scheduler.add(make_request("big", num_prompt_positions=28, max_frames=10))
    run_step(scheduler)
    scheduler.add(make_request("small", num_prompt_positions=8, max_frames=10))
    for _ in range(3):
        output, _ = run_step(scheduler)
        assert ids(output.prefills) == []
        assert scheduler.requests["small"].status is RequestStatus.WAITING
    run_step(scheduler, eos_ids={"big"})  # finishing returns big's blocks
    output, _ = run_step(scheduler)
    assert ids(output.prefills) == ["small"]
    assert len(output.prefills[0].block_ids) == 3


def test_admission_keeps_the_batch_within_max_running() -> None:
    scheduler = Scheduler(make_config(max_running=3, max_prefill_positions_per_step=1000))
    for index in range(5):
        scheduler.add(make_request(f"r{index}"))
    first, _ = run_step(scheduler)
    assert ids(first.prefills) == ["r0", "r1", "r2"]
    second, _ = run_step(scheduler)
    assert ids(second.prefills) == []
    assert len(second.decodes) == 3
    run_step(scheduler, eos_ids={"r1"})
    # r1 keeps its slot through the step that runs its final codec chunk, then it is freed.
    fourth, _ = run_step(scheduler)
    assert ids(fourth.prefills) == []
    assert [chunk.request_id for chunk in fourth.codec_chunks if chunk.is_final] == ["r1"]
    fifth, _ = run_step(scheduler)
    assert ids(fifth.freed) == ["r1"]
    assert ids(fifth.prefills) == ["r3"]


def test_admission_assigns_distinct_slots_and_reuses_a_freed_one() -> None:
    scheduler = Scheduler(make_config(max_running=2))
    scheduler.add(make_request("a"))
    scheduler.add(make_request("b"))
    first, _ = run_step(scheduler)
    assert sorted(item.slot for item in first.prefills) == [0, 1]
    slot_of_a = first.prefills[0].slot
    scheduler.abort("a")
    scheduler.add(make_request("c"))
    second, _ = run_step(scheduler)
    assert [(item.request_id, item.slot) for item in second.freed] == [("a", slot_of_a)]
    assert [(item.request_id, item.slot) for item in second.prefills] == [("c", slot_of_a)]


def test_request_with_open_input_and_no_text_is_admitted_on_its_prompt() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", is_text_closed=False, num_text_tokens=0))
    output, _ = run_step(scheduler)
    assert ids(output.prefills) == ["a"]


def test_queue_time_is_admission_minus_arrival() -> None:
    scheduler = Scheduler(make_config(max_prefill_positions_per_step=8))
    scheduler.add(make_request("a", arrival_time=1.0))
    scheduler.add(make_request("b", arrival_time=1.5))
    run_step(scheduler, now=2.0)
    run_step(scheduler, now=2.25)
    assert scheduler.requests["a"].queue_time_s == pytest.approx(1.0)
    assert scheduler.requests["b"].queue_time_s == pytest.approx(0.75)


def test_first_frame_comes_from_the_prefill_and_decoding_starts_the_step_after() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", num_prompt_positions=8))
    first, events = run_step(scheduler)
    assert ids(first.prefills) == ["a"] and ids(first.decodes) == []
    assert [(event.num_frames, event.is_new_frame) for event in events] == [(1, True)]
    second, _ = run_step(scheduler)
    assert [(item.position, item.frame_index) for item in second.decodes] == [(8, 1)]
