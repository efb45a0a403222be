"""A step that admits requests leaves out the codec work of streams far ahead of their playback; a step later it
is all decoded, in order."""

from __future__ import annotations

import math

import pytest

from scheduler.outputs import SchedulerOutput
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step

STEP_S = 0.01  # a step far shorter than the 80 ms of audio each frame holds: streams get ahead quickly


def chunks_of(output: SchedulerOutput, request_id: str) -> list[tuple[int, int]]:
    return [(chunk.first_frame, chunk.num_frames) for chunk in output.codec_chunks if chunk.request_id == request_id]


def playing_scheduler(min_slack_to_defer_codec_s: float, num_steps: int) -> tuple[Scheduler, float]:
    """Stream "a" played for `num_steps` steps; returns the scheduler and the time of the next step."""
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), min_slack_to_defer_codec_s=min_slack_to_defer_codec_s))
    scheduler.add(make_request("a", max_frames=100))
    for step in range(num_steps):
        run_step(scheduler, now=step * STEP_S)
    return scheduler, num_steps * STEP_S


def test_an_admission_step_leaves_out_a_stream_far_ahead_and_the_next_step_decodes_both_frames_in_order() -> None:
    scheduler, now = playing_scheduler(min_slack_to_defer_codec_s=0.5, num_steps=12)
    assert scheduler.requests["a"].playback_slack_s(now, 0.08) >= 0.5
    scheduler.add(make_request("b", arrival_time=now))
    admission, _ = run_step(scheduler, now=now)
    assert [item.request_id for item in admission.prefills] == ["b"]
    assert chunks_of(admission, "a") == []
    following, _ = run_step(scheduler, now=now + STEP_S)
    assert chunks_of(following, "a") == [(11, 1), (12, 1)]
    assert chunks_of(following, "b") == [(0, 1)]


@pytest.mark.parametrize(("min_slack_to_defer_codec_s", "num_steps"), [
    (math.inf, 12),  # deferral off
    (0.5, 3),  # on, but the stream is not that far ahead yet
])
def test_a_stream_not_far_enough_ahead_keeps_its_codec_work_in_an_admission_step(
        min_slack_to_defer_codec_s: float, num_steps: int) -> None:
    scheduler, now = playing_scheduler(min_slack_to_defer_codec_s, num_steps)
    scheduler.add(make_request("b", arrival_time=now))
    admission, _ = run_step(scheduler, now=now)
    assert [item.request_id for item in admission.prefills] == ["b"]
    assert chunks_of(admission, "a") == [(num_steps - 1, 1)]


def test_steps_without_admissions_decode_every_stream_however_far_ahead() -> None:
    scheduler, now = playing_scheduler(min_slack_to_defer_codec_s=0.5, num_steps=12)
    output, _ = run_step(scheduler, now=now)
    assert chunks_of(output, "a") == [(11, 1)]


def test_a_finished_streams_last_audio_is_never_left_out() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), min_slack_to_defer_codec_s=0.5))
    scheduler.add(make_request("a", max_frames=12))
    for step in range(12):
        run_step(scheduler, now=step * STEP_S)
    assert scheduler.requests["a"].is_finished
    scheduler.add(make_request("b", arrival_time=12 * STEP_S))
    admission, _ = run_step(scheduler, now=12 * STEP_S)
    assert [(chunk.first_frame, chunk.num_frames, chunk.is_final) for chunk in admission.codec_chunks
            if chunk.request_id == "a"] == [(11, 1, True)]


def test_a_slack_to_defer_at_zero_or_below_is_refused() -> None:
    with pytest.raises(ValueError, match="min_slack_to_defer_codec_s must be > 0"):
        make_config(min_slack_to_defer_codec_s=0.0)
