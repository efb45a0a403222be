"""A new stream's first frame goes to the codec in the step whose prefill makes it."""

from __future__ import annotations

from scheduler.outputs import SchedulerOutput, StepResult
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step


def chunk_plan(output: SchedulerOutput) -> list[tuple[str, int, int, bool, bool]]:
    return [(chunk.request_id, chunk.first_frame, chunk.num_frames, chunk.is_final, chunk.is_prefill_frame)
            for chunk in output.codec_chunks]


def test_a_new_stream_gets_its_first_chunk_in_its_prefill_step_and_the_rest_one_step_after_each_frame() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=True))
    scheduler.add(make_request("a", max_frames=3))
    plans = [chunk_plan(run_step(scheduler, now=step * 0.01)[0]) for step in range(4)]
    assert plans == [
        [("a", 0, 1, False, True)],  # the prefill makes frame 0 and the same step decodes it
        [],  # this step's decode makes frame 1
        [("a", 1, 1, False, False)],  # and the next step's codec call decodes it
        [("a", 2, 1, True, False)],  # LENGTH at 3 frames: the last frame is the final chunk
    ]
    run_step(scheduler, now=0.05)  # releases it
    assert not scheduler.has_unfinished_requests


def test_the_prefill_chunk_counts_as_audio_at_the_steps_audio_time() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=True))
    scheduler.add(make_request("a"))
    output = scheduler.schedule(0.0)
    scheduler.update(StepResult.for_output(output, audio_time=0.25), now=0.3)
    request = scheduler.requests["a"]
    assert (request.num_frames, request.num_codec_frames, request.num_audio_frames) == (1, 1, 1)
    assert request.first_audio_time == 0.25


def test_a_prefill_that_makes_eos_takes_its_chunk_back_and_the_stream_closes_with_no_audio() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=True))
    scheduler.add(make_request("a"))
    first, _ = run_step(scheduler, now=0.0, eos_ids={"a"})
    assert chunk_plan(first) == [("a", 0, 1, False, True)]
    request = scheduler.requests["a"]
    assert (request.num_codec_frames, request.num_audio_frames, request.first_audio_time) == (0, 0, None)
    second, _ = run_step(scheduler, now=0.01)
    assert chunk_plan(second) == [("a", 0, 0, True, False)]
    run_step(scheduler, now=0.02)  # releases it
    assert not scheduler.has_unfinished_requests


def test_a_failed_prefill_counts_no_audio() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=True))
    scheduler.add(make_request("a"))
    run_step(scheduler, now=0.0, errors={"a": "prefill failed"})
    request = scheduler.requests["a"]
    assert (request.num_audio_frames, request.first_audio_time) == (0, None)
    run_step(scheduler, now=0.01)
    assert "a" not in scheduler.requests


def test_a_resumed_stream_with_audio_gets_no_prefill_chunk() -> None:
    # Two 4-position prompts in six 4-position blocks: the newer one is preempted at the tenth step.
    scheduler = Scheduler(make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=True,
                                      block_size=4, num_kv_blocks=6))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    outputs = [run_step(scheduler)[0] for _ in range(10)]
    assert outputs[9].preempted == ("new",)
    assert scheduler.requests["new"].num_audio_frames > 0
    run_step(scheduler, eos_ids={"old"})
    resumed, _ = run_step(scheduler)
    assert [item.request_id for item in resumed.prefills] == ["new"]
    assert not any(chunk.is_prefill_frame for chunk in resumed.codec_chunks)


def test_without_the_option_or_with_a_longer_first_chunk_the_first_chunk_waits_a_step() -> None:
    for config in (make_config(codec_chunk_schedule=(1,), first_chunk_in_prefill_step=False),
                   make_config(codec_chunk_schedule=(2, 4), first_chunk_in_prefill_step=True)):
        scheduler = Scheduler(config)
        scheduler.add(make_request("a"))
        first, _ = run_step(scheduler, now=0.0)
        assert first.codec_chunks == ()
