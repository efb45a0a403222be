"""A decoder layer's projections for one or two rows, each with the small kernel around it taken inside.

At one or two rows (a stream's decode step, two streams, a frame's first two predictor tokens) the projections are
GEMVs, and cuBLAS streams the talker's weights near the memory's bandwidth, but every layer also runs two norm
kernels, a SiLU kernel and, for the down projection, cuBLAS's own split-K reduction: a few microseconds each, plus
a launch gap, 28 times a frame. Here the norm (and the residual add before it) runs inside the projection that
reads it, and SiLU(gate) * up inside the gate/up projection:

- `normed_projection`: (x + delta) -> RMSNorm -> @ W.T. Every program normalises the row itself (a few KB from
  L2) while its first weights are on their way; program 0 stores the sum, which the layer needs for its residual.
- `gated_projection`: the same input, gate and up rows in one program, SiLU(gate) * up as the output.
- `projection`: a plain x @ W.T (the o and down projections), one program per tile of rows, no split-K pass.

A program holds one tile of W's rows and walks the whole input width, summing in an fp32 tile per column and
reducing it once at the end, so no step waits on another warp. On Hopper the kernels launch as programmatic
dependents: a projection's programs start while the kernel before finishes and load their first weights, which
depend on no kernel, before they wait for its outputs. Rounding follows the eager chain (the norm kernel's, then
each projection's output, SiLU's output); only the order of the fp32 sums differs, as cuBLAS's choice of kernel
makes it differ. On an H100 a 1.7B talker layer's four calls take 46 us at one row against the chain's 54, and the
1.7B frame 4.35 ms against 4.65 (BENCHMARKS.md at 9d30722).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_service.model.triton_utils import gdc_launch_dependents, gdc_wait, launches_early, tl, triton

# The most rows (streams times tokens) these kernels take, the sizes they were tuned and measured at; larger
# batches keep cuBLAS (`kernel_policy.KernelPolicy.row_projection_kernel` decides).
MAX_ROWS = 2
_MIN_CHUNK = 64


@dataclass(frozen=True)
class Tiling:
    """How a projection's kernel splits its work: rows of W per program, input columns per step, warps."""

    tile_rows: int
    chunk: int
    num_warps: int


# The fastest of sweeps on an H100 at both talkers' shapes (BENCHMARKS.md at 9d30722), by kind and rows: four rows
# of W a program and the whole input width a step where it fits (every weight load then leaves before the norm's
# pass over the input); gate/up at a 1024-wide input (0.6B, and every code predictor) its own.
_TILINGS = {("normed", 1): Tiling(4, 2048, 8), ("normed", 2): Tiling(4, 2048, 4),
            ("gated", 1): Tiling(4, 2048, 8), ("gated", 2): Tiling(2, 2048, 4),
            ("plain", 1): Tiling(4, 2048, 4), ("plain", 2): Tiling(4, 2048, 4)}
_NARROW_GATED = {1: Tiling(2, 512, 4), 2: Tiling(2, 1024, 4)}
_NARROW_WIDTH = 1024


def default_tiling(kind: str, num_rows: int, width: int) -> Tiling:
    """The measured tiling of the `kind` kernel for `num_rows` rows of an input `width` wide."""
    if kind == "gated" and width <= _NARROW_WIDTH:
        return _NARROW_GATED[num_rows]
    return _TILINGS[kind, num_rows]


