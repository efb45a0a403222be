"""Checks of the decode attention kernel for Triton's interpreter, run by `test_kv_cache` in a process of its own
(the interpreter must be on before Triton is imported)."""

from __future__ import annotations

import torch

from tts_service.runner.kv_cache import PagedKVCache, decode_attention_torch, decode_attention_triton, flat_slots


def check_the_last_split_combines_as_the_combine_launch_does(num_splits: int) -> None:
    """The splits combined by the last of them to finish give the second launch's output exactly (the same
    reduction), rows with contexts shorter than a split's share included, and every counter is zero again."""
    generator = torch.Generator().manual_seed(num_splits)
    batch, heads, kv_heads, head_dim, block_size = 3, 4, 2, 16, 128
    caches = [PagedKVCache(1, 9, block_size, kv_heads, head_dim, torch.float32, "cpu") for _ in range(2)]
    contents = torch.randn(caches[0].storage.shape, generator=generator)
    for cache in caches:
        cache.storage.copy_(contents)
    tables = torch.tensor([[0, 3, 6], [1, 4, 7], [2, 5, 8]], dtype=torch.int32)
    positions = torch.tensor([270, 5, 60])
    q = torch.randn(batch, heads, head_dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, head_dim, generator=generator) for _ in range(2))
    arrivals = torch.zeros(batch, kv_heads, dtype=torch.int32)

    combined_in_place = decode_attention_triton(caches[0].layer(0), q, k, v, tables, positions,
                                                caches[0].scratch_block, num_splits, arrivals)
    combined_after = decode_attention_triton(caches[1].layer(0), q, k, v, tables, positions,
                                             caches[1].scratch_block, num_splits)
    assert torch.equal(combined_in_place, combined_after)
    assert torch.equal(caches[0].storage, caches[1].storage)
    assert not arrivals.any()


def check_the_kernel_attends_as_dense_attention_does(num_splits: int, early: int) -> None:
    """Rows of one tile, of several, and one ending inside a split's first tile: the kernel's output equals dense
    attention over the cache it left (holding the new key and value at each row's position), with each split's
    first tile loaded ahead of the query (`early`, as at one row on a GPU) or in the loop."""
    generator = torch.Generator().manual_seed(100 + num_splits)
    batch, heads, kv_heads, head_dim, block_size = 3, 4, 2, 16, 32
    cache = PagedKVCache(1, 9, block_size, kv_heads, head_dim, torch.float32, "cpu")
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=generator))
    tables = torch.tensor([[0, 3, 6], [1, 4, 7], [2, 5, 8]], dtype=torch.int32)
    positions = torch.tensor([90, 5, 33])
    q = torch.randn(batch, heads, head_dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, head_dim, generator=generator) for _ in range(2))
    out = decode_attention_triton(cache.layer(0), q, k, v, tables, positions, cache.scratch_block, num_splits,
                                  torch.zeros(batch, kv_heads, dtype=torch.int32), bool(early))
    slots = flat_slots(tables, positions, block_size, cache.scratch_block)
    flat_keys = cache.layer(0)[0].reshape(-1, kv_heads, head_dim)
    assert torch.equal(flat_keys[slots], k)
    expected = decode_attention_torch(cache.layer(0), q[:, :, None], tables, positions)[:, :, 0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
