"""Host time of the scheduler's side of a step at steady load: schedule(), the step's result, update().

    python -m benchmarks.scheduler_host --running 128 --steps 400 --out bench-results/scheduler_host.json

`--running` requests with 60-position prompts and no end decode every step with one-frame codec chunks, as the
engine runs them; after a few warm-up steps, `--steps` steps are timed. The scheduler is pure Python, so this is
the same work on any machine's CPU, and it sits on the engine's critical path: the device waits for the next
step's talker pass while the host runs it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from scheduler.outputs import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler, SchedulerConfig

_FRAME_S = 0.08
_WARM_UP_STEPS = 5


def time_steps(num_running: int, num_steps: int) -> dict[str, float]:
    """Mean ms per step of schedule(), StepResult.for_output() and update() with `num_running` decodes a step."""
    config = SchedulerConfig(max_running=num_running, max_waiting=num_running, max_prefill_positions_per_step=4096,
                             block_size=16, num_kv_blocks=num_running * (num_steps + 200), codec_chunk_schedule=(1,),
                             min_playback_slack_s=-1e9, max_prefill_positions_at_risk=4096, frame_duration_s=_FRAME_S)
    scheduler = Scheduler(config)
    for index in range(num_running):
        scheduler.add(Request(f"r{index}", 60, max_frames=10 * num_steps, arrival_time=0.0, is_text_closed=True))
    totals = {"schedule_ms": 0.0, "result_ms": 0.0, "update_ms": 0.0}
    num_decodes = 0
    for step in range(_WARM_UP_STEPS + num_steps):
        now = step * _FRAME_S
        started = time.perf_counter()
        output = scheduler.schedule(now)
        scheduled = time.perf_counter()
        result = StepResult.for_output(output)
        answered = time.perf_counter()
        scheduler.update(result, now)
        updated = time.perf_counter()
        if step >= _WARM_UP_STEPS:
            totals["schedule_ms"] += scheduled - started
            totals["result_ms"] += answered - scheduled
            totals["update_ms"] += updated - answered
            num_decodes = len(output.decodes)
    means = {name: seconds * 1e3 / num_steps for name, seconds in totals.items()}
    return {**means, "num_decodes": num_decodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=128)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.running < 1 or args.steps < 1:
        parser.error("--running and --steps must be >= 1")
    timings = time_steps(args.running, args.steps)
    report = {"benchmark": "scheduler_host", "cpu": platform.processor() or platform.machine(),
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.scheduler_host", *(argv or sys.argv[1:])]),
              "num_running": args.running, "num_steps": args.steps, **timings}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    sys.stdout.write(f"{timings['num_decodes']} decodes a step: schedule {timings['schedule_ms']:.3f} ms, "
                     f"result {timings['result_ms']:.3f} ms, update {timings['update_ms']:.3f} ms\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
