"""Benchmark: the frame step's projections at 1 to 8 rows through cuBLAS, with the weight stored as the checkpoint
has it ([out, in], F.linear's "TN" GEMM) or transposed ([in, out], an "NN" GEMM), each weight read from memory as
in a real frame rather than from L2.

    python -m benchmarks.projection_layouts --out bench-results/projection_layouts.json

A frame reads about 3 GB of weights at batch 1 and the H100's L2 holds 50 MB, so a weight is never in L2 when its
projection runs again. Each call here reads the next of enough copies of the weight to fill 256 MB, and a CUDA
graph of those calls is timed (median of replays). cuBLAS picks its kernel by layout and shape, so the two
layouts may run different kernels at the same shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from tts_service.model.configs import ModelConfig
from tts_service.model.random_checkpoint import model_config_dict

_WORKING_SET_BYTES = 256 << 20


def projection_shapes(size: str) -> dict[str, tuple[int, int]]:
    """(out, in) of every projection a decode step runs per layer (packed as the fused path packs them)."""
    config = ModelConfig.parse(model_config_dict(size, "custom_voice")).talker
    shapes = {}
    for part, layers in (("talker", config.layers), ("predictor", config.code_predictor)):
        hidden, heads, kv_heads, head_dim = (layers.hidden_size, layers.num_attention_heads,
                                             layers.num_key_value_heads, layers.head_dim)
        shapes[f"{part}.qkv"] = ((heads + 2 * kv_heads) * head_dim, hidden)
        shapes[f"{part}.o"] = (hidden, heads * head_dim)
        shapes[f"{part}.gate_up"] = (2 * layers.intermediate_size, hidden)
        shapes[f"{part}.down"] = (hidden, layers.intermediate_size)
    return shapes


def time_calls(call: Callable[[torch.Tensor], torch.Tensor], weights: list[torch.Tensor], replays: int = 20) -> float:
    """Microseconds per call, over a graph that calls once per weight copy."""
    def run() -> None:
        for weight in weights:
            call(weight)

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / len(weights))
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1.7b,0.6b")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    results = []
    for size in args.sizes.split(","):
        for name, (num_out, num_in) in projection_shapes(size).items():
            num_copies = max(8, _WORKING_SET_BYTES // (num_out * num_in * 2))
            weights = [torch.randn(num_out, num_in, generator=generator, device=device).bfloat16()
                       for _ in range(num_copies)]
            transposed = [weight.t().contiguous() for weight in weights]
            megabytes = num_out * num_in * 2 / 1e6
            for num_rows in map(int, args.rows.split(",")):
                x = torch.randn(num_rows, num_in, generator=generator, device=device).bfloat16()
                as_stored = time_calls(lambda weight, x=x: F.linear(x, weight), weights)
                as_transposed = time_calls(lambda weight, x=x: torch.mm(x, weight), transposed)
                results.append({"size": size, "projection": name, "out": num_out, "in": num_in, "rows": num_rows,
                                "mb": megabytes, "tn_us": as_stored, "nn_us": as_transposed})
                print(f"{size} {name:18s} rows {num_rows}: [out, in] {as_stored:6.2f} us "
                      f"({megabytes / as_stored:.2f} TB/s), [in, out] {as_transposed:6.2f} us "
                      f"({megabytes / as_transposed:.2f} TB/s)", flush=True)
            del weights, transposed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "projection_layouts", "device": torch.cuda.get_device_name(),
                                    "torch": torch.__version__, "command": " ".join(sys.argv),
                                    "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
