"""The 12 Hz speech-tokenizer decoder: codec codes [B, 16, T] -> 24 kHz waveform.

Every layer is causal (left-padded convolutions, transposed convolutions trimmed on the right,
sliding-window causal attention), so decoding a stream chunk by chunk while carrying a small
fixed-size state per row computes the same samples a one-shot decode would. They are equal up to
rounding, not bit for bit: other chunk lengths make the kernels sum in another order. On the test
decoder the samples differ by at most a few 1e-6 in float32 and about 1e-14 in float64.
`forward` is simply a single chunk decoded from a fresh state; `decode_chunk` is the serving path.

Parameter names follow the checkpoint's `decoder.*` keys (without the prefix).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tts_service.model import fused_ops
from tts_service.model.configs import CodecDecoderConfig
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import (
    MLP,
    PackedProjections,
    RMSNorm,
    apply_rope,
    rope_cos_sin,
    rope_inverse_frequencies,
    use_fused_kernels,
)

ConvStates = tuple[torch.Tensor, ...]


@dataclass
class CodecStreamState:
    """Per-row decoder state of fixed shape. The rows are the first dimension of every tensor but the attention's
    rings, which hold each layer's rows together ([layers, B, ...]): a layer's window is then one contiguous block
    that batched matmuls read in place (batch-first, every layer copied it out, 0.6 ms a call at 128 rows)."""

    position: torch.Tensor  # [B] int64: frames already decoded
    # Rotated keys and the values of the last `window` frames, as rings: frame p is in slot p % window.
    keys: torch.Tensor  # [layers, B, kv_heads, window, head_dim]
    values: torch.Tensor  # [layers, B, kv_heads, window, head_dim]
    conv: ConvStates  # per stateful convolution: [B, history, channels], time-major as the activations
    # A view of some streams (`select_rows(..., share_rings=True)`): keys/values are then every stream's rings, and
    # the view's row b has ring `ring_rows[b]`, which the attention reads and writes in place.
    ring_rows: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [self.position, self.keys, self.values, *self.conv]

    def _row_dims(self) -> list[int]:
        return [0, 1, 1, *(0 for _ in self.conv)]

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Return the given rows to the start of a stream, so a slot can serve a new request."""
        for tensor, dim in zip(self.tensors(), self._row_dims(), strict=True):
            tensor.index_fill_(dim, rows, 0)

    def select_rows(self, rows: torch.Tensor, share_rings: bool = False) -> CodecStreamState:
        """A copy of the given rows' state, in their order. With `share_rings` the attention's rings stay where
        they are (the view reads and writes them in place): they are most of a stream's state (4.7 of 5.0 MB at
        the released decoder's size), and copying them out and back took a fifth of a 128-row codec call."""
        if share_rings:
            return CodecStreamState(position=self.position[rows], keys=self.keys, values=self.values,
                                    conv=tuple(t[rows] for t in self.conv), ring_rows=rows)
        return CodecStreamState(position=self.position[rows], keys=self.keys[:, rows], values=self.values[:, rows],
                                conv=tuple(t[rows] for t in self.conv))

    def store_rows(self, rows: torch.Tensor, state: CodecStreamState) -> None:
        """Write `state` (as `select_rows(rows)` returned it, advanced) back into the given rows."""
        for target, source, dim in zip(self.tensors(), state.tensors(), self._row_dims(), strict=True):
            if source is not target:  # shared rings were written in place
                target.index_copy_(dim, rows, source)


