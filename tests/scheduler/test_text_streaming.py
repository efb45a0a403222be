from __future__ import annotations

import pytest

from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step


def _streaming_request_with_two_text_tokens(scheduler: Scheduler) -> None:
    scheduler.add(make_request("a", num_prompt_positions=8, is_text_closed=False, num_text_tokens=2))


def test_request_parks_when_its_next_text_token_has_not_arrived_and_keeps_kv_and_slot() -> None:
    scheduler = Scheduler(make_config())
    _streaming_request_with_two_text_tokens(scheduler)
    outputs = [run_step(scheduler)[0] for _ in range(4)]
    # Frame 0 from the prefill; frames 1 and 2 consume text tokens 0 and 1; frame 3 needs token 2.
    assert [ids(output.decodes) for output in outputs] == [[], ["a"], ["a"], []]
    request = scheduler.requests["a"]
    assert request.num_frames == 3
    assert request.status is RequestStatus.PARKED
    assert (outputs[3].num_parked, outputs[3].num_running) == (1, 0)
    assert scheduler.num_parked == 1
    assert request.slot is not None and request.block_ids
    assert scheduler.num_kv_blocks_used == len(request.block_ids)


def test_append_text_unparks_and_decoding_resumes_at_the_next_frame() -> None:
    scheduler = Scheduler(make_config())
    _streaming_request_with_two_text_tokens(scheduler)
    for _ in range(5):
        run_step(scheduler)
    assert scheduler.append_text("a", 1)
    assert scheduler.requests["a"].status is RequestStatus.RUNNING
    resumed, _ = run_step(scheduler)
    assert [(item.request_id, item.frame_index) for item in resumed.decodes] == [("a", 3)]
    parked_again, _ = run_step(scheduler)
    assert ids(parked_again.decodes) == []


def test_closing_the_text_input_unparks_and_decodes_on_padding_until_the_end() -> None:
    scheduler = Scheduler(make_config())
    _streaming_request_with_two_text_tokens(scheduler)
    for _ in range(4):
        run_step(scheduler)
    assert scheduler.requests["a"].status is RequestStatus.PARKED
    assert scheduler.append_text("a", 0, is_closed=True)
    outputs = [run_step(scheduler)[0] for _ in range(3)]
    assert [[item.frame_index for item in output.decodes] for output in outputs] == [[3], [4], [5]]


def test_parked_request_does_not_stop_others_from_decoding() -> None:
    scheduler = Scheduler(make_config())
    _streaming_request_with_two_text_tokens(scheduler)
    scheduler.add(make_request("b"))
    outputs = [run_step(scheduler)[0] for _ in range(6)]
    assert all("b" in ids(output.decodes) for output in outputs[1:])


def test_unparked_request_beyond_max_running_waits_parked_for_batch_room() -> None:
    # Two slots but a decode batch of one: a parked request keeps its slot while another decodes.
    scheduler = Scheduler(make_config(max_running=1, max_slots=2))
    scheduler.add(make_request("a", is_text_closed=False))
    scheduler.add(make_request("b"))
    first, _ = run_step(scheduler)
    assert [item.request_id for item in first.prefills] == ["a"]
    second, _ = run_step(scheduler)  # "a" waits for text, so "b" gets the batch row
    assert (ids(second.prefills), ids(second.decodes)) == (["b"], [])
    third, _ = run_step(scheduler)
    assert ids(third.decodes) == ["b"]
    scheduler.append_text("a", 5)
    fourth, _ = run_step(scheduler)
    # The older admission decodes first; "b" has its text but no batch room this step.
    assert ids(fourth.decodes) == ["a"]
    assert scheduler.requests["b"].status is RequestStatus.PARKED
    assert (fourth.num_running, fourth.num_parked) == (1, 1)


def test_text_after_the_input_closed_is_rejected() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add(make_request("a", is_text_closed=False))
    scheduler.append_text("a", 3, is_closed=True)
    with pytest.raises(ValueError):
        scheduler.append_text("a", 1)
    assert scheduler.append_text("a", 0, is_closed=True)  # closing twice is harmless


def test_append_text_to_an_unknown_request_is_ignored() -> None:
    scheduler = Scheduler(make_config())
    assert not scheduler.append_text("missing", 3)


def test_resumed_request_without_its_next_text_token_is_skipped_not_blocking() -> None:
    # 4 blocks of 4 positions: "old" and "stream" hold 2 each; at frame 5 "old" needs a 3rd.
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=4))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=12))
    scheduler.add(make_request("stream", num_prompt_positions=4, max_frames=12, is_text_closed=False,
                               num_text_tokens=4))
    outputs = [run_step(scheduler)[0] for _ in range(6)]
    # Frame 5 would need text token 4, which has not arrived: "stream" is parked at step 6 and,
    # being parked, is the first victim when "old" needs a block.
    assert outputs[5].preempted == ("stream",)
    assert not scheduler.requests["stream"].has_text_for_next_frame
    scheduler.abort("old")
    scheduler.add(make_request("later", num_prompt_positions=2, max_frames=8))
    output, _ = run_step(scheduler)
    assert ids(output.prefills) == ["later"]
    assert scheduler.requests["stream"].status is RequestStatus.WAITING
    scheduler.append_text("stream", 1)
    output, _ = run_step(scheduler)
    assert ids(output.prefills) == ["stream"]
    assert (output.prefills[0].num_positions, output.prefills[0].num_resumed_frames) == (4 + 5, 5)
