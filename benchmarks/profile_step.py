"""Where one frame step's GPU time goes: kernel counts and times by phase, from the PyTorch profiler.

    python -m benchmarks.profile_step --batch 1 --out bench-results/profile.json
    python -m benchmarks.profile_step --batch 1 --prefill-lengths 16,32,64 --out bench-results/profile.json

The step runs eagerly: the captured graph replays these same kernels, so their count and their
times show what graph capture alone cannot remove. `--prefill-lengths` does the same for the talker's
prefill of `--prefill-batch` prompts of each length, and also times that prefill captured in a graph,
as the engine replays it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.params import GenerationParams
from tts_service.runner.runner import DecodeInput, ModelRunner


def kernel_summary(prof: profile, max_kernels: int) -> dict:
    """The profiled CUDA kernels: how many, their total time, and the heaviest by total time."""
    kernels: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name].append(event.device_time)
    top = sorted(kernels.items(), key=lambda item: -sum(item[1]))[:max_kernels]
    return {"num_kernels": sum(len(times) for times in kernels.values()),
            "kernel_time_us": sum(sum(times) for times in kernels.values()),
            "top_kernels": [{"name": name[:120], "count": len(times), "total_us": sum(times)} for name, times in top]}


def profile_decode(runner: ModelRunner, batch: int, context: int) -> dict:
    blocks_per_row = -(-(context + 8) // runner.config.block_size)
    runner.state.assign(list(range(batch)), [GenerationParams(seed=slot) for slot in range(batch)])
    decodes = tuple(DecodeInput(slot, tuple(range(slot * blocks_per_row, (slot + 1) * blocks_per_row)), context,
                                5, 0) for slot in range(batch))
    runner._decode(decodes)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        runner._decode(decodes)
        torch.cuda.synchronize()
    return {"batch": batch, **kernel_summary(prof, max_kernels=40)}


def _fill_prefill_buffers(runner: ModelRunner, batch: int, length: int) -> None:
    """`batch` prompts of `length` positions, each in blocks of its own."""
    buffers = runner.prefill
    width = -(-length // runner.config.block_size)
    buffers.inputs.normal_(0.0, 0.02)
    buffers.lengths[:batch] = length
    buffers.block_tables[:batch, :width] = torch.arange(batch * width, dtype=torch.int32,
                                                        device=runner.device).view(batch, width)


def profile_prefill(runner: ModelRunner, batch: int, length: int, iterations: int = 20) -> dict:
    """The prefill's kernels run eagerly, and the median time of the same prefill replayed as a CUDA graph."""
    _fill_prefill_buffers(runner, batch, length)
    with torch.inference_mode():
        runner._prefill_step(batch, length)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            runner._prefill_step(batch, length)
            torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            runner._prefill_step(batch, length)
        torch.cuda.current_stream().wait_stream(stream)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iterations):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return {"batch": batch, "length": length, "graph_ms": sorted(times)[iterations // 2],
            **kernel_summary(prof, max_kernels=40)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice")
    parser.add_argument("--batch", default="1,64")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--prefill-lengths", default="", help="comma-separated prompt lengths to profile")
    parser.add_argument("--prefill-batch", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",") if b]
    prefill_lengths = [int(length) for length in args.prefill_lengths.split(",") if length]
    model = load_model(args.model, LoadOptions.default_for("cuda"))
    blocks_per_row = -(-(args.context + 80) // 32)
    max_batch = max([*batches, args.prefill_batch])
    config = EngineConfig(max_running=max_batch, num_kv_blocks=max_batch * blocks_per_row,
                          max_positions_per_request=blocks_per_row * 32, use_cuda_graphs=False)
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    results = []
    for batch in batches:
        result = profile_decode(runner, batch, args.context)
        result["eager_step_ms"] = 1e3 * sorted(time_steps(runner, batch, args.context, 10))[5]
        results.append(result)
    prefills = [profile_prefill(runner, args.prefill_batch, length) for length in prefill_lengths]
    report = {"benchmark": "profile_step", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "command": " ".join(["python -m benchmarks.profile_step", *(argv or sys.argv[1:])]), "results": results,
              "prefills": prefills}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for result in results:
        sys.stdout.write(f"batch {result['batch']}: {result['num_kernels']} kernels, "
                         f"{result['kernel_time_us'] / 1e3:.2f} ms of kernel time, eager step "
                         f"{result['eager_step_ms']:.2f} ms\n")
        for kernel in result["top_kernels"][:15]:
            sys.stdout.write(f"  {kernel['count']:>5} x {kernel['total_us'] / kernel['count']:>7.1f} us  "
                             f"{kernel['name']}\n")
    for result in prefills:
        sys.stdout.write(f"prefill {result['batch']} x {result['length']}: {result['num_kernels']} kernels, "
                         f"{result['kernel_time_us'] / 1e3:.2f} ms of kernel time, graph {result['graph_ms']:.2f} ms\n")
        for kernel in result["top_kernels"][:15]:
            sys.stdout.write(f"  {kernel['count']:>5} x {kernel['total_us'] / kernel['count']:>7.1f} us  "
                             f"{kernel['name']}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
