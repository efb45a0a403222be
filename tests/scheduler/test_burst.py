from __future__ import annotations

from scheduler.request import RequestStatus
from scheduler.scheduler import Scheduler
from tests.scheduler.helpers import make_config, make_request, run_step


def test_a_burst_of_100_arrivals_never_stops_running_requests_from_decoding() -> None:
    scheduler = Scheduler(make_config(max_running=16, max_waiting=100, max_prefill_positions_per_step=64,
                                      block_size=4, num_kv_blocks=1024))
    for index in range(8):
        scheduler.add(make_request(f"early{index}", num_prompt_positions=8, max_frames=80))
    run_step(scheduler, now=0.0)
    for index in range(100):
        scheduler.add(make_request(f"burst{index}", num_prompt_positions=40, max_frames=20,
                                   arrival_time=0.01))
    now = 0.01
    num_steps = 0
    while scheduler.has_unfinished_requests:
        running_before = {request.request_id for request in scheduler.requests.values()
                          if request.status is RequestStatus.RUNNING}
        now += 0.02
        output, _ = run_step(scheduler, now)
        num_steps += 1
        assert running_before <= {item.request_id for item in output.decodes}, f"step {num_steps}"
        assert output.preempted == ()
        assert len(output.prefills) <= 1  # 40-position prompts against a 64-position budget
        assert num_steps < 500, "the burst was never drained"
    assert (scheduler.num_kv_blocks_used, scheduler.num_slots_used) == (0, 0)
