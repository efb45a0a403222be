"""A request whose reader falls behind is paused: parked with its KV and slot, its made frames still
reaching the codec, until the reader catches up."""

from __future__ import annotations

from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def test_a_paused_request_makes_no_frames_but_keeps_kv_and_slot_and_others_go_on() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("slow-reader"))
    scheduler.add(make_request("other"))
    for _ in range(3):
        run_step(scheduler)
    scheduler.set_output_paused("slow-reader", True)
    request = scheduler.requests["slow-reader"]
    num_frames = request.num_frames
    outputs = [run_step(scheduler)[0] for _ in range(4)]
    assert all(ids(output.decodes) == ["other"] for output in outputs)
    assert request.num_frames == num_frames
    assert request.status is RequestStatus.PARKED and scheduler.num_parked == 1
    assert request.slot is not None and request.block_ids
    # Frames made before the pause still reach the codec.
    assert request.num_codec_frames == num_frames


def test_resuming_decodes_from_the_next_frame() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a"))
    for _ in range(3):
        run_step(scheduler)
    scheduler.set_output_paused("a", True)
    run_step(scheduler)
    scheduler.set_output_paused("a", False)
    assert scheduler.requests["a"].status is RequestStatus.RUNNING
    resumed, _ = run_step(scheduler)
    assert [(item.request_id, item.frame_index) for item in resumed.decodes] == [("a", 3)]


def test_a_paused_request_is_preempted_before_decoding_ones_and_not_resumed_while_paused() -> None:
    # 5 blocks of 4: each takes 2 at admission; "busy" takes the last free one, then needs a 4th.
    # Without the pause the newer request would be the victim.
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=5))
    scheduler.add(make_request("paused", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("busy", num_prompt_positions=4, max_frames=16))
    run_step(scheduler)
    scheduler.set_output_paused("paused", True)
    outputs = [run_step(scheduler)[0] for _ in range(12)]
    assert [output.preempted for output in outputs if output.preempted] == [("paused",)]
    assert scheduler.requests["paused"].status is RequestStatus.WAITING
    assert all("paused" not in ids(output.prefills) for output in outputs)
    assert scheduler.requests["busy"].num_frames == 13


def test_pausing_unknown_or_finished_requests_is_ignored() -> None:
    scheduler = Scheduler(make_config())
    scheduler.set_output_paused("nobody", True)
    scheduler.add(make_request("short", max_frames=1))
    run_step(scheduler)  # its prefill makes its only frame
    scheduler.set_output_paused("short", True)
    assert scheduler.requests["short"].is_finished and not scheduler.requests["short"].is_output_paused
