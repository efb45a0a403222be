from __future__ import annotations

import pytest

from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import ids, make_config, make_request, run_step

FAST_STEP_S = 0.001


def _stream_with_27_frames_of_audio(at_risk_budget: int = 8, **request_options: object) -> Scheduler:
    """A stream whose 5th chunk (27 frames delivered in all, 2.16 s of audio) ran at step 27."""
    scheduler = Scheduler(make_config(min_playback_slack_s=0.5, max_prefill_positions_per_step=1000,
                                      max_prefill_positions_at_risk=at_risk_budget))
    scheduler.add(make_request("stream", **request_options))
    for step in range(1, 29):
        run_step(scheduler, now=step * FAST_STEP_S)
    stream = scheduler.requests["stream"]
    assert (stream.num_audio_frames, stream.first_audio_time) == (27, FAST_STEP_S)
    return scheduler


def _add_four(scheduler: Scheduler) -> None:
    for index in range(4):
        scheduler.add(make_request(f"new{index}"))


def test_healthy_streams_let_every_waiting_request_in_at_once() -> None:
    scheduler = _stream_with_27_frames_of_audio()
    _add_four(scheduler)
    output, _ = run_step(scheduler, now=29 * FAST_STEP_S)  # slack is about 2.1 s
    assert ids(output.prefills) == ["new0", "new1", "new2", "new3"]


def test_a_stream_short_of_playback_slack_throttles_admission_to_one_per_step() -> None:
    scheduler = _stream_with_27_frames_of_audio(at_risk_budget=8)  # one 8-position prompt per step
    _add_four(scheduler)
    # 2.0 s after its first audio the client has played 2.0 of its 2.16 s: 0.16 s of slack < 0.5 s.
    late = scheduler.requests["stream"].first_audio_time + 2.0
    assert scheduler.requests["stream"].playback_slack_s(late, 0.08) == pytest.approx(0.16)
    admitted_per_step = []
    for step in range(4):
        output, _ = run_step(scheduler, now=late + step * FAST_STEP_S)
        admitted_per_step.append(ids(output.prefills))
        assert ids(output.decodes)[0] == "stream"  # the stream itself keeps decoding every step
    assert admitted_per_step == [["new0"], ["new1"], ["new2"], ["new3"]]


def test_a_stream_parked_for_lack_of_text_does_not_throttle_admission() -> None:
    scheduler = _stream_with_27_frames_of_audio(is_text_closed=False, num_text_tokens=27)
    stream = scheduler.requests["stream"]
    assert stream.num_frames == 28 and not stream.has_text_for_next_frame
    _add_four(scheduler)
    late = stream.first_audio_time + 2.0  # its slack is low, but more GPU time would not help it
    output, _ = run_step(scheduler, now=late)
    assert stream.status is RequestStatus.PARKED
    assert ids(output.prefills) == ["new0", "new1", "new2", "new3"]


def test_at_risk_admission_fills_the_smaller_prefill_budget_not_just_one_request() -> None:
    scheduler = _stream_with_27_frames_of_audio(at_risk_budget=16)  # two 8-position prompts per step
    _add_four(scheduler)
    late = scheduler.requests["stream"].first_audio_time + 2.0
    admitted = [ids(run_step(scheduler, now=late + step * FAST_STEP_S)[0].prefills) for step in range(2)]
    assert admitted == [["new0", "new1"], ["new2", "new3"]]
