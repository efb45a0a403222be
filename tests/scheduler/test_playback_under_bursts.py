"""A burst of admissions while streams are playing: with deadline protection no stream that has started ever runs
out of audio, on a step-cost model where prefill positions make a step slower (as on the GPU)."""

from __future__ import annotations

from scheduler.outputs import StepResult
from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import NO_PLAYBACK_PROTECTION, make_config, make_request

FRAME_S = 0.08
# A step's cost: the decode and codec of every running stream, plus each prefilled position (a 40-position
# prompt adds 8 ms). Numbers of the H100's order, chosen so that prefilling a whole burst at once is too slow.
STEP_BASE_S = 0.03
STEP_PER_PREFILL_POSITION_S = 0.0002


def _scheduler(min_playback_slack_s: float) -> Scheduler:
    return Scheduler(make_config(max_running=48, max_waiting=128, max_prefill_positions_per_step=4096,
                                 max_prefill_positions_at_risk=64, min_playback_slack_s=min_playback_slack_s,
                                 codec_chunk_schedule=(1,), block_size=4, num_kv_blocks=4096))


def _worst_slack_through_a_burst(scheduler: Scheduler) -> float:
    """Run 8 streams for a few steps, add 40 requests at once, and run everything to the end; returns the lowest
    playback slack any started stream had at the end of a step, before that step's audio reached it."""
    for index in range(8):
        scheduler.add(make_request(f"playing{index}", num_prompt_positions=40, max_frames=60))
    now, worst = 0.0, float("inf")
    for step in range(400):
        if step == 3:
            for index in range(40):
                scheduler.add(make_request(f"burst{index}", num_prompt_positions=40, max_frames=30, arrival_time=now))
        output = scheduler.schedule(now)
        if output.is_empty:
            break
        now += STEP_BASE_S + STEP_PER_PREFILL_POSITION_S * sum(item.num_positions for item in output.prefills)
        for request in scheduler.requests.values():
            slack = request.playback_slack_s(now, FRAME_S)
            if request.status is RequestStatus.RUNNING and slack is not None:
                worst = min(worst, slack)
        scheduler.update(StepResult.for_output(output), now)
    assert not scheduler.has_unfinished_requests
    return worst


def test_a_burst_of_admissions_never_lets_a_playing_stream_run_dry() -> None:
    assert _worst_slack_through_a_burst(_scheduler(min_playback_slack_s=0.5)) >= 0.0


def test_without_deadline_protection_the_same_burst_makes_a_stream_run_dry() -> None:
    """The model above is one where the protection matters: admitting the burst as fast as room allows stalls."""
    assert _worst_slack_through_a_burst(_scheduler(min_playback_slack_s=NO_PLAYBACK_PROTECTION)) < 0.0
