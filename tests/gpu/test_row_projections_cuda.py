"""On a GPU: the row projections (norm and SiLU inside) give what the norm kernel, cuBLAS and the SiLU kernel give,
in bf16, and a decoder layer takes them at one and two rows only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tts_service.model import fused_ops, row_projections
from tts_service.model.configs import DecoderLayerStack
from tts_service.model.layers import DecoderLayer, use_fused_kernels
from tts_service.model.triton_utils import HAS_TRITON

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON),
                                reason="needs a CUDA GPU and Triton")

DEVICE = torch.device("cuda")
EPS = 1e-6


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (scale * torch.randn(*shape, generator=generator, device=DEVICE)).bfloat16()


def assert_as_close_as_the_chain(out: torch.Tensor, chain: torch.Tensor, truth: torch.Tensor) -> None:
    """Only the fp32 sums' order differs from the chain: the error to fp32 is the chain's own, and nearly every
    element is the chain's bit for bit."""
    error, chain_error = ((t.float() - truth).abs().mean().item() for t in (out, chain))
    assert error <= 1.05 * chain_error, (error, chain_error)
    assert (out == chain).float().mean().item() >= 0.98


@pytest.mark.parametrize("width", [1024, 2048])
@pytest.mark.parametrize("num_rows", [1, 2])
def test_the_norm_and_silu_inside_the_projections_round_as_the_kernels_they_replace(num_rows: int, width: int) -> None:
    x, delta = randn(num_rows, 1, width, seed=1), randn(num_rows, 1, width, seed=2)
    norm_weight = 1 + randn(width, seed=3, scale=0.25)
    weight, gate_up = randn(4096, width, seed=4, scale=width ** -0.5), randn(6144, width, seed=5, scale=width ** -0.5)
    down = randn(width, 3072, seed=6, scale=3072 ** -0.5)
    total, normed = fused_ops.add_rms_norm(x, delta, norm_weight, EPS)
    exact_total = total.float()
    exact_normed = exact_total * torch.rsqrt(exact_total.pow(2).mean(-1, keepdim=True) + EPS) * norm_weight.float()

    summed, out = row_projections.normed_projection(x, delta, norm_weight, EPS, weight)
    assert torch.equal(summed, total)
    assert_as_close_as_the_chain(out, F.linear(normed, weight), exact_normed @ weight.float().T)

    summed, activations = row_projections.gated_projection(x, delta, norm_weight, EPS, gate_up)
    assert torch.equal(summed, total)
    gate, up = F.linear(normed, gate_up).chunk(2, dim=-1)
    exact_gate, exact_up = (exact_normed @ gate_up.float().T).chunk(2, dim=-1)
    assert_as_close_as_the_chain(activations, fused_ops.silu_mul(gate, up), F.silu(exact_gate) * exact_up)

    assert_as_close_as_the_chain(row_projections.projection(activations, down), F.linear(activations, down),
                                 activations.float() @ down.float().T)


def _only_the_new_token(layer_index: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    # Attention over the one position given: softmax of a single score is 1, so the output is the value per head.
    return value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)


@pytest.mark.parametrize("num_rows", [1, 2])
def test_a_decoder_layer_takes_the_row_projections_up_to_two_rows_and_gives_the_chains_values(num_rows: int) -> None:
    shape = DecoderLayerStack(hidden_size=1024, intermediate_size=3072, num_hidden_layers=1, num_attention_heads=16,
                              num_key_value_heads=8, head_dim=128, rms_norm_eps=EPS, rope_theta=10000.0,
                              vocab_size=3072)
    layer = DecoderLayer(shape, 0).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        for index, parameter in enumerate(layer.parameters()):
            parameter.copy_(randn(*parameter.shape, seed=10 + index, scale=0.05) + (parameter.dim() == 1))
    use_fused_kernels(layer, True)
    cos = torch.ones(num_rows, 1, 128, device=DEVICE).bfloat16()
    sin = torch.zeros(num_rows, 1, 128, device=DEVICE).bfloat16()
    x, mlp_out = randn(num_rows, 1, 1024, seed=7), randn(num_rows, 1, 1024, seed=8)
    assert layer._takes_row_kernels(x)
    assert not layer._takes_row_kernels(randn(3, 1, 1024, seed=9))
    with torch.no_grad():
        rows = layer(x, mlp_out, cos, sin, _only_the_new_token)
        chain_x, normed = layer.input_layernorm.add_and_norm(x, mlp_out)
        chain_x, normed = layer.post_attention_layernorm.add_and_norm(
            chain_x, layer.self_attn(normed, cos, sin, _only_the_new_token))
        chain = layer.mlp(normed)
    # q/k/v come from another sum order than cuBLAS's, so both outputs may move by a bf16 unit here and there.
    for out, expected in zip(rows, (chain_x, chain), strict=True):
        torch.testing.assert_close(out, expected, rtol=0.02, atol=0.02)
        assert (out == expected).float().mean().item() >= 0.95
