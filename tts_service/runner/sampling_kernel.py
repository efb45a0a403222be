"""One Triton program per row for `sampling.sample`: temperature, top-k, top-p, the Gumbel draw and the greedy
argmax in one launch, where the torch chain runs about fifteen kernels around a full-vocabulary sort.

Top-k needs no sort: the k-th largest score is found by a 32-step radix select over the scores' bits (each step
counts the scores at or above a candidate), and every score at or above it is kept, exactly as the torch chain
keeps `ascending >= kth_largest`. Everything before the top-p cut is elementwise in the same fp32 operations as
the torch chain (an IEEE division by the temperature, one add of the noise, the first index of the maximum), so
rows with top_p = 1 (the checkpoints' default) draw exactly what the chain draws.

Top-p sorts the kept scores in the program and sums their probabilities in ascending order as the chain does,
but a parallel sum adds in another order than torch's scan. A token whose cumulative mass lies within float
rounding of 1 - top_p can therefore be cut on one path and kept on the other, and tied scores straddling the cut
are kept together here where the chain's stable sort splits them by index.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: the CPU build and CI have none, and the torch chain needs none.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    HAS_TRITON = False

_MAX_VOCAB = 8192  # one row lives in one program's registers


def kernel_applies(scores: torch.Tensor, gumbel: torch.Tensor) -> bool:
    return (HAS_TRITON and scores.is_cuda and scores.dtype == gumbel.dtype == torch.float32 and scores.dim() == 2
            and scores.shape == gumbel.shape and scores.shape[1] <= _MAX_VOCAB and scores.stride(-1) == 1
            and gumbel.stride(-1) == 1)


def sample_rows(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                gumbel: torch.Tensor) -> torch.Tensor:
    """scores, gumbel [B, V] fp32; per-row temperature (0 = greedy), top_k (0 = off) and top_p -> ids [B]."""
    batch, vocab = scores.shape
    out = torch.empty(batch, dtype=torch.int64, device=scores.device)
    block = triton.next_power_of_2(vocab)
    _sample_rows_kernel[(batch,)](scores, gumbel, temperature, top_k, top_p, out, scores.stride(0),
                                  gumbel.stride(0), vocab, BLOCK=block, num_warps=8 if block >= 4096 else 4)
    return out


if HAS_TRITON:

    @triton.jit
    def _sortable_key(x):
        # float32 -> an int64 in [0, 2**32) that orders as the floats do (-0.0 just below +0.0).
        bits = x.to(tl.int32, bitcast=True)
        signed = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return signed.to(tl.int64) + 2147483648

    @triton.jit
    def _float_of_key(key):
        signed = (key - 2147483648).to(tl.int32)
        return tl.where(signed < 0, signed ^ 0x7FFFFFFF, signed).to(tl.float32, bitcast=True)

    @triton.jit
    def _sample_rows_kernel(scores_ptr, gumbel_ptr, temperature_ptr, top_k_ptr, top_p_ptr, out_ptr,
                            scores_row_stride, gumbel_row_stride, vocab, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        in_vocab = cols < vocab
        scores = tl.load(scores_ptr + row * scores_row_stride + cols, mask=in_vocab, other=float("-inf"))
        greedy = tl.argmax(scores, axis=0, tie_break_left=True)

        temperature = tl.load(temperature_ptr + row)
        scaled = tl.math.div_rn(scores, tl.where(temperature > 0, temperature, 1.0))
        top_k = tl.load(top_k_ptr + row)
        k = tl.where(top_k > 0, tl.minimum(top_k, vocab), vocab)

        # The k-th largest: the largest key with at least k keys at or above it, one bit at a time.
        keys = tl.where(in_vocab, _sortable_key(scaled), -1)
        kth = tl.zeros((), dtype=tl.int64)
        for bit in tl.static_range(31, -1, -1):
            candidate = kth + (1 << bit)
            kth = tl.where(tl.sum((keys >= candidate).to(tl.int32), axis=0) >= k, candidate, kth)
        kept = in_vocab & (scaled >= _float_of_key(kth))
        filtered = tl.where(kept, scaled, float("-inf"))

        top_p = tl.load(top_p_ptr + row)
        if top_p < 1.0:
            ascending = tl.sort(filtered, dim=0)
            probabilities = tl.exp(ascending - tl.max(ascending, axis=0))
            probabilities = probabilities / tl.sum(probabilities, axis=0)
            cumulative = tl.cumsum(probabilities, axis=0)
            # The largest token is never cut; the cut tokens are a prefix of the ascending order.
            is_cut = (cumulative <= 1.0 - top_p) & (cols < BLOCK - 1)
            smallest_kept = tl.min(tl.where(is_cut, float("inf"), ascending), axis=0)
            filtered = tl.where(filtered >= smallest_kept, filtered, float("-inf"))

        noise = tl.load(gumbel_ptr + row * gumbel_row_stride + cols, mask=in_vocab, other=0.0)
        drawn = tl.argmax(tl.where(in_vocab, filtered + noise, float("-inf")), axis=0, tie_break_left=True)
        tl.store(out_ptr + row, tl.where(temperature > 0, drawn, greedy).to(tl.int64))