class _Convolution(nn.Module):
    """A convolution layer (self.conv) whose input, filter and output may be stored in a narrower dtype than its
    parameters: `input_dtype`, set by `CodecDecoder.use_half_convolutions`. cuDNN then reads and writes half the
    bytes and runs fp16 tensor-core kernels, which accumulate in fp32. Such a layer adds its bias in the
    parameters' dtype, on the upcast output, and carries its history in `input_dtype`."""

    conv: nn.Conv1d | nn.ConvTranspose1d
    input_dtype: torch.dtype | None = None  # None: the parameters' dtype
    slot: int = -1  # layers with history: their place in `CodecStreamState.conv`

    def state_shape(self) -> tuple[int, int] | None:
        raise NotImplementedError

    def stored_dtype(self) -> torch.dtype:
        """The dtype this layer reads its input in (and keeps its history in)."""
        return self.conv.weight.dtype if self.input_dtype is None else self.input_dtype

    def _is_narrowed(self) -> bool:
        return self.stored_dtype() != self.conv.weight.dtype

    def _convolve(self, x: torch.Tensor, filters: torch.Tensor, bias: torch.Tensor | None,
                  dilation: int = 1, groups: int = 1) -> torch.Tensor:
        if not self._is_narrowed():
            return _convolve_over_time(x, filters, bias, dilation, groups)
        y = _convolve_over_time(x, filters, None, dilation, groups)
        return y if bias is None else y + bias  # upcast to the parameters' dtype by the add


class _DerivedTensors:
    """Tensors worked out from parameters once, and again only when a parameter changes (in place or replaced)."""

    def __init__(self) -> None:
        self._values: tuple[torch.Tensor, ...] = ()
        self._key: tuple[object, ...] | None = None

    def get(self, parameters: tuple[torch.Tensor | None, ...], build: Callable[[], tuple[torch.Tensor, ...]],
            *settings: object) -> tuple[torch.Tensor, ...]:
        """`settings`: whatever else the tensors depend on (a dtype to store them in)."""
        key = (*(None if p is None else (p.data_ptr(), p._version, p.dtype, p.device) for p in parameters),
               *settings)
        if self._key != key:
            with torch.no_grad():
                self._values = build()
            self._key = key
        return self._values


def _channels_last_filter(weight: torch.Tensor) -> torch.Tensor:
    """[out, in, k] -> [out, in, 1, k] in channels-last memory: the layout cuDNN's NHWC kernels read."""
    return weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)


def _convolve_over_time(x: torch.Tensor, filters: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1,
                        groups: int = 1) -> torch.Tensor:
    """A 1-D convolution of time-major x [B, L, in] -> [B, L - (k - 1) * dilation, out], run as a 2-D one whose
    input and filter are in channels-last memory. cuDNN's convolutions read and write that layout; handed the
    channels-first one, it re-laid out every input, output and filter on every call, 0.78 of the 2.34 ms a
    one-row codec call spent in kernels on an H100."""
    y = F.conv2d(x.transpose(1, 2).unsqueeze(2), filters, bias, dilation=(1, dilation), groups=groups)
    return y.squeeze(2).transpose(1, 2)


