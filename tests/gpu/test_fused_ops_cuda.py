"""On a GPU: each fused kernel reproduces the eager chain it replaces, rounding step by rounding step."""

from __future__ import annotations

import pytest
import torch

from tts_service.model import fused_ops
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import rope_cos_sin, rope_inverse_frequencies, use_fused_kernels

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and fused_ops.HAS_TRITON),
                                reason="needs a CUDA GPU and Triton")

DEVICE = torch.device("cuda")


def activations(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (3 * torch.randn(*shape, generator=generator, device=DEVICE)).to(dtype)


def assert_matches_eager(fused: torch.Tensor, eager: torch.Tensor, max_ulps: int) -> None:
    """Equal but for the fp32 summation order inside the mean square (and the approximate rsqrt),
    which can move a rare 16-bit element by a unit in the last place (a few more after RoPE).
    In fp32 no rounding to a short mantissa hides those differences, so a few ulps are allowed."""
    assert fused.shape == eager.shape and fused.dtype == eager.dtype
    is_fp32 = eager.dtype == torch.float32
    ulp = torch.finfo(eager.dtype).eps * eager.float().abs().clamp(min=torch.finfo(eager.dtype).tiny)
    assert bool(((fused.float() - eager.float()).abs() <= (8 if is_fp32 else max_ulps) * ulp).all())
    if not is_fp32:
        assert (fused == eager).float().mean().item() >= 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("width", [1024, 2048, 100])
def test_rms_norm_kernel_equals_eager_chain(dtype: torch.dtype, width: int) -> None:
    x = activations(3, 5, width, dtype=dtype)
    weight = activations(width, dtype=dtype, seed=1)
    assert_matches_eager(fused_ops.rms_norm(x, weight, 1e-6), fused_ops.rms_norm_eager(x, weight, 1e-6), 1)


def test_add_rms_norm_rounds_the_sum_before_normalising() -> None:
    x, residual, weight = activations(7, 2048), activations(7, 2048, seed=2), activations(2048, seed=3)
    total, normed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(total, x + residual)
    assert_matches_eager(normed, fused_ops.rms_norm_eager(x + residual, weight, 1e-6), 1)


@pytest.mark.parametrize("length", [1, 13])
def test_qk_norm_rope_kernel_equals_eager_chain(length: int) -> None:
    batch, heads, kv_heads, head_dim = 3, 16, 8, 128
    q, k = activations(batch, length, heads, head_dim), activations(batch, length, kv_heads, head_dim, seed=4)
    q_weight, k_weight = activations(head_dim, seed=5), activations(head_dim, seed=6)
    positions = torch.arange(40, 40 + length, device=DEVICE).expand(batch, -1)
    cos, sin = rope_cos_sin(rope_inverse_frequencies(head_dim, 1e6), positions, torch.bfloat16)
    fused_q, fused_k = fused_ops.qk_norm_rope(q, k, q_weight, k_weight, 1e-6, cos, sin)
    assert_matches_eager(fused_q, fused_ops.norm_rope_eager(q, q_weight, 1e-6, cos, sin), 4)
    assert_matches_eager(fused_k, fused_ops.norm_rope_eager(k, k_weight, 1e-6, cos, sin), 4)


def test_silu_mul_kernel_equals_eager_chain() -> None:
    gate, up = activations(5, 6144), activations(5, 6144, seed=7)
    assert_matches_eager(fused_ops.silu_mul(gate, up), fused_ops.silu_mul_eager(gate, up), 1)


def test_fused_talker_gives_the_eager_talkers_greedy_codes() -> None:
    from tests.test_runner import requests_for
    from tts_service.generate import generate_codes

    model = load_model("random:tiny-custom_voice", LoadOptions(device=DEVICE, dtype=torch.bfloat16))
    requests = requests_for(model, [9, 14, 11])
    eager = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    assert use_fused_kernels(model.talker, True) > 0
    fused = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    for got, want in zip(fused, eager, strict=True):
        assert torch.equal(got.codes, want.codes)
