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
do not cover.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton is optional: the CPU build and CI have none, and the eager path needs none.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    HAS_TRITON = False

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_SILU_BLOCK = 1024
_SNAKE_BLOCK = 1024
# The longest history a causal convolution of the codec keeps (kernel 7, dilation 9: 54 columns) fits one block.
_MAX_HISTORY = 256
# Rows of history one program advances: a row is at most a few hundred bytes, too little for a program alone.
_HISTORY_ROWS = 64


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


def snake_beta_eager(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    """The codec's activation, x + sin²(x·e^alpha) / (e^beta + 1e-9), per channel of x [B, C, L]."""
    frequency = log_alpha.exp()[None, :, None]
    magnitude = log_beta.exp()[None, :, None]
    # The reference's 1e-9 guard, kept so that results match it.
    return x + (1.0 / (magnitude + 1e-9)) * torch.sin(x * frequency).pow(2)


# Dispatch: the kernel when it applies, the eager chain otherwise.

def _is_kernel_tensor(x: torch.Tensor) -> bool:
    return HAS_TRITON and x.is_cuda and x.dtype in _KERNEL_DTYPES and x.stride(-1) == 1


def kernels_available(device: torch.device) -> bool:
    return HAS_TRITON and device.type == "cuda"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not (_is_kernel_tensor(x) and weight.dtype == x.dtype):
        return rms_norm_eager(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rms_norm(x, None, weight, eps, out, None)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) with the sum rounded first, as the eager add does."""
    if not (_is_kernel_tensor(x) and _is_kernel_tensor(residual) and weight.dtype == x.dtype == residual.dtype):
        total = x + residual
        return total, rms_norm_eager(total, weight, eps)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty_like(total)
    _launch_rms_norm(x, residual, weight, eps, out, total)
    return total, out


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, D], k [B, T, KV, D] -> normalised and rotated, as [B, H, T, D] and [B, KV, T, D]."""
    if not qk_kernel_applies(q, k, q_weight, k_weight, cos, sin):
        return norm_rope_eager(q, q_weight, eps, cos, sin), norm_rope_eager(k, k_weight, eps, cos, sin)
    head_dim = q.shape[-1]
    cos, sin = _rope_table_layout(cos), _rope_table_layout(sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    num_q_rows = q.shape[0] * q.shape[1] * q.shape[2]
    num_k_rows = k.shape[0] * k.shape[1] * k.shape[2]
    # No fused multiply-adds: the eager chain rounds the mean square before adding eps and each RoPE product
    # before the sum. With them, about 11% of the outputs differed from it by a unit in the last place.
    _qk_norm_rope_kernel[(num_q_rows + num_k_rows,)](
        q, k, q_weight, k_weight, cos, sin, q_out, k_out, _token_stride(q), _token_stride(k), q.shape[2], k.shape[2],
        num_q_rows, q.shape[1], cos.stride(0), sin.stride(0), eps, HEAD_DIM=head_dim, num_warps=1,
        enable_fp_fusion=False)
    # Same memory layout as the eager chain's result: [B, T, H, D] storage seen as [B, H, T, D].
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def qk_kernel_applies(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `qk_norm_rope` runs the kernel: heads packed in each token, tokens evenly spaced (slices of a
    packed q/k/v projection qualify), one dtype, a power-of-two head size."""
    head_dim = q.shape[-1]
    return (_is_kernel_tensor(q) and _is_kernel_tensor(k) and q.dtype == k.dtype == q_weight.dtype
            == k_weight.dtype == cos.dtype == sin.dtype and head_dim & (head_dim - 1) == 0
            and q.stride(2) == head_dim and k.stride(2) == head_dim
            and _token_stride(q) is not None and _token_stride(k) is not None)


def _token_stride(x: torch.Tensor) -> int | None:
    """The step between consecutive tokens of x [B, T, H, D] read as B*T tokens; None where it is not even.
    A dimension of size 1 may carry any stride, so a single-token row steps by the batch stride."""
    if x.shape[1] == 1:
        return x.stride(0)
    if x.shape[0] == 1 or x.stride(0) == x.shape[1] * x.stride(1):
        return x.stride(1)
    return None


def _rope_table_layout(table: torch.Tensor) -> torch.Tensor:
    """cos or sin [B, T, D] as the kernel reads it: tokens packed in a row, any batch stride (0 for a table
    shared by every row, as the code predictor's is)."""
    if table.stride(-1) == 1 and table.stride(1) == table.shape[-1]:
        return table
    return table.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if not (_is_kernel_tensor(gate) and _is_kernel_tensor(up) and gate.dtype == up.dtype
            and gate.shape == up.shape):
        return silu_mul_eager(gate, up)
    width = gate.shape[-1]
    gate_rows, up_rows = gate.reshape(-1, width), up.reshape(-1, width)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    grid = (gate_rows.shape[0], triton.cdiv(width, _SILU_BLOCK))
    _silu_mul_kernel[grid](gate_rows, up_rows, out, gate_rows.stride(0), up_rows.stride(0), width,
                           BLOCK=_SILU_BLOCK, num_warps=4)
    return out


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    """One pass over x instead of the eager chain's seven, which at 24 kHz move most of the codec's bytes."""
    if not (_is_kernel_tensor(x) and x.dim() == 3 and x.is_contiguous() and x.dtype == log_alpha.dtype
            == log_beta.dtype):
        return snake_beta_eager(x, log_alpha, log_beta)
    out = torch.empty_like(x)
    _launch_snake_beta(x, log_alpha, log_beta, out, x)
    return out


def snake_beta_after_history(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                             history: torch.Tensor) -> torch.Tensor:
    """[history | snake(x)] along time, as a causal convolution reads its input, with `history` [B, C, H]
    advanced in place to the last H columns of that. The activation writes straight after the history instead of
    into a tensor of its own that a concatenation then copies: at the codec's 24 kHz stages those are its
    largest tensors. The values are snake_beta's, bit for bit."""
    size = history.shape[-1]
    if not (_is_kernel_tensor(x) and x.dim() == 3 and x.is_contiguous() and history.is_contiguous()
            and x.dtype == log_alpha.dtype == log_beta.dtype == history.dtype and 0 < size <= _MAX_HISTORY):
        extended = torch.cat((history, snake_beta(x, log_alpha, log_beta)), dim=-1)
        history.copy_(extended[..., extended.shape[-1] - size:])
        return extended
    batch, channels, length = x.shape
    extended = torch.empty(batch, channels, size + length, dtype=x.dtype, device=x.device)
    _launch_snake_beta(x, log_alpha, log_beta, extended, history)
    rows = batch * channels
    _advance_history_kernel[(triton.cdiv(rows, _HISTORY_ROWS),)](extended, history, rows, length, size,
                                                                  ROWS=_HISTORY_ROWS,
                                                                  BLOCK=triton.next_power_of_2(size), num_warps=4)
    return extended


def _launch_snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, out: torch.Tensor,
                       history: torch.Tensor) -> None:
    """snake(x) into the last columns of each row of `out`; the columns before them get `history`'s row (none
    when `out` is as wide as x)."""
    batch, channels, length = x.shape
    size = out.shape[-1] - length
    grid = (batch * channels, triton.cdiv(length, _SNAKE_BLOCK))
    # No fused multiply-adds: the eager chain rounds the product before the sum.
    _snake_beta_kernel[grid](x, log_alpha, log_beta, out, history, channels, length, size, BLOCK=_SNAKE_BLOCK,
                             HISTORY_BLOCK=triton.next_power_of_2(size) if size else 0, num_warps=4,
                             enable_fp_fusion=False)


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


if HAS_TRITON:

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
                             cos_batch_stride, sin_batch_stride, eps, HEAD_DIM: tl.constexpr):
        # One launch for both: queries take the first rows of the grid, keys the rest.
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
    def _snake_beta_kernel(x_ptr, log_alpha_ptr, log_beta_ptr, out_ptr, history_ptr, channels, length, history_size,
                           BLOCK: tl.constexpr, HISTORY_BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        out_row = out_ptr + row * (history_size + length)
        # Nested: the outer test is settled at compile time, so no empty arange is built without a history.
        if HISTORY_BLOCK > 0:  # noqa: SIM102
            if tl.program_id(1) == 0:
                held = tl.arange(0, HISTORY_BLOCK)
                is_held = held < history_size
                tl.store(out_row + held, tl.load(history_ptr + row * history_size + held, mask=is_held),
                         mask=is_held)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < length
        channel = row % channels
        dtype = out_ptr.dtype.element_ty
        # Each step rounds to the activation dtype where the eager chain writes a tensor; libdevice's
        # exp and sin are the functions PyTorch's own CUDA kernels call.
        frequency = libdevice.exp(tl.load(log_alpha_ptr + channel).to(tl.float32)).to(dtype).to(tl.float32)
        magnitude = libdevice.exp(tl.load(log_beta_ptr + channel).to(tl.float32)).to(dtype).to(tl.float32)
        inverse = tl.math.div_rn(1.0, (magnitude + 1e-9).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x = tl.load(x_ptr + row * length + cols, mask=mask, other=0.0).to(tl.float32)
        wave = libdevice.sin((x * frequency).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        squared = (wave * wave).to(dtype).to(tl.float32)
        tl.store(out_row + history_size + cols, (x + (inverse * squared).to(dtype).to(tl.float32)).to(dtype),
                 mask=mask)

    @triton.jit
    def _advance_history_kernel(extended_ptr, history_ptr, num_rows, length, history_size, ROWS: tl.constexpr,
                                BLOCK: tl.constexpr):
        rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
        held = tl.arange(0, BLOCK)[None, :]
        mask = (rows < num_rows) & (held < history_size)
        latest = tl.load(extended_ptr + rows * (history_size + length) + length + held, mask=mask)
        tl.store(history_ptr + rows * history_size + held, latest, mask=mask)
