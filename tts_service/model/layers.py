"""Building blocks shared by the talker and the code predictor (Qwen3-style decoder layers).

Attention reads and writes its key/value memory through an `AttentionBackend`, so the same
layers serve the simple eager path (a growing cache per request) and the paged, graph-captured
runner.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from tts_service.model import fused_ops, row_projections
from tts_service.model.configs import DecoderLayerStack
from tts_service.model.fused_ops import apply_rope
from tts_service.model.kernel_policy import KernelPolicy


@runtime_checkable
class PacksProjections(Protocol):
    """A module that can hold its bias-free projections as slices of one packed weight (one GEMM for several)."""

    def pack_projections(self) -> None: ...


class AttentionBackend(Protocol):
    """Stores this step's keys/values for a layer and attends over everything held for each row."""

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        """query [B, H, T, D], key/value [B, KV, T, D] (already rotated) -> output [B, H, T, D]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.is_fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_fused:
            return fused_ops.rms_norm(x, self.weight, self.eps)
        return fused_ops.rms_norm_eager(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, self(x + residual))."""
        if self.is_fused:
            return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)
        total = x + residual
        return total, fused_ops.rms_norm_eager(total, self.weight, self.eps)


def rope_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(inverse_frequencies: torch.Tensor, positions: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, T, head_dim], computed in fp32 then cast."""
    freqs = positions.float()[..., None] * inverse_frequencies.to(positions.device)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def interleaved_mrope_cos_sin(inverse_frequencies: torch.Tensor, positions: torch.Tensor,
                              mrope_section: tuple[int, ...],
                              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal RoPE with interleaved sections.

    positions [S, B, T] holds one position stream per section (temporal, height, width).
    Frequency i takes its angle from stream i % S while i < S * section size, and from the
    first stream after that. Speech prompts use the same position in every stream, which makes
    this equal to plain RoPE; it is kept general so a checkpoint's layout is honoured as written.
    """
    num_streams = len(mrope_section)
    freqs = positions.float()[..., None] * inverse_frequencies.to(positions.device)  # [S, B, T, D/2]
    chosen = freqs[0].clone()
    for stream in range(1, num_streams):
        end = mrope_section[stream] * num_streams
        chosen[..., stream:end:num_streams] = freqs[stream, ..., stream:end:num_streams]
    angles = torch.cat((chosen, chosen), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class PackedProjections(nn.Module):
    """An attention's q, k, v and o projections as the checkpoint holds them, with q, k and v packable into one
    weight (on CUDA, by `use_fused_kernels`) so that the fused path computes them in one GEMM."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.is_fused = False
        # Not saved: the checkpoint holds the three projections.
        self.qkv_weight: torch.Tensor | None
        self.register_buffer("qkv_weight", None, persistent=False)

    def pack_projections(self) -> None:
        if self.qkv_weight is None:
            self.qkv_weight = pack_weights(self.q_proj, self.k_proj, self.v_proj)

    def split_packed(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv_width = self.num_kv_heads * self.head_dim
        return qkv.split((self.num_heads * self.head_dim, kv_width, kv_width), -1)


class Attention(PackedProjections):
    def __init__(self, shape: DecoderLayerStack, layer_index: int) -> None:
        super().__init__(shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim)
        self.layer_index = layer_index
        self.q_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.is_fused and self.qkv_weight is not None:
            return self.split_packed(F.linear(x, self.qkv_weight))
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        return self.attend(*self._project(x), cos, sin, backend)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               backend: AttentionBackend) -> torch.Tensor:
        """Projected q, k, v [B, T, width] -> the attention's output through o [B, T, hidden]."""
        batch, length, _ = q.shape
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.is_fused:
            q, k = fused_ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin)
        else:
            q = apply_rope(self.q_norm(q).transpose(1, 2), cos, sin)
            k = apply_rope(self.k_norm(k).transpose(1, 2), cos, sin)
        out = backend(self.layer_index, q, k, v).transpose(1, 2).reshape(batch, length, -1)
        if self.is_fused and KernelPolicy.row_projection_kernel(out, self.o_proj.weight, "plain"):
            return row_projections.projection(out, self.o_proj.weight)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.is_fused = False
        self.gate_up_weight: torch.Tensor | None
        self.register_buffer("gate_up_weight", None, persistent=False)

    def pack_projections(self) -> None:
        """Hold gate and up as slices of one weight, so the fused path computes both in one GEMM."""
        if self.gate_up_weight is None:
            self.gate_up_weight = pack_weights(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_fused and self.gate_up_weight is not None:
            gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
            return self.down_proj(fused_ops.silu_mul(gate, up))
        if self.is_fused:  # not packed: a device without the kernels
            return self.down_proj(fused_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: DecoderLayerStack, layer_index: int) -> None:
        super().__init__()
        self.self_attn = Attention(shape, layer_index)
        self.mlp = MLP(shape.hidden_size, shape.intermediate_size)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, mlp_out: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, the previous layer's MLP output not yet added to it) -> the same for this layer.
        The add is left to the next norm, which does it in the same kernel, rounding the sum first as a
        separate add would."""
        if self._takes_row_kernels(x):
            return self._forward_rows(x, mlp_out, cos, sin, backend)
        if mlp_out is None:
            normed = self.input_layernorm(x)
        else:
            x, normed = self.input_layernorm.add_and_norm(x, mlp_out)
        x, normed = self.post_attention_layernorm.add_and_norm(x, self.self_attn(normed, cos, sin, backend))
        return x, self.mlp(normed)

    def _takes_row_kernels(self, x: torch.Tensor) -> bool:
        attention, mlp = self.self_attn, self.mlp
        return (attention.is_fused and attention.qkv_weight is not None and mlp.gate_up_weight is not None
                and KernelPolicy.row_projection_kernel(x, attention.qkv_weight, "normed")
                and KernelPolicy.row_projection_kernel(x, mlp.gate_up_weight, "gated")
                and KernelPolicy.row_projection_kernel(x, mlp.down_proj.weight, "plain"))

    def _forward_rows(self, x: torch.Tensor, mlp_out: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` for a step of one or two rows: each norm (and the residual add before it) inside the
        projection that reads it, SiLU inside gate/up (`row_projections`), rounding where the chain rounds."""
        attention, mlp = self.self_attn, self.mlp
        norm = self.input_layernorm
        x, qkv = row_projections.normed_projection(x, mlp_out, norm.weight, norm.eps, attention.qkv_weight)
        attended = attention.attend(*attention.split_packed(qkv), cos, sin, backend)
        norm = self.post_attention_layernorm
        x, activations = row_projections.gated_projection(x, attended, norm.weight, norm.eps, mlp.gate_up_weight)
        return x, row_projections.projection(activations, mlp.down_proj.weight)


class DecoderStack(nn.Module):
    """Layers plus final norm; named `model` in checkpoints (`layers.N.*`, `norm.weight`)."""

    def __init__(self, shape: DecoderLayerStack) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(shape, index) for index in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   backend: AttentionBackend) -> torch.Tensor:
        mlp_out = None
        for layer in self.layers:
            x, mlp_out = layer(x, mlp_out, cos, sin, backend)
        if mlp_out is None:
            return self.norm(x)
        return self.norm.add_and_norm(x, mlp_out)[1]


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, KV, T, D] -> [B, H, T, D] for grouped-query attention."""
    groups = num_heads // x.shape[1]
    if groups == 1:
        return x
    batch, kv_heads, length, dim = x.shape
    return x[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, num_heads, length, dim)


def pack_weights(*projections: nn.Linear | nn.Embedding) -> torch.Tensor:
    """Concatenate bias-free projections' weights (or embedding tables) into one matrix and make each module's
    weight a view of its rows: one copy of the weights in memory, which the separate and the packed GEMMs (or
    lookups) both read. Call it once the module sits on its final device and dtype (moving it afterwards copies
    the views apart)."""
    packed = torch.cat([projection.weight.detach() for projection in projections])
    start = 0
    for projection in projections:
        rows = projection.weight.shape[0]
        projection.weight = nn.Parameter(packed[start:start + rows], requires_grad=False)
        start += rows
    return packed


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def use_fused_kernels(module: nn.Module, enabled: bool) -> int:
    """Switch every decoder norm, attention and MLP under `module` to the fused kernels (or back).

    Switching on also packs, on CUDA, the projections of every module that can (`PacksProjections`: each layer's
    q/k/v and gate/up weights, the codec's attention too, the talker's frame embedding tables), so the fused path
    runs two GEMMs where the eager chain runs five; the eager chain reads the same memory through views. A packed
    GEMM may sum in another order than the separate ones (cuBLAS picks kernels by shape), which is within bf16's
    own rounding and is what the fidelity benchmark judges. Returns how many modules were switched. The kernels
    run only on CUDA with Triton; elsewhere the switched modules still take the eager chain, so this is safe on any
    device.
    """
    switched = 0
    for child in module.modules():
        if isinstance(child, RMSNorm | Attention | MLP):
            child.is_fused = enabled
            switched += 1
        if enabled and isinstance(child, PacksProjections) and KernelPolicy.runs_kernels(_device_of(child)):
            child.pack_projections()
    return switched
