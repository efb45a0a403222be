"""Checks of `row_projections` for Triton's interpreter, run by `test_row_projections` in a process of its own
(the interpreter must be on before Triton is imported). In fp32, where the kernels round nowhere the chain does
not, they must give the eager chain's values up to the order of each sum."""

from __future__ import annotations

import torch

from tts_service.model import row_projections
from tts_service.model.fused_ops import rms_norm_eager, silu_mul_eager


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def check_the_projections_give_the_chains_values(num_rows: int, chunk: int) -> None:
    generator = torch.Generator().manual_seed(num_rows * 1000 + chunk)
    width, out_width, intermediate = 256, 96, 128
    tiling = row_projections.Tiling(tile_rows=8, chunk=chunk, num_warps=4)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    x, delta, norm_weight = randn(num_rows, 1, width), randn(num_rows, 1, width), 1 + randn(width) / 4
    weight, gate_up, down = randn(out_width, width), randn(2 * intermediate, width), randn(out_width, intermediate)
    eps = 1e-6
    total = x + delta

    summed, out = row_projections.normed_projection(x, delta, norm_weight, eps, weight, tiling)
    torch.testing.assert_close(summed, total, rtol=0, atol=0)
    _close(out, rms_norm_eager(total, norm_weight, eps) @ weight.T)

    unchanged, out = row_projections.normed_projection(x, None, norm_weight, eps, weight, tiling)
    assert unchanged is x
    _close(out, rms_norm_eager(x, norm_weight, eps) @ weight.T)

    summed, activations = row_projections.gated_projection(x, delta, norm_weight, eps, gate_up, tiling)
    torch.testing.assert_close(summed, total, rtol=0, atol=0)
    gate, up = (rms_norm_eager(total, norm_weight, eps) @ gate_up.T).chunk(2, dim=-1)
    _close(activations, silu_mul_eager(gate, up))

    _close(row_projections.projection(activations, down, tiling), activations @ down.T)
