"""On a GPU: each fused kernel reproduces the eager chain it replaces, rounding step by rounding step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tts_service.model import fused_ops
from tts_service.model.codec_decoder import CodecDecoder, _Attention, _WindowFrames
from tts_service.model.configs import SpeechTokenizerConfig
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import rope_cos_sin, rope_inverse_frequencies
from tts_service.model.random_checkpoint import speech_tokenizer_config_dict
from tts_service.model.triton_utils import HAS_TRITON

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON),
                                reason="needs a CUDA GPU and Triton")

DEVICE = torch.device("cuda")


def activations(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (3 * torch.randn(*shape, generator=generator, device=DEVICE)).to(dtype)


def assert_matches_eager(fused: torch.Tensor, eager: torch.Tensor, max_ulps: int, scale: torch.Tensor,
                         is_mostly_bit_equal: bool = True) -> None:
    """Equal but for the fp32 summation order inside the mean square (and the approximate rsqrt),
    which can move a rare 16-bit element by a unit in the last place of `scale`, the magnitude
    of the terms that made it (RoPE sums two products that can cancel). In fp32 no rounding to a
    short mantissa hides those differences, so a few ulps are allowed there."""
    assert fused.shape == eager.shape and fused.dtype == eager.dtype
    is_fp32 = eager.dtype == torch.float32
    allowed = (8 if is_fp32 else max_ulps) * torch.finfo(eager.dtype).eps * scale
    excess = ((fused.float() - eager.float()).abs() - allowed).max().item()
    assert excess <= 0, f"an element differs by {excess} more than allowed"
    if is_mostly_bit_equal and not is_fp32:
        equal = (fused == eager).float().mean().item()
        assert equal >= 0.99, f"only {equal:.4f} of the elements are bit-equal"


def magnitude(x: torch.Tensor) -> torch.Tensor:
    return x.float().abs().clamp(min=torch.finfo(x.dtype).tiny)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("width", [1024, 2048, 100])
def test_rms_norm_kernel_equals_eager_chain(dtype: torch.dtype, width: int) -> None:
    x = activations(3, 5, width, dtype=dtype)
    weight = activations(width, dtype=dtype, seed=1)
    eager = fused_ops.rms_norm_eager(x, weight, 1e-6)
    assert_matches_eager(fused_ops.rms_norm(x, weight, 1e-6), eager, 1, magnitude(eager))


def test_add_rms_norm_rounds_the_sum_before_normalising() -> None:
    x, residual, weight = activations(7, 2048), activations(7, 2048, seed=2), activations(2048, seed=3)
    total, normed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(total, x + residual)
    eager = fused_ops.rms_norm_eager(x + residual, weight, 1e-6)
    assert_matches_eager(normed, eager, 1, magnitude(eager))


@pytest.mark.parametrize("length", [1, 13])
def test_qk_norm_rope_kernel_equals_eager_chain(length: int) -> None:
    batch, heads, kv_heads, head_dim = 3, 16, 8, 128
    q, k = activations(batch, length, heads, head_dim), activations(batch, length, kv_heads, head_dim, seed=4)
    q_weight, k_weight = activations(head_dim, seed=5), activations(head_dim, seed=6)
    positions = torch.arange(40, 40 + length, device=DEVICE).expand(batch, -1)
    cos, sin = rope_cos_sin(rope_inverse_frequencies(head_dim, 1e6), positions, torch.bfloat16)
    fused_q, fused_k = fused_ops.qk_norm_rope(q, k, q_weight, k_weight, 1e-6, cos, sin)
    for fused, x, weight in ((fused_q, q, q_weight), (fused_k, k, k_weight)):
        normed = fused_ops.rms_norm_eager(x, weight, 1e-6).transpose(1, 2)
        # Each output sums two products of normalised elements with cos and sin, each within 1.
        terms = normed.float().abs() + normed.float().abs().roll(head_dim // 2, dims=-1)
        # With fused multiply-adds allowed, about 11% of the outputs differed from the eager chain by an ulp.
        assert_matches_eager(fused, fused_ops.norm_rope_eager(x, weight, 1e-6, cos, sin), 4, terms)


def test_silu_mul_kernel_equals_eager_chain() -> None:
    gate, up = activations(5, 6144), activations(5, 6144, seed=7)
    eager = fused_ops.silu_mul_eager(gate, up)
    assert_matches_eager(fused_ops.silu_mul(gate, up), eager, 1, magnitude(eager))



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "channels"), [(1, 1536), (4, 1536), (80, 96), (1920, 96), (3000, 7)])
def test_snake_beta_kernel_equals_eager_chain(dtype: torch.dtype, length: int, channels: int) -> None:
    x = activations(3, length, channels, dtype=dtype)
    log_alpha = (0.3 * activations(channels, dtype=torch.float32, seed=1)).to(dtype)
    log_beta = (0.3 * activations(channels, dtype=torch.float32, seed=2)).to(dtype)
    eager = fused_ops.snake_beta_eager(x, log_alpha, log_beta)
    fused = fused_ops.snake_beta(x, log_alpha, log_beta, fused_ops.snake_beta_tables(log_alpha, log_beta))
    assert torch.equal(fused, eager), f"max difference {(fused.float() - eager.float()).abs().max().item()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "channels"), [(1, 768), (32, 768), (1920, 96)])
def test_snake_with_an_input_bias_equals_the_eager_add_then_snake(dtype: torch.dtype, length: int,
                                                                  channels: int) -> None:
    x = activations(3, length, channels, dtype=dtype)
    bias = activations(channels, dtype=dtype, seed=6)
    log_alpha = (0.3 * activations(channels, dtype=torch.float32, seed=1)).to(dtype)
    log_beta = (0.3 * activations(channels, dtype=torch.float32, seed=2)).to(dtype)
    fused = fused_ops.snake_beta(x, log_alpha, log_beta, fused_ops.snake_beta_tables(log_alpha, log_beta), bias)
    assert torch.equal(fused, fused_ops.snake_beta_eager(x + bias, log_alpha, log_beta))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_codebooks", "length"), [(15, 1), (15, 7), (1, 3)])
def test_codebook_sum_adds_the_lookups_in_the_eager_order_bit_for_bit(dtype: torch.dtype, num_codebooks: int,
                                                                      length: int) -> None:
    tables = activations(num_codebooks, 2048, 256, dtype=dtype)
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    # A slice of a wider code tensor, as the split quantizer hands each half its codebooks.
    codes = torch.randint(0, 2048, (5, num_codebooks + 1, length), generator=generator, device=DEVICE)[:, 1:]
    assert torch.equal(fused_ops.codebook_sum(codes, tables), fused_ops.codebook_sum_eager(codes, tables))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "dim"), [(1, 1024), (1, 2048), (64, 1024), (256, 2048)])
def test_frame_embedding_sums_as_torchs_reduction_then_adds_bit_for_bit(dtype: torch.dtype, batch: int,
                                                                        dim: int) -> None:
    """The talker's next input at its real shapes: codebook 0's 3072 ids and 15 tables of 2048, rows read
    through their slots, the text's embedding added."""
    sizes = torch.tensor([3072] + [2048] * 15)
    table = activations(int(sizes.sum()), dim, dtype=dtype)
    offsets = torch.cat((torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)[:-1])).to(DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    frames = torch.randint(0, 2048, (batch + 3, 16), generator=generator, device=DEVICE)
    slots = torch.randperm(batch + 3, generator=generator, device=DEVICE)[:batch]
    text = activations(batch, dim, dtype=dtype, seed=1)
    eager = F.embedding(frames[slots] + offsets, table).sum(-2) + text
    assert torch.equal(fused_ops.frame_embedding(frames, slots, table, offsets, text), eager)


@pytest.mark.parametrize(("length", "channels", "taps", "dilation"), [(1920, 96, 7, 1), (1, 96, 7, 1),
                                                                     (37, 200, 3, 2)])
def test_one_channel_convolution_is_the_exact_convolution_to_fp32_rounding(length: int, channels: int, taps: int,
                                                                           dilation: int) -> None:
    x = activations(3, length + (taps - 1) * dilation, channels, dtype=torch.float32)
    weight = activations(1, channels, taps, dtype=torch.float32, seed=1) / 30
    bias = activations(1, dtype=torch.float32, seed=2)
    assert KernelPolicy.one_channel_convolution_kernel(x, weight, bias)
    exact = torch.nn.functional.conv1d(x.double().transpose(1, 2), weight.double(), bias.double(),
                                       dilation=dilation).transpose(1, 2)
    fused = fused_ops.one_channel_convolution(x, weight, bias, dilation)
    assert fused.shape == exact.shape and fused.dtype == torch.float32
    # The rounding bound of the kernel's sum: 7 tap additions per lane, a tree of 8 levels over the lanes, the bias.
    terms = torch.nn.functional.conv1d(x.double().abs().transpose(1, 2), weight.double().abs(),
                                       dilation=dilation).transpose(1, 2)
    assert ((fused.double() - exact).abs() <= 16 * torch.finfo(torch.float32).eps * (terms + bias.abs())).all()


def test_one_channel_convolution_leaves_other_convolutions_to_cudnn() -> None:
    x = activations(2, 10, 96, dtype=torch.float32)
    bias = activations(1, dtype=torch.float32)
    assert not KernelPolicy.one_channel_convolution_kernel(x, activations(2, 96, 7, dtype=torch.float32), bias)
    assert not KernelPolicy.one_channel_convolution_kernel(x.half(), activations(1, 96, 7, dtype=torch.half),
                                                         bias.half())
    assert not KernelPolicy.one_channel_convolution_kernel(x, activations(1, 96, 7, dtype=torch.float32), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "channels"), [(1, 768), (1920, 96), (3, 7)])