class CausalConv1d(_Convolution):
    """Stride-1 convolution that sees only the past; its state is the last inputs it must look back at."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history = (kernel_size - 1) * dilation
        self._filters = _DerivedTensors()
        self.is_fused = False  # a convolution to one channel (the waveform) then takes its own kernel

    def state_shape(self) -> tuple[int, int] | None:
        return (self.history, self.conv.in_channels) if self.history else None

    def forward(self, x: torch.Tensor, states: ConvStates, activation: SnakeBeta | None = None, *,
                input_bias: torch.Tensor | None = None, with_bias: bool = True) -> torch.Tensor:
        """conv(activation(x + input_bias)) (conv(x) without an activation) over time-major x [B, L, in], carrying
        the history across calls; `with_bias=False` leaves this convolution's bias for its caller to add."""
        dtype = self.stored_dtype()
        if not self.history:
            inputs = x.to(dtype) if activation is None else activation(x, input_bias=input_bias, dtype=dtype)
            return self._convolve_with_filters(inputs, with_bias)
        if input_bias is not None and activation is None:
            raise ValueError("an input bias is added by the activation ahead of a convolution with history")
        past = states[self.slot]
        # A fresh state is zeros, which is exactly the zero left-padding of a one-shot decode.
        if activation is not None:
            return self._convolve_with_filters(activation.after_history(x, past, input_bias), with_bias)
        extended = torch.cat((past, x.to(dtype)), dim=1)
        past.copy_(extended[:, x.shape[1]:])
        return self._convolve_with_filters(extended, with_bias)

    def _convolve_with_filters(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        conv = self.conv
        if (self.is_fused and with_bias and conv.groups == 1
                and KernelPolicy.one_channel_convolution_kernel(x, conv.weight, conv.bias)):
            return fused_ops.one_channel_convolution(x, conv.weight, conv.bias, conv.dilation[0])  # type: ignore[arg-type]
        # A copy of the checkpoint's weight (126 MB over the released decoder in fp32), so that the parameter keeps
        # the checkpoint's layout for saving and for the reference's state dict.
        dtype = self.stored_dtype()
        (filters,) = self._filters.get((conv.weight,), lambda: (_channels_last_filter(conv.weight).to(dtype),), dtype)
        return self._convolve(x, filters, conv.bias if with_bias else None, conv.dilation[0], conv.groups)


class CausalConvTranspose1d(_Convolution):
    """Transposed convolution trimmed on the right, computed in its polyphase form.

    With stride s and kernel s + o (o <= s), output sample t*s + p is x[t]·W[..., p] plus, for p < o,
    x[t-1]·W[..., p + s]: a stride-1 convolution of kernel 2 over the input with s output channels per
    channel, then an interleave. It is the same sum as the transposed convolution's. cuDNN runs it as
    the tensor-core convolution every other layer uses, where its transposed kernel fell back to a slow
    fp32 engine for some streaming shapes (4.1 of an 18.9 ms codec call at 128 rows on an H100). The
    phases are ordered phase-major (channel p * out + c), so that in time-major memory the interleave is
    a reshape that moves nothing. The state is the last input frame, which is all the next chunk needs
    from the past.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride
        if not 0 <= self.overlap <= stride:
            raise ValueError("a causal transposed convolution needs stride <= kernel_size <= 2 * stride")
        self._phases = _DerivedTensors()

    def state_shape(self) -> tuple[int, int] | None:
        return (1, self.conv.in_channels) if self.overlap else None

    def phase_filters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stride-1 convolution's filter [stride * out, in, 1, taps] in channels-last memory, and its bias
        [stride * out]. Output channel p * out + c holds, in its last tap, W[:, c, p] (the current input) and,
        with an overlap, in its first, W[:, c, p + stride] (the previous input)."""
        def build() -> tuple[torch.Tensor, torch.Tensor]:
            weight = self.conv.weight  # [in, out, kernel]
            in_channels, out_channels, _ = weight.shape
            stride, overlap = self.stride, self.overlap
            taps = 2 if overlap else 1
            phases = weight.new_zeros(in_channels, stride, out_channels, taps)
            phases[..., -1] = weight[..., :stride].permute(0, 2, 1)
            if overlap:
                phases[:, :overlap, :, 0] = weight[..., stride:].permute(0, 2, 1)
            filters = phases.reshape(in_channels, stride * out_channels, taps).transpose(0, 1)
            return _channels_last_filter(filters).to(self.stored_dtype()), self.conv.bias.repeat(stride)

        filters, bias = self._phases.get((self.conv.weight, self.conv.bias), build, self.stored_dtype())
        return filters, bias

    def forward(self, x: torch.Tensor, states: ConvStates, activation: SnakeBeta | None = None,
                with_bias: bool = True) -> torch.Tensor:
        """The transposed convolution of activation(x) (of x without one) over time-major x [B, T, in] ->
        [B, T * stride, out], carrying the last input frame; `with_bias=False` leaves the bias (`conv.bias`, one
        per output channel) for the caller to add."""
        batch, num_steps, _ = x.shape
        filters, bias = self.phase_filters()
        dtype = self.stored_dtype()
        if self.overlap:
            previous = states[self.slot]
            if activation is not None:
                extended = activation.after_history(x, previous)
            else:
                extended = torch.cat((previous, x.to(dtype)), dim=1)
                previous.copy_(x[:, -1:])
        else:  # no tap reaches back: the current input's alone
            extended = x.to(dtype) if activation is None else activation(x, dtype=dtype)
        y = self._convolve(extended, filters, bias if with_bias else None)  # [B, T, stride * out], phase-major
        return y.reshape(batch, num_steps * self.stride, self.conv.out_channels)


class SnakeBeta(nn.Module):
    """x + sin²(x·e^alpha) / e^beta per channel of time-major x [..., C], with alpha and beta stored as
    logarithms."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.is_fused = False
        self._tables = _DerivedTensors()

    def _kernel_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        frequency, inverse = self._tables.get((self.alpha, self.beta),
                                              lambda: fused_ops.snake_beta_tables(self.alpha, self.beta))
        return frequency, inverse

    def forward(self, x: torch.Tensor, states: ConvStates = (), input_bias: torch.Tensor | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:
        """self(x + input_bias), the sum rounded first (self(x) without one), stored in `dtype` (x's by default)."""
        if self.is_fused:
            return fused_ops.snake_beta(x, self.alpha, self.beta, self._kernel_tables(), input_bias, dtype)
        activated = fused_ops.snake_beta_eager(x if input_bias is None else x + input_bias, self.alpha, self.beta)
        return activated.to(x.dtype if dtype is None else dtype)

    def after_history(self, x: torch.Tensor, history: torch.Tensor, input_bias: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """[history | self(x + input_bias)] along time (dimension 1; self(x) without a bias), in the history's dtype,
        with `history` [B, H, C] advanced in place to the last H steps of that."""
        if self.is_fused:
            return fused_ops.snake_beta_after_history(x, self.alpha, self.beta, self._kernel_tables(), history,
                                                      input_bias)
        extended = torch.cat((history, self(x, input_bias=input_bias, dtype=history.dtype)), dim=1)
        history.copy_(extended[:, x.shape[1]:])
        return extended


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, states: ConvStates) -> torch.Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x, states)))))
        return x + self.gamma * h


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, states: ConvStates, input_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The unit over x + input_bias (x alone without one): `input_bias` is the bias of the convolution that made
        x, left to this unit's passes over it."""
        # Each convolution's bias is added by the pass that reads its output next (the snake, the residual add),
        # which saves a pass over the unit's tensors, the codec's largest; each sum is rounded as a separate add.
        h = self.conv1(x, states, self.act1, input_bias=input_bias, with_bias=False)
        y = self.conv2(h, states, self.act2, input_bias=self.conv1.conv.bias, with_bias=False)
        if self.act2.is_fused:
            return fused_ops.add_biased(x, y, self.conv2.conv.bias, input_bias)
        return (x if input_bias is None else x + input_bias) + (y + self.conv2.conv.bias)


