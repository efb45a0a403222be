"""The Triton decode path against the torch path, on a CUDA GPU (skipped elsewhere).

Errors are ‖out − ref‖ / ‖ref‖ per row, with the reference computed by the torch path on a
float64 copy of the same cache: fp32 must land within 1e-4, bf16 within 1e-2.
"""

from __future__ import annotations

import pytest
import torch

from tts_service.model.triton_utils import HAS_TRITON
from tts_service.runner.kv_cache import PagedDecodeBackend, PagedKVCache, PagedPrefillBackend

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON),
                                reason="needs a CUDA GPU and Triton")

HEADS, KV_HEADS = 16, 8
MAX_CONTEXT = 2000
TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-4}


def row_relative_errors(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    difference = (out.double() - reference).flatten(1).norm(dim=1)
    return difference / reference.flatten(1).norm(dim=1)


def random_cache(dtype: torch.dtype, num_blocks: int, block_size: int, head_dim: int,
                 generator: torch.Generator) -> PagedKVCache:
    cache = PagedKVCache(1, num_blocks, block_size, KV_HEADS, head_dim, dtype, "cuda")
    # Random contents everywhere, stale blocks included: zeros would hide wrong indexing.
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=generator, device="cuda"))
    return cache


def float64_copy(cache: PagedKVCache) -> PagedKVCache:
    copy = PagedKVCache(cache.num_layers, cache.num_blocks, cache.block_size, cache.num_kv_heads,
                        cache.head_dim, torch.float64, cache.device)
    copy.storage.copy_(cache.storage)
    return copy


def random_metadata(batch: int, block_size: int, generator: torch.Generator,
                    num_blocks: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Shuffled disjoint block tables and positions; the first row always has the longest context."""
    width = -(-MAX_CONTEXT // block_size)
    tables = torch.randperm(num_blocks, generator=generator)[: batch * width].view(batch, width)
    positions = torch.randint(0, MAX_CONTEXT, (batch,), generator=generator)
    positions[0] = MAX_CONTEXT - 1
    if batch > 1:
        positions[1] = 0  # a context of one token
    return tables.to(torch.int32), positions, width


def decode_inputs(batch: int, head_dim: int, dtype: torch.dtype,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v laid out as the attention module passes them: transposed views of [B, T, heads, D]."""
    def heads(count: int) -> torch.Tensor:
        sample = torch.randn(batch, 1, count, head_dim, generator=generator, device="cuda")
        return sample.to(dtype).transpose(1, 2)
    return heads(HEADS), heads(KV_HEADS), heads(KV_HEADS)


def cuda_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_triton_decode_matches_the_float64_torch_path(dtype: torch.dtype, batch: int, block_size: int,
                                                      num_splits: int | None) -> None:
    generator = cuda_generator(batch * 1000 + block_size)
    host_generator = torch.Generator().manual_seed(batch + block_size)
    width = -(-MAX_CONTEXT // block_size)
    cache = random_cache(dtype, batch * width + 3, block_size, 128, generator)
    reference_cache = float64_copy(cache)
    tables, positions, width = random_metadata(batch, block_size, host_generator, cache.num_blocks)
    query, key, value = decode_inputs(batch, 128, dtype, generator)

    backend = PagedDecodeBackend(cache, batch, width, implementation="triton", num_splits=num_splits)
    reference = PagedDecodeBackend(reference_cache, batch, width, implementation="torch")
    backend.set_metadata(tables, positions)
    reference.set_metadata(tables, positions)
    out = backend(0, query, key, value)
    expected = reference(0, query.double(), key.double(), value.double())

    assert out.dtype == dtype and out.shape == (batch, HEADS, 1, 128)
    assert torch.isfinite(out).all()
    assert row_relative_errors(out, expected).max() < TOLERANCE[dtype]
    # The store wrote exactly the new tokens: caches agree to the bit after the same rounding.
    assert torch.equal(cache.storage, reference_cache.storage.to(dtype))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 128, 256])