def test_add_biased_equals_the_two_eager_adds(dtype: torch.dtype, length: int, channels: int) -> None:
    x, y = activations(3, length, channels, dtype=dtype), activations(3, length, channels, dtype=dtype, seed=4)
    bias = activations(channels, dtype=dtype, seed=6)
    assert torch.equal(fused_ops.add_biased(x, y, bias), x + (y + bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "channels"), [(1, 768), (1920, 96), (3, 7)])
def test_add_biased_adds_the_bias_x_was_made_without_as_an_eager_add_would(dtype: torch.dtype, length: int,
                                                                           channels: int) -> None:
    x, y = activations(3, length, channels, dtype=dtype), activations(3, length, channels, dtype=dtype, seed=4)
    bias, x_bias = activations(channels, dtype=dtype, seed=6), activations(channels, dtype=dtype, seed=7)
    assert torch.equal(fused_ops.add_biased(x, y, bias, x_bias), (x + x_bias) + (y + bias))


@pytest.mark.parametrize(("history_size", "length", "channels", "dtype"),
                         [(6, 32, 768, torch.float32), (54, 1920, 96, torch.float32), (6, 640, 192, torch.float16)])
def test_snake_after_history_with_an_input_bias_equals_the_eager_add_then_snake(history_size: int, length: int,
                                                                                channels: int,
                                                                                dtype: torch.dtype) -> None:
    """fp32 activations and parameters, the history in `dtype`: fp16 for a half-precision convolution after it."""
    log_alpha = 0.3 * activations(channels, dtype=torch.float32, seed=1)
    log_beta = 0.3 * activations(channels, dtype=torch.float32, seed=2)
    tables = fused_ops.snake_beta_tables(log_alpha, log_beta)
    history = activations(3, history_size, channels, dtype=dtype, seed=3)
    x = activations(3, length, channels, dtype=torch.float32, seed=4)
    bias = activations(channels, dtype=torch.float32, seed=5)
    activated = fused_ops.snake_beta_eager(x + bias, log_alpha, log_beta).to(dtype)
    expected = torch.cat((history, activated), dim=1)
    extended = fused_ops.snake_beta_after_history(x, log_alpha, log_beta, tables, history, bias)
    assert torch.equal(extended, expected)
    assert torch.equal(history, expected[:, -history_size:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("history_size", "length", "channels"),
                         [(1, 1, 1536), (54, 1, 96), (54, 20, 96), (6, 1920, 96), (54, 3000, 96), (18, 32, 768)])
def test_snake_after_history_writes_what_concatenating_the_eager_chain_would(dtype: torch.dtype, history_size: int,
                                                                             length: int, channels: int) -> None:
    """Twice in a row, as a stream's consecutive chunks: the second call reads the history the first left."""
    log_alpha = (0.3 * activations(channels, dtype=torch.float32, seed=1)).to(dtype)
    log_beta = (0.3 * activations(channels, dtype=torch.float32, seed=2)).to(dtype)
    tables = fused_ops.snake_beta_tables(log_alpha, log_beta)
    history = activations(3, history_size, channels, dtype=dtype, seed=3)
    expected_history = history.clone()
    for seed in (4, 5):
        x = activations(3, length, channels, dtype=dtype, seed=seed)
        expected = torch.cat((expected_history, fused_ops.snake_beta_eager(x, log_alpha, log_beta)), dim=1)
        expected_history = expected[:, -history_size:].clone()
        extended = fused_ops.snake_beta_after_history(x, log_alpha, log_beta, tables, history)
        assert torch.equal(extended, expected)
        assert torch.equal(history, expected_history)


@pytest.mark.parametrize(("length", "channels"), [(1, 1536), (1920, 96), (3000, 7)])
def test_snake_stores_fp16_for_a_half_convolution_as_the_fp32_eager_chain_then_a_cast(length: int,
                                                                                     channels: int) -> None:
    """What a half-precision convolution reads: snake of the fp32 residual stream, and snake of an fp16
    convolution output plus its fp32 bias, each worked out in fp32 and rounded to fp16 once."""
    x = activations(3, length, channels, dtype=torch.float32)
    bias = activations(channels, dtype=torch.float32, seed=6)
    log_alpha = 0.3 * activations(channels, dtype=torch.float32, seed=1)
    log_beta = 0.3 * activations(channels, dtype=torch.float32, seed=2)
    tables = fused_ops.snake_beta_tables(log_alpha, log_beta)
    fused = fused_ops.snake_beta(x, log_alpha, log_beta, tables, dtype=torch.float16)
    assert fused.dtype == torch.float16
    assert torch.equal(fused, fused_ops.snake_beta_eager(x, log_alpha, log_beta).half())
    half = x.half()
    fused = fused_ops.snake_beta(half, log_alpha, log_beta, tables, bias, dtype=torch.float16)
    assert torch.equal(fused, fused_ops.snake_beta_eager(half + bias, log_alpha, log_beta).half())


@pytest.mark.parametrize(("history_size", "length", "channels"), [(54, 1, 96), (6, 1920, 96), (1, 4, 1536)])
def test_snake_after_an_fp16_history_writes_fp16_as_the_eager_chain_then_a_cast(history_size: int, length: int,
                                                                                channels: int) -> None:
    log_alpha = 0.3 * activations(channels, dtype=torch.float32, seed=1)
    log_beta = 0.3 * activations(channels, dtype=torch.float32, seed=2)
    history = activations(3, history_size, channels, dtype=torch.float16, seed=3)
    x = activations(3, length, channels, dtype=torch.float32, seed=4)
    expected = torch.cat((history, fused_ops.snake_beta_eager(x, log_alpha, log_beta).half()), dim=1)
    extended = fused_ops.snake_beta_after_history(x, log_alpha, log_beta,
                                                  fused_ops.snake_beta_tables(log_alpha, log_beta), history)
    assert torch.equal(extended, expected)
    assert torch.equal(history, expected[:, -history_size:])


@pytest.mark.parametrize(("length", "channels"), [(1, 768), (1920, 96)])
def test_add_biased_upcasts_a_half_convolution_output_as_the_eager_adds_do(length: int, channels: int) -> None:
    x = activations(3, length, channels, dtype=torch.float32)
    y = activations(3, length, channels, dtype=torch.float16, seed=4)
    bias = activations(channels, dtype=torch.float32, seed=6)
    fused = fused_ops.add_biased(x, y, bias)
    assert fused.dtype == torch.float32
    assert torch.equal(fused, x + (y + bias))


@pytest.mark.parametrize(("start", "length"), [(0, 2), (7, 1)])
def test_qk_norm_rope_reads_one_table_row_for_every_batch_row(start: int, length: int) -> None:
    """The code predictor hands the kernel a slice of one [1, G, D] table expanded over the batch (batch stride
    0); the kernel must read what it would from that slice copied out per row."""
    batch, heads, kv_heads, head_dim = 5, 16, 8, 128
    q, k = activations(batch, length, heads, head_dim), activations(batch, length, kv_heads, head_dim, seed=4)
    q_weight, k_weight = activations(head_dim, seed=5), activations(head_dim, seed=6)
    table = rope_cos_sin(rope_inverse_frequencies(head_dim, 1e6), torch.arange(16, device=DEVICE)[None],
                         torch.bfloat16)
    shared = [t[:, start:start + length].expand(batch, -1, -1) for t in table]
    assert shared[0].stride(0) == 0
    copied = [t.contiguous() for t in shared]
    for got, want in zip(fused_ops.qk_norm_rope(q, k, q_weight, k_weight, 1e-6, *shared),
                         fused_ops.qk_norm_rope(q, k, q_weight, k_weight, 1e-6, *copied), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("length", [1, 3])
def test_qk_kernel_serves_slices_of_a_packed_projection(length: int) -> None:
    """q and k cut from one q/k/v GEMM's output are strided views; a single-token row's view may carry any stride
    in its size-1 dimension, which once sent every decode step back to the eager chain."""
    batch, heads, kv_heads, head_dim = 4, 16, 8, 128
    packed = activations(batch, length, (heads + 2 * kv_heads) * head_dim)
    q, k, _ = packed.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    q = q.view(batch, length, heads, head_dim)
    k = k.view(batch, length, kv_heads, head_dim)
    weight = activations(head_dim, seed=5)
    cos, sin = rope_cos_sin(rope_inverse_frequencies(head_dim, 1e6),
                            torch.arange(length, device=DEVICE).expand(batch, -1), torch.bfloat16)
    assert KernelPolicy.qk_norm_rope_kernel(q, k, weight, weight, cos, sin)
    for got, want in zip(fused_ops.qk_norm_rope(q, k, weight, weight, 1e-6, cos, sin),
                         fused_ops.qk_norm_rope(q.contiguous(), k.contiguous(), weight, weight, 1e-6, cos, sin),
                         strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("is_in_place", [False, True], ids=["rings-copied", "rings-in-place"])
@pytest.mark.parametrize(("num_kv_heads", "length", "positions"),
                         [(16, 1, (0, 5, 71, 72, 500)), (16, 4, (0, 70, 1000)), (8, 3, (2, 143)), (16, 64, (0, 9))])
def test_window_attention_kernel_equals_the_eager_codec_attention(num_kv_heads: int, length: int,
                                                                  positions: tuple[int, ...],
                                                                  is_in_place: bool) -> None:
    """The codec's real shapes (16 heads of 64, a 72-frame window), rows before, at and past the ring's first wrap,
    and query heads sharing key heads: the outputs agree to fp32 summation order and the rings bit for bit. In
    place, the rings are every stream's, the rows' own in another order, and the others must not move."""
    released = SpeechTokenizerConfig.parse({"decoder_config": speech_tokenizer_config_dict("1.7b")["decoder_config"]})
    config = dataclasses.replace(released.decoder, num_key_value_heads=num_kv_heads)
    attention = _Attention(config).to(DEVICE)
    attention.pack_projections()
    batch = len(positions)
    x = activations(batch, length, config.hidden_size, dtype=torch.float32)
    ring_shape = (batch, num_kv_heads, config.sliding_window, config.head_dim)
    keys, values = activations(*ring_shape, dtype=torch.float32, seed=1), activations(*ring_shape, dtype=torch.float32,
                                                                                     seed=2)
    position = torch.tensor(positions, device=DEVICE)
    inverse_frequencies = rope_inverse_frequencies(config.head_dim, config.rope_theta).to(DEVICE)
    # Every stream's rings: two more streams than rows, the rows' rings at reversed, spread-out places.
    ring_rows = torch.arange(batch, device=DEVICE).flip(0) * 2 + 1
    all_keys, all_values = (activations(2 * batch + 2, *ring_shape[1:], dtype=torch.float32, seed=seed)
                            for seed in (3, 4))
    all_keys[ring_rows], all_values[ring_rows] = keys, values
    results = []
    for is_fused in (False, True):
        attention.is_fused = is_fused
        rows = ring_rows if is_fused and is_in_place else None
        frames = _WindowFrames(position, length, config.sliding_window, rows)
        cos, sin = rope_cos_sin(inverse_frequencies, frames.query_positions, torch.float32)
        rings = (all_keys.clone(), all_values.clone()) if rows is not None else (keys.clone(), values.clone())
        with torch.inference_mode():
            out = attention(x, cos, sin, frames, *rings)
        if rows is not None:
            others = torch.ones(len(all_keys), dtype=torch.bool, device=DEVICE)
            others[rows] = False
            assert torch.equal(rings[0][others], all_keys[others]) and torch.equal(rings[1][others], all_values[others])
            rings = rings[0][rows], rings[1][rows]
        results.append((out, *rings))
    (eager, eager_keys, eager_values), (fused, fused_keys, fused_values) = results
    qkv = torch.nn.functional.linear(x, attention.qkv_weight)
    assert KernelPolicy.window_attention_kernel(qkv, cos, sin, keys, values)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    assert torch.equal(fused_keys, eager_keys) and torch.equal(fused_values, eager_values)


def test_the_fused_codec_decoder_streams_what_the_eager_one_does() -> None:
    """The released decoder's shape, random weights, fp32, streamed a frame a call as the engine serves it. With
    cuDNN's TF32 off on both sides, the kernels' only departures from the eager chain are fp32 summation orders
    (the window attention's, the last convolution's), so the waveforms agree to a few fp32 ulps of the signal."""
    config = SpeechTokenizerConfig.parse({"decoder_config": speech_tokenizer_config_dict("1.7b")["decoder_config"]})
    decoder = CodecDecoder(config.decoder).eval()
    decoder.randomize_(torch.Generator().manual_seed(0))
    decoder.to(DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    codes = torch.randint(0, config.decoder.codebook_size, (3, config.decoder.num_quantizers, 6), generator=generator,
                          device=DEVICE)
    waves = []
    allows_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for is_fused in (False, True):
            assert decoder.use_fused_kernels(is_fused) > 0
            state = decoder.new_stream_state(3)
            waves.append(torch.cat([decoder.decode_chunk(codes[:, :, frame:frame + 1], state)
                                    for frame in range(codes.shape[2])], dim=-1))
    finally:
        torch.backends.cudnn.allow_tf32 = allows_tf32
        decoder.use_fused_kernels(False)
    eager, fused = waves
    scale = eager.abs().max().item()
    assert scale > 1e-3
    assert (fused - eager).abs().max().item() <= 1e-4 * scale
