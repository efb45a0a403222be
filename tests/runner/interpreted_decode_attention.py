"""Checks of the decode attention kernel for Triton's interpreter, run by `test_kv_cache` in a process of its own
(the interpreter must be on before Triton is imported)."""

from __future__ import annotations

import torch

from tts_service.runner.kv_cache import PagedKVCache, decode_attention_torch, decode_attention_triton, flat_slots

_BATCH, _HEADS, _KV_HEADS, _HEAD_DIM = 3, 4, 2, 16
# Three rows, each with three blocks of a 9-block cache, interleaved.
_TABLES = torch.tensor([[0, 3, 6], [1, 4, 7], [2, 5, 8]], dtype=torch.int32)


def _random_step(seed: int, block_size: int,
                 num_caches: int) -> tuple[list[PagedKVCache], torch.Tensor, torch.Tensor, torch.Tensor]:
    """`num_caches` fp32 caches holding the same random contents, and a step's random q, k, v."""
    generator = torch.Generator().manual_seed(seed)
    caches = [PagedKVCache(1, 9, block_size, _KV_HEADS, _HEAD_DIM, torch.float32, "cpu") for _ in range(num_caches)]
    contents = torch.randn(caches[0].storage.shape, generator=generator)
    for cache in caches:
        cache.storage.copy_(contents)
    q = torch.randn(_BATCH, _HEADS, _HEAD_DIM, generator=generator)
    k, v = (torch.randn(_BATCH, _KV_HEADS, _HEAD_DIM, generator=generator) for _ in range(2))
    return caches, q, k, v


def check_the_last_split_combines_as_the_combine_launch_does(num_splits: int) -> None:
    """The splits combined by the last of them to finish give the second launch's output exactly (the same
    reduction), rows with contexts shorter than a split's share included, and every counter is zero again."""
    positions = torch.tensor([270, 5, 60])
    caches, q, k, v = _random_step(num_splits, block_size=128, num_caches=2)
    arrivals = torch.zeros(_BATCH, _KV_HEADS, dtype=torch.int32)

    combined_in_place = decode_attention_triton(caches[0].layer(0), q, k, v, _TABLES, positions,
                                                caches[0].scratch_block, num_splits, arrivals)
    combined_after = decode_attention_triton(caches[1].layer(0), q, k, v, _TABLES, positions,
                                             caches[1].scratch_block, num_splits)
    assert torch.equal(combined_in_place, combined_after)
    assert torch.equal(caches[0].storage, caches[1].storage)
    assert not arrivals.any()


def check_the_kernel_attends_as_dense_attention_does(num_splits: int, early: int) -> None:
    """Rows of one tile, of several, and one ending inside a split's first tile: the kernel's output equals dense
    attention over the cache it left (holding the new key and value at each row's position), with each split's
    first tile loaded ahead of the query (`early`, as at one row on a GPU) or in the loop."""
    positions = torch.tensor([90, 5, 33])
    (cache,), q, k, v = _random_step(100 + num_splits, block_size=32, num_caches=1)
    out = decode_attention_triton(cache.layer(0), q, k, v, _TABLES, positions, cache.scratch_block, num_splits,
                                  torch.zeros(_BATCH, _KV_HEADS, dtype=torch.int32), bool(early))
    slots = flat_slots(_TABLES, positions, cache.block_size, cache.scratch_block)
    flat_keys = cache.layer(0)[0].reshape(-1, _KV_HEADS, _HEAD_DIM)
    assert torch.equal(flat_keys[slots], k)
    expected = decode_attention_torch(cache.layer(0), q[:, :, None], _TABLES, positions)[:, :, 0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
