"""One Triton program per row for `sampling.sample`: the row's Gumbel noise, temperature, top-k, top-p, the draw and
the greedy argmax in one launch, where the torch chain runs about fifteen kernels around a full-vocabulary sort and
about twenty more to make the noise. `sample_and_embed_rows` also copies each drawn id's embedding row (the code
predictor's next input); `sample_codebook0` does codebook 0's logit processing before its draw, reading every
setting through the row's slot (`frame_codes.process_codebook0_logits`'s operations, elementwise).

The noise is `sampling.gumbel_noise`'s counter-based hash of (seed, draw, token), worked out in the program with the
same 64-bit integer operations and the same `logf` as PyTorch's kernels, so it is the chain's noise bit for bit and
a request's draws still depend only on its seed and position.

Top-k needs no sort: the k-th largest score is found by a radix select over the scores' 32 bits, two a step (each
step counts the scores at or above three candidates in one block-wide sum), and every score at or above it is kept,
exactly as the torch chain keeps `ascending >= kth_largest`. Everything before the top-p cut is elementwise in
the same fp32 operations as the torch chain (an IEEE division by the temperature, one add of the noise, the first
index of the maximum), so rows with top_p = 1 (the checkpoints' default) draw exactly what the chain draws. A
greedy row (temperature 0) takes its argmax alone.

Top-p sorts the kept scores in the program and sums their probabilities in ascending order as the chain does,
but a parallel sum adds in another order than torch's scan. A token whose cumulative mass lies within float
rounding of 1 - top_p can therefore be cut on one path and kept on the other, and tied scores straddling the cut
are kept together here where the chain's stable sort splits them by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.triton_utils import libdevice, tl, triton
from tts_service.runner.sampling import DRAW_STRIDE, MIX_MULTIPLIERS, TOKEN_STRIDE, RowSampling, sample


class KernelSampler:
    """`sampling`'s draws, one program a row where `KernelPolicy.sampling_kernel` says the kernel takes the
    scores (its noise made inside it), the torch chain elsewhere. The runner's `Sampler`."""

    def makes_own_noise(self, scores: torch.Tensor) -> bool:
        return KernelPolicy.sampling_kernel(scores)

    def sample(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
               gumbel: torch.Tensor | None = None) -> torch.Tensor:
        if self.makes_own_noise(scores):
            return sample_rows(scores, rows.temperature, rows.top_k, rows.top_p, seeds, draws)
        return sample(scores, rows, seeds, draws, gumbel)

    def sample_and_embed(self, scores: torch.Tensor, rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
                         embedding: torch.Tensor,
                         gumbel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel copies each row as it draws its id: one lookup kernel fewer a codebook."""
        if self.makes_own_noise(scores):
            return sample_and_embed_rows(scores, rows.temperature, rows.top_k, rows.top_p, seeds, draws, embedding)
        ids = sample(scores, rows, seeds, draws, gumbel)
        return ids, embedding[ids]


def sample_rows(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                seeds: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """scores [B, V] fp32; per-row temperature (0 = greedy), top_k (0 = off), top_p, and the seed and draw index
    (int64) that make the row's noise -> ids [B]."""
    return _launch_sample_rows(scores, temperature, top_k, top_p, seeds, draws, None)[0]


def sample_and_embed_rows(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                          seeds: torch.Tensor, draws: torch.Tensor,
                          embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_rows`, and the ids' rows of the `embedding` table [V, W] -> (ids [B], [B, W]). Each row is copied by
    the program that drew its id: the next call's input needs no lookup kernel of its own."""
    return _launch_sample_rows(scores, temperature, top_k, top_p, seeds, draws, embedding.contiguous())


def _launch_sample_rows(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                        seeds: torch.Tensor, draws: torch.Tensor,
                        embedding: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    batch, vocab = scores.shape
    out = torch.empty(batch, dtype=torch.int64, device=scores.device)
    # Without a table the kernel copies no rows, and the scores stand in for both pointers.
    table, embedded, width = scores, scores, 1
    if embedding is not None:
        table, width = embedding, embedding.shape[1]
        embedded = torch.empty(batch, width, dtype=embedding.dtype, device=scores.device)
    block = triton.next_power_of_2(vocab)
    # 8 warps from 2048 tokens: a row of 2048 took 9.9 us against 11.9 with 4 on an H100, at 1 and 128 rows.
    _sample_rows_kernel[(batch,)](scores, temperature, top_k, top_p, seeds, draws, out, table, embedded,
                                  scores.stride(0), vocab, seeds.stride(0), draws.stride(0), width, BLOCK=block,
                                  BLOCK_W=triton.next_power_of_2(width), HAS_EMBEDDING=embedding is not None,
                                  num_warps=8 if block >= 2048 else 4)
    return out, embedded


@dataclass(frozen=True)
class SlotTensors:
    """Per-slot state on the device that the codebook-0 kernel reads through each row's slot: the talker's and the
    predictor's sampling settings, the seed, the repetition penalty and its history (`seen` [S, V] bool, updated
    with each draw), the minimum length."""

    temperature: torch.Tensor  # [S] float32; 0 = greedy
    top_k: torch.Tensor  # [S] int64; 0 = off
    top_p: torch.Tensor  # [S] float32
    predictor_temperature: torch.Tensor
    predictor_top_k: torch.Tensor
    predictor_top_p: torch.Tensor
    seeds: torch.Tensor  # [S] int64
    repetition_penalty: torch.Tensor  # [S] float32
    min_frames: torch.Tensor  # [S] int64
    seen: torch.Tensor  # [S, V] bool


@dataclass(frozen=True)
class Codebook0Draw:
    """What the codebook-0 kernel gives a frame's rows: code 0, its embedding, and the predictor's per-row
    settings, seeds and draw indices (codebooks 1..G-1) for the draws to come."""

    codes: torch.Tensor  # [B] int64
    embedding: torch.Tensor  # [B, W]
    predictor_temperature: torch.Tensor  # [B] float32
    predictor_top_k: torch.Tensor  # [B] int64
    predictor_top_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64
    draws: torch.Tensor  # [B, G-1] int64


def sample_codebook0(logits: torch.Tensor, slots: torch.Tensor, frame_index: torch.Tensor, state: SlotTensors,
                     suppressed: torch.Tensor, eos_id: int, num_groups: int, embedding: torch.Tensor) -> Codebook0Draw:
    """The talker head's logits [B, V] -> code 0 and its rows of `embedding`, as `frame_codes`'
    `process_codebook0_logits` then `sampling.sample` draw it (draw index frame_index * num_groups), with each
    drawn id marked in its slot's `seen` row; one program per row reads every setting through the row's slot, and
    lays out the predictor's for the frame, in place of some thirty small kernels around the sampling kernel."""
    batch, vocab = logits.shape
    device = logits.device
    embedding = embedding.contiguous()  # the kernel steps through the table a row of `width` at a time
    width = embedding.shape[1]
    draw = Codebook0Draw(
        codes=torch.empty(batch, dtype=torch.int64, device=device),
        embedding=torch.empty(batch, width, dtype=embedding.dtype, device=device),
        predictor_temperature=torch.empty(batch, dtype=state.predictor_temperature.dtype, device=device),
        predictor_top_k=torch.empty(batch, dtype=state.predictor_top_k.dtype, device=device),
        predictor_top_p=torch.empty(batch, dtype=state.predictor_top_p.dtype, device=device),
        seeds=torch.empty(batch, dtype=state.seeds.dtype, device=device),
        draws=torch.empty(batch, num_groups - 1, dtype=torch.int64, device=device))
    block = triton.next_power_of_2(vocab)
    # 16 warps at codebook 0's 3072 ids: 17.2 us a launch against 18.6 with 8 (4.0 against 5.2 greedy) on an H100,
    # at one and 64 rows, the same draws (commit e8f6eb5).
    num_warps = 16 if block >= 4096 else 8 if block >= 2048 else 4
    _codebook0_kernel[(batch,)](
        logits, slots, frame_index, state.temperature, state.top_k, state.top_p, state.predictor_temperature,
        state.predictor_top_k, state.predictor_top_p, state.seeds, state.repetition_penalty, state.min_frames,
        state.seen, suppressed, embedding, draw.codes, draw.embedding, draw.predictor_temperature,
        draw.predictor_top_k, draw.predictor_top_p, draw.seeds, draw.draws, logits.stride(0), state.seen.stride(0),
        vocab, eos_id, num_groups, width, BLOCK=block, BLOCK_W=triton.next_power_of_2(width),
        BLOCK_G=triton.next_power_of_2(num_groups), num_warps=num_warps)
    return draw


_MIX_A, _MIX_B, _MIX_C = (tl.constexpr(multiplier) for multiplier in MIX_MULTIPLIERS)
_TOKEN_STRIDE = tl.constexpr(TOKEN_STRIDE)
_DRAW_STRIDE = tl.constexpr(DRAW_STRIDE)


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
def _mix(x):
    # `sampling._mix` in 32-bit arithmetic: its int64 products masked to 32 bits are exactly uint32's
    # wrapping products, and its shifts of values below 2**32 are logical ones.
    x = x ^ (x >> 16)
    x = x * _MIX_A
    x = x ^ (x >> 15)
    x = x * _MIX_B
    x = x ^ (x >> 16)
    x = x * _MIX_C
    return x ^ (x >> 15)


@triton.jit
def _gumbel_noise(seed, draw, tokens):
    # `sampling.gumbel_noise` for one row: the key of (seed, draw), then each token's 32 bits, then (0, 1).
    # Only the low 32 bits of the seed and of the draw index reach the hash, as `& MASK32` keeps them there.
    key = _mix(seed.to(tl.uint32) ^ (draw.to(tl.uint32) * _DRAW_STRIDE))
    bits = _mix(key + tokens.to(tl.uint32) * _TOKEN_STRIDE)
    uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / (1 << 23))
    # libdevice's log is the logf PyTorch's own log kernel calls.
    return -libdevice.log(-libdevice.log(uniform))


@triton.jit
def _kth_largest_key(keys, k):
    """The largest key with at least k keys at or above it, two bits a step: the three candidates' counts
    (each at most the block, under 2**21) share one int64 sum, one block-wide reduction where a bit a step
    takes two. The counts fall as the candidate rises, so the bits taken are how many of the three reach k.
    On an H100 a 2048-token row took 10.6 us against 11.3 a bit a step, a 3072-token one 16.8 against 16.1 (the
    packing's int64 work grows with the row): BENCHMARKS.md at 2dbe081."""
    kth = tl.zeros((), dtype=tl.int64)
    for shift in tl.static_range(30, -1, -2):
        packed = ((keys >= kth + (1 << shift)).to(tl.int64)
                  + ((keys >= kth + (2 << shift)).to(tl.int64) << 21)
                  + ((keys >= kth + (3 << shift)).to(tl.int64) << 42))
        counts = tl.sum(packed, axis=0)
        reached = (((counts & 0x1FFFFF) >= k).to(tl.int64) + (((counts >> 21) & 0x1FFFFF) >= k).to(tl.int64)
                   + ((counts >> 42) >= k).to(tl.int64))
        kth = kth + (reached << shift)
    return kth


@triton.jit
def _draw_row(scores, cols, in_vocab, temperature, top_k_ptr, top_p_ptr, seed_ptr, draw, vocab,
              BLOCK: tl.constexpr):
    """A row with temperature > 0: scaled, cut to its top-k and top-p, the noise added, the first maximum.
    top_k_ptr, top_p_ptr and seed_ptr point at the row's own settings."""
    scaled = tl.math.div_rn(scores, temperature)
    top_k = tl.load(top_k_ptr)
    k = tl.where(top_k > 0, tl.minimum(top_k, vocab), vocab)
    keys = tl.where(in_vocab, _sortable_key(scaled), -1)
    kept = in_vocab & (scaled >= _float_of_key(_kth_largest_key(keys, k)))
    filtered = tl.where(kept, scaled, float("-inf"))

    top_p = tl.load(top_p_ptr)
    if top_p < 1.0:
        ascending = tl.sort(filtered, dim=0)
        probabilities = tl.exp(ascending - tl.max(ascending, axis=0))
        probabilities = probabilities / tl.sum(probabilities, axis=0)
        cumulative = tl.cumsum(probabilities, axis=0)
        # The largest token is never cut; the cut tokens are a prefix of the ascending order.
        is_cut = (cumulative <= 1.0 - top_p) & (cols < BLOCK - 1)
        smallest_kept = tl.min(tl.where(is_cut, float("inf"), ascending), axis=0)
        filtered = tl.where(filtered >= smallest_kept, filtered, float("-inf"))

    noise = _gumbel_noise(tl.load(seed_ptr).to(tl.int64), draw, cols)
    return tl.argmax(tl.where(in_vocab, filtered + noise, float("-inf")), axis=0, tie_break_left=True)


@triton.jit
def _pick(scores, cols, in_vocab, temperature, top_k_ptr, top_p_ptr, seed_ptr, draw, vocab, BLOCK: tl.constexpr):
    """The row's draw, or its argmax where temperature is 0 (scores hold -inf past the vocabulary). A NaN score wins
    the argmax, as it does torch's (the chain's greedy draw): Triton's own argmax would keep a -inf over a NaN and
    could return a column past the vocabulary, whose `seen` entry and embedding row lie outside their tensors."""
    if temperature > 0:
        drawn = _draw_row(scores, cols, in_vocab, temperature, top_k_ptr, top_p_ptr, seed_ptr, draw, vocab, BLOCK)
    else:
        drawn = tl.argmax(tl.where(scores != scores, float("inf"), scores), axis=0, tie_break_left=True)
    return drawn


@triton.jit
def _copy_embedding(embedding_ptr, embedded_ptr, row, drawn, width, BLOCK_W: tl.constexpr):
    cols = tl.arange(0, BLOCK_W)
    in_width = cols < width
    embedded = tl.load(embedding_ptr + drawn.to(tl.int64) * width + cols, mask=in_width)
    tl.store(embedded_ptr + row * width + cols, embedded, mask=in_width)


@triton.jit
def _sample_rows_kernel(scores_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seeds_ptr, draws_ptr, out_ptr,
                        embedding_ptr, embedded_ptr, scores_row_stride, vocab, seeds_stride, draws_stride, width,
                        BLOCK: tl.constexpr, BLOCK_W: tl.constexpr, HAS_EMBEDDING: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    scores = tl.load(scores_ptr + row * scores_row_stride + cols, mask=in_vocab, other=float("-inf"))
    drawn = _pick(scores, cols, in_vocab, tl.load(temperature_ptr + row), top_k_ptr + row, top_p_ptr + row,
                  seeds_ptr + row * seeds_stride, tl.load(draws_ptr + row * draws_stride).to(tl.int64), vocab,
                  BLOCK)
    tl.store(out_ptr + row, drawn.to(tl.int64))
    if HAS_EMBEDDING:
        _copy_embedding(embedding_ptr, embedded_ptr, row, drawn, width, BLOCK_W)


@triton.jit
def _codebook0_kernel(logits_ptr, slots_ptr, frame_index_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                      predictor_temperature_ptr, predictor_top_k_ptr, predictor_top_p_ptr, seeds_ptr, penalty_ptr,
                      min_frames_ptr, seen_ptr, suppressed_ptr, embedding_ptr, out_ptr, embedded_ptr,
                      rows_temperature_ptr, rows_top_k_ptr, rows_top_p_ptr, rows_seeds_ptr, rows_draws_ptr,
                      logits_row_stride, seen_row_stride, vocab, eos_id, num_groups, width, BLOCK: tl.constexpr,
                      BLOCK_W: tl.constexpr, BLOCK_G: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    frame = tl.load(frame_index_ptr + row)
    # The predictor's settings for the frame's later draws, read through the slot once.
    tl.store(rows_temperature_ptr + row, tl.load(predictor_temperature_ptr + slot))
    tl.store(rows_top_k_ptr + row, tl.load(predictor_top_k_ptr + slot))
    tl.store(rows_top_p_ptr + row, tl.load(predictor_top_p_ptr + slot))
    tl.store(rows_seeds_ptr + row, tl.load(seeds_ptr + slot))
    later = tl.arange(0, BLOCK_G)
    tl.store(rows_draws_ptr + row * (num_groups - 1) + later, frame * num_groups + 1 + later,
             mask=later < num_groups - 1)

    cols = tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    logits = tl.load(logits_ptr + row * logits_row_stride + cols, mask=in_vocab, other=0.0).to(tl.float32)
    seen_row = seen_ptr + slot * seen_row_stride
    seen = tl.load(seen_row + cols, mask=in_vocab, other=0) != 0
    # As `process_codebook0_logits`: the repetition penalty (an IEEE division, as torch's), EOS blocked before
    # the minimum length, the suppressed ids; every step elementwise in the same fp32 operations.
    penalty = tl.load(penalty_ptr + slot)
    penalized = tl.where(logits < 0, logits * penalty, tl.math.div_rn(logits, penalty))
    scores = tl.where(seen, penalized, logits)
    is_blocked = (cols == eos_id) & (frame < tl.load(min_frames_ptr + slot))
    is_suppressed = tl.load(suppressed_ptr + cols, mask=in_vocab, other=1) != 0
    scores = tl.where(is_blocked | is_suppressed | ~in_vocab, float("-inf"), scores)
    drawn = _pick(scores, cols, in_vocab, tl.load(temperature_ptr + slot), top_k_ptr + slot, top_p_ptr + slot,
                  seeds_ptr + slot, frame * num_groups, vocab, BLOCK)
    tl.store(out_ptr + row, drawn.to(tl.int64))
    tl.store(seen_row + drawn, 1)
    _copy_embedding(embedding_ptr, embedded_ptr, row, drawn, width, BLOCK_W)
