"""The code predictor's call for one codebook at one or two rows (streams times tokens), as one persistent kernel.

A codebook's pass through the predictor's five layers is about fifty kernels (per layer two norms, four
projections, q/k norm with RoPE, attention, SiLU), each too small to keep the memory busy: at 1.7B on an H100 the
pass takes about 200 us where its weights (about 165 MB) would stream in some 55 us, and a frame runs it 15 times.
Here one program per SM walks the whole pass (the input projection; per layer q/k/v, attention, o, gate/up,
down; the final norm and the codebook's head), each phase's rows shared out over every program, the phases
separated by grid-wide barriers. Each barrier is split: a program arrives, loads the weights its next phase opens
with (they depend on no other program), then waits. The barrier needs every program resident at once: one per SM
(its 8 warps take up to 250 registers a thread, which leaves no room for a second). It is launched as a cooperative
grid, CUDA's guarantee of exactly that, rather than trusting the SMs to free in time: no program spins at a barrier
while another waits for an SM that other streams' kernels hold (the codec's, the forced aligner's), and a grid that
cannot all be resident (a GPU share capped below its SM count, as MPS's active-thread percentage does) fails to
launch rather than hang. A program's tiles in a phase are few (one to four), so each round trip to memory it waits
out shows: within a phase it loads each tile's weights before it reduces the tile before, and at one row it keeps
two chunks in flight. The call takes about 125 us at one row (BENCHMARKS.md at 927abc4, b1e759d, 2dbe081), a
quarter of it in its barriers (about 1.2 us each: 26 a call, 25 where the predictor is as wide as the talker).

Rounding follows the eager chain as the other fused kernels do: each tensor the eager chain writes is rounded to
the activation dtype where it writes it (the normalised input, the weighted input, each projection's output, the
residual sums, the rotated q/k, the attention probabilities before they weight the values, SiLU's output). Only the
fp32 sums inside a projection, a norm or the attention run in another order, as cuBLAS's choice of kernel does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tts_service.model.talker import Talker
from tts_service.model.triton_utils import tl, triton

# Rows the kernel's scratch holds, and so the most it computes in one call; the engine hands it at most
# `kernel_policy.MAX_PREDICTOR_PASS_ROWS`, where it was measured faster than the layer chain.
MAX_ROWS = 4
_LOG2_E = 1.4426950408889634
# Rows of a projection one program reduces at a time, and the most of the input it reads per load.
_TILE_ROWS = 8
_MAX_CHUNK = 1024


def stack_parameters(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous [N, ...] tensor holding `tensors`, each of which becomes a view of its slice (no second copy
    of the weights; the modules still read the same values)."""
    stacked = torch.stack([tensor.detach() for tensor in tensors])
    for index, tensor in enumerate(tensors):
        tensor.data = stacked[index]
    return stacked


