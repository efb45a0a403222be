"""Session 16 probe: the in-order engine step's host path between two talker passes, stamped (python -m
benchmarks.engine in process, steps in order): the frames on the host (PendingStep.result returns), the runner's
call returns (run_step), the loop resumes (Engine._answer), the loop starts the next step (_step_in_order), the
plan is ready (Engine._plan), the runner's next call starts (run_step) and its rows and metadata are queued
(ModelRunner._start_decodes returns, right after the talker's replay). Medians of each gap to argv[1]."""
import json
import statistics
import sys
import time
from collections import defaultdict

from benchmarks.engine import main
from tts_service.engine import engine as E
from tts_service.runner import runner as R

stamps: dict[str, list[float]] = defaultdict(list)


def stamp_exit(name, function):
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        finally:
            stamps[name].append(time.perf_counter())
    return wrapper


def stamp_entry(name, function):
    def wrapper(*args, **kwargs):
        stamps[name].append(time.perf_counter())
        return function(*args, **kwargs)
    return wrapper


original_run_step = E.run_step


def run_step(*args, **kwargs):
    stamps["worker_starts"].append(time.perf_counter())
    try:
        return original_run_step(*args, **kwargs)
    finally:
        stamps["worker_returns"].append(time.perf_counter())


E.run_step = run_step
R.PendingStep.result = stamp_exit("frames_on_host", R.PendingStep.result)
original_start_decodes = R.ModelRunner._start_decodes
original_start_step = R.ModelRunner.start_step
talker_queued: list[float | None] = [None]


def start_decodes(self, decodes):
    original_start_decodes(self, decodes)
    talker_queued[0] = time.perf_counter()


def start_step(self, step):
    talker_queued[0] = None
    try:
        return original_start_step(self, step)
    finally:
        stamps["talker_queued"].append(talker_queued[0])  # None: a step of prefills alone


R.ModelRunner._start_decodes = start_decodes
R.ModelRunner.start_step = start_step
E.Engine._answer = stamp_entry("loop_resumes", E.Engine._answer)
E.Engine._plan = stamp_exit("planned", E.Engine._plan)
original_step = E.Engine._step_in_order


async def step_in_order(self):
    stamps["loop_starts_step"].append(time.perf_counter())
    return await original_step(self)


E.Engine._step_in_order = step_in_order
out, argv = sys.argv[1], sys.argv[2:]
if argv and argv[0].startswith("--switch-interval-ms="):
    sys.setswitchinterval(float(argv.pop(0).split("=")[1]) / 1000)
code = main(argv)
n = min(len(v) for k, v in stamps.items() if k != "loop_starts_step")


def gaps(later, earlier, shift=0):
    values = [1e3 * (stamps[later][i + shift] - stamps[earlier][i]) for i in range(n - 1)
              if stamps[later][i + shift] is not None and stamps[earlier][i] is not None]
    return {"p50_ms": statistics.median(values), "mean_ms": statistics.fmean(values)}


summary = {
    "frames on host -> runner's call returns": gaps("worker_returns", "frames_on_host"),
    "runner's call returns -> loop resumes": gaps("loop_resumes", "worker_returns"),
    "plan ready -> runner's next call starts": gaps("worker_starts", "planned", 0),
    "runner's call starts -> talker queued": gaps("talker_queued", "worker_starts"),
    "loop resumes -> next talker queued": gaps("talker_queued", "loop_resumes", 1),
    "frames on host -> next talker queued": gaps("talker_queued", "frames_on_host", 1),
}
for name, row in summary.items():
    print(f"{name:42s} p50 {row['p50_ms']:.3f} mean {row['mean_ms']:.3f} ms")
json.dump({"steps": n, "gaps": summary}, open(out, "w"), indent=1)
raise SystemExit(code)
