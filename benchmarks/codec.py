"""Benchmark: what the codec decoder costs the engine per call and per frame of audio, by batch and
chunk length, through the runner's own path (host checks, the copy in, the captured graph, the copy out).

    python -m benchmarks.codec --out bench-results/codec.json

It answers how the engine should cut its frames into codec calls: many rows of one frame each,
or fewer rows of longer chunks. Times are the median of host wall-clock calls after warm-up (the call
ends with its copy to the host, so it has waited for the device).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.profile_step import kernel_summary
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.runner import ModelRunner


def time_calls(runner: ModelRunner, batch: int, num_frames: int, iterations: int) -> list[float]:
    codebook_size = runner.model.codec_decoder.config.codebook_size
    rng = np.random.default_rng(batch * 100 + num_frames)
    codes = rng.integers(0, codebook_size, (batch, num_frames, runner.num_groups), dtype=np.int64)
    slots = list(range(batch))
    for _ in range(3):
        runner.decode_audio(slots, codes)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        runner.decode_audio(slots, codes)
        times.append(time.perf_counter() - started)
    return times


def batch_dependence(runner: ModelRunner, batch_sizes: tuple[int, ...], num_frames: int = 12) -> list[dict]:
    """How far one stream's audio moves with the number of rows decoded beside it: the same codes, one frame a
    call as the engine serves them, in row 0 of each batch (the other rows random), against the stream alone.
    cuDNN picks its kernels by the batch, and in TF32 different kernels round differently."""
    codebook_size = runner.model.codec_decoder.config.codebook_size
    rng = np.random.default_rng(7)
    stream = rng.integers(0, codebook_size, (1, num_frames, runner.num_groups), dtype=np.int64)
    decoded = {}
    for batch in (1, *batch_sizes):
        others = rng.integers(0, codebook_size, (batch - 1, num_frames, runner.num_groups), dtype=np.int64)
        codes = np.concatenate([stream, others])
        slots = list(range(batch))
        runner.reset_audio(slots)
        decoded[batch] = np.concatenate([runner.decode_audio(slots, codes[:, frame:frame + 1])[0]
                                         for frame in range(num_frames)])
    return [{"batch": batch, "max_abs_diff_vs_alone": float(np.abs(decoded[batch] - decoded[1]).max()),
             "rms_alone": float(np.sqrt(np.mean(decoded[1] ** 2)))} for batch in batch_sizes]


def profile_call(runner: ModelRunner, batch: int, num_frames: int) -> dict:
    """Kernels of one eager codec call, heaviest first (the captured graph replays the same ones)."""
    decoder = runner.model.codec_decoder
    codes = torch.randint(0, decoder.config.codebook_size, (batch, runner.num_groups, num_frames),
                          device=runner.device)
    state = decoder.new_stream_state(batch)
    with torch.inference_mode():
        decoder.decode_chunk(codes, state)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            decoder.decode_chunk(codes, state)
            torch.cuda.synchronize()
    return {"batch": batch, "chunk_frames": num_frames, **kernel_summary(prof, max_kernels=25)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--batch-sizes", default="1,8,16,32,64,128")
    parser.add_argument("--chunk-lengths", default="1,2,4,8,12")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--no-fused-kernels", action="store_true", help="the eager activation chain")
    parser.add_argument("--profile", default="1:1,128:1", help="batch:frames calls to profile kernel by kernel")
    parser.add_argument("--codec-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--codec-convolution-dtype", default="auto", choices=("auto", "float32", "float16"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU")
    batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    chunk_lengths = tuple(int(t) for t in args.chunk_lengths.split(","))
    options = LoadOptions.default_for("cuda", args.codec_dtype, args.codec_convolution_dtype)
    model = load_model(f"random:{args.size}-custom_voice", options)
    config = EngineConfig(max_running=max(batch_sizes), num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=batch_sizes, codec_chunk_schedule=chunk_lengths,
                          prefill_graph_batch_sizes=(), prefill_graph_lengths=(),
                          use_fused_kernels=not args.no_fused_kernels)
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    profiles = [profile_call(runner, *map(int, shape.split(":"))) for shape in args.profile.split(",") if shape]
    results = []
    for batch in batch_sizes:
        for num_frames in chunk_lengths:
            median = statistics.median(time_calls(runner, batch, num_frames, args.iterations))
            results.append({"batch": batch, "chunk_frames": num_frames, "call_ms": median * 1e3,
                            "ms_per_frame": median * 1e3 / (batch * num_frames)})
    dependence = batch_dependence(runner, batch_sizes) if 1 in chunk_lengths else []
    report = {"benchmark": "codec", "model": args.size, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "fused_kernels": not args.no_fused_kernels, "codec_dtype": args.codec_dtype,
              "codec_convolution_dtype": args.codec_convolution_dtype,
              "codec_half_convolutions": options.codec_half_convolutions,
              "command": " ".join(["python -m benchmarks.codec", *(argv or sys.argv[1:])]), "results": results,
              "profiles": profiles, "batch_dependence": dependence}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'batch':>5} {'frames':>6} {'call ms':>8} {'ms/frame':>9}"]
    lines += [f"{r['batch']:>5} {r['chunk_frames']:>6} {r['call_ms']:>8.2f} {r['ms_per_frame']:>9.3f}" for r in results]
    lines += [f"one stream in row 0 of {d['batch']:>3} rows: max |audio - alone| {d['max_abs_diff_vs_alone']:.2e}"
              f" (rms {d['rms_alone']:.3f})" for d in dependence]
    for result in profiles:
        lines.append(f"batch {result['batch']} x {result['chunk_frames']} frames: {result['num_kernels']} kernels, "
                     f"{result['kernel_time_us'] / 1e3:.2f} ms")
        lines += [f"  {k['count']:>4} x {k['total_us'] / k['count']:>7.1f} us  {k['name']}"
                  for k in result["top_kernels"][:12]]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