class PredictorPass:
    """The code predictor's weights stacked per kind and the scratch its kernel shares between phases. Built once
    per runner; `logits` is capturable in a CUDA graph (all its tensors keep their addresses)."""

    def __init__(self, talker: Talker, cache_storage: torch.Tensor, tile_rows: int = _TILE_ROWS,
                 num_warps: int = 8, num_programs: int | None = None) -> None:
        predictor = talker.code_predictor
        shape = talker.config.code_predictor
        layers = list(predictor.model.layers)
        attention = [layer.self_attn for layer in layers]
        mlps = [layer.mlp for layer in layers]
        if any(a.qkv_weight is None for a in attention) or any(m.gate_up_weight is None for m in mlps):
            raise ValueError("the predictor's projections must be packed (use_fused_kernels) first")
        self.hidden_size = shape.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = (shape.num_attention_heads, shape.num_key_value_heads,
                                                            shape.head_dim)
        self.intermediate_size = shape.intermediate_size
        self.vocab_size = shape.vocab_size
        self.num_layers = len(layers)
        self.eps = shape.rms_norm_eps
        self.input_size = talker.config.layers.hidden_size
        self.cache_storage = cache_storage
        with torch.no_grad():
            self.input_norms = stack_parameters([layer.input_layernorm.weight for layer in layers])
            self.qkv = _stack_packed(attention, "qkv_weight", ("q_proj", "k_proj", "v_proj"))
            self.q_norms = stack_parameters([a.q_norm.weight for a in attention])
            self.k_norms = stack_parameters([a.k_norm.weight for a in attention])
            self.o = stack_parameters([a.o_proj.weight for a in attention])
            self.post_norms = stack_parameters([layer.post_attention_layernorm.weight for layer in layers])
            self.gate_up = _stack_packed(mlps, "gate_up_weight", ("gate_proj", "up_proj"))
            self.down = stack_parameters([m.down_proj.weight for m in mlps])
            self.heads = stack_parameters([head.weight for head in predictor.lm_head])
        self.final_norm = predictor.model.norm.weight
        projection = predictor.small_to_mtp_projection
        self.projection = projection if isinstance(projection, nn.Linear) else None
        dtype, device = self.o.dtype, self.o.device
        self.rope_cos, self.rope_sin = (table[0].contiguous()
                                        for table in predictor.rope_table(talker.config.num_code_groups, dtype))
        self.hidden = torch.zeros(MAX_ROWS, self.hidden_size, dtype=dtype, device=device)
        self.qkv_out = torch.zeros(MAX_ROWS, self.qkv.shape[1], dtype=dtype, device=device)
        self.attention_out = torch.zeros(MAX_ROWS, self.num_heads * self.head_dim, dtype=dtype, device=device)
        self.activations = torch.zeros(MAX_ROWS, self.intermediate_size, dtype=dtype, device=device)
        self.logits_out = torch.zeros(MAX_ROWS, self.vocab_size, dtype=torch.float32, device=device)
        # Counts every barrier arrival of every call; never reset (int64: it cannot wrap), each call finds its
        # base from it (see the kernel).
        self.arrivals = torch.zeros(1, dtype=torch.int64, device=device)
        # One program per SM: all resident at once (a cooperative launch), which the grid-wide barrier needs.
        self.num_programs = num_programs or torch.cuda.get_device_properties(device).multi_processor_count
        self.tile_rows, self.num_warps = tile_rows, num_warps
        self.chunk = _chunk(self.input_size, self.hidden_size, self.intermediate_size,
                            self.num_heads * self.head_dim)

    @staticmethod
    def covers(talker: Talker) -> bool:
        """Whether the kernel's tiles cover this predictor's shapes; whether it runs at all is
        `KernelPolicy.predictor_pass`'s to say."""
        shape = talker.config.code_predictor
        group = shape.num_attention_heads // max(1, shape.num_key_value_heads)
        rows = (shape.hidden_size, shape.intermediate_size, shape.vocab_size,
                (shape.num_attention_heads + 2 * shape.num_key_value_heads) * shape.head_dim)
        return (_chunk(shape.hidden_size, talker.config.layers.hidden_size, shape.intermediate_size,
                       shape.num_attention_heads * shape.head_dim) >= 16
                and all(size % _TILE_ROWS == 0 for size in rows)
                and _is_power_of_two(shape.head_dim) and _is_power_of_two(group) and _is_power_of_two(shape.hidden_size)
                and shape.num_attention_heads % shape.num_key_value_heads == 0)

    def logits(self, codebook: int, inputs: torch.Tensor) -> torch.Tensor:
        """The head's logits [B, V] (fp32 holding the activation dtype's values, as `.float()` of the eager
        logits) for `codebook`, from each stream's `inputs` [B, T, talker width]: the previous codebook's embedding
        at position `codebook` (T = 1), or for codebook 1 the frame's first two tokens at positions 0 and 1; stores
        those positions' keys and values in the cache as the layers' attention does, and takes the logits of each
        stream's last token."""
        batch, num_tokens = inputs.shape[:2]
        start = codebook + 1 - num_tokens
        num_rows = batch * num_tokens
        if not (1 <= codebook < self.rope_cos.shape[0] and num_tokens in (1, 2) and start >= 0
                and 1 <= num_rows <= MAX_ROWS):
            raise ValueError(f"codebook {codebook} with {num_tokens} tokens at batch {batch} is outside the "
                             "kernel's range")
        inputs = inputs.reshape(num_rows, inputs.shape[2]).contiguous()
        cache = self.cache_storage
        projection = self.projection
        # At one row a tile reduces quickly and the memory's round trips show: each program holds two chunks in
        # flight outside gate/up (a quarter off o's phase, 1.7B codebooks 2-15 about 4% faster). At two rows the
        # reductions hide one round trip and the second chunk's registers cost more than it saves (about 5% slower
        # at 1.7B): BENCHMARKS.md at b1e759d.
        _predictor_pass_kernel[(self.num_programs,)](
            inputs, projection.weight if projection is not None else inputs,
            projection.bias if projection is not None else inputs,
            self.input_norms, self.qkv, self.q_norms, self.k_norms, self.o, self.post_norms, self.gate_up, self.down,
            self.final_norm, self.heads[codebook - 1], self.rope_cos, self.rope_sin,
            cache, cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3), cache.stride(4),
            self.hidden, self.qkv_out, self.attention_out, self.activations, self.logits_out, self.arrivals,
            num_rows, start, self.eps, _LOG2_E / math.sqrt(self.head_dim),
            INPUT_SIZE=self.input_size, HIDDEN=self.hidden_size, NUM_HEADS=self.num_heads,
            NUM_KV_HEADS=self.num_kv_heads, HEAD_DIM=self.head_dim, INTERMEDIATE=self.intermediate_size,
            VOCAB=self.vocab_size, NUM_LAYERS=self.num_layers, HAS_PROJECTION=projection is not None,
            HAS_BIAS=projection is not None and projection.bias is not None, NUM_TOKENS=num_tokens,
            BLOCK_B=_next_power_of_two(num_rows), BLOCK_S=_next_power_of_two(batch),
            BLOCK_T=_next_power_of_two(self.rope_cos.shape[0]), TILE_ROWS=self.tile_rows, CHUNK=self.chunk,
            TWO_AHEAD=num_rows == 1, ON_GPU=inputs.is_cuda, num_warps=self.num_warps, enable_fp_fusion=False,
            launch_cooperative_grid=True)
        return self.logits_out[:batch]