def normed_projection(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, tiling: Tiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta) @ weight.T) for x [..., K]; without delta, (x, RMSNorm(x) @ weight.T)."""
    tiling = tiling or default_tiling("normed", _num_rows(x), x.shape[-1])
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else x
    out = _launch(x, delta, norm_weight, eps, weight, total, weight.shape[0], gated=False, tiling=tiling)
    return total, out


def gated_projection(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                     gate_up: torch.Tensor, tiling: Tiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, SiLU(h @ gate.T) * (h @ up.T)) where h = RMSNorm(x + delta) and gate_up [2I, K] holds gate's
    rows, then up's."""
    tiling = tiling or default_tiling("gated", _num_rows(x), x.shape[-1])
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else x
    out = _launch(x, delta, norm_weight, eps, gate_up, total, gate_up.shape[0] // 2, gated=True, tiling=tiling)
    return total, out


def projection(x: torch.Tensor, weight: torch.Tensor, tiling: Tiling | None = None) -> torch.Tensor:
    """x @ weight.T for x [..., K]."""
    return _launch(x, None, None, 0.0, weight, x, weight.shape[0], gated=False,
                   tiling=tiling or default_tiling("plain", _num_rows(x), x.shape[-1]))


def _num_rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def chunk_for(width: int, tiling: Tiling) -> int:
    """The tiling's chunk, halved until it divides the width (a power of two, as Triton's ranges must be)."""
    chunk = tiling.chunk
    while chunk > _MIN_CHUNK and width % chunk:
        chunk //= 2
    return chunk


def _launch(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor | None, eps: float,
            weight: torch.Tensor, total: torch.Tensor, out_width: int, gated: bool, tiling: Tiling) -> torch.Tensor:
    width = x.shape[-1]
    x_rows = x.reshape(-1, width)
    batch = x_rows.shape[0]
    delta_rows = delta.reshape(-1, width) if delta is not None else x_rows
    out = torch.empty((*x.shape[:-1], out_width), dtype=x.dtype, device=x.device)
    early = launches_early(x.device)
    _row_projection_kernel[(out_width // tiling.tile_rows,)](
        x_rows, delta_rows, norm_weight if norm_weight is not None else weight, weight, out, total,
        x_rows.stride(0), delta_rows.stride(0), batch, eps,
        N=out_width, K=width, HAS_DELTA=delta is not None, HAS_NORM=norm_weight is not None, GATED=gated,
        BLOCK_B=triton.next_power_of_2(batch), TILE_ROWS=tiling.tile_rows, CHUNK=chunk_for(width, tiling),
        LAUNCHES_EARLY=early, num_warps=tiling.num_warps, launch_pdl=early)
    return out


@triton.jit
def _input_chunk(x_ptr, delta_ptr, x_stride, delta_stride, start, batch, HAS_DELTA: tl.constexpr,
                 BLOCK_B: tl.constexpr, CHUNK: tl.constexpr):
    """Columns start.. of x (+ delta, the sum rounded first, as a separate add writes it) -> [BLOCK_B, CHUNK]."""
    batch_rows = tl.arange(0, BLOCK_B)[:, None]
    cols = start + tl.arange(0, CHUNK)[None, :]
    x = tl.load(x_ptr + batch_rows * x_stride + cols, mask=batch_rows < batch, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + batch_rows * delta_stride + cols, mask=batch_rows < batch, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _weight_chunk(w_ptr, row0, start, K: tl.constexpr, TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr):
    rows = row0 + tl.arange(0, TILE_ROWS)
    cols = start + tl.arange(0, CHUNK)
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], eviction_policy="evict_first")


@triton.jit
def _row_projection_kernel(x_ptr, delta_ptr, norm_ptr, w_ptr, out_ptr, total_ptr, x_stride, delta_stride,
                           batch, eps, N: tl.constexpr, K: tl.constexpr, HAS_DELTA: tl.constexpr,
                           HAS_NORM: tl.constexpr, GATED: tl.constexpr, BLOCK_B: tl.constexpr,
                           TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr, LAUNCHES_EARLY: tl.constexpr):
    program = tl.program_id(0)
    dtype = out_ptr.dtype.element_ty
    row0 = program * TILE_ROWS
    batch_rows = tl.arange(0, BLOCK_B)
    # The first weights leave before the norm's pass over the input, which then overlaps their round trip.
    first = _weight_chunk(w_ptr, row0, 0, K, TILE_ROWS, CHUNK)
    if GATED:
        first_up = _weight_chunk(w_ptr, N + row0, 0, K, TILE_ROWS, CHUNK)
    if LAUNCHES_EARLY:
        # The weights depend on no kernel: only what follows waits for the kernel before to finish. Once every
        # program has started, the kernel after may start too (and load its own weights).
        gdc_launch_dependents()
        gdc_wait()
    inverse_rms = tl.zeros([BLOCK_B], tl.float32)
    if HAS_NORM:
        squares = tl.zeros([BLOCK_B], tl.float32)
        for start in tl.static_range(0, K, CHUNK):
            x = _input_chunk(x_ptr, delta_ptr, x_stride, delta_stride, start, batch, HAS_DELTA, BLOCK_B,
                             CHUNK)
            if HAS_DELTA and program == 0:
                cols = start + tl.arange(0, CHUNK)
                tl.store(total_ptr + batch_rows[:, None] * K + cols[None, :], x, mask=batch_rows[:, None] < batch)
            x32 = x.to(tl.float32)
            squares += tl.sum(x32 * x32, axis=1)
        inverse_rms = tl.rsqrt(squares / K + eps)

    acc = tl.zeros([BLOCK_B, TILE_ROWS, CHUNK], tl.float32)
    if GATED:
        acc_up = tl.zeros([BLOCK_B, TILE_ROWS, CHUNK], tl.float32)
    for start in tl.static_range(0, K, CHUNK):
        w = first if start == 0 else _weight_chunk(w_ptr, row0, start, K, TILE_ROWS, CHUNK)
        x = _input_chunk(x_ptr, delta_ptr, x_stride, delta_stride, start, batch, HAS_DELTA, BLOCK_B,
                         CHUNK).to(tl.float32)
        if HAS_NORM:
            # As the norm kernel rounds: the normalised row, then the weighted one.
            norm_weight = tl.load(norm_ptr + start + tl.arange(0, CHUNK)).to(tl.float32)
            x = ((x * inverse_rms[:, None]).to(dtype).to(tl.float32) * norm_weight[None, :]).to(dtype)
            x = x.to(tl.float32)
        acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
        if GATED:
            w_up = first_up if start == 0 else _weight_chunk(w_ptr, N + row0, start, K, TILE_ROWS, CHUNK)
            acc_up += w_up.to(tl.float32)[None, :, :] * x[:, None, :]

    out = tl.sum(acc, axis=2).to(dtype)
    if GATED:
        gate = out.to(tl.float32)
        up = tl.sum(acc_up, axis=2).to(dtype).to(tl.float32)
        out = ((gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up).to(dtype)
    rows = row0 + tl.arange(0, TILE_ROWS)
    tl.store(out_ptr + batch_rows[:, None] * N + rows[None, :], out, mask=batch_rows[:, None] < batch)