class DecoderBlock(nn.Module):
    """Snake, upsample by `rate`, then residual units dilated 1, 3 and 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([
            SnakeBeta(in_dim),
            CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate),
            *(ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)),
        ])

    def forward(self, x: torch.Tensor, states: ConvStates) -> torch.Tensor:
        activation, upsample, *units = self.block
        # The upsampling's bias is added by the first unit's two passes over its output: cuDNN's convolution adds it
        # in a pass of its own over the block's largest tensor (in the two last blocks, 0.14 ms of a 5.3 ms codec
        # call at 128 rows on an H100).
        x = upsample(x, states, activation, with_bias=False)
        bias = upsample.conv.bias
        for unit in units:
            x = unit(x, states, bias)
            bias = None
        return x


# --- residual vector quantizer (decode side only) -------------------------------------------------

class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self._table = _DerivedTensors()

    def table(self) -> torch.Tensor:
        """[size, dim]: each code's vector, embedding_sum / usage. Worked out once, and again only when either
        parameter changes, so a lookup is one gather: the same quotients, divided once rather than per call."""
        (table,) = self._table.get((self.cluster_usage, self.embedding_sum),
                                   lambda: (self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None],))
        return table


class _VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _ResidualQuantizer(nn.Module):
    def __init__(self, num_quantizers: int, size: int, dim: int, outer_dim: int) -> None:
        super().__init__()
        # The encoder-side projection is never used here but is part of the checkpoint.
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(_VectorQuantizer(size, dim) for _ in range(num_quantizers))
        self.is_fused = False  # the lookups and their sum in one kernel
        self._tables = _DerivedTensors()

    def _stacked_tables(self) -> torch.Tensor:
        """[Q, size, dim]: every codebook's table, for the kernel that sums them."""
        codebooks = [layer._codebook for layer in self.vq.layers]
        parameters = tuple(p for codebook in codebooks for p in (codebook.cluster_usage, codebook.embedding_sum))
        (tables,) = self._tables.get(parameters, lambda: (torch.stack([codebook.table() for codebook in codebooks]),))
        return tables

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> [B, T, outer_dim]."""
        if self.is_fused:
            total = fused_ops.codebook_sum(codes, self._stacked_tables())
        else:  # each codebook's own table, with no stacked copy of them all
            total = fused_ops.codebook_sum_eager(codes, [layer._codebook.table() for layer in self.vq.layers])
        # A kernel-1 convolution over time-major frames is a matrix product.
        return F.linear(total, self.output_proj.weight[..., 0])


class SplitQuantizer(nn.Module):
    """One semantic codebook and the acoustic rest, each with its own output projection."""

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        semantic = config.num_semantic_quantizers
        if not 0 < semantic < config.num_quantizers:
            raise ValueError("need at least one semantic and one acoustic quantizer")
        dim = config.codebook_dim // 2
        # The reference sizes both codebooks by `codebook_size`; `semantic_codebook_size` is unused.
        self.rvq_first = _ResidualQuantizer(semantic, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = _ResidualQuantizer(config.num_quantizers - semantic, config.codebook_size, dim,
                                           config.codebook_dim)
        self.num_semantic = semantic

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        first = self.rvq_first.decode(codes[:, :self.num_semantic])
        return first + self.rvq_rest.decode(codes[:, self.num_semantic:])


# --- pre-transformer ----------------------------------------------------------------------------------

class _LayerScale(nn.Module):
    def __init__(self, size: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((size,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _Attention(PackedProjections):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        self.window = config.sliding_window

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: _WindowFrames,
                held_keys: torch.Tensor, held_values: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; held_* [B, KV, window, D] are the rings of the previous `window` frames (every stream's,
        [S, KV, window, D], with `frames.ring_rows`); the chunk's last min(T, window) frames go into them once every
        query has attended."""
        batch, length, _ = x.shape
        if self.qkv_weight is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            qkv = F.linear(x, self.qkv_weight)
            if self.is_fused and KernelPolicy.window_attention_kernel(qkv, cos, sin, held_keys, held_values):
                return self.o_proj(fused_ops.window_attention(qkv, self.num_heads, cos, sin, frames.position,
                                                              held_keys, held_values, self.head_dim ** -0.5,
                                                              frames.ring_rows))
            q, k, v = self.split_packed(qkv)
        rings = None
        if frames.ring_rows is not None:  # this call's rings out of every stream's, and back after
            rings = held_keys, held_values
            held_keys, held_values = held_keys[frames.ring_rows], held_values[frames.ring_rows]
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        out = _window_attention(apply_rope(q, cos, sin), held_keys, held_values, k, v, frames.mask,
                                self.head_dim ** -0.5)
        # Written after attending: the chunk's earlier queries still see the frames these overwrite.
        kept = frames.write_slots.shape[1]
        index = frames.write_slots[:, None, :, None].expand(-1, self.num_kv_heads, -1, self.head_dim)
        held_keys.scatter_(2, index, k[:, :, length - kept:])
        held_values.scatter_(2, index, v[:, :, length - kept:])
        if rings is not None:
            rings[0].index_copy_(0, frames.ring_rows, held_keys)
            rings[1].index_copy_(0, frames.ring_rows, held_values)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class _WindowFrames:
    """Where a chunk's frames fall in the attention rings, for every layer of one call. The eager path's mask and
    ring slots are made on first use, so a call whose layers all take the kernel (which works them out from
    `position`) launches none of their kernels."""

    def __init__(self, position: torch.Tensor, length: int, window: int,
                 ring_rows: torch.Tensor | None = None) -> None:
        self.position = position  # [B]: each row's first frame
        self.length = length
        self.window = window
        self.ring_rows = ring_rows  # as in CodecStreamState

    @functools.cached_property
    def query_positions(self) -> torch.Tensor:  # [B, T]
        return self.position[:, None] + torch.arange(self.length, device=self.position.device)

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """[B, 1, T, window + T]: which held and own frames each query sees."""
        position, window = self.position, self.window
        # Ring slot s holds the latest earlier frame congruent to s modulo the window (negative: none yet).
        slots = torch.arange(window, device=position.device)
        held_positions = position[:, None] - window + torch.remainder(slots[None, :] - position[:, None], window)
        key_positions = torch.cat((held_positions, self.query_positions), dim=1)  # [B, window + T]
        distance = self.query_positions[:, :, None] - key_positions[:, None, :]
        # Key k is visible from query q when 0 <= q - k < window and k is a real frame (not before the start).
        return ((distance >= 0) & (distance < window) & (key_positions[:, None, :] >= 0))[:, None]

    @functools.cached_property
    def write_slots(self) -> torch.Tensor:
        """[B, min(T, window)]: the ring slots of the chunk's last frames."""
        return torch.remainder(self.query_positions[:, max(0, self.length - self.window):], self.window)


