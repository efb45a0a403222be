"""Benchmark: how much a step's frames and the codec gain from running side by side, on their two streams.

    python -m benchmarks.overlap --batch-sizes 96,128 --out bench-results/overlap.json

At each batch size it times, through the runner's own calls, with CUDA events over `--iterations` steps:
  - `frames`: the frame graph alone (talker pass and sampling), step after step;
  - `codec`: the codec alone, one frame for every row, call after call;
  - `serial`: each step's frames, then their audio, the host waiting for each before the next (the
    engine's order with no overlap at all);
  - `pipelined`: each step's frames queued right behind the last step's, each step's audio decoded on the
    codec's stream behind its frames, the host never waiting: what an engine that queues step N+1's
    frames before step N's come back (asynchronous scheduling) could at best reach;
  - `pipelined_frames_first` and `pipelined_codec_first`: the same with the frames' stream, or the codec's, at
    the device's highest stream priority (the other at the default, the lowest), so that the block scheduler
    hands free multiprocessors to that stream's waiting blocks first.
So `pipelined` against `frames` says how far concurrent kernels hide the codec, before any of that is built.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.params import GenerationParams
from tts_service.runner.runner import DecodeInput, ModelRunner

# PyTorch maps a priority beyond the device's range to the nearest end: this is the highest the device has.
HIGHEST_PRIORITY = -100


def per_step_ms(run: Callable[[], None], iterations: int, codec_stream: torch.cuda.Stream) -> float:
    """Device milliseconds per call of `run`, over `iterations` calls queued back to back after warm-up, until
    both streams are done."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        run()
    torch.cuda.current_stream().wait_stream(codec_stream)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


def time_batch(runner: ModelRunner, batch: int, context: int, iterations: int) -> dict[str, float]:
    blocks_per_row = -(-(context + 4 * iterations + 32) // runner.config.block_size)
    slots = list(range(batch))
    runner.state.assign(slots, [GenerationParams(seed=slot) for slot in slots])
    runner.state.last_frame.random_(0, 2048)
    runner.reset_audio(slots)
    step = tuple(DecodeInput(slot, tuple(range(slot * blocks_per_row, (slot + 1) * blocks_per_row)), context, 5, 0)
                 for slot in slots)
    rows = list(range(batch))

    def frames() -> None:
        runner._decode(step)

    def codec() -> None:
        runner._start_frame_audio(rows, slots)

    def serial() -> None:
        runner._decode(step)
        torch.cuda.current_stream().synchronize()
        runner._start_frame_audio(rows, slots).result()

    def pipelined() -> None:
        runner._decode(step)
        runner._start_frame_audio(rows, slots)

    codec_stream = runner.codec_stream
    assert codec_stream is not None
    with torch.inference_mode():
        times = {name: per_step_ms(run, iterations, codec_stream) for name, run in
                 (("frames", frames), ("codec", codec), ("serial", serial), ("pipelined", pipelined))}
        with torch.cuda.stream(torch.cuda.Stream(priority=HIGHEST_PRIORITY)):
            times["pipelined_frames_first"] = per_step_ms(pipelined, iterations, codec_stream)
        runner.codec_stream = torch.cuda.Stream(priority=HIGHEST_PRIORITY)
        try:
            times["pipelined_codec_first"] = per_step_ms(pipelined, iterations, runner.codec_stream)
        finally:
            runner.codec_stream = codec_stream
    return {"batch": batch, **{f"{name}_ms": value for name, value in times.items()},
            "pipelined_over_frames": times["pipelined"] / times["frames"],
            "serial_over_frames": times["serial"] / times["frames"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--batch-sizes", default="32,96,128")
    parser.add_argument("--context", type=int, default=300, help="KV positions held per row")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    model = load_model(f"random:{args.size}-custom_voice", LoadOptions.default_for("cuda"))
    blocks_per_row = -(-(args.context + 4 * args.iterations + 64) // 32)
    config = EngineConfig(max_running=max(batch_sizes), block_size=32, num_kv_blocks=max(batch_sizes) * blocks_per_row,
                          max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batch_sizes))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    results = [time_batch(runner, batch, args.context, args.iterations) for batch in batch_sizes]
    report = {"benchmark": "overlap", "model": args.size, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.overlap", *(argv or sys.argv[1:])]), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    header = (f"{'batch':>5} {'frames':>7} {'codec':>7} {'serial':>7} {'pipelined':>9} {'frames 1st':>10} "
              f"{'codec 1st':>9}  (ms a step)")
    lines = [header] + [f"{r['batch']:>5} {r['frames_ms']:>7.2f} {r['codec_ms']:>7.2f} {r['serial_ms']:>7.2f} "
                        f"{r['pipelined_ms']:>9.2f} {r['pipelined_frames_first_ms']:>10.2f} "
                        f"{r['pipelined_codec_first_ms']:>9.2f}" for r in results]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
