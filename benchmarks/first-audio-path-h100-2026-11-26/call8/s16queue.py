"""Session 16 probe: inside the engine (python -m benchmarks.engine, in process), the host time of each piece of
queueing a decode step: the rows' loads, the talker's metadata, each graph's replay, the codec's queueing. Each
runner method below is wrapped with a host clock; the totals per call are printed and written to argv[1]."""
import json
import sys
import time
from collections import defaultdict

from benchmarks.engine import main
from tts_service.runner import runner as R
from tts_service.runner.kv_cache import PagedDecodeBackend

totals: dict[str, list[float]] = defaultdict(list)


def timed(name, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[name].append(time.perf_counter() - started)
    return wrapper


original_replay = R.ModelRunner._replay_or_run


def replay(self, graphs, step, batch):
    name = "talker_replay" if graphs is self.rows.talker_graphs else "sampling_replay"
    started = time.perf_counter()
    try:
        return original_replay(self, graphs, step, batch)
    finally:
        totals[name].append(time.perf_counter() - started)


R.ModelRunner._replay_or_run = replay
R.ModelRunner._load_rows = timed("load_rows", R.ModelRunner._load_rows)
PagedDecodeBackend.set_metadata = timed("set_metadata", PagedDecodeBackend.set_metadata)
R.ModelRunner._start_decodes = timed("start_decodes", R.ModelRunner._start_decodes)
R.ModelRunner._sample_frames = timed("sample_frames", R.ModelRunner._sample_frames)
R.ModelRunner._start_frame_audio = timed("start_frame_audio", R.ModelRunner._start_frame_audio)
R.ModelRunner.start_step = timed("start_step", R.ModelRunner.start_step)
out, argv = sys.argv[1], sys.argv[2:]
code = main(argv)
summary = {name: {"calls": len(values), "mean_ms": 1e3 * sum(values) / len(values),
                  "p50_ms": 1e3 * sorted(values)[len(values) // 2]} for name, values in totals.items()}
for name, row in summary.items():
    print(f"{name:18s} calls {row['calls']:6d} mean {row['mean_ms']:.3f} ms p50 {row['p50_ms']:.3f} ms")
json.dump(summary, open(out, "w"), indent=1)
raise SystemExit(code)
