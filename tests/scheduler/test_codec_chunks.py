from __future__ import annotations

from itertools import pairwise

import pytest

from scheduler.codec_chunks import chunk_size, plan_chunk_sizes
from scheduler.outputs import StepResult
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step

SCHEDULE = (1, 2, 4, 8, 12)


def test_chunk_size_follows_the_schedule_then_repeats_its_last_size() -> None:
    assert [chunk_size(SCHEDULE, index) for index in range(8)] == [1, 2, 4, 8, 12, 12, 12, 12]


@pytest.mark.parametrize(("num_chunks_sent", "num_pending", "is_end", "expected"), [
    (0, 0, False, []),
    (0, 1, False, [1]),
    (1, 1, False, []),  # the second chunk waits for 2 frames
    (1, 2, False, [2]),
    (0, 7, False, [1, 2, 4]),  # a backlog (after a resume) drains as whole chunks
    (5, 11, False, []),
    (5, 11, True, [11]),  # end of stream: the remainder, shorter than 12
    (5, 12, True, [12]),  # exactly a full chunk at the end is the final chunk itself, no empty one after
    (5, 13, True, [12, 1]),
    (3, 0, True, [0]),  # nothing left: an empty final chunk still closes the stream
])
def test_plan_chunk_sizes(num_chunks_sent: int, num_pending: int, is_end: bool, expected: list[int]) -> None:
    assert plan_chunk_sizes(SCHEDULE, num_chunks_sent, num_pending, is_end) == expected


def test_a_40_frame_stream_is_chunked_1_2_4_8_12_12_then_a_final_1_at_the_exact_steps() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=SCHEDULE))
    scheduler.add(make_request("a", max_frames=40))
    chunks = []
    for step in range(1, 43):
        output, _ = run_step(scheduler, now=step * 0.01)
        chunks.extend((step, chunk.first_frame, chunk.num_frames, chunk.is_final)
                      for chunk in output.codec_chunks)
    # Frame f is produced by step f + 1, and a chunk is cut in the step that makes its last frame (the codec
    # runs after the step's frames). The stream ends at 40 frames (LENGTH); the last 1 frame is flushed.
    assert chunks == [
        (1, 0, 1, False),
        (3, 1, 2, False),
        (7, 3, 4, False),
        (15, 7, 8, False),
        (27, 15, 12, False),
        (39, 27, 12, False),
        (41, 39, 1, True),
    ]
    assert not scheduler.has_unfinished_requests


def test_stream_ending_right_after_a_full_chunk_gets_an_empty_final_chunk() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=SCHEDULE))
    scheduler.add(make_request("a"))
    outputs = [run_step(scheduler)[0] for _ in range(3)]  # frames 0-2, each chunk cut in the step of its last
    assert [[(chunk.first_frame, chunk.num_frames) for chunk in output.codec_chunks]
            for output in outputs] == [[(0, 1)], [], [(1, 2)]]
    output, _ = run_step(scheduler, eos_ids={"a"})
    assert output.codec_chunks == ()
    final, _ = run_step(scheduler)
    assert [(chunk.first_frame, chunk.num_frames, chunk.is_final) for chunk in final.codec_chunks] == [
        (3, 0, True)]


def test_delivered_chunks_set_first_audio_time_and_count_audio_frames() -> None:
    scheduler = Scheduler(make_config(codec_chunk_schedule=SCHEDULE))
    scheduler.add(make_request("a"))
    output = scheduler.schedule(1.0)
    request = scheduler.requests["a"]
    assert request.first_audio_time is None
    scheduler.update(StepResult.for_output(output), now=1.05)  # the prefill's frame and its chunk
    assert (request.first_audio_time, request.num_audio_frames) == (1.05, 1)
    for step in range(1, 4):
        run_step(scheduler, now=1.0 + step * 0.1)  # frames 1 and 2 are the second chunk
    assert (request.first_audio_time, request.num_audio_frames) == (1.05, 3)
    assert request.playback_slack_s(now=1.3, frame_duration_s=0.08) == pytest.approx(3 * 0.08 - 0.25)


def test_frames_pending_at_preemption_are_chunked_after_the_resume() -> None:
    scheduler = Scheduler(make_config(block_size=4, num_kv_blocks=5, codec_chunk_schedule=SCHEDULE))
    scheduler.add(make_request("old", num_prompt_positions=4, max_frames=16))
    scheduler.add(make_request("new", num_prompt_positions=4, max_frames=16))
    sent_frames: list[tuple[int, int]] = []
    for step in range(1, 30):
        output, _ = run_step(scheduler, now=step * 0.01, eos_ids={"old"} if step == 10 else ())
        sent_frames.extend((chunk.first_frame, chunk.num_frames) for chunk in output.codec_chunks
                           if chunk.request_id == "new")
        if step == 6:
            assert output.preempted == ("new",)
    # Contiguous, in order, with the schedule's sizes, across the preemption.
    assert [size for _, size in sent_frames[:4]] == [1, 2, 4, 8]
    assert all(first == previous_first + previous_size
               for (previous_first, previous_size), (first, _) in pairwise(sent_frames))
