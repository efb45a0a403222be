"""Benchmark: the forced aligner's time for one batch of clips (features, forward pass, timings), by batch size and
clip length, eager (`ForcedAligner.align_many`, the reference's layout) and as the engine runs it (`AlignerRunner`:
packed, replayed from captured graphs), its text decoder on the eager chain and on the fused kernels (the engine's
default); then each captured bucket's graph alone, replayed on an idle GPU (device time between CUDA events: what a
batch's forward pass holds the GPU for, beside the engine's frames). Random 0.6B weights at the published shapes:
the timings it predicts are noise, its cost is the real model's.

    python -m benchmarks.aligner --out bench-results/aligner.json [--batch-sizes 1,4,16] [--seconds 2,5,10]
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

from tts_service.model.aligner import AlignmentItem, ForcedAligner
from tts_service.runner.aligner_runner import AlignerRunner, Bucket

RATE = 24000
SENTENCE = "the quick brown fox jumps over a lazy dog while seven bright birds sing in the tall green trees"
WORDS = SENTENCE.split(" ")


def items(batch: int, seconds: float, rng: np.random.Generator) -> list[AlignmentItem]:
    num_words = max(1, round(seconds * 2.5))  # about the words of speech that long
    text = " ".join(WORDS[index % len(WORDS)] for index in range(num_words)) + "."
    return [AlignmentItem(rng.standard_normal(round(seconds * RATE)).astype(np.float32) * 0.1, RATE, text)
            for _ in range(batch)]


def time_batch(aligner: ForcedAligner | AlignerRunner, batch: list[AlignmentItem], repeats: int) -> list[float]:
    aligner.align_many(batch)  # warm: allocator, kernels
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        aligner.align_many(batch)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def replay_ms(runner: AlignerRunner, bucket: Bucket, repeats: int) -> float:
    """One bucket's captured graph, replayed `repeats` times on the runner's stream: device ms a replay. Its inputs
    are first set to an empty batch, as at capture (a larger bucket's last batch may point past this one's)."""
    graph = runner._graphs[bucket]
    assert runner.stream is not None
    runner._static.token_clip.fill_(-1)
    runner._static.ids[2].fill_(-1)
    runner._static.ids[3].zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(runner.stream):
        graph.replay()
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aligner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--seconds", default="2,5,10")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    aligner = ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16)
    fused = AlignerRunner(ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16))
    paths = {"eager": aligner, "graphs": AlignerRunner(aligner, use_fused_kernels=False), "graphs_fused": fused}
    rng = np.random.default_rng(0)
    rows = []
    for seconds in (float(value) for value in args.seconds.split(",")):
        for batch in (int(value) for value in args.batch_sizes.split(",")):
            clips = items(batch, seconds, rng)
            for path, runner in paths.items():
                timings = time_batch(runner, clips, args.repeats)
                rows.append({"path": path, "batch": batch, "clip_seconds": seconds,
                             "median_ms": statistics.median(timings) * 1e3,
                             "clips_per_s": batch / statistics.median(timings)})
                sys.stdout.write(f"{path:12s} batch {batch:3d} clip {seconds:5.1f} s: {rows[-1]['median_ms']:8.1f} "
                                 f"ms, {rows[-1]['clips_per_s']:7.1f} clips/s\n")
    replays = [{"path": path, "bucket_chunks": bucket.num_chunks, "bucket_tokens": bucket.num_tokens,
                "replay_ms": replay_ms(runner, bucket, args.repeats)}
               for path, runner in paths.items() if isinstance(runner, AlignerRunner)
               for bucket in runner.captured_buckets]
    for row in replays:
        sys.stdout.write(f"{row['path']:12s} bucket {row['bucket_chunks']:3d} chunks: {row['replay_ms']:6.2f} ms a "
                         "replay\n")
    result = {"benchmark": "aligner", "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.aligner", *(argv or sys.argv[1:])]), "results": rows,
              "replays": replays}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