def _stack_packed(modules: list[nn.Module], packed_name: str, parts: tuple[str, ...]) -> torch.Tensor:
    """Stack each module's packed weight, and re-point the packed buffer and its parts' weights into the stack."""
    stacked = torch.stack([getattr(module, packed_name) for module in modules])
    for index, module in enumerate(modules):
        setattr(module, packed_name, stacked[index])
        start = 0
        for part in parts:
            weight = getattr(module, part).weight
            rows = weight.shape[0]
            weight.data = stacked[index, start:start + rows]
            start += rows
    return stacked


def _chunk(*widths: int) -> int:
    """The longest span, a power of two up to _MAX_CHUNK, that divides every input width a projection reads."""
    chunk = _MAX_CHUNK
    while chunk > 1 and any(width % chunk for width in widths):
        chunk //= 2
    return chunk


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _next_power_of_two(value: int) -> int:
    return 1 << (value - 1).bit_length()


@triton.jit
def _arrive(arrivals_ptr, ON_GPU: tl.constexpr):
    """This program's writes so far are done: count it in. Every thread's writes come before the CTA's barrier;
    then thread 0 alone adds, with release semantics (a fence, then a reduction that returns nothing), so whoever
    sees the count sees the writes."""
    tl.debug_barrier()
    if ON_GPU:
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_first; .reg .u32 %t_id;
            mov.u32 %t_id, %tid.x; setp.eq.u32 %p_first, %t_id, 0;
            @%p_first red.release.gpu.global.add.u64 [$1], 1;
            mov.u32 $0, 0; }""", "=r,l", [arrivals_ptr], dtype=tl.int32, is_pure=False, pack=1)
    else:  # Triton's interpreter (one program at a time) runs no PTX
        tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(arrivals_ptr, target, ON_GPU: tl.constexpr):
    """Wait until `target` arrivals are counted. Thread 0 alone polls, the CTA's other threads wait at its
    barrier: every warp polling the one address took a barrier 1.9 us against 1.2 (BENCHMARKS.md at 2dbe081).
    The poll is a volatile load, not an acquire (which also invalidates the SM's L1 each time round, measured
    slower): what orders the reads of other programs' writes after it is that each is issued only once the
    poll's value has decided the branch and the CTA's barrier, and reads through L2 (`.cg`), where the writes
    were before the count (an SM's L1 may hold a line another SM has since written)."""
    if ON_GPU:
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_wait; .reg .u32 %t_id; .reg .s64 %seen;
            mov.u32 %t_id, %tid.x; setp.ne.u32 %p_wait, %t_id, 0;
            @%p_wait bra DONE_WAITING;
            POLL: ld.volatile.global.s64 %seen, [$1];
            setp.lt.s64 %p_wait, %seen, $2;
            @%p_wait bra POLL;
            DONE_WAITING: mov.u32 $0, 0; }""", "=r,l,l", [arrivals_ptr, target], dtype=tl.int32, is_pure=False,
            pack=1)
    else:
        seen = tl.load(arrivals_ptr, volatile=True)
        while seen < target:
            seen = tl.load(arrivals_ptr, volatile=True)
    tl.debug_barrier()


@triton.jit
def _tile_chunk(w_ptr, tile, num_rows: tl.constexpr, K: tl.constexpr, TILE_ROWS: tl.constexpr,
                CHUNK: tl.constexpr, START: tl.constexpr = 0):
    """Columns START..START+CHUNK of a tile of w [num_rows, K] (zeros past its rows: a tile this program does
    not have). Loaded ahead, before a barrier or the tile before it is reduced, so that its latency hides
    theirs."""
    rows = tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
    cols = START + tl.arange(0, CHUNK)
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=rows[:, None] < num_rows,
                   other=0.0, eviction_policy="evict_first")


@triton.jit
def _opening_chunks(w_ptr, tile, num_programs, num_rows: tl.constexpr, K: tl.constexpr,
                    TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr, TWO_AHEAD: tl.constexpr):
    """The chunks of w [num_rows, K] a program reduces first from `tile` on: the tile's first; with TWO_AHEAD
    also the next, the tile's second chunk when its rows are wider than a chunk, else the next tile's (else
    `second` is `first` again, unused)."""
    first = _tile_chunk(w_ptr, tile, num_rows, K, TILE_ROWS, CHUNK)
    if TWO_AHEAD and K > CHUNK:
        second = _tile_chunk(w_ptr, tile, num_rows, K, TILE_ROWS, CHUNK, CHUNK)
    elif TWO_AHEAD:
        second = _tile_chunk(w_ptr, tile + num_programs, num_rows, K, TILE_ROWS, CHUNK)
    else:
        second = first
    return first, second


@triton.jit
def _inverse_rms(x_ptr, x_stride, batch, eps, WIDTH: tl.constexpr, BLOCK_B: tl.constexpr):
    """1 / rms of each of the first `batch` rows of x [*, WIDTH] (rows x_stride apart) -> [BLOCK_B] fp32."""
    rows = tl.arange(0, BLOCK_B)
    cols = tl.arange(0, WIDTH)
    x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=rows[:, None] < batch, other=0.0,
                cache_modifier=".cg").to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=1) / WIDTH + eps)


@triton.jit
def _project_tile(w_ptr, row0, x_ptr, x_stride, batch, inverse_rms, norm_ptr, first, second, K: tl.constexpr,
                  HAS_NORM: tl.constexpr, HAS_FIRST: tl.constexpr, HAS_SECOND: tl.constexpr,
                  BLOCK_B: tl.constexpr, TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr):
    """x [B, K] (RMS-normalised and weighted first, when HAS_NORM, rounding as the norm kernel does) times
    rows row0.. of w [*, K] -> [BLOCK_B, TILE_ROWS] fp32 sums. With HAS_FIRST, `first` holds the tile's first
    chunk of w, loaded already; with HAS_SECOND, `second` its second."""
    dtype = w_ptr.dtype.element_ty
    rows = row0 + tl.arange(0, TILE_ROWS)
    batch_rows = tl.arange(0, BLOCK_B)
    acc = tl.zeros([BLOCK_B, TILE_ROWS], tl.float32)
    for start in tl.static_range(0, K, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        if HAS_FIRST and start == 0:
            w = first.to(tl.float32)
        elif HAS_SECOND and start == CHUNK:
            w = second.to(tl.float32)
        else:
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                        eviction_policy="evict_first").to(tl.float32)
        if HAS_NORM:
            norm_weight = tl.load(norm_ptr + cols).to(tl.float32)
        for b in tl.static_range(BLOCK_B):
            x = tl.load(x_ptr + b * x_stride + cols, mask=tl.full([CHUNK], b, tl.int32) < batch, other=0.0,
                        cache_modifier=".cg").to(tl.float32)
            if HAS_NORM:
                row_inverse = tl.sum(tl.where(batch_rows == b, inverse_rms, 0.0), axis=0)
                x = ((x * row_inverse).to(dtype).to(tl.float32) * norm_weight).to(dtype).to(tl.float32)
            part = tl.sum(w * x[None, :], axis=1)
            acc += tl.where(batch_rows[:, None] == b, part[None, :], 0.0)
    return acc


@triton.jit
def _store_rows(out_ptr, row0, values, batch, WIDTH: tl.constexpr, BLOCK_B: tl.constexpr,
                TILE_ROWS: tl.constexpr):
    batch_rows = tl.arange(0, BLOCK_B)
    rows = row0 + tl.arange(0, TILE_ROWS)
    tl.store(out_ptr + batch_rows[:, None] * WIDTH + rows[None, :], values, mask=batch_rows[:, None] < batch)


@triton.jit
def _held_rows(hidden_ptr, row0, batch, HIDDEN: tl.constexpr, BLOCK_B: tl.constexpr, TILE_ROWS: tl.constexpr):
    """hidden[:, row0..] in fp32: the residual a tile's sums are added to (each rounded first, as a separate
    projection's output is), loaded before the tile is reduced so that its round trip overlaps the weights'."""
    rows = row0 + tl.arange(0, TILE_ROWS)
    batch_rows = tl.arange(0, BLOCK_B)
    return tl.load(hidden_ptr + batch_rows[:, None] * HIDDEN + rows[None, :], mask=batch_rows[:, None] < batch,
                   other=0.0, cache_modifier=".cg").to(tl.float32)


@triton.jit
def _projection_phase(w_ptr, first, second, x_ptr, x_stride, batch, inverse_rms, norm_ptr, out_ptr, program,
                      num_programs, NUM_ROWS: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
                      ADDS: tl.constexpr, value_dtype: tl.constexpr, BLOCK_B: tl.constexpr,
                      TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr, TWO_AHEAD: tl.constexpr):
    """out[:, rows] = x @ w[rows].T (x's rows x_stride apart), rounded to value_dtype, over this program's tiles
    (added into out, a [B, NUM_ROWS] residual stream, when ADDS, rounding as a separate projection's output and
    sum do); `first` and `second` hold its `_opening_chunks`, and as many load before a tile is reduced."""
    for tile in range(program, NUM_ROWS // TILE_ROWS, num_programs):
        if TWO_AHEAD and K == CHUNK:
            upcoming_first = second
            upcoming_second = _tile_chunk(w_ptr, tile + 2 * num_programs, NUM_ROWS, K, TILE_ROWS, CHUNK)
        else:
            upcoming_first, upcoming_second = _opening_chunks(w_ptr, tile + num_programs, num_programs, NUM_ROWS,
                                                              K, TILE_ROWS, CHUNK, TWO_AHEAD)
        row0 = tile * TILE_ROWS
        if ADDS:
            held = _held_rows(out_ptr, row0, batch, NUM_ROWS, BLOCK_B, TILE_ROWS)
        acc = _project_tile(w_ptr, row0, x_ptr, x_stride, batch, inverse_rms, norm_ptr, first, second, K, HAS_NORM,
                            True, TWO_AHEAD and K > CHUNK, BLOCK_B, TILE_ROWS, CHUNK)
        if ADDS:
            _store_rows(out_ptr, row0, (held + acc.to(value_dtype).to(tl.float32)).to(value_dtype), batch,
                        NUM_ROWS, BLOCK_B, TILE_ROWS)
        else:
            _store_rows(out_ptr, row0, acc.to(value_dtype), batch, NUM_ROWS, BLOCK_B, TILE_ROWS)
        first, second = upcoming_first, upcoming_second


@triton.jit
def _gate_up_phase(w_ptr, first, hidden_ptr, batch, inverse_rms, norm_ptr, activations_ptr, program,
                   num_programs, HIDDEN: tl.constexpr, INTERMEDIATE: tl.constexpr, BLOCK_B: tl.constexpr,
                   TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr):
    """SiLU(gate) * up for this program's intermediate rows, rounded as the eager chain rounds each; `first`
    holds the first tile's gate chunk, and each tile's up chunk and the next tile's gate chunk load before it
    is reduced (two in flight: holding the next tile's up rows as well measured slower, BENCHMARKS.md at
    b1e759d)."""
    dtype = hidden_ptr.dtype.element_ty
    gate_chunk = first
    for tile in range(program, INTERMEDIATE // TILE_ROWS, num_programs):
        up_chunk = _tile_chunk(w_ptr + INTERMEDIATE * HIDDEN, tile, INTERMEDIATE, HIDDEN, TILE_ROWS, CHUNK)
        upcoming = _tile_chunk(w_ptr, tile + num_programs, INTERMEDIATE, HIDDEN, TILE_ROWS, CHUNK)
        row0 = tile * TILE_ROWS
        gate = _project_tile(w_ptr, row0, hidden_ptr, HIDDEN, batch, inverse_rms, norm_ptr, gate_chunk, gate_chunk,
                             HIDDEN, True, True, False, BLOCK_B, TILE_ROWS, CHUNK).to(dtype).to(tl.float32)
        up = _project_tile(w_ptr, INTERMEDIATE + row0, hidden_ptr, HIDDEN, batch, inverse_rms, norm_ptr, up_chunk,
                           up_chunk, HIDDEN, True, True, False, BLOCK_B, TILE_ROWS, CHUNK).to(dtype).to(tl.float32)
        activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        _store_rows(activations_ptr, row0, (activated * up).to(dtype), batch, INTERMEDIATE, BLOCK_B, TILE_ROWS)
        gate_chunk = upcoming


@triton.jit
def _norm_rope(x, x_partner, weight, weight_partner, cos, sin, eps, HEAD_DIM: tl.constexpr,
               dtype: tl.constexpr):
    """Per-head RMSNorm then RoPE of x [N, HEAD_DIM] (its rotate-half partner given), as `_norm_rope_row`."""
    cols = tl.arange(0, HEAD_DIM)
    inverse = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
    normed = ((x * inverse).to(dtype).to(tl.float32) * weight[None, :]).to(dtype).to(tl.float32)
    partner = ((x_partner * inverse).to(dtype).to(tl.float32) * weight_partner[None, :]).to(dtype).to(tl.float32)
    rotated = tl.where(cols[None, :] < HEAD_DIM // 2, -partner, partner)
    with_cos = (normed * cos[None, :]).to(dtype).to(tl.float32)
    with_sin = (rotated * sin[None, :]).to(dtype).to(tl.float32)
    return (with_cos + with_sin).to(dtype).to(tl.float32)


@triton.jit
def _attend(layer, sequence, kv_head, qkv_ptr, attention_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr,
            cache_ptr, stride_layer, stride_kv, stride_block, stride_slot, stride_head, start, eps, scale_log2,
            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
            NUM_TOKENS: tl.constexpr):
    """One (sequence, kv head), for each of the sequence's NUM_TOKENS tokens in turn (rows sequence *
    NUM_TOKENS.. of q/k/v, at positions start..): its queries and key normalised and rotated, the key and value
    stored at its position of the sequence's block (block `sequence`, as the predictor's paged memory lays them
    out), and the group's queries attended over positions 0..its own, as the decode attention kernel (one
    token) and causal attention (the frame's first call, two) compute them."""
    dtype = qkv_ptr.dtype.element_ty
    group: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    qkv_width: tl.constexpr = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    cols = tl.arange(0, HEAD_DIM)
    partner_cols = (cols + HEAD_DIM // 2) % HEAD_DIM
    heads = kv_head * group + tl.arange(0, group)
    # The positions already held load first, beside q/k/v: they never include one stored below, so their
    # round trip need not wait for the stores.
    slots = tl.arange(0, BLOCK_T)
    head_base = (tl.cast(stride_layer, tl.int64) * layer + tl.cast(sequence, tl.int64) * stride_block
                 + kv_head * stride_head)
    key_slots = cache_ptr + head_base + slots[:, None] * stride_slot + cols[None, :]
    held = slots[:, None] < start
    keys = tl.load(key_slots, mask=held, other=0.0).to(tl.float32)
    values = tl.load(key_slots + stride_kv, mask=held, other=0.0).to(tl.float32)
    q_norm = tl.load(q_norm_ptr + layer * HEAD_DIM + cols).to(tl.float32)
    q_norm_partner = tl.load(q_norm_ptr + layer * HEAD_DIM + partner_cols).to(tl.float32)
    k_norm = tl.load(k_norm_ptr + layer * HEAD_DIM + cols).to(tl.float32)
    k_norm_partner = tl.load(k_norm_ptr + layer * HEAD_DIM + partner_cols).to(tl.float32)

    # A token's keys join the ones before it; the positions after it are masked out of its scores.
    for token in tl.static_range(NUM_TOKENS):
        position = start + token
        row = sequence * NUM_TOKENS + token
        base = qkv_ptr + row * qkv_width
        cos = tl.load(cos_ptr + position * HEAD_DIM + cols).to(tl.float32)
        sin = tl.load(sin_ptr + position * HEAD_DIM + cols).to(tl.float32)
        q_rows = base + heads[:, None] * HEAD_DIM
        query = _norm_rope(tl.load(q_rows + cols[None, :], cache_modifier=".cg").to(tl.float32),
                           tl.load(q_rows + partner_cols[None, :], cache_modifier=".cg").to(tl.float32),
                           q_norm, q_norm_partner, cos, sin, eps, HEAD_DIM, dtype)
        k_row = base + NUM_HEADS * HEAD_DIM + kv_head * HEAD_DIM
        new_key = _norm_rope(tl.load(k_row + cols[None, :], cache_modifier=".cg").to(tl.float32),
                             tl.load(k_row + partner_cols[None, :], cache_modifier=".cg").to(tl.float32),
                             k_norm, k_norm_partner, cos, sin, eps, HEAD_DIM, dtype)
        new_value = tl.load(base + (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM + kv_head * HEAD_DIM + cols[None, :],
                            cache_modifier=".cg").to(tl.float32)

        tl.store(cache_ptr + head_base + position * stride_slot + cols[None, :], new_key.to(dtype))
        tl.store(cache_ptr + stride_kv + head_base + position * stride_slot + cols[None, :], new_value.to(dtype))
        is_new = slots[:, None] == position
        keys = tl.where(is_new, new_key, keys)
        values = tl.where(is_new, new_value, values)

        scores = tl.sum(query[:, None, :] * keys[None, :, :], axis=2) * scale_log2
        scores = tl.where(slots[None, :] <= position, scores, float("-inf"))
        probabilities = tl.exp2(scores - tl.max(scores, axis=1)[:, None])
        total = tl.sum(probabilities, axis=1)
        weighted = probabilities.to(dtype).to(tl.float32)
        out = tl.sum(weighted[:, :, None] * values[None, :, :], axis=1) / total[:, None]
        tl.store(attention_ptr + row * (NUM_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + cols[None, :],
                 out.to(dtype))


@triton.jit
def _predictor_pass_kernel(
        inputs_ptr, projection_ptr, projection_bias_ptr,
        input_norms_ptr, qkv_ptr, q_norms_ptr, k_norms_ptr, o_ptr, post_norms_ptr, gate_up_ptr, down_ptr,
        final_norm_ptr, head_ptr, cos_ptr, sin_ptr,
        cache_ptr, stride_layer, stride_kv, stride_block, stride_slot, stride_head,
        hidden_ptr, qkv_out_ptr, attention_ptr, activations_ptr, logits_ptr, arrivals_ptr,
        num_rows, start, eps, scale_log2,
        INPUT_SIZE: tl.constexpr, HIDDEN: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr, INTERMEDIATE: tl.constexpr, VOCAB: tl.constexpr, NUM_LAYERS: tl.constexpr,
        HAS_PROJECTION: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_TOKENS: tl.constexpr, BLOCK_B: tl.constexpr,
        BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, TILE_ROWS: tl.constexpr, CHUNK: tl.constexpr,
        TWO_AHEAD: tl.constexpr, ON_GPU: tl.constexpr):
    program = tl.program_id(0)
    num_programs = tl.num_programs(0)
    dtype = hidden_ptr.dtype.element_ty
    batch_rows = tl.arange(0, BLOCK_B)
    in_batch = batch_rows[:, None] < num_rows
    num_sequences = num_rows // NUM_TOKENS
    qkv_width: tl.constexpr = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    attention_width: tl.constexpr = NUM_HEADS * HEAD_DIM
    no_norm = tl.zeros([BLOCK_B], tl.float32)
    # The counter is never reset (a memset before every call cost a graph node): each call adds
    # NUM_BARRIERS * num_programs arrivals, and a program reads it before its first arrival, when the calls
    # before have finished and this one's other programs have added fewer than num_programs (none can pass the
    # first barrier without it). Rounding down to a whole number of calls gives this call's base.
    NUM_BARRIERS: tl.constexpr = 5 * NUM_LAYERS + HAS_PROJECTION
    arrivals_per_call = NUM_BARRIERS * num_programs
    arrived = tl.load(arrivals_ptr, volatile=True)
    arrived -= arrived % arrivals_per_call

    # The input: projected to the predictor's width (bias added before rounding, as the GEMM's epilogue does),
    # or, at the talker's width, copied for the rows whose residual this program adds in the first o phase (the
    # same tiles): the first layer reads the input itself, and no barrier is needed.
    for tile in range(program, HIDDEN // TILE_ROWS, num_programs):
        row0 = tile * TILE_ROWS
        rows = row0 + tl.arange(0, TILE_ROWS)
        if HAS_PROJECTION:
            acc = _project_tile(projection_ptr, row0, inputs_ptr, INPUT_SIZE, num_rows, no_norm, projection_ptr,
                                no_norm, no_norm, INPUT_SIZE, False, False, False, BLOCK_B, TILE_ROWS, CHUNK)
            if HAS_BIAS:
                acc += tl.load(projection_bias_ptr + rows).to(tl.float32)[None, :]
            value = acc.to(dtype)
        else:
            value = tl.load(inputs_ptr + batch_rows[:, None] * INPUT_SIZE + rows[None, :], mask=in_batch,
                            other=0.0)
        _store_rows(hidden_ptr, row0, value, num_rows, HIDDEN, BLOCK_B, TILE_ROWS)
    # Each barrier is split: a program arrives, loads the weights that open its next phase, then waits.
    if HAS_PROJECTION:
        _arrive(arrivals_ptr, ON_GPU)
    first, second = _opening_chunks(qkv_ptr, program, num_programs, qkv_width, HIDDEN, TILE_ROWS, CHUNK,
                                    TWO_AHEAD)
    if HAS_PROJECTION:
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

    # A loop, not unrolled: five copies of the layer would cost minutes of compilation for nothing.
    for layer in range(NUM_LAYERS):
        layer_input = hidden_ptr
        if not HAS_PROJECTION:
            layer_input = tl.where(layer == 0, inputs_ptr, hidden_ptr)
        inverse_rms = _inverse_rms(layer_input, HIDDEN, num_rows, eps, HIDDEN, BLOCK_B)
        _projection_phase(qkv_ptr + layer * qkv_width * HIDDEN, first, second, layer_input, HIDDEN, num_rows,
                          inverse_rms,
                          input_norms_ptr + layer * HIDDEN, qkv_out_ptr, program, num_programs, qkv_width, HIDDEN,
                          True, False, dtype, BLOCK_B, TILE_ROWS, CHUNK, TWO_AHEAD)
        _arrive(arrivals_ptr, ON_GPU)
        first, second = _opening_chunks(o_ptr + layer * HIDDEN * attention_width, program, num_programs, HIDDEN,
                                        attention_width, TILE_ROWS, CHUNK, TWO_AHEAD)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

        for item in range(program, num_sequences * NUM_KV_HEADS, num_programs):
            _attend(layer, item // NUM_KV_HEADS, item % NUM_KV_HEADS, qkv_out_ptr, attention_ptr, q_norms_ptr,
                    k_norms_ptr, cos_ptr, sin_ptr, cache_ptr, stride_layer, stride_kv, stride_block, stride_slot,
                    stride_head, start, eps, scale_log2, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_T, NUM_TOKENS)
        _arrive(arrivals_ptr, ON_GPU)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

        _projection_phase(o_ptr + layer * HIDDEN * attention_width, first, second, attention_ptr, attention_width,
                          num_rows, no_norm,
                          o_ptr, hidden_ptr, program, num_programs, HIDDEN, attention_width, False, True, dtype,
                          BLOCK_B, TILE_ROWS, CHUNK, TWO_AHEAD)
        _arrive(arrivals_ptr, ON_GPU)
        layer_gate_up = gate_up_ptr + layer * 2 * INTERMEDIATE * HIDDEN
        first = _tile_chunk(layer_gate_up, program, INTERMEDIATE, HIDDEN, TILE_ROWS, CHUNK)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

        inverse_rms = _inverse_rms(hidden_ptr, HIDDEN, num_rows, eps, HIDDEN, BLOCK_B)
        post_norm = post_norms_ptr + layer * HIDDEN
        _gate_up_phase(layer_gate_up, first, hidden_ptr, num_rows, inverse_rms, post_norm, activations_ptr, program,
                       num_programs, HIDDEN, INTERMEDIATE, BLOCK_B, TILE_ROWS, CHUNK)
        _arrive(arrivals_ptr, ON_GPU)
        first, second = _opening_chunks(down_ptr + layer * HIDDEN * INTERMEDIATE, program, num_programs, HIDDEN,
                                        INTERMEDIATE, TILE_ROWS, CHUNK, TWO_AHEAD)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

        _projection_phase(down_ptr + layer * HIDDEN * INTERMEDIATE, first, second, activations_ptr, INTERMEDIATE,
                          num_rows, no_norm,
                          down_ptr, hidden_ptr, program, num_programs, HIDDEN, INTERMEDIATE, False, True, dtype,
                          BLOCK_B, TILE_ROWS, CHUNK, TWO_AHEAD)
        _arrive(arrivals_ptr, ON_GPU)
        if layer + 1 < NUM_LAYERS:
            first, second = _opening_chunks(qkv_ptr + (layer + 1) * qkv_width * HIDDEN, program, num_programs,
                                            qkv_width, HIDDEN, TILE_ROWS, CHUNK, TWO_AHEAD)
        else:
            first, second = _opening_chunks(head_ptr, program, num_programs, VOCAB, HIDDEN, TILE_ROWS, CHUNK,
                                            TWO_AHEAD)
        arrived += num_programs
        _wait(arrivals_ptr, arrived, ON_GPU)

    # The head reads each sequence's last token alone.
    last_rows = hidden_ptr + (NUM_TOKENS - 1) * HIDDEN
    inverse_rms = _inverse_rms(last_rows, NUM_TOKENS * HIDDEN, num_sequences, eps, HIDDEN, BLOCK_S)
    _projection_phase(head_ptr, first, second, last_rows, NUM_TOKENS * HIDDEN, num_sequences, inverse_rms,
                      final_norm_ptr, logits_ptr, program, num_programs, VOCAB, HIDDEN, True, False, dtype, BLOCK_S,
                      TILE_ROWS, CHUNK, TWO_AHEAD)
