"""Fused elementwise kernels for the decoder layers, rounding exactly where the eager math rounds.

A batch-1 frame step runs ~100 decoder layers (28 talker + 5 predictor layers x 15 codebooks),
and in eager PyTorch every RMSNorm is eight kernels (cast, square, mean, add, rsqrt, multiply,
cast, scale) and every q/k RoPE another five: thousands of launches of a few microseconds each,
which is where the step's time went. Each kernel here does one of those chains in one launch.

Fidelity is the point, not an afterthought: each kernel computes in fp32 and rounds to the
activation dtype at every place the eager chain writes a tensor (after normalising, after the
weight scale, after each RoPE product, after the sum, after SiLU), so in bf16 it reproduces the
eager chain bit for bit except for the order of the fp32 sum inside the mean square. The eager
functions are kept here as the reference and as the path for the CPU and for tensors the kernels
do not cover; `kernel_policy.KernelPolicy` decides, per call, which of the two runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from tts_service.model.kernel_policy import KernelPolicy, token_stride
from tts_service.model.triton_utils import gdc_launch_dependents, gdc_wait, launches_early, libdevice, tl, triton

_SILU_BLOCK = 1024
# Elements one program covers in the codec's flat, time-major kernels (the snake, the biased residual add).
_FLAT_BLOCK = 2048
# Ring slots the window-attention kernel reads at a time.
_WINDOW_SLOTS_BLOCK = 32
# Output samples one program of the one-output-channel convolution covers.
_ONE_CHANNEL_STEPS_BLOCK = 32
# Dimensions one program of the codebook sum, and of the talker's frame embedding, covers.
_CODEBOOK_DIMS_BLOCK = 256
_FRAME_DIMS_BLOCK = 1024


# The eager reference chains (also the path wherever the kernels do not apply).

def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 and scale after casting back, exactly as the checkpoints were trained.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, T, D]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def norm_rope_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] -> per-head RMSNorm, then RoPE, as [B, H, T, D]."""
    return apply_rope(rms_norm_eager(x, weight, eps).transpose(1, 2), cos, sin)