def _window_attention(query: torch.Tensor, held_keys: torch.Tensor, held_values: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention over the held window and the chunk's own frames, as plain batched matmuls over the two
    parts: nothing concatenates the window (at 128 rows, 38 MB a layer in fp32). A chunk has a few queries per
    row against ~72 keys, where SDPA's fused kernels tile 64 queries per head and row (~150 us a layer at 128
    rows and one query on an H100). The query heads that share a key head are stacked as that head's rows, so
    the window is never copied out per query head either. `mask` [B, 1, T, window + T]; every query sees at
    least its own frame."""
    batch, num_heads, length, head_dim = query.shape
    num_kv_heads = held_keys.shape[1]
    grouped = query.reshape(batch, num_kv_heads, num_heads // num_kv_heads * length, head_dim)

    def per_query_head(x: torch.Tensor) -> torch.Tensor:  # [B, KV, G * T, N] -> [B, H, T, N]
        return x.reshape(batch, num_heads, length, x.shape[-1])

    def per_key_head(x: torch.Tensor) -> torch.Tensor:  # [B, H, T, N] -> [B, KV, G * T, N]
        return x.reshape(batch, num_kv_heads, -1, x.shape[-1])

    scores = torch.cat((per_query_head(torch.matmul(grouped, held_keys.transpose(-1, -2))),
                        per_query_head(torch.matmul(grouped, keys.transpose(-1, -2)))), dim=-1) * scale
    probabilities = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    window = held_keys.shape[2]
    return per_query_head(torch.matmul(per_key_head(probabilities[..., :window]), held_values)
                          + torch.matmul(per_key_head(probabilities[..., window:]), values))


class _TransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = _LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.mlp_layer_scale = _LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: _WindowFrames,
                held_keys: torch.Tensor, held_values: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, frames, held_keys, held_values)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """Sliding-window causal transformer over latent frames, between two linear projections."""

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.window = config.sliding_window
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        self.register_buffer("inv_freq", self.rope_frequencies(), persistent=False)

    def rope_frequencies(self) -> torch.Tensor:
        return rope_inverse_frequencies(self.head_dim, self.theta)

    def forward(self, x: torch.Tensor, position: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                ring_rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, latent] for frames starting at each row's `position` [B]; keys/values (and ring_rows) as in the
        state."""
        frames = _WindowFrames(position, x.shape[1], self.window, ring_rows)
        # RoPE angles in fp32 as the reference does, then cast to the compute dtype.
        cos, sin = rope_cos_sin(self.inv_freq, frames.query_positions, x.dtype)
        h = self.input_proj(x)
        for index, layer in enumerate(self.layers):
            h = layer(h, cos, sin, frames, keys[index], values[index])
        return self.output_proj(self.norm(h))


