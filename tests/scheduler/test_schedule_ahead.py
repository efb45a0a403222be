"""Steps scheduled ahead: the next step is scheduled while the last one runs, as if its frames were made."""

from __future__ import annotations

import pytest

from scheduler.outputs import SchedulerOutput, StepResult
from scheduler.request import FinishReason, RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request

ONE_FRAME_CHUNKS = {"codec_chunk_schedule": (1,)}


def answer(scheduler: Scheduler, output: SchedulerOutput, eos_ids: tuple[str, ...] = ()) -> list[str]:
    """update() for `output`; the ids that got a new frame."""
    events = scheduler.update(StepResult.for_output(output, eos_ids), 0.0)
    return [event.request_id for event in events if event.is_new_frame]


def running_pair(max_frames: int = 100, **config: object) -> tuple[Scheduler, SchedulerOutput]:
    """Two requests prefilled and answered, then decoded once, that step still in flight."""
    scheduler = Scheduler(make_config(**{**ONE_FRAME_CHUNKS, **config}))
    for request_id in ("r0", "r1"):
        scheduler.add(make_request(request_id, num_prompt_positions=3, max_frames=max_frames))
    answer(scheduler, scheduler.schedule(0.0))
    return scheduler, scheduler.schedule(0.0)


def test_a_step_ahead_decodes_the_next_frames_as_if_those_in_flight_were_made() -> None:
    scheduler, in_flight = running_pair()
    ahead = scheduler.schedule_ahead(0.0)
    assert ahead is not None
    assert [(item.frame_index, item.position) for item in in_flight.decodes] == [(1, 3), (1, 3)]
    assert [(item.frame_index, item.position) for item in ahead.decodes] == [(2, 4), (2, 4)]
    assert [(chunk.first_frame, chunk.is_step_frame) for chunk in ahead.codec_chunks] == [(2, True), (2, True)]
    assert answer(scheduler, in_flight) == ["r0", "r1"]
    assert answer(scheduler, ahead) == ["r0", "r1"]
    assert [scheduler.requests[r].num_frames for r in ("r0", "r1")] == [3, 3]


def test_a_frame_scheduled_after_its_requests_end_in_flight_is_dropped_with_its_chunk() -> None:
    scheduler, in_flight = running_pair()
    ahead = scheduler.schedule_ahead(0.0)
    assert ahead is not None and ids(ahead.decodes) == ["r0", "r1"]
    assert answer(scheduler, in_flight, eos_ids=("r0",)) == ["r1"]
    r0 = scheduler.requests["r0"]
    assert r0.finish_reason is FinishReason.STOPPED and r0.num_frames == 1
    # Both of r0's step-frame chunks are taken back: the EOS frame's and the one scheduled ahead of it.
    assert (r0.num_codec_frames, r0.num_frames_pending_codec) == (1, 0)
    after = scheduler.schedule_ahead(0.0)
    assert after is not None and ids(after.decodes) == ["r1"]
    final = [chunk for chunk in after.codec_chunks if chunk.request_id == "r0"]
    assert [(chunk.first_frame, chunk.num_frames, chunk.is_final) for chunk in final] == [(1, 0, True)]
    # The frame made after r0's end reaches no event and moves nothing.
    assert answer(scheduler, ahead) == ["r1"]
    assert (r0.num_frames, r0.num_audio_frames, r0.status) == (1, 1, RequestStatus.FINISHED)
    assert answer(scheduler, after) == ["r1"]
    # r0 keeps its slot until the step with its final chunk is answered, then a schedule releases it.
    released = scheduler.schedule(0.0)
    assert [(item.request_id, item.reason) for item in released.freed] == [("r0", FinishReason.STOPPED)]