def silu_mul_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def snake_beta_tables(log_alpha: torch.Tensor, log_beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel, e^alpha and 1 / (e^beta + 1e-9), rounded as the eager chain rounds them."""
    # The reference's 1e-9 guard, kept so that results match it.
    return log_alpha.exp(), 1.0 / (log_beta.exp() + 1e-9)


def snake_beta_eager(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    """The codec's activation, x + sin²(x·e^alpha) / (e^beta + 1e-9), per channel of time-major x [..., C]."""
    frequency, inverse = snake_beta_tables(log_alpha, log_beta)
    return x + inverse * torch.sin(x * frequency).pow(2)


# Host wrappers: the kernel where `KernelPolicy` says it runs, the eager chain otherwise.

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not KernelPolicy.rms_norm_kernel(x, weight):
        return rms_norm_eager(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rms_norm(x, None, weight, eps, out, None)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) with the sum rounded first, as the eager add does."""
    if not KernelPolicy.add_rms_norm_kernel(x, residual, weight):
        total = x + residual
        return total, rms_norm_eager(total, weight, eps)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty_like(total)
    _launch_rms_norm(x, residual, weight, eps, out, total)
    return total, out


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, D], k [B, T, KV, D] -> normalised and rotated, as [B, H, T, D] and [B, KV, T, D]."""
    if not KernelPolicy.qk_norm_rope_kernel(q, k, q_weight, k_weight, cos, sin):
        return norm_rope_eager(q, q_weight, eps, cos, sin), norm_rope_eager(k, k_weight, eps, cos, sin)
    head_dim = q.shape[-1]
    cos, sin = _rope_table_layout(cos), _rope_table_layout(sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    num_q_rows = q.shape[0] * q.shape[1] * q.shape[2]
    num_k_rows = k.shape[0] * k.shape[1] * k.shape[2]
    # Early at one token only, as the decode attention after it (`kv_cache.PagedDecodeBackend` says why).
    early = launches_early(q.device) and q.shape[0] * q.shape[1] == 1
    # No fused multiply-adds: the eager chain rounds the mean square before adding eps and each RoPE product
    # before the sum. With them, about 11% of the outputs differed from it by a unit in the last place.
    _qk_norm_rope_kernel[(num_q_rows + num_k_rows,)](
        q, k, q_weight, k_weight, cos, sin, q_out, k_out, token_stride(q), token_stride(k), q.shape[2], k.shape[2],
        num_q_rows, q.shape[1], cos.stride(0), sin.stride(0), eps, HEAD_DIM=head_dim, LAUNCHES_EARLY=early,
        num_warps=1, enable_fp_fusion=False, launch_pdl=early)
    # Same memory layout as the eager chain's result: [B, T, H, D] storage seen as [B, H, T, D].
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _rope_table_layout(table: torch.Tensor) -> torch.Tensor:
    """cos or sin [B, T, D] as the kernel reads it: tokens packed in a row, any batch stride (0 for a table
    shared by every row, as the code predictor's is)."""
    if table.stride(-1) == 1 and table.stride(1) == table.shape[-1]:
        return table
    return table.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if not KernelPolicy.silu_mul_kernel(gate, up):
        return silu_mul_eager(gate, up)
    width = gate.shape[-1]
    gate_rows, up_rows = gate.reshape(-1, width), up.reshape(-1, width)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    grid = (gate_rows.shape[0], triton.cdiv(width, _SILU_BLOCK))
    _silu_mul_kernel[grid](gate_rows, up_rows, out, gate_rows.stride(0), up_rows.stride(0), width,
                           BLOCK=_SILU_BLOCK, num_warps=4)
    return out


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
               tables: tuple[torch.Tensor, torch.Tensor], input_bias: torch.Tensor | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """snake(x + input_bias) (snake(x) without one) in one pass over x [B, L, C], instead of the eager chain's
    seven, which at 24 kHz move most of the codec's bytes; the sum is rounded first, as a separate add would
    round it. `tables` are `snake_beta_tables(log_alpha, log_beta)`, worked out once by the caller. The result is
    stored in `dtype` (x's by default), for a convolution that reads another dtype than the activations'; x may
    be stored in one too. Either way the activation is worked out as the eager chain works it out in the tables'
    dtype (x upcast, every step rounded there), and rounded to `dtype` once, at the end."""
    dtype = x.dtype if dtype is None else dtype
    if not KernelPolicy.snake_kernel(x, log_alpha, log_beta, input_bias):
        return snake_beta_eager(x if input_bias is None else x + input_bias, log_alpha, log_beta).to(dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    _launch_snake_beta(x, tables, out, x, input_bias)
    return out


def add_biased(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor, x_bias: torch.Tensor | None = None
               ) -> torch.Tensor:
    """x + (y + bias) for time-major x, y [..., C] and bias [C], in one pass: a convolution's bias added where its
    output joins the residual stream, rounded as the two separate adds round it. y may be stored in another
    dtype than x and the bias (a half-precision convolution's output); it is upcast, as the eager adds upcast it.
    With `x_bias` [C], x is the output of a convolution that left its bias to this pass: (x + x_bias) + (y + bias),
    each sum rounded as a separate add rounds it."""
    if not KernelPolicy.add_biased_kernel(x, y, bias, x_bias):
        return (x if x_bias is None else x + x_bias) + (y + bias)
    out = torch.empty_like(x)
    num_elements = x.numel()
    _add_biased_kernel[(triton.cdiv(num_elements, _FLAT_BLOCK),)](
        x, y, bias, bias if x_bias is None else x_bias, out, num_elements, bias.shape[0], HAS_X_BIAS=x_bias is not None,
        BLOCK=_FLAT_BLOCK, num_warps=8)
    return out


def window_attention(qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor, position: torch.Tensor,
                     held_keys: torch.Tensor, held_values: torch.Tensor, scale: float,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """The codec's sliding-window attention for a chunk, in one launch per layer: RoPE on the chunk's queries and
    keys, softmax attention over the held ring and the chunk's own frames, and the chunk's last frames written
    into the ring once every query has attended. qkv [B, T, (H + 2 KV) * D] is the packed projection; cos/sin
    [B, T, D]; position [B] is each row's first frame; held_keys/values [B, KV, W, D], ring slot s holding the
    latest earlier frame congruent to s modulo W. With `rows` [B] int64, held_keys/values are [S, KV, W, D], every
    stream's ring, and row b reads and writes ring `rows[b]` in place (no copy of the rings in or out; distinct
    rows but for a scratch ring whose contents nobody reads). Returns [B, T, H * D], the layout the output
    projection reads. RoPE rounds as `apply_rope` does, so the ring holds the eager path's keys bit for bit; the
    attention sums in another order than the eager matmuls (fp32, ~1e-7 apart). Only where
    `KernelPolicy.window_attention_kernel` says so."""
    batch, length, width = qkv.shape
    _, num_kv_heads, window, head_dim = held_keys.shape
    out = torch.empty(batch, length, num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    _window_attention_kernel[(batch, num_kv_heads)](
        qkv, cos, sin, position, position if rows is None else rows, held_keys, held_values, out, length, window,
        width, num_heads // num_kv_heads, num_heads * head_dim, scale, HEAD_DIM=head_dim,
        BLOCK_SLOTS=_WINDOW_SLOTS_BLOCK, BLOCK_OWN=max(16, triton.next_power_of_2(length)),
        HAS_ROWS=rows is not None, num_warps=4, enable_fp_fusion=False)
    return out


def codebook_sum_eager(codes: torch.Tensor, tables: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """codes [B, Q, T] -> sum over q of tables[q][codes[:, q]] [B, T, dim], added one codebook after another;
    `tables`: Q tables [size, dim], or one tensor [Q, size, dim]."""
    total = F.embedding(codes[:, 0], tables[0])
    for index in range(1, codes.shape[1]):
        total = total + F.embedding(codes[:, index], tables[index])
    return total


def codebook_sum(codes: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """`codebook_sum_eager` in one launch instead of a lookup and an add per codebook (29 launches for the 15
    acoustic codebooks). The vectors are added in the same order, each sum rounded to the tables' dtype as the
    eager adds round it, so the result is the eager chain's bit for bit. Codes must be valid (the caller checks
    them on the host)."""
    if not KernelPolicy.codebook_sum_kernel(codes, tables):
        return codebook_sum_eager(codes, tables)
    batch, num_codebooks, length = codes.shape
    _, size, dim = tables.shape
    out = torch.empty(batch, length, dim, dtype=tables.dtype, device=tables.device)
    grid = (batch * length, triton.cdiv(dim, _CODEBOOK_DIMS_BLOCK))
    _codebook_sum_kernel[grid](codes, tables, out, length, num_codebooks, size, dim, codes.stride(0),
                               codes.stride(1), codes.stride(2), BLOCK=_CODEBOOK_DIMS_BLOCK, num_warps=2)
    return out


def frame_embedding(frames: torch.Tensor, slots: torch.Tensor, table: torch.Tensor, offsets: torch.Tensor,
                    addend: torch.Tensor) -> torch.Tensor:
    """sum over g of table[frames[slots, g] + offsets[g]], plus `addend` [B, dim]: the talker's next input from
    its rows' previous frames (`frames` [S, G], one row a slot) and their text, in one launch where the eager
    chain runs five (the rows' gather, the offsets, the lookup, the sum, the add). The G vectors are summed in
    fp32 as torch's reduction over a middle dimension sums them (four running sums, each taking every fourth
    vector, then added in order), rounded once; then the addend, rounded again: the eager chain's values. Codes
    must be valid (the sampler wrote them)."""
    if not KernelPolicy.frame_embedding_kernel(frames, table, addend):
        return F.embedding(frames[slots] + offsets, table).sum(-2) + addend
    batch = slots.shape[0]
    num_groups, dim = frames.shape[1], table.shape[1]
    out = torch.empty(batch, dim, dtype=table.dtype, device=table.device)
    _frame_embedding_kernel[(batch, triton.cdiv(dim, _FRAME_DIMS_BLOCK))](
        frames, slots, table, offsets, addend, out, addend.stride(0), dim, NUM_GROUPS=num_groups,
        BLOCK=_FRAME_DIMS_BLOCK, num_warps=4)
    return out


def one_channel_convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int = 1
                            ) -> torch.Tensor:
    """A valid 1-D convolution of time-major x [B, L, C] with weight [1, C, K] -> [B, L - (K - 1) * dilation, 1],
    in plain fp32 arithmetic. cuDNN has no good kernel for one output channel: it re-lays the input out and runs
    a slow engine (0.22 ms of a 5.3 ms codec call at 128 rows on an H100, for a layer that reads 95 MB), and in
    TF32, so this sums closer to the exact convolution than it did. Only where
    `KernelPolicy.one_channel_convolution_kernel` says so."""
    batch, extended, channels = x.shape
    taps = weight.shape[2]
    length = extended - (taps - 1) * dilation
    out = torch.empty(batch, length, 1, dtype=x.dtype, device=x.device)
    grid = (batch, triton.cdiv(length, _ONE_CHANNEL_STEPS_BLOCK))
    _one_channel_convolution_kernel[grid](x, weight, bias, out, length, extended, channels, taps, dilation,
                                          BLOCK_STEPS=_ONE_CHANNEL_STEPS_BLOCK,
                                          BLOCK_CHANNELS=triton.next_power_of_2(channels), num_warps=4)
    return out


def snake_beta_after_history(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                             tables: tuple[torch.Tensor, torch.Tensor], history: torch.Tensor,
                             input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """[history | snake(x + input_bias)] along time (dimension 1; snake(x) without a bias), as a causal convolution
    reads its input, with `history` [B, H, C] advanced in place to the last H steps of that. The activation writes
    straight after the history instead of into a tensor of its own that a concatenation then copies: at the
    codec's 24 kHz stages those are its largest tensors. The values are snake_beta's in the history's dtype, bit
    for bit."""
    length = x.shape[1]
    if not KernelPolicy.snake_after_history_kernel(x, log_alpha, log_beta, history, input_bias):
        activated = snake_beta(x, log_alpha, log_beta, tables, input_bias, dtype=history.dtype)
        extended = torch.cat((history, activated), dim=1)
        history.copy_(extended[:, length:])
        return extended
    batch, size, channels = history.shape
    extended = torch.empty(batch, size + length, channels, dtype=history.dtype, device=x.device)
    _launch_snake_beta(x, tables, extended, history, input_bias)
    history.copy_(extended[:, length:])
    return extended


def _launch_snake_beta(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor,
                       history: torch.Tensor, input_bias: torch.Tensor | None = None) -> None:
    """Each batch row of `out` [B, H + L, C] gets `history`'s row [H, C], then snake(x)'s [L, C] (no history when
    `out` is as long as x). Both are contiguous runs of memory, so one program covers a block of either,
    whatever the channel count: short chunks of many channels waste no lanes."""
    batch, length, channels = x.shape
    history_size = (out.shape[1] - length) * channels
    row_size = history_size + length * channels
    frequency, inverse = tables
    grid = (batch, triton.cdiv(row_size, _FLAT_BLOCK))
    # No fused multiply-adds: the eager chain rounds the product before the sum.
    _snake_beta_kernel[grid](x, frequency, inverse, x if input_bias is None else input_bias, out, history, channels,
                             row_size, history_size, HAS_BIAS=input_bias is not None, BLOCK=_FLAT_BLOCK,
                             num_warps=8, enable_fp_fusion=False)


def _launch_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     out: torch.Tensor, total: torch.Tensor | None) -> None:
    width = x.shape[-1]
    x_rows = x.reshape(-1, width)
    residual_rows = residual.reshape(-1, width) if residual is not None else x_rows
    block = triton.next_power_of_2(width)
    _rms_norm_kernel[(x_rows.shape[0],)](
        x_rows, residual_rows, weight, out, total if total is not None else out,
        x_rows.stride(0), residual_rows.stride(0), width, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(8, max(1, block // 256)))


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, total_ptr, x_row_stride, residual_row_stride,
                     width, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(total_ptr + row * width + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(x32 * x32, axis=0) / width + eps)
    normalised = (x32 * inverse_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (normalised * weight).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_rope_row(x_ptr, weight_ptr, cos_ptr, sin_ptr, out_ptr, row, token_stride, num_heads, num_tokens,
                   cos_batch_stride, sin_batch_stride, eps, HEAD_DIM: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    token = row // num_heads
    batch_row = token // num_tokens
    row_token = token % num_tokens
    head = row % num_heads
    cols = tl.arange(0, HEAD_DIM)
    partner = (cols + HEAD_DIM // 2) % HEAD_DIM
    base = x_ptr + token * token_stride + head * HEAD_DIM
    x = tl.load(base + cols).to(tl.float32)
    x_partner = tl.load(base + partner).to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
    # The eager chain writes the normalised head, then the weighted head, in the activation dtype.
    normed = ((x * inverse_rms).to(dtype).to(tl.float32)
              * tl.load(weight_ptr + cols).to(tl.float32)).to(dtype).to(tl.float32)
    normed_partner = ((x_partner * inverse_rms).to(dtype).to(tl.float32)
                      * tl.load(weight_ptr + partner).to(tl.float32)).to(dtype).to(tl.float32)
    rotated = tl.where(cols < HEAD_DIM // 2, -normed_partner, normed_partner)
    cos = tl.load(cos_ptr + batch_row * cos_batch_stride + row_token * HEAD_DIM + cols).to(tl.float32)
    sin = tl.load(sin_ptr + batch_row * sin_batch_stride + row_token * HEAD_DIM + cols).to(tl.float32)
    with_cos = (normed * cos).to(dtype).to(tl.float32)
    with_sin = (rotated * sin).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * HEAD_DIM + cols, (with_cos + with_sin).to(dtype))


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                         q_token_stride, k_token_stride, num_q_heads, num_k_heads, num_q_rows, num_tokens,
                         cos_batch_stride, sin_batch_stride, eps, HEAD_DIM: tl.constexpr,
                         LAUNCHES_EARLY: tl.constexpr):
    # One launch for both: queries take the first rows of the grid, keys the rest. As a programmatic
    # dependent it starts while the projection before it finishes, and waits before reading anything.
    if LAUNCHES_EARLY:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    if row < num_q_rows:
        _norm_rope_row(q_ptr, q_weight_ptr, cos_ptr, sin_ptr, q_out_ptr, row, q_token_stride, num_q_heads,
                       num_tokens, cos_batch_stride, sin_batch_stride, eps, HEAD_DIM)
    else:
        _norm_rope_row(k_ptr, k_weight_ptr, cos_ptr, sin_ptr, k_out_ptr, row - num_q_rows, k_token_stride,
                       num_k_heads, num_tokens, cos_batch_stride, sin_batch_stride, eps, HEAD_DIM)


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, gate_row_stride, up_row_stride, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (activated * up).to(dtype), mask=mask)


@triton.jit
def _snake_beta_kernel(x_ptr, frequency_ptr, inverse_ptr, bias_ptr, out_ptr, history_ptr, channels, row_size,
                       history_size, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offsets < row_size
    is_held = offsets < history_size
    is_new = in_row & (offsets >= history_size)
    held = tl.load(history_ptr + row * history_size + offsets, mask=is_held, other=0.0)
    dtype = frequency_ptr.dtype.element_ty
    channel = offsets % channels
    # The tables hold e^alpha and 1 / (e^beta + 1e-9) already rounded as the eager chain rounds them; each
    # step below rounds to the activation dtype (the tables') where the eager chain writes a tensor, and
    # libdevice's sin is the function PyTorch's own CUDA kernel calls. The store may round once more, to the
    # dtype a half-precision convolution reads.
    frequency = tl.load(frequency_ptr + channel, mask=is_new, other=0.0).to(tl.float32)
    inverse = tl.load(inverse_ptr + channel, mask=is_new, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * (row_size - history_size) + offsets - history_size, mask=is_new,
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = (x + tl.load(bias_ptr + channel, mask=is_new, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    wave = libdevice.sin((x * frequency).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    squared = (wave * wave).to(dtype).to(tl.float32)
    out_dtype = out_ptr.dtype.element_ty
    activated = (x + (inverse * squared).to(dtype).to(tl.float32)).to(dtype).to(out_dtype)
    tl.store(out_ptr + row * row_size + offsets, tl.where(is_held, held.to(out_dtype), activated), mask=in_row)


@triton.jit
def _add_biased_kernel(x_ptr, y_ptr, bias_ptr, x_bias_ptr, out_ptr, num_elements, channels,
                       HAS_X_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < num_elements
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_X_BIAS:
        x_bias = tl.load(x_bias_ptr + offsets % channels, mask=mask, other=0.0).to(tl.float32)
        x = (x + x_bias).to(dtype).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + offsets % channels, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (x + (y + bias).to(dtype).to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def _codebook_sum_kernel(codes_ptr, tables_ptr, out_ptr, length, num_codebooks, size, dim, codes_batch_stride,
                         codes_book_stride, codes_step_stride, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_dim = dims < dim
    codes_at = codes_ptr + (token // length) * codes_batch_stride + (token % length) * codes_step_stride
    dtype = tables_ptr.dtype.element_ty
    code = tl.load(codes_at).to(tl.int64)
    total = tl.load(tables_ptr + code * dim + dims, mask=is_dim, other=0.0).to(tl.float32)
    for book in range(1, num_codebooks):
        code = tl.load(codes_at + book * codes_book_stride).to(tl.int64)
        vector = tl.load(tables_ptr + (book * size + code) * dim + dims, mask=is_dim, other=0.0).to(tl.float32)
        total = (total + vector).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * dim + dims, total.to(dtype), mask=is_dim)


@triton.jit
def _frame_embedding_kernel(frames_ptr, slots_ptr, table_ptr, offsets_ptr, addend_ptr, out_ptr, addend_stride,
                            dim, NUM_GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_dim = dims < dim
    dtype = out_ptr.dtype.element_ty
    frame = frames_ptr + tl.load(slots_ptr + row) * NUM_GROUPS
    # Four running sums, as torch's reduction keeps them (vector g joins sum g % 4), then added in order.
    sum0 = tl.zeros([BLOCK], tl.float32)
    sum1 = tl.zeros([BLOCK], tl.float32)
    sum2 = tl.zeros([BLOCK], tl.float32)
    sum3 = tl.zeros([BLOCK], tl.float32)
    for group in tl.static_range(NUM_GROUPS):
        entry = tl.load(frame + group) + tl.load(offsets_ptr + group)
        vector = tl.load(table_ptr + entry * dim + dims, mask=is_dim, other=0.0).to(tl.float32)
        if group % 4 == 0:
            sum0 += vector
        elif group % 4 == 1:
            sum1 += vector
        elif group % 4 == 2:
            sum2 += vector
        else:
            sum3 += vector
    total = (((sum0 + sum1) + sum2) + sum3).to(dtype).to(tl.float32)
    addend = tl.load(addend_ptr + row * addend_stride + dims, mask=is_dim, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * dim + dims, (total + addend).to(dtype), mask=is_dim)


@triton.jit
def _one_channel_convolution_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, length, extended, channels, taps,
                                    dilation, BLOCK_STEPS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    steps = tl.program_id(1) * BLOCK_STEPS + tl.arange(0, BLOCK_STEPS)
    is_step = steps < length
    lanes = tl.arange(0, BLOCK_CHANNELS)
    is_lane = lanes < channels
    mask = is_step[:, None] & is_lane[None, :]
    rows_at = x_ptr + row * extended * channels
    # Each channel's taps first, then the channels: a tap's inputs overlap the last tap's, so they come from
    # the cache rather than memory.
    products = tl.zeros((BLOCK_STEPS, BLOCK_CHANNELS), dtype=tl.float32)
    for tap in range(0, taps):
        weights = tl.load(weight_ptr + lanes * taps + tap, mask=is_lane, other=0.0)
        inputs = tl.load(rows_at + (steps + tap * dilation)[:, None] * channels + lanes[None, :], mask=mask,
                         other=0.0)
        products += inputs * weights[None, :]
    total = tl.sum(products, axis=1) + tl.load(bias_ptr)
    tl.store(out_ptr + row * length + steps, total, mask=is_step)


@triton.jit
def _window_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, position_ptr, rows_ptr, keys_ptr, values_ptr, out_ptr,
                             length, window, width, group_size, out_width, scale, HEAD_DIM: tl.constexpr,
                             BLOCK_SLOTS: tl.constexpr, BLOCK_OWN: tl.constexpr, HAS_ROWS: tl.constexpr):
    # One program per (row, key head) serves every query head of the group, so no program writes a ring
    # another still has to read.
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    num_heads = num_kv_heads * group_size
    dims = tl.arange(0, HEAD_DIM)
    # rotate_half: the first half takes minus the second, the second takes the first.
    rotated_dims = (dims + HEAD_DIM // 2) % HEAD_DIM
    sign = tl.where(dims < HEAD_DIM // 2, -1.0, 1.0)
    start = tl.load(position_ptr + row)
    ring_row = row
    if HAS_ROWS:
        ring_row = tl.load(rows_ptr + row).to(tl.int64)
    ring = (ring_row * num_kv_heads + kv_head) * window * HEAD_DIM
    ring_keys = keys_ptr + ring
    ring_values = values_ptr + ring

    own = tl.arange(0, BLOCK_OWN)
    is_own = own < length
    tokens = row * length + own
    k_at = qkv_ptr + tokens[:, None] * width + (num_heads + kv_head) * HEAD_DIM
    own_cos = tl.load(cos_ptr + tokens[:, None] * HEAD_DIM + dims[None, :], mask=is_own[:, None], other=0.0)
    own_sin = tl.load(sin_ptr + tokens[:, None] * HEAD_DIM + dims[None, :], mask=is_own[:, None], other=0.0)
    raw_keys = tl.load(k_at + dims[None, :], mask=is_own[:, None], other=0.0)
    raw_rotated = tl.load(k_at + rotated_dims[None, :], mask=is_own[:, None], other=0.0)
    own_keys = raw_keys * own_cos + sign[None, :] * raw_rotated * own_sin
    own_values = tl.load(k_at + num_kv_heads * HEAD_DIM + dims[None, :], mask=is_own[:, None], other=0.0)

    for head in range(kv_head * group_size, (kv_head + 1) * group_size):
        for query in range(0, length):
            token = row * length + query
            q_at = qkv_ptr + token * width + head * HEAD_DIM
            cos = tl.load(cos_ptr + token * HEAD_DIM + dims)
            sin = tl.load(sin_ptr + token * HEAD_DIM + dims)
            q = tl.load(q_at + dims) * cos + sign * tl.load(q_at + rotated_dims) * sin
            # The chunk's own frames first: the query sees at least itself, so the running maximum is finite.
            is_own_visible = is_own & (own <= query) & (query - own < window)
            own_scores = tl.where(is_own_visible, tl.sum(q[None, :] * own_keys, axis=1) * scale, float("-inf"))
            top = tl.max(own_scores, axis=0)
            own_weights = tl.exp(own_scores - top)
            total = tl.sum(own_weights, axis=0)
            attended = tl.sum(own_weights[:, None] * own_values, axis=0)
            # Then the ring in blocks of slots, with the softmax carried across them (small tiles keep a
            # program's registers few, so many programs share a multiprocessor).
            for first in range(0, window, BLOCK_SLOTS):
                slots = first + tl.arange(0, BLOCK_SLOTS)
                is_slot = slots < window
                at = slots[:, None] * HEAD_DIM + dims[None, :]
                # Slot s holds the latest earlier frame congruent to s modulo the window (negative: none yet);
                # a key is visible when it is a real frame at most window - 1 frames before the query.
                positions = start - window + ((slots - start) % window + window) % window
                distance = start + query - positions
                is_visible = is_slot & (distance >= 0) & (distance < window) & (positions >= 0)
                held_keys = tl.load(ring_keys + at, mask=is_slot[:, None], other=0.0)
                scores = tl.where(is_visible, tl.sum(q[None, :] * held_keys, axis=1) * scale, float("-inf"))
                new_top = tl.maximum(top, tl.max(scores, axis=0))
                rescale = tl.exp(top - new_top)
                weights = tl.exp(scores - new_top)
                held_values = tl.load(ring_values + at, mask=is_slot[:, None], other=0.0)
                total = total * rescale + tl.sum(weights, axis=0)
                attended = attended * rescale + tl.sum(weights[:, None] * held_values, axis=0)
                top = new_top
            tl.store(out_ptr + token * out_width + head * HEAD_DIM + dims, attended / total)

    # The chunk's last min(length, window) frames replace the ring's oldest, after every query has attended.
    is_kept = is_own & (own >= length - window)
    kept_at = ((start + own) % window)[:, None] * HEAD_DIM + dims[None, :]
    tl.store(ring_keys + kept_at, own_keys, mask=is_kept[:, None])
    tl.store(ring_values + kept_at, own_values, mask=is_kept[:, None])
