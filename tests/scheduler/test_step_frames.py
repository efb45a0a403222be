"""A chunk is cut in the step that makes its last frame: the engine decodes every chunk after the step's frames."""

from __future__ import annotations

import pytest

from scheduler.outputs import SchedulerOutput
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step


def chunk_plan(output: SchedulerOutput) -> list[tuple[str, int, int, bool, bool]]:
    return [(chunk.request_id, chunk.first_frame, chunk.num_frames, chunk.is_final, chunk.is_step_frame)
            for chunk in output.codec_chunks]


def test_with_one_frame_chunks_every_frame_is_decoded_in_the_step_that_makes_it() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,)))
    scheduler.add(make_request("a", max_frames=4))
    plans = [chunk_plan(run_step(scheduler, now=step * 0.01)[0]) for step in range(5)]
    assert plans == [
        [("a", 0, 1, False, True)],  # the prefill makes frame 0 and the same step decodes it
        [("a", 1, 1, False, True)],
        [("a", 2, 1, False, True)],
        [("a", 3, 1, False, True)],  # LENGTH at 4 frames
        [("a", 4, 0, True, False)],  # nothing left: the final chunk only closes the stream
    ]
    run_step(scheduler, now=0.05)  # releases it
    assert not scheduler.has_unfinished_requests


def test_a_longer_chunk_is_cut_in_the_step_that_makes_its_last_frame_with_the_earlier_ones() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1, 3)))
    scheduler.add(make_request("a", max_frames=7))
    plans = [chunk_plan(run_step(scheduler, now=step * 0.01)[0]) for step in range(8)]
    assert plans == [
        [("a", 0, 1, False, True)],
        [], [],  # frames 1 and 2 wait
        [("a", 1, 3, False, True)],  # frame 3 fills the chunk, which is decoded in the step that makes it
        [], [],
        [("a", 4, 3, False, True)],  # LENGTH at 7 frames
        [("a", 7, 0, True, False)],
    ]


def test_a_step_frame_counts_as_audio_once_its_step_is_answered() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,)))
    scheduler.add(make_request("a"))
    output, _ = run_step(scheduler, now=0.25)
    assert chunk_plan(output) == [("a", 0, 1, False, True)]
    request = scheduler.requests["a"]
    assert (request.num_frames, request.num_codec_frames, request.num_audio_frames) == (1, 1, 1)
    assert request.first_audio_time == 0.25


@pytest.mark.parametrize("num_frames_before_eos", [0, 1, 3])
def test_a_step_that_makes_eos_takes_its_chunk_back_and_the_stream_closes_with_what_it_had(
        num_frames_before_eos: int) -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,)))
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


def test_eos_in_the_step_that_would_fill_a_chunk_sends_the_earlier_frames_with_the_final_chunk() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1, 3)))
    scheduler.add(make_request("a"))
    for step in range(3):
        run_step(scheduler, now=step * 0.01)  # frame 0 (decoded), frames 1 and 2 (waiting)
    last, _ = run_step(scheduler, now=0.1, eos_ids={"a"})
    assert chunk_plan(last) == [("a", 1, 3, False, True)]
    request = scheduler.requests["a"]
    assert (request.num_codec_frames, request.num_audio_frames) == (1, 1)
    closing, _ = run_step(scheduler, now=0.2)
    assert chunk_plan(closing) == [("a", 1, 2, True, False)]


def test_a_failed_step_frame_counts_no_audio() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,)))
    scheduler.add(make_request("a"))
    run_step(scheduler, now=0.0, errors={"a": "prefill failed"})
    request = scheduler.requests["a"]
    assert (request.num_audio_frames, request.first_audio_time) == (0, None)
    run_step(scheduler, now=0.01)
    assert "a" not in scheduler.requests


def test_a_resumed_streams_next_frame_is_decoded_in_its_resume_step_after_the_rebuilt_context() -> None:
    # Two 4-position prompts in six 4-position blocks: the newer one is preempted at the tenth step.
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), block_size=4, num_kv_blocks=6))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    outputs = [run_step(scheduler)[0] for _ in range(10)]
    assert outputs[9].preempted == ("new",)
    num_frames = scheduler.requests["new"].num_frames
    assert scheduler.requests["new"].num_audio_frames == num_frames  # nothing waits for the codec
    run_step(scheduler, eos_ids={"old"})
    resumed, _ = run_step(scheduler)
    [prefill] = resumed.prefills
    assert (prefill.request_id, prefill.num_resumed_frames, prefill.num_codec_frames) == ("new", num_frames,
                                                                                         num_frames)
    assert ("new", num_frames, 1, False, True) in chunk_plan(resumed)


def test_step_frames_are_planned_while_a_stream_is_short_of_playback_slack() -> None:
    """They are the step's one codec call, not an extra one, so deadline protection does not hold them back."""
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), min_playback_slack_s=0.5))
    scheduler.add(make_request("a", max_frames=40))
    for step in range(3):
        output, _ = run_step(scheduler, now=step * 0.01)
        assert chunk_plan(output) == [("a", step, 1, False, True)]
    scheduler.add(make_request("b", max_frames=40))
    output, _ = run_step(scheduler, now=0.03)
    assert chunk_plan(output) == [("a", 3, 1, False, True), ("b", 0, 1, False, True)]
