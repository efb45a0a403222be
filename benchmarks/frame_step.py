"""Benchmark 1: time of one whole frame step (talker decode + codebook 0 + 15-step code predictor)
at several batch sizes, on random weights at the real shapes, with achieved bandwidth.

    python -m benchmarks.frame_step --out bench-results/frame_step.json

Each row of the batch holds `--context` positions of KV. The step is the captured CUDA graph the
engine replays; times are the median of CUDA-event-timed replays after warm-up, two ways:
- `step_ms`: one step at a time, from before the host loads its metadata to the frame's last kernel (the host's
  own part of a step shows here, as it does in a synchronous caller);
- `device_step_ms`: the step's graphs replayed back to back, the host ahead of the device as in the engine (which
  queues a step while the one before runs): the device's time per frame.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.params import GenerationParams
from tts_service.runner.runner import DecodeInput, ModelRunner

FRAME_SECONDS = 0.08


def weight_bytes_per_frame(runner: ModelRunner) -> int:
    """Weights one frame must read: the talker stack and head once, the predictor stack once per codebook."""
    talker = runner.talker

    def size(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    predictor = talker.code_predictor
    stack = size(predictor.model) - size(predictor.model.codec_embedding)
    return (size(talker.model) - size(talker.model.codec_embedding) - size(talker.model.text_embedding)
            + size(talker.codec_head) + (talker.config.num_code_groups - 1) * stack
            + size(predictor.lm_head) + size(predictor.small_to_mtp_projection))


def kv_bytes(runner: ModelRunner, batch: int, context: int) -> int:
    layers = runner.model.config.talker.layers
    return batch * context * layers.num_hidden_layers * layers.num_key_value_heads * layers.head_dim * 2 * 2


def time_steps(runner: ModelRunner, batch: int, context: int, iterations: int) -> list[float]:
    blocks_per_row = -(-(context + iterations + 8) // runner.config.block_size)
    runner.state.assign(list(range(batch)), [GenerationParams(seed=slot) for slot in range(batch)])
    runner.state.last_frame.random_(0, 2048)
    decodes = [DecodeInput(slot, tuple(range(slot * blocks_per_row, (slot + 1) * blocks_per_row)), context, 5, 0)
               for slot in range(batch)]
    step = tuple(decodes)
    for _ in range(3):
        runner._decode(step)
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner._decode(step)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return times


def device_step_seconds(runner: ModelRunner, batch: int, frames: int) -> float:
    """The device's time per frame with the host ahead of it: the step's graphs (on the metadata `time_steps`
    left) replayed `frames` times back to back, the median of five such runs."""
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(frames):
            runner.replay_decode(batch)
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1000.0 / frames)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.6b,1.7b")
    parser.add_argument("--batch-sizes", default="1,8,32,64,128,256")
    parser.add_argument("--context", type=int, default=300, help="KV positions held per row")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--bandwidth-gbs", type=float, default=3000.0, help="memory bandwidth for the floor")
    parser.add_argument("--no-predictor-kernel", action="store_true",
                        help="keep the code predictor's layer chain at one and two rows as well")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    results = []
    for size in args.sizes.split(","):
        model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
        blocks_per_row = -(-(args.context + args.iterations + 16) // 32)
        started = time.perf_counter()
        config = EngineConfig(max_running=max(batch_sizes), block_size=32,
                              num_kv_blocks=max(batch_sizes) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batch_sizes),
                              use_predictor_kernel=not args.no_predictor_kernel)
        runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
        capture_s = time.perf_counter() - started
        weights = weight_bytes_per_frame(runner)
        for batch in batch_sizes:
            times = time_steps(runner, batch, args.context, args.iterations)
            median = statistics.median(times)
            device_median = device_step_seconds(runner, batch, args.iterations)
            moved = weights + kv_bytes(runner, batch, args.context)
            results.append({
                "model": size, "batch": batch, "context": args.context, "step_ms": median * 1e3,
                "device_step_ms": device_median * 1e3, "device_achieved_gbs": moved / device_median / 1e9,
                "p90_step_ms": sorted(times)[int(0.9 * len(times))] * 1e3,
                "frames_per_s": batch / median, "realtime_factor_per_stream": median / FRAME_SECONDS,
                "x_realtime_aggregate": batch * FRAME_SECONDS / median,
                "bytes_per_step": moved, "achieved_gbs": moved / median / 1e9,
                "floor_ms": moved / (args.bandwidth_gbs * 1e9) * 1e3, "graph_capture_s": capture_s,
            })
        del runner, model
        torch.cuda.empty_cache()
    report = {"benchmark": "frame_step", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python -m benchmarks.frame_step",
                                                                      *(argv or sys.argv[1:])]),
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    header = (f"{'model':>6} {'batch':>5} {'step ms':>8} {'device ms':>9} {'floor ms':>8} {'GB/s':>7} "
              f"{'frames/s':>9} {'x rt':>7}")
    lines = [header] + [f"{r['model']:>6} {r['batch']:>5} {r['step_ms']:>8.2f} {r['device_step_ms']:>9.2f} "
                        f"{r['floor_ms']:>8.2f} "
                        f"{r['achieved_gbs']:>7.0f} {r['frames_per_s']:>9.0f} {r['x_realtime_aggregate']:>7.1f}"
                        for r in results]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