def test_a_request_at_its_last_frame_in_flight_is_not_decoded_ahead() -> None:
    scheduler = Scheduler(make_config(**ONE_FRAME_CHUNKS))
    scheduler.add(make_request("short", max_frames=2))
    scheduler.add(make_request("long"))
    answer(scheduler, scheduler.schedule(0.0))
    in_flight = scheduler.schedule(0.0)  # frame 1, the last of "short"
    ahead = scheduler.schedule_ahead(0.0)
    assert ahead is not None and ids(ahead.decodes) == ["long"]
    answer(scheduler, in_flight)
    assert scheduler.requests["short"].finish_reason is FinishReason.LENGTH


def test_schedule_ahead_declines_without_changing_anything_when_a_decode_needs_a_preemption() -> None:
    # 3 prompt positions + frames in blocks of 4: both requests cross into their second block at frame 2.
    scheduler, in_flight = running_pair(max_frames=6, num_kv_blocks=3)
    blocks_before = {r: list(scheduler.requests[r].block_ids) for r in ("r0", "r1")}
    assert scheduler.schedule_ahead(0.0) is None
    assert {r: scheduler.requests[r].block_ids for r in ("r0", "r1")} == blocks_before
    assert [scheduler.requests[r].num_frames_in_flight for r in ("r0", "r1")] == [1, 1]
    answer(scheduler, in_flight)
    in_order = scheduler.schedule(0.0)  # in order, the newest request gives its blocks back
    assert ids(in_order.decodes) == ["r0"] and in_order.preempted == ("r1",)


def test_stalled_requests_are_preempted_for_waiting_ones_only_by_a_step_in_order() -> None:
    scheduler = Scheduler(make_config(max_running=2, max_slots=2, **ONE_FRAME_CHUNKS))
    scheduler.add(make_request("stalled", is_text_closed=False, num_text_tokens=1))
    scheduler.add(make_request("running"))
    answer(scheduler, scheduler.schedule(0.0))
    in_flight = scheduler.schedule(0.0)  # frame 1: "stalled" has text for it, and for no frame after
    scheduler.add(make_request("waiting"))
    ahead = scheduler.schedule_ahead(0.0)
    assert ahead is not None and ids(ahead.decodes) == ["running"]
    assert not ahead.prefills and not ahead.preempted
    answer(scheduler, in_flight)
    assert scheduler.schedule_ahead(0.0) is None, "the next step must be scheduled in order, to preempt"
    answer(scheduler, ahead)
    in_order = scheduler.schedule(0.0)
    assert in_order.preempted == ("stalled",) and ids(in_order.prefills) == ["waiting"]


def test_an_abort_while_frames_are_in_flight_releases_at_the_step_ahead_and_drops_its_frame() -> None:
    scheduler, in_flight = running_pair()
    scheduler.abort("r1")
    ahead = scheduler.schedule_ahead(0.0)
    assert ahead is not None and ids(ahead.decodes) == ["r0"]
    assert [(item.request_id, item.reason) for item in ahead.freed] == [("r1", FinishReason.ABORTED)]
    assert answer(scheduler, in_flight) == ["r0"]
    assert answer(scheduler, ahead) == ["r0"]
    assert "r1" not in scheduler.requests


def test_chunks_longer_than_a_frame_are_scheduled_in_order_only() -> None:
    scheduler, _ = running_pair(codec_chunk_schedule=(1, 2, 4))
    assert scheduler.schedule_ahead(0.0) is None


@pytest.mark.parametrize("num_in_flight", [0, 2])
def test_schedule_ahead_needs_exactly_one_step_in_flight(num_in_flight: int) -> None:
    scheduler = Scheduler(make_config(**ONE_FRAME_CHUNKS))
    scheduler.add(make_request("r0"))
    if num_in_flight:
        answer(scheduler, scheduler.schedule(0.0))
        scheduler.schedule(0.0)
        assert scheduler.schedule_ahead(0.0) is not None
    with pytest.raises(RuntimeError, match="exactly one step in flight"):
        scheduler.schedule_ahead(0.0)
