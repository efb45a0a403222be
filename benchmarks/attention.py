"""Micro-benchmark: paged decode attention, Triton kernel vs the torch path, on CUDA.

    python -m benchmarks.attention --out bench-results/attention.json

Each configuration runs the talker's decode attention for every layer (store + attend, as the
model calls it) inside one CUDA graph, so launch gaps are what a captured decode step sees.
Every layer reads its own K/V and Triton's `do_bench` clears L2 before each replay, so the
bytes come from HBM. GB/s counts the K/V bytes each step must read: batch * context * KV heads *
head_dim * 2 (keys and values) * element size, per layer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tts_service.model.triton_utils import HAS_TRITON
from tts_service.runner.kv_cache import PagedDecodeBackend, PagedKVCache

TALKER_HEADS, TALKER_KV_HEADS, TALKER_HEAD_DIM, TALKER_LAYERS = 16, 8, 128, 28


@dataclass(frozen=True)
class Measurement:
    batch: int
    context: int
    block_size: int
    num_splits: int
    kv_bytes_per_layer: int
    triton_us_per_layer: float
    torch_us_per_layer: float

    @property
    def triton_gb_per_s(self) -> float:
        return self.kv_bytes_per_layer / self.triton_us_per_layer / 1e3

    @property
    def torch_gb_per_s(self) -> float:
        return self.kv_bytes_per_layer / self.torch_us_per_layer / 1e3

    def as_json(self) -> dict[str, float | int]:
        return {**asdict(self), "triton_gb_per_s": self.triton_gb_per_s,
                "torch_gb_per_s": self.torch_gb_per_s, "speedup": self.speedup}

    @property
    def speedup(self) -> float:
        return self.torch_us_per_layer / self.triton_us_per_layer


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA GPU; none is visible to torch")
    if not HAS_TRITON:
        raise SystemExit("bench_attention needs Triton, which is not installed")


def build_cache(batch: int, context: int, block_size: int, num_layers: int,
                dtype: torch.dtype) -> tuple[PagedKVCache, torch.Tensor, torch.Tensor]:
    """A cache holding `context - 1` random positions per row in shuffled blocks, and its metadata."""
    width = -(-context // block_size)
    cache = PagedKVCache(num_layers, batch * width, block_size, TALKER_KV_HEADS, TALKER_HEAD_DIM, dtype,
                         "cuda")
    for layer in range(num_layers):  # one layer at a time keeps the fp32 temporary small
        cache.storage[layer].normal_()
    tables = torch.randperm(batch * width).view(batch, width).to(torch.int32)
    positions = torch.full((batch,), context - 1, dtype=torch.int64)
    return cache, tables, positions


def capture_step(backend: PagedDecodeBackend, num_layers: int, batch: int,
                 dtype: torch.dtype) -> torch.cuda.CUDAGraph:
    """A graph of one decode step's attention across all layers, with static random inputs."""
    query = torch.randn(batch, TALKER_HEADS, 1, TALKER_HEAD_DIM, device="cuda", dtype=dtype)
    key = torch.randn(batch, TALKER_KV_HEADS, 1, TALKER_HEAD_DIM, device="cuda", dtype=dtype)
    value = torch.randn_like(key)

    def step() -> None:
        for layer in range(num_layers):
            backend(layer, query, key, value)

    step()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def measure_copy_bandwidth() -> float:
    """Device-to-device copy rate (bytes read + written), the ceiling the GB/s columns compare with."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    target = torch.empty_like(source)
    milliseconds = median_ms(lambda: target.copy_(source))
    return 2 * source.numel() / milliseconds / 1e6


def median_ms(function: Callable[[], None]) -> float:
    from triton.testing import do_bench

    return float(do_bench(function, warmup=25, rep=200, return_mode="median"))


def measure(batch: int, context: int, block_size: int, num_layers: int, dtype: torch.dtype) -> Measurement:
    cache, tables, positions = build_cache(batch, context, block_size, num_layers, dtype)
    times_us: dict[str, float] = {}
    num_splits = 1
    for implementation in ("triton", "torch"):
        backend = PagedDecodeBackend(cache, batch, tables.shape[1], implementation=implementation)
        backend.set_metadata(tables, positions)
        graph = capture_step(backend, num_layers, batch, dtype)
        times_us[implementation] = median_ms(graph.replay) * 1e3 / num_layers
        if implementation == "triton":
            num_splits = backend.num_splits(batch)
        del graph, backend
        torch.cuda.empty_cache()
    kv_bytes = batch * context * TALKER_KV_HEADS * TALKER_HEAD_DIM * 2 * cache.storage.element_size()
    return Measurement(batch, context, block_size, num_splits, kv_bytes, times_us["triton"],
                       times_us["torch"])


def format_table(rows: list[Measurement]) -> str:
    header = f"{'batch':>5} {'ctx':>5} {'splits':>6} {'triton us':>10} {'torch us':>10} {'speedup':>8} " \
             f"{'triton GB/s':>12} {'torch GB/s':>11}"
    lines = [header]
    for row in rows:
        lines.append(f"{row.batch:>5} {row.context:>5} {row.num_splits:>6} "
                     f"{row.triton_us_per_layer:>10.1f} {row.torch_us_per_layer:>10.1f} {row.speedup:>8.2f} "
                     f"{row.triton_gb_per_s:>12.0f} {row.torch_gb_per_s:>11.0f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=TALKER_LAYERS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    require_cuda()
    dtype = torch.bfloat16
    torch.manual_seed(0)
    rows = [measure(batch, context, args.block_size, args.layers, dtype)
            for context in args.contexts for batch in args.batches]
    import triton

    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": str(dtype),
        "heads": TALKER_HEADS, "kv_heads": TALKER_KV_HEADS, "head_dim": TALKER_HEAD_DIM,
        "layers_per_graph": args.layers,
        "timing": "median CUDA-graph replay of all layers (store + attention) / layers; L2 cleared first",
        "gb_per_s": "K/V bytes a step must read / time",
        "hbm_copy_gb_per_s": measure_copy_bandwidth(),
        "results": [row.as_json() for row in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(format_table(rows) + "\n")


if __name__ == "__main__":
    main()
