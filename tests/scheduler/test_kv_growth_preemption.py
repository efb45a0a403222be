from __future__ import annotations

from itertools import pairwise

from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def test_decode_takes_one_more_block_exactly_when_it_crosses_a_block_boundary() -> None:
    scheduler = Scheduler(make_config(block_size=4))
    scheduler.add(make_request("a", num_prompt_positions=3))
    prefill, _ = run_step(scheduler)
    # The prefill reserves its 3 positions plus the first decode's: 4 positions, one block.
    assert len(prefill.prefills[0].block_ids) == 1
    num_blocks_by_frame: dict[int, int] = {}
    for _ in range(9):
        output, _ = run_step(scheduler)
        (decode,) = output.decodes
        assert decode.position == 3 + decode.frame_index - 1
        assert decode.position < len(decode.block_ids) * 4
        num_blocks_by_frame[decode.frame_index] = len(decode.block_ids)
    # Frame f writes position 2 + f: frames 1 (pos 3) fit block 0, frames 2-5 block 1, 6-9 block 2.
    assert num_blocks_by_frame == {1: 1, 2: 2, 3: 2, 4: 2, 5: 2, 6: 3, 7: 3, 8: 3, 9: 3}
    assert scheduler.num_kv_blocks_used == 3


def test_growing_blocks_keep_earlier_block_ids_in_order() -> None:
    scheduler = Scheduler(make_config(block_size=2))
    scheduler.add(make_request("a", num_prompt_positions=2))
    outputs = [run_step(scheduler)[0] for _ in range(6)]
    tables = [item.block_ids for output in outputs for item in (*output.prefills, *output.decodes)]
    for shorter, longer in pairwise(tables):
        assert longer[:len(shorter)] == shorter


def _two_requests_that_outgrow_six_blocks() -> Scheduler:
    # Two prompts of 4 positions, 4-position blocks, 6 blocks: each holds 2 blocks after the prefill,
    # 3 from frame 5 (position 8), and the older one needs a 4th at frame 9 (position 12) when none is free.
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=6))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    return scheduler


def test_running_out_of_kv_preempts_the_most_recently_admitted_request() -> None:
    scheduler = _two_requests_that_outgrow_six_blocks()
    outputs = [run_step(scheduler)[0] for _ in range(10)]
    assert all(not output.preempted for output in outputs[:9])
    tenth = outputs[9]
    assert tenth.preempted == ("new",)
    assert [(item.request_id, item.reason) for item in tenth.freed] == [("new", None)]
    assert ids(tenth.decodes) == ["old"]
    assert tenth.decodes[0].frame_index == 9
    new = scheduler.requests["new"]
    assert (new.status, new.block_ids, new.slot, new.num_frames, new.num_preemptions) == (
        RequestStatus.WAITING, [], None, 9, 1)
    assert scheduler.num_kv_blocks_used == 4


def test_preempted_request_resumes_first_with_prompt_plus_frames_prefill() -> None:
    scheduler = _two_requests_that_outgrow_six_blocks()
    outputs = [run_step(scheduler)[0] for _ in range(6)]  # from step 6 both hold 3 blocks: none is free
    scheduler.add(make_request("late", num_prompt_positions=4, max_frames=16))
    outputs += [run_step(scheduler)[0] for _ in range(5)]
    assert outputs[9].preempted == ("new",)
    # The preempting step admits nothing, although "late" would fit in the 2 blocks it freed.
    assert ids(outputs[9].prefills) == []
    # Next step "new" is at the front and does not fit (14 positions = 4 blocks, 2 free):
    # "late" may not pass it.
    assert ids(outputs[10].prefills) == []
    assert scheduler.requests["late"].status is RequestStatus.WAITING
    run_step(scheduler, eos_ids={"old"})
    resumed, _ = run_step(scheduler)
    assert ids(resumed.prefills) == ["new", "late"]
    new_prefill = resumed.prefills[0]
    assert (new_prefill.num_positions, new_prefill.num_resumed_frames) == (4 + 9, 9)
    assert len(new_prefill.block_ids) == 4  # 13 positions + the next decode's = 14 -> 4 blocks
    following, _ = run_step(scheduler)
    assert [(item.request_id, item.frame_index, item.position) for item in following.decodes] == [
        ("new", 10, 13), ("late", 1, 4)]


def test_resumed_request_keeps_its_seniority_and_a_later_admission_is_preempted_instead() -> None:
    scheduler = _two_requests_that_outgrow_six_blocks()
    for _ in range(6):
        run_step(scheduler)
    scheduler.add(make_request("late", num_prompt_positions=4, max_frames=16))
    for _ in range(5):
        run_step(scheduler)
    run_step(scheduler, eos_ids={"old"})
    resumed, _ = run_step(scheduler)
    assert ids(resumed.prefills) == ["new", "late"]  # "new" was prefilled last in time, but admitted first
    preempted: list[str] = []
    for _ in range(4):
        output, _ = run_step(scheduler)
        preempted.extend(output.preempted)
    # "new" needs a 5th block at frame 13 and none is free: the victim is "late", admitted after it.
    assert preempted == ["late"]
    assert scheduler.requests["new"].status is RequestStatus.RUNNING


def test_parked_request_is_preempted_before_any_decoding_request() -> None:
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=6))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("idle", num_prompt_positions=4, max_frames=16, is_text_closed=False))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    outputs = [run_step(scheduler)[0] for _ in range(6)]
    assert scheduler.requests["idle"].status is RequestStatus.WAITING
    (preempting,) = [output for output in outputs if output.preempted]
    assert preempting.preempted == ("idle",)
    assert ids(preempting.decodes) == ["old", "new"]


def test_request_preempts_itself_when_only_older_requests_hold_the_kv_it_needs() -> None:
    # 5 blocks: both need a 3rd block at frame 5; the older takes the only free one.
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=5))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    outputs = [run_step(scheduler)[0] for _ in range(6)]
    assert outputs[5].preempted == ("new",)
    assert ids(outputs[5].decodes) == ["old"]
    assert scheduler.num_kv_blocks_used == 3
