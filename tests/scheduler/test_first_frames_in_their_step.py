"""A new stream's first frames go to the codec in the step that makes each of them."""

from __future__ import annotations

import pytest

from scheduler.outputs import SchedulerOutput, StepResult
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step


def chunk_plan(output: SchedulerOutput) -> list[tuple[str, int, int, bool, bool]]:
    return [(chunk.request_id, chunk.first_frame, chunk.num_frames, chunk.is_final, chunk.is_step_frame)
            for chunk in output.codec_chunks]


def test_a_new_streams_first_frames_are_decoded_in_their_step_and_the_rest_one_step_after_each() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=2))
    scheduler.add(make_request("a", max_frames=4))
    plans = [chunk_plan(run_step(scheduler, now=step * 0.01)[0]) for step in range(5)]
    assert plans == [
        [("a", 0, 1, False, True)],  # the prefill makes frame 0 and the same step decodes it
        [("a", 1, 1, False, True)],  # the decode makes frame 1 and the same step decodes it
        [],  # this step makes frame 2
        [("a", 2, 1, False, False)],  # which the next step's batched call decodes; this step makes frame 3
        [("a", 3, 1, True, False)],  # LENGTH at 4 frames: the last frame is the final chunk
    ]
    run_step(scheduler, now=0.05)  # releases it
    assert not scheduler.has_unfinished_requests


def test_a_step_frame_counts_as_audio_at_the_steps_audio_time() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=1))
    scheduler.add(make_request("a"))
    output = scheduler.schedule(0.0)
    scheduler.update(StepResult.for_output(output, audio_time=0.25), now=0.3)
    request = scheduler.requests["a"]
    assert (request.num_frames, request.num_codec_frames, request.num_audio_frames) == (1, 1, 1)
    assert request.first_audio_time == 0.25


@pytest.mark.parametrize("num_frames_before_eos", [0, 1])
def test_a_step_that_makes_eos_takes_its_chunk_back_and_the_stream_closes_with_what_it_had(
        num_frames_before_eos: int) -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=2))
    scheduler.add(make_request("a"))
    for step in range(num_frames_before_eos):
        run_step(scheduler, now=step * 0.01)
    last, _ = run_step(scheduler, now=0.1, eos_ids={"a"})
    assert chunk_plan(last) == [("a", num_frames_before_eos, 1, False, True)]
    request = scheduler.requests["a"]
    assert request.num_codec_frames == request.num_audio_frames == num_frames_before_eos
    closing, _ = run_step(scheduler, now=0.2)
    assert chunk_plan(closing) == [("a", num_frames_before_eos, 0, True, False)]
    run_step(scheduler, now=0.3)  # releases it
    assert not scheduler.has_unfinished_requests


def test_a_failed_step_frame_counts_no_audio() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=2))
    scheduler.add(make_request("a"))
    run_step(scheduler, now=0.0, errors={"a": "prefill failed"})
    request = scheduler.requests["a"]
    assert (request.num_audio_frames, request.first_audio_time) == (0, None)
    run_step(scheduler, now=0.01)
    assert "a" not in scheduler.requests


def test_a_resumed_stream_past_its_first_frames_gets_no_step_frame_chunk() -> None:
    # Two 4-position prompts in six 4-position blocks: the newer one is preempted at the tenth step.
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=2,
                                      block_size=4, num_kv_blocks=6))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    outputs = [run_step(scheduler)[0] for _ in range(10)]
    assert outputs[9].preempted == ("new",)
    assert scheduler.requests["new"].num_audio_frames > 2
    run_step(scheduler, eos_ids={"old"})
    resumed, _ = run_step(scheduler)
    assert [item.request_id for item in resumed.prefills] == ["new"]
    assert not any(chunk.is_step_frame for chunk in resumed.codec_chunks)


def test_with_none_or_a_longer_first_chunk_every_frame_waits_a_step() -> None:
    for config in (make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=0),
                   make_config(codec_chunk_schedule=(2, 4), num_first_frames_in_their_step=2)):
        scheduler = Scheduler(config)
        scheduler.add(make_request("a"))
        outputs = [run_step(scheduler, now=step * 0.01)[0] for step in range(3)]
        assert not any(chunk.is_step_frame for output in outputs for chunk in output.codec_chunks)
        assert outputs[0].codec_chunks == ()


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="num_first_frames_in_their_step"):
        make_config(num_first_frames_in_their_step=-1)


def test_no_first_frame_is_decoded_in_its_step_while_a_playing_stream_is_at_risk() -> None:
    """The extra codec call lengthens everyone's step: it is made only while every playing stream holds at least
    min_playback_slack_s of audio. A stream gains 80 ms of audio per 10 ms step here, so "a" is at risk for its
    first steps (0.5 s of slack takes 8 of them) and safe after."""
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), num_first_frames_in_their_step=1,
                                      min_playback_slack_s=0.5))
    scheduler.add(make_request("a", max_frames=40))
    step_frames: dict[str, bool] = {}
    for step in range(14):
        if step == 2:
            scheduler.add(make_request("b", max_frames=40))
        if step == 12:
            scheduler.add(make_request("c", max_frames=40))
        output, _ = run_step(scheduler, now=step * 0.01)
        for item in output.prefills:
            step_frames[item.request_id] = any(chunk.request_id == item.request_id and chunk.is_step_frame
                                               for chunk in output.codec_chunks)
    assert step_frames == {"a": True, "b": False, "c": True}
