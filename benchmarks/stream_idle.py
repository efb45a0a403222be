"""How long each CUDA stream sits idle per engine step under steady load: what overlapping the host's work with the
device's (asynchronous scheduling) could win.

    python -m benchmarks.stream_idle --concurrency 128 --requests 512 --out bench-results/stream_idle.json

The engine runs `--requests` closed-loop requests at `--concurrency` (benchmarks/engine.py's workload). After
`--delay-s`, the PyTorch profiler records the device's kernels, copies and memsets for `--window-s`. Per stream it
reports the busy time (the union of its activities), the idle time between them, and the idle gaps of 50 us or
more; for the device as a whole, the time no stream runs anything. Each is also divided by the engine steps that
ran in the window. Kernels inside CUDA graphs are recorded one by one, so the frame and codec graphs show as the
streams they replay on: the frame step's stream has the talker's kernels, the codec's has its convolutions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine import bench_workload, run_level
from observability.metrics import StepObservation
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_GAP_US = 50.0


@dataclass(frozen=True)
class Activity:
    stream: int
    start_us: float
    end_us: float
    name: str


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _idle_report(busy: list[tuple[float, float]], window: tuple[float, float], num_steps: int) -> dict[str, float]:
    """Busy and idle time of merged, clipped intervals within `window`, in ms, also per step."""
    start, end = window
    busy_us = sum(b - a for a, b in busy)
    edges = [start, *(edge for interval in busy for edge in interval), end]
    gaps = [edges[i + 1] - edges[i] for i in range(0, len(edges), 2)]
    long_gaps = sorted(gap for gap in gaps if gap >= _GAP_US)
    idle_us = (end - start) - busy_us
    per_step = 1e3 * max(num_steps, 1)
    return {"busy_ms": busy_us / 1e3, "idle_ms": idle_us / 1e3,
            "busy_ms_per_step": busy_us / per_step, "idle_ms_per_step": idle_us / per_step,
            "num_gaps_over_50us": len(long_gaps), "gaps_over_50us_ms": sum(long_gaps) / 1e3,
            "longest_gap_ms": (long_gaps[-1] if long_gaps else 0.0) / 1e3}


def idle_by_stream(activities: list[Activity], window: tuple[float, float], num_steps: int) -> dict[str, object]:
    """Each stream's busy and idle time in `window` (us on the profiler's clock), and the whole device's."""
    start, end = window
    clipped = [(a.stream, max(a.start_us, start), min(a.end_us, end), a.name, a.end_us - a.start_us)
               for a in activities if a.end_us > start and a.start_us < end]
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    time_by_name: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for stream, a, b, name, duration in clipped:
        by_stream[stream].append((a, b))
        time_by_name[stream][name] += duration
    streams = {}
    for stream, intervals in sorted(by_stream.items()):
        top = sorted(time_by_name[stream].items(), key=lambda item: -item[1])[:3]
        streams[str(stream)] = {"num_activities": len(intervals), **_idle_report(_merged(intervals), window, num_steps),
                                "top_activities_ms": {name[:80]: us / 1e3 for name, us in top}}
    device = _idle_report(_merged([(a, b) for _, a, b, _, _ in clipped]), window, num_steps)
    return {"window_ms": (end - start) / 1e3, "num_steps": num_steps, "streams": streams, "device": device}


def device_activities(trace_path: Path) -> list[Activity]:
    """The kernels, copies and memsets of a Chrome trace that the PyTorch profiler exported."""
    trace = json.loads(trace_path.read_text())
    return [Activity(int(event["args"]["stream"]), float(event["ts"]), float(event["ts"]) + float(event["dur"]),
                     event["name"])
            for event in trace["traceEvents"]
            if event.get("cat") in _DEVICE_CATEGORIES and "stream" in event.get("args", {})]


async def profiled_window(engine: Engine, concurrency: int, num_requests: int, frame_s: float, delay_s: float,
                          window_s: float, trace_path: Path) -> tuple[int, float]:
    """Run the level; profile the device for `window_s` once `delay_s` has passed. Returns the steps that ran
    in the window and the level's audio seconds per second."""
    engine.start()
    steps: list[StepObservation] = []  # those that ran in the window
    try:
        await run_level(engine, 4, bench_workload(8), frame_s)  # warm-up
        started = time.perf_counter()
        level = asyncio.create_task(run_level(engine, concurrency, bench_workload(num_requests), frame_s))
        await asyncio.sleep(delay_s)
        engine.add_step_observer(steps.append)
        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            await asyncio.sleep(window_s)
        engine.remove_step_observer(steps.append)
        timings = await level
        profiled.export_chrome_trace(str(trace_path))
        audio_s = sum(timing.audio_s for timing in timings)
        return len(steps), audio_s / (time.perf_counter() - started)
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--delay-s", type=float, default=3.0, help="from the level's start to the window's")
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    model = load_model(args.model, LoadOptions.default_for("cuda"))
    engine = Engine.create(model, EngineConfig(max_running=args.concurrency, max_waiting=4 * args.requests,
                                               max_positions_per_request=1024))
    frame_s = 1.0 / model.speech_config.frame_rate_hz
    with tempfile.TemporaryDirectory() as scratch:
        trace_path = Path(scratch) / "trace.json"
        num_steps, audio_s_per_s = asyncio.run(profiled_window(
            engine, args.concurrency, args.requests, frame_s, args.delay_s, args.window_s, trace_path))
        activities = device_activities(trace_path)
    window = (min(a.start_us for a in activities), max(a.end_us for a in activities))
    report = {"benchmark": "stream_idle", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "command": " ".join(["python -m benchmarks.stream_idle", *(argv or sys.argv[1:])]),
              "concurrency": args.concurrency, "num_requests": args.requests, "audio_s_per_s": audio_s_per_s,
              **idle_by_stream(activities, window, num_steps)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{report['num_steps']} steps in {report['window_ms']:.0f} ms; audio s per s {audio_s_per_s:.1f}"]
    for name, stats in [*report["streams"].items(), ("device", report["device"])]:
        lines.append(f"{name:>8}: busy {stats['busy_ms_per_step']:.2f} ms/step, idle {stats['idle_ms_per_step']:.2f} "
                     f"ms/step, {stats['num_gaps_over_50us']} gaps >= 50 us ({stats['gaps_over_50us_ms']:.1f} ms), "
                     f"longest {stats['longest_gap_ms']:.2f} ms")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
