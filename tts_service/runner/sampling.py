"""Batched sampling with per-row parameters and no host synchronisation.

The filters follow the reference's generate(): repetition penalty on codebook 0, suppressed
ids, the minimum-length EOS mask, then temperature, top-k and top-p. Drawing uses the
Gumbel-max trick with noise from a counter-based hash of (seed, draw index, token id), so a
request's samples depend only on its own seed and position, never on which other requests
share its batch: the eager path and the batched engine draw the same tokens.

Everything here is the torch chain, which the eager path runs and the sampling kernels are held to; the runner
draws through `sampling_kernel.KernelSampler`, which takes the kernels where `KernelPolicy` says they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tts_service.runner.params import SamplingParams

# The counter-based hash of `gumbel_noise`, which the sampling kernels compute too. Odd multipliers below 2**31 keep
# every product of 32-bit values inside int64 (no reliance on overflow).
MASK32 = 0xFFFFFFFF
MIX_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)
TOKEN_STRIDE = 0x61C88647
DRAW_STRIDE = 0x3C6EF372


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling parameters as device tensors, built once per batch layout."""

    temperature: torch.Tensor  # [B] float32; 0 = greedy
    top_k: torch.Tensor  # [B] int64; 0 = off
    top_p: torch.Tensor  # [B] float32

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device) -> RowSampling:
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )


def _mix(x: torch.Tensor) -> torch.Tensor:
    first, second, third = MIX_MULTIPLIERS
    x = x ^ (x >> 16)
    x = (x * first) & MASK32
    x = x ^ (x >> 15)
    x = (x * second) & MASK32
    x = x ^ (x >> 16)
    x = (x * third) & MASK32
    return x ^ (x >> 15)


def uniform_noise(seeds: torch.Tensor, draws: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise [B, V] for draws [B], or [B, D, V] for draws [B, D], determined by each row's seed
    and draw index alone (the hash is elementwise, so a draw's noise is the same whichever way it is asked for)."""
    tokens = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    seeds = seeds.reshape(seeds.shape + (1,) * (draws.dim() - 1))
    key = _mix((seeds & MASK32) ^ ((draws * DRAW_STRIDE) & MASK32))
    bits = _mix((key[..., None] + tokens * TOKEN_STRIDE) & MASK32)
    return unit_interval(bits)


def gumbel_noise(seeds: torch.Tensor, draws: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise of the shape `uniform_noise` gives. The code predictor asks for a frame's 15 draws at once:
    one set of kernels instead of fifteen, and the same values."""
    return -torch.log(-torch.log(uniform_noise(seeds, draws, vocab_size)))


def unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """32 random bits -> float32 strictly inside (0, 1).

    23 bits, not 24: (2**24 - 0.5) / 2**24 rounds to exactly 1.0 in float32, and u == 1 makes the
    Gumbel noise +inf, which turns a removed token's -inf score into NaN and lets argmax pick it.
    """
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def penalize_repetitions(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Reference semantics: seen tokens' logits are divided by the penalty if positive, else multiplied."""
    penalized = torch.where(logits < 0, logits * penalty[:, None], logits / penalty[:, None])
    return torch.where(seen, penalized, logits)


def filter_top_k_top_p(scores: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Apply per-row temperature, top-k then top-p to fp32 scores; removed tokens become -inf."""
    vocab = scores.shape[-1]
    temperature = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
    scores = scores / temperature[:, None]
    ascending, order = scores.sort(dim=-1)
    k = torch.where(rows.top_k > 0, rows.top_k.clamp(max=vocab), torch.full_like(rows.top_k, vocab))
    kth_largest = ascending.gather(-1, (vocab - k)[:, None])
    ascending = ascending.masked_fill(ascending < kth_largest, float("-inf"))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1.0 - rows.top_p)[:, None]
    drop[:, -1] = False
    drop &= (rows.top_p < 1.0)[:, None]
    ascending = ascending.masked_fill(drop, float("-inf"))
    return torch.empty_like(scores).scatter_(-1, order, ascending)


def sample(scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
           gumbel: torch.Tensor | None = None) -> torch.Tensor:
    """scores [B, V] fp32 after logit processors -> token ids [B]; greedy rows take the argmax. `gumbel` is this
    draw's `gumbel_noise` when the caller made it already."""
    if gumbel is None:
        gumbel = gumbel_noise(seeds, draws, scores.shape[-1])
    return sample_eager(scores, rows, gumbel)


def sample_eager(scores: torch.Tensor, rows: RowSampling, gumbel: torch.Tensor) -> torch.Tensor:
    """The torch chain: the CPU path and the reference the kernels are tested against."""
    greedy = scores.argmax(dim=-1)
    filtered = filter_top_k_top_p(scores, rows)
    drawn = (filtered + gumbel).argmax(dim=-1)
    return torch.where(rows.temperature > 0, drawn, greedy)


class Sampler(Protocol):
    """What draws a frame's ids: the torch chain (`TORCH_SAMPLER`), or the runner's `KernelSampler`."""

    def makes_own_noise(self, scores: torch.Tensor) -> bool:
        """Whether drawing from `scores` makes its noise itself (so no caller need make it ahead)."""
        ...

    def sample(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
               gumbel: torch.Tensor | None = None) -> torch.Tensor: ...

    def sample_and_embed(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
                         embedding: torch.Tensor,
                         gumbel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample`, and the drawn ids' rows of the `embedding` table [V, W] -> (ids [B], [B, W])."""
        ...


class TorchSampler:
    """The torch chain as a `Sampler`: the eager path's, which never runs a kernel."""

    def makes_own_noise(self, scores: torch.Tensor) -> bool:
        return False

    def sample(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
               gumbel: torch.Tensor | None = None) -> torch.Tensor:
        return sample(scores, rows, seeds, draws, gumbel)

    def sample_and_embed(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
                         embedding: torch.Tensor,
                         gumbel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ids = sample(scores, rows, seeds, draws, gumbel)
        return ids, embedding[ids]


TORCH_SAMPLER = TorchSampler()