def test_triton_decode_handles_every_block_size_and_head_dim(head_dim: int, block_size: int) -> None:
    generator = cuda_generator(head_dim + block_size)
    host_generator = torch.Generator().manual_seed(block_size)
    batch = 5
    width = -(-MAX_CONTEXT // block_size)
    cache = random_cache(torch.bfloat16, batch * width + 1, block_size, head_dim, generator)
    reference_cache = float64_copy(cache)
    tables, positions, width = random_metadata(batch, block_size, host_generator, cache.num_blocks)
    query, key, value = decode_inputs(batch, head_dim, torch.bfloat16, generator)
    backend = PagedDecodeBackend(cache, batch, width, implementation="triton")
    reference = PagedDecodeBackend(reference_cache, batch, width, implementation="torch")
    backend.set_metadata(tables, positions)
    reference.set_metadata(tables, positions)
    out = backend(0, query, key, value)
    expected = reference(0, query.double(), key.double(), value.double())
    assert row_relative_errors(out, expected).max() < TOLERANCE[torch.bfloat16]


def test_padded_rows_leave_real_blocks_alone_and_stay_finite() -> None:
    generator = cuda_generator(11)
    host_generator = torch.Generator().manual_seed(11)
    real_rows, batch, block_size = 3, 8, 16
    width = -(-MAX_CONTEXT // block_size)
    cache = random_cache(torch.bfloat16, real_rows * width, block_size, 128, generator)
    tables, positions, width = random_metadata(real_rows, block_size, host_generator, cache.num_blocks)
    query, key, value = decode_inputs(batch, 128, torch.bfloat16, generator)
    key[real_rows:] *= 1e3
    value[real_rows:] *= 1e3

    unpadded = PagedDecodeBackend(cache, real_rows, width, implementation="triton")
    unpadded.set_metadata(tables, positions)
    before = cache.storage.clone()
    expected = unpadded(0, query[:real_rows], key[:real_rows], value[:real_rows])
    expected_storage = cache.storage.clone()
    cache.storage.copy_(before)

    padded = PagedDecodeBackend(cache, batch, width, implementation="triton")
    padded.set_metadata(tables, positions)
    out = padded(0, query, key, value)
    assert torch.isfinite(out).all()
    assert row_relative_errors(out[:real_rows], expected.double()).max() < 1e-2
    real = slice(0, cache.num_blocks)
    assert torch.equal(cache.storage[:, :, real], expected_storage[:, :, real])


@pytest.mark.parametrize("batch", [1, 7])
def test_graph_replay_with_new_metadata_matches_eager(batch: int) -> None:
    generator = cuda_generator(21 + batch)
    host_generator = torch.Generator().manual_seed(21 + batch)
    block_size, num_layers = 16, 2
    width = -(-MAX_CONTEXT // block_size)
    cache = PagedKVCache(num_layers, batch * width + 2, block_size, KV_HEADS, 128, torch.bfloat16, "cuda")
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=generator, device="cuda"))
    backend = PagedDecodeBackend(cache, batch + 1, width, implementation="triton")
    static_query, static_key, static_value = decode_inputs(batch, 128, torch.bfloat16, generator)

    def step() -> list[torch.Tensor]:
        return [backend(layer, static_query, static_key, static_value) for layer in range(num_layers)]

    tables, positions, _ = random_metadata(batch, block_size, host_generator, cache.num_blocks)
    backend.set_metadata(tables, positions)
    saved = cache.storage.clone()
    step()  # compiles the kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    cache.storage.copy_(saved)

    for _ in range(3):
        tables, positions, _ = random_metadata(batch, block_size, host_generator, cache.num_blocks)
        query, key, value = decode_inputs(batch, 128, torch.bfloat16, generator)
        reference_cache = float64_copy(cache)
        reference = PagedDecodeBackend(reference_cache, batch, width, implementation="torch")
        reference.set_metadata(tables, positions)
        static_query.copy_(query)
        static_key.copy_(key)
        static_value.copy_(value)
        backend.set_metadata(tables, positions)
        graph.replay()
        for layer in range(num_layers):
            expected = reference(layer, query.double(), key.double(), value.double())
            assert row_relative_errors(static_out[layer], expected).max() < TOLERANCE[torch.bfloat16]
        assert torch.equal(cache.storage, reference_cache.storage.to(torch.bfloat16))


def test_gpu_prefill_then_triton_decode_matches_float64_attention() -> None:
    generator = cuda_generator(31)
    lengths, block_size, num_steps = [300, 17, 1], 16, 4
    width = -(-(max(lengths) + num_steps) // block_size)
    cache = PagedKVCache(1, len(lengths) * width, block_size, KV_HEADS, 128, torch.bfloat16, "cuda")
    reference_cache = float64_copy(cache)
    tables = torch.randperm(cache.num_blocks)[: len(lengths) * width].view(len(lengths), width)
    tables = tables.to(torch.int32)
    prompt = max(lengths)
    query = torch.randn(len(lengths), HEADS, prompt, 128, generator=generator, device="cuda")
    key = torch.randn(len(lengths), KV_HEADS, prompt, 128, generator=generator, device="cuda")
    value = torch.randn(len(lengths), KV_HEADS, prompt, 128, generator=generator, device="cuda")
    for target, dtype in ((cache, torch.bfloat16), (reference_cache, torch.float64)):
        prefill = PagedPrefillBackend(target)
        prefill.set_metadata(tables, torch.tensor(lengths))
        prefill(0, query.to(dtype), key.to(dtype), value.to(dtype))

    backend = PagedDecodeBackend(cache, len(lengths), width, implementation="triton")
    reference = PagedDecodeBackend(reference_cache, len(lengths), width, implementation="torch")
    for step in range(num_steps):
        positions = torch.tensor(lengths) + step
        backend.set_metadata(tables, positions)
        reference.set_metadata(tables, positions)
        step_query, step_key, step_value = decode_inputs(len(lengths), 128, torch.bfloat16, generator)
        out = backend(0, step_query, step_key, step_value)
        expected = reference(0, step_query.double(), step_key.double(), step_value.double())
        assert row_relative_errors(out, expected).max() < TOLERANCE[torch.bfloat16]
