"""Which CUDA runtime calls hold the engine's host time: a torch profile of the engine in process under load.

    python -m benchmarks.host_calls --concurrency 32 --out bench-results/host-calls.txt

It runs 2C closed-loop requests at concurrency C (benchmarks/engine.py's workload) under torch.profiler and
writes the profiler's table, by total host time, plus a count of runtime calls that took over 2 ms (a launch
that long waited for room in the stream's queue, that is for the GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from benchmarks.engine import bench_workload, run_level
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model

_SLOW_CALL_US = 2000


async def profiled_level(engine: Engine, concurrency: int, frame_s: float) -> profile:
    engine.start()
    try:
        await run_level(engine, 4, bench_workload(8), frame_s)  # warm-up, unprofiled
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
            await run_level(engine, concurrency, bench_workload(2 * concurrency), frame_s)
        return profiled
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    model = load_model(args.model, LoadOptions.default_for("cuda"))
    engine = Engine.create(model, EngineConfig(max_running=args.concurrency, max_waiting=4 * args.concurrency,
                                               max_positions_per_request=1024))
    profiled = asyncio.run(profiled_level(engine, args.concurrency, 1.0 / model.speech_config.frame_rate_hz))
    table = profiled.key_averages().table(sort_by="cpu_time_total", row_limit=45, max_name_column_width=60)
    slow = Counter(event.name for event in profiled.events()
                   if event.name.startswith("cuda") and event.cpu_time_total > _SLOW_CALL_US)
    report = f"{table}\nruntime calls over {_SLOW_CALL_US / 1000:g} ms: {dict(slow.most_common(10))}\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