# --- the decoder ------------------------------------------------------------------------------------

class CodecDecoder(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.pre_transformer = PreTransformer(config)
        self.quantizer = SplitQuantizer(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, 3)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(config.latent_dim, config.latent_dim, factor, factor),
                           ConvNeXtBlock(config.latent_dim)])
            for factor in config.upsampling_ratios
        )
        dims = [config.decoder_dim // 2 ** index for index in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv1d(config.latent_dim, config.decoder_dim, 7),
            *(DecoderBlock(dims[i], dims[i + 1], rate) for i, rate in enumerate(config.upsample_rates)),
            SnakeBeta(dims[-1]),
            CausalConv1d(dims[-1], 1, 7),
        ])
        self._stateful = [m for m in self.modules() if isinstance(m, _Convolution) and m.state_shape()]
        for slot, module in enumerate(self._stateful):
            module.slot = slot

    # --- state -------------------------------------------------------------------------------------

    def new_stream_state(self, batch_size: int, device: torch.device | str | None = None,
                         dtype: torch.dtype | None = None) -> CodecStreamState:
        reference = self.pre_conv.conv.weight
        device = reference.device if device is None else device
        dtype = reference.dtype if dtype is None else dtype
        config = self.config
        kv_shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, config.sliding_window,
                    config.head_dim)
        return CodecStreamState(
            position=torch.zeros(batch_size, dtype=torch.int64, device=device),
            keys=torch.zeros(kv_shape, dtype=dtype, device=device),
            values=torch.zeros(kv_shape, dtype=dtype, device=device),
            conv=tuple(torch.zeros((batch_size, *m.state_shape()), device=device,
                                   dtype=dtype if m.input_dtype is None else m.input_dtype) for m in self._stateful),
        )

    def use_half_convolutions(self, enabled: bool) -> int:
        """Store the residual units' convolutions' inputs, filters and outputs in fp16 (or back in the parameters'
        dtype). They hold about three quarters of the decoder's arithmetic, at 96 to 768 channels and 32 to 1,920
        samples a frame. fp16 keeps the 10-bit mantissa that cuDNN's TF32 kernels round fp32 inputs to, and its
        kernels accumulate in fp32 too; what it adds is one rounding of each output, on a residual branch rather
        than on the stream itself, and a range of +-65504. Every other layer stays as it is: the upsampling
        convolutions write the residual stream, and in fp16 they and the layers at frame rate added most of the
        error for little time (BENCHMARKS.md, "fp16 convolutions"). For an fp32 decoder only; a stream state made
        before this no longer fits. Returns how many layers were switched."""
        if enabled and self.pre_conv.conv.weight.dtype != torch.float32:
            raise ValueError("half-precision convolutions are for a float32 decoder")
        units = [m for m in self.modules() if isinstance(m, ResidualUnit)]
        for unit in units:
            for module in (unit.conv1, unit.conv2):
                module.input_dtype = torch.float16 if enabled else None
        return 2 * len(units)

    def use_fused_kernels(self, enabled: bool) -> int:
        """Switch every SnakeBeta to its one-pass kernel, the pre-transformer's attention, norms and MLPs to theirs,
        the codebook lookups to one summing kernel and a convolution to one channel (the waveform) to its own (or
        back); switching on also packs each attention's q/k/v and each MLP's gate/up weights on CUDA. Returns how
        many modules were switched. The kernels run only on CUDA with Triton, so this is safe on any device."""
        switched = [module for module in self.modules()
                    if isinstance(module, SnakeBeta | _Attention | CausalConv1d | _ResidualQuantizer)]
        for module in switched:
            module.is_fused = enabled
        return len(switched) + use_fused_kernels(self.pre_transformer, enabled)

    # --- decoding ----------------------------------------------------------------------------------

    def _decode(self, codes: torch.Tensor, state: CodecStreamState) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"expected codes [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")
        # Time-major from the codebook lookup to the waveform: [B, T, channels] throughout.
        convs = state.conv
        latent = self.pre_conv(self.quantizer(codes), convs)
        h = self.pre_transformer(latent, state.position, state.keys, state.values, state.ring_rows)
        state.position.add_(codes.shape[2])
        for stage in self.upsample:
            for layer in stage:
                h = layer(h, convs)
        *stages, activation, last = self.decoder
        for stage in stages:
            h = stage(h, convs)
        return last(h, convs, activation).clamp(min=-1.0, max=1.0).transpose(1, 2)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> waveform [B, 1, T * samples_per_frame], decoded in one shot."""
        return self._decode(codes, self.new_stream_state(codes.shape[0]))

    @torch.no_grad()
    def decode_chunk(self, codes: torch.Tensor, state: CodecStreamState) -> torch.Tensor:
        """Decode the next `T` frames of each row's stream; `state` is advanced in place.

        codes [B, Q, T] -> waveform [B, T * samples_per_frame]. Shapes depend only on (B, T), and nothing
        synchronises with the host, so a fixed (B, T) can be captured in a CUDA graph.
        """
        return self._decode(codes, state)[:, 0]

    # --- random weights ----------------------------------------------------------------------------

    @torch.no_grad()
    def randomize_(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Fill every weight with plausible random values (for random-weight checkpoints and tests).

        Transformer matrices use `std`, as a Hugging Face initialiser would. Convolutions instead use
        1/sqrt(fan_in): some 30 of them are stacked and their fan-in spans 7 to 10k, so any single std
        would make the signal vanish or blow past the final clamp. Gains (ConvNeXt gamma, layer scales)
        are set large enough that each branch visibly changes the waveform, which is what lets a parity
        test catch a mistake in any of them.
        """
        device = generator.device

        def normal(tensor: torch.Tensor, mean: float, scale: float) -> None:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, device=device) * scale + mean)

        def fan_in_normal(weight: torch.Tensor, fan_in: int, gain: float = 1.0) -> None:
            normal(weight, 0.0, gain / math.sqrt(fan_in))

        layer_scale = self.config.layer_scale_initial_scale
        for module in self.modules():
            if isinstance(module, _Codebook):
                normal(module.embedding_sum, 0.0, 1.0)
                usage = torch.rand(module.cluster_usage.shape, generator=generator, device=device)
                module.cluster_usage.copy_(usage * 1.5 + 0.5)
            elif isinstance(module, RMSNorm | nn.LayerNorm):
                normal(module.weight, 1.0, 0.1)
                if isinstance(module, nn.LayerNorm):
                    normal(module.bias, 0.0, 0.02)
            elif isinstance(module, _LayerScale):
                # Trained layer scales drift upwards from their initial value; 10x keeps attention visible.
                normal(module.scale, 10 * layer_scale, 2 * layer_scale)
            elif isinstance(module, SnakeBeta):
                normal(module.alpha, 0.0, 0.3)
                normal(module.beta, 0.0, 0.3)
            elif isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
                kernel, stride = module.kernel_size[0], module.stride[0]
                # A transposed convolution feeds each output sample from kernel/stride input frames.
                taps = kernel // stride if isinstance(module, nn.ConvTranspose1d) else kernel
                fan_in_normal(module.weight, module.in_channels // module.groups * taps)
                if module.bias is not None:
                    normal(module.bias, 0.0, 0.02)
            elif isinstance(module, nn.Linear):
                normal(module.weight, 0.0, std)
                if module.bias is not None:
                    normal(module.bias, 0.0, 0.02)
        for module in self.modules():
            if isinstance(module, ConvNeXtBlock):
                # Its pointwise layers are convolutions in spirit: keep their gain near one.
                fan_in_normal(module.pwconv1.weight, module.pwconv1.in_features)
                fan_in_normal(module.pwconv2.weight, module.pwconv2.in_features)
                normal(module.gamma, 0.3, 0.05)
            elif isinstance(module, ResidualUnit):
                # At unit gain each of the 12 residual units would double the signal; a small branch keeps
                # the waveform stage near unit scale and Snake's sin() in its smooth range.
                fan_in_normal(module.conv2.conv.weight, module.conv2.conv.in_channels, gain=0.3)
            elif isinstance(module, _ResidualQuantizer):
                # Its codebooks are summed, so each contributes a share of the variance.
                count = len(module.vq.layers)
                fan_in_normal(module.output_proj.weight, module.output_proj.in_channels * count)
        # The last convolution sets the loudness: aim well inside the clamp.
        fan_in_normal(self.decoder[-1].conv.weight, self.decoder[-1].conv.in_channels * 7, gain=0.15)
        self.pre_transformer.inv_freq.copy_(self.pre_transformer.rope_frequencies())
