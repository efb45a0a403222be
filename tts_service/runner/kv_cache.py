"""Paged (block) key/value memory for the talker, and the attention backends that read it.

Layout. One tensor `[num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim]` is
allocated once; `layer(i)` is a view `[2, blocks, block_size, KV, D]` (keys at 0, values at 1).
One allocation rather than one per layer because it is sized exactly from the memory budget, it
cannot fragment the allocator between layers, and every layer view has the same strides, so a
kernel is specialised (compiled) once for all 28 layers.

Block ids. Blocks `0 .. num_blocks - 1` are the ones the scheduler's `BlockAllocator` hands
out. One more block, `scratch_block == num_blocks`, is never handed out: padded rows of a
batch point every block-table entry at it and use position 0. A padded row then writes its
(meaningless) K/V into the scratch block, attends over that one freshly written token and gets
a finite output, while no real row's block is ever touched. Unused block-table entries of real
rows also hold the scratch id, so every id the backends read is a valid index.

The cache is zero-initialised so that nothing ever read from it is NaN/Inf bit noise; the torch
path additionally zeroes keys and values outside each row's context before the matmuls, because
a masked score does not stop `0 * NaN` in `probabilities @ values`.

Decode metadata lives in static tensors owned by `PagedDecodeBackend` (`block_tables`,
`positions`), written by `set_metadata` before a forward. The backend call reads them only on
the device, so it can be captured in a CUDA graph and replayed after new metadata is copied
into the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import repeat_kv
from tts_service.model.triton_utils import gdc_launch_dependents, gdc_wait, launches_early, tl, triton

Implementation = Literal["auto", "triton", "torch"]

# Tokens per inner-loop tile of the decode kernel. Independent of block_size: every token finds
# its block through the block table, so any block size works with any tile.
_TILE_16BIT = 64
_TILE_32BIT = 32  # fp32 tiles are twice the bytes; keeps the pipelined shared memory modest
_MAX_SPLITS = 16
_LOG2_E = 1.4426950408889634


class PagedKVCache:
    """Block-paged K/V storage for every layer, allocated once."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.storage = torch.zeros(num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim,
                                   dtype=dtype, device=self.device)

    @property
    def scratch_block(self) -> int:
        """The reserved block padded rows write to; never a real request's block."""
        return self.num_blocks

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across all layers, keys and values."""
        return self.block_bytes(self.num_layers, self.block_size, self.num_kv_heads, self.head_dim,
                                self.dtype)

    @property
    def total_bytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
        element_size = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * block_size * num_kv_heads * head_dim * element_size

    @classmethod
    def num_blocks_for_budget(cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
                              head_dim: int, dtype: torch.dtype) -> int:
        """Usable blocks (scratch block excluded) whose whole allocation fits in `budget_bytes`."""
        per_block = cls.block_bytes(num_layers, block_size, num_kv_heads, head_dim, dtype)
        usable = budget_bytes // per_block - 1
        if usable < 1:
            raise ValueError(f"a budget of {budget_bytes} bytes holds no usable KV block "
                             f"({per_block} bytes each, plus one scratch block)")
        return usable

    def layer(self, layer_index: int) -> torch.Tensor:
        """[2, num_blocks + 1, block_size, KV, D] view: keys at 0, values at 1."""
        return self.storage[layer_index]

    def keys(self, layer_index: int) -> torch.Tensor:
        return self.storage[layer_index, 0]

    def values(self, layer_index: int) -> torch.Tensor:
        return self.storage[layer_index, 1]


# ---------------------------------------------------------------------------------------------
# Torch path: the CPU implementation and the reference the Triton kernels are checked against.
# ---------------------------------------------------------------------------------------------

def flat_slots(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int,
               scratch_block: int) -> torch.Tensor:
    """Flat slot index (block * block_size + offset) of each position; positions [B, ...].

    A position past the end of its row's block table lands in the scratch block rather than
    indexing out of bounds or into another row's memory.
    """
    width = block_tables.shape[1]
    block_index = torch.div(positions, block_size, rounding_mode="floor")
    in_range = block_index < width
    flat_index = block_index.clamp(max=width - 1).reshape(positions.shape[0], -1)
    blocks = block_tables.gather(1, flat_index).reshape(positions.shape).long()
    blocks = torch.where(in_range, blocks, scratch_block)
    return blocks * block_size + positions % block_size


def store_kv_torch(layer_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   slots: torch.Tensor) -> None:
    """key/value [N, KV, D] into the flat slots [N] of a layer view [2, blocks, block_size, KV, D]."""
    flat = layer_cache.flatten(1, 2)  # [2, blocks * block_size, KV, D]
    flat[0, slots] = key
    flat[1, slots] = value


def gather_dense(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size, KV, D] through block_tables [B, M] -> [B, KV, M * block_size, D]."""
    gathered = cache[block_tables.long()]  # [B, M, block_size, KV, D]
    batch, width, block_size, kv_heads, dim = gathered.shape
    return gathered.reshape(batch, width * block_size, kv_heads, dim).transpose(1, 2)


def _masked_dense(cache: torch.Tensor, block_tables: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    # Zeroing what lies outside the context keeps stale or scratch contents out of the matmuls.
    return torch.where(key_valid[:, None, :, None], gather_dense(cache, block_tables), 0)


def decode_attention_torch(layer_cache: torch.Tensor, query: torch.Tensor, block_tables: torch.Tensor,
                           positions: torch.Tensor) -> torch.Tensor:
    """query [B, H, 1, D] over positions 0..positions[b] of each row -> [B, H, 1, D]."""
    span = block_tables.shape[1] * layer_cache.shape[2]
    key_valid = torch.arange(span, device=query.device)[None, :] <= positions[:, None]
    num_heads = query.shape[1]
    keys = repeat_kv(_masked_dense(layer_cache[0], block_tables, key_valid), num_heads)
    values = repeat_kv(_masked_dense(layer_cache[1], block_tables, key_valid), num_heads)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=key_valid[:, None, None, :])


# ---------------------------------------------------------------------------------------------
# Triton path (CUDA only).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _cache_slot(block_tables_ptr, row, position, head, stride_table_row, max_blocks, scratch_block,
                stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE: tl.constexpr):
    """Where a row's token at `position` lives for one kv head; past the row's table, the scratch block."""
    block_index = position // BLOCK_SIZE
    in_range = block_index < max_blocks
    block = tl.load(block_tables_ptr + row.to(tl.int64) * stride_table_row
                    + tl.minimum(block_index, max_blocks - 1))
    block = tl.where(in_range, block, scratch_block)
    return (block.to(tl.int64) * stride_cache_block
            + (position % BLOCK_SIZE).to(tl.int64) * stride_cache_slot + head * stride_cache_head)


@triton.jit
def _store_kv_kernel(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, positions_ptr,
                     stride_kb, stride_kh, stride_vb, stride_vh,
                     stride_cache_block, stride_cache_slot, stride_cache_head,
                     stride_table_row, max_blocks, scratch_block,
                     HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    slot = _cache_slot(block_tables_ptr, row, tl.load(positions_ptr + row), head, stride_table_row, max_blocks,
                       scratch_block, stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_DIM)
    key = tl.load(key_ptr + row.to(tl.int64) * stride_kb + head * stride_kh + dims)
    value = tl.load(value_ptr + row.to(tl.int64) * stride_vb + head * stride_vh + dims)
    tl.store(key_cache_ptr + slot + dims, key)
    tl.store(value_cache_ptr + slot + dims, value)


@triton.jit
def _split_tiles(position, split, max_blocks, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                 NUM_SPLITS: tl.constexpr):
    """The row's context and the tiles [first, last) of it that this split attends."""
    # Clamping to the table's span keeps a bad position from reading past the row's table.
    context = tl.minimum(position + 1, max_blocks * BLOCK_SIZE).to(tl.int32)
    num_tiles = tl.cdiv(context, TILE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    first_tile = split * tiles_per_split
    return context, first_tile, tl.minimum(first_tile + tiles_per_split, num_tiles)


@triton.jit
def _tile_slots(table_row, tile, context, kv_head, stride_cache_block, stride_cache_slot, stride_cache_head,
                HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """A tile's tokens, which of them are inside the context, and where their keys (and values) lie."""
    dims = tl.arange(0, HEAD_DIM)
    tokens = tile * TILE + tl.arange(0, TILE)
    valid = tokens < context
    blocks = tl.load(table_row + tokens // BLOCK_SIZE, mask=valid, other=0)
    slots = (blocks.to(tl.int64) * stride_cache_block
             + (tokens % BLOCK_SIZE).to(tl.int64) * stride_cache_slot + kv_head * stride_cache_head)
    return tokens, valid, slots[:, None] + dims[None, :]


@triton.jit
def _attend_tile(query, tokens, valid, addresses, key_cache_ptr, value_cache_ptr, keys_ahead, values_ahead,
                 position, new_key, new_value, running_max, running_sum, acc, scale_log2,
                 DOT_PRECISION: tl.constexpr, AHEAD: tl.constexpr):
    """One tile into the online softmax; the row's new key and value stand in for its slot's old contents.
    With AHEAD the tile's keys and values were loaded already; else each loads here, the values after the
    keys are in hand (loading both first made 256 rows 3.5% slower: BENCHMARKS.md at 2dbe081)."""
    is_new = (tokens == position)[:, None]
    keys = keys_ahead if AHEAD else tl.load(key_cache_ptr + addresses, mask=valid[:, None], other=0.0)
    keys = tl.where(is_new, new_key[None, :], keys)
    values = values_ahead if AHEAD else tl.load(value_cache_ptr + addresses, mask=valid[:, None], other=0.0)
    values = tl.where(is_new, new_value[None, :], values)
    scores = tl.dot(query, tl.trans(keys), input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(valid[None, :], scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    rescale = tl.exp2(running_max - new_max)
    probabilities = tl.exp2(scores - new_max[:, None])
    running_sum = running_sum * rescale + tl.sum(probabilities, 1)
    acc = acc * rescale[:, None] + tl.dot(probabilities.to(values.dtype), values, input_precision=DOT_PRECISION)
    return new_max, running_sum, acc


@triton.jit
def _decode_attention_kernel(query_ptr, key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr,
                             positions_ptr, out_ptr, lse_ptr, combined_ptr, arrivals_ptr,
                             stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
                             stride_cache_block, stride_cache_slot, stride_cache_head,
                             stride_table_row,
                             stride_ob, stride_oh, stride_osplit,
                             stride_lb, stride_lh, stride_cb, stride_ch,
                             scale_log2, max_blocks, scratch_block,
                             GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
                             DOT_PRECISION: tl.constexpr, COMBINES: tl.constexpr, SPLITS_POW2: tl.constexpr,
                             FIRST_TILE_AHEAD: tl.constexpr, LAUNCHES_EARLY: tl.constexpr):
    """One program per (row, kv head, split): all query heads of the group, online softmax. The row's new key
    and value are attended from the registers and written to the cache by split 0: no program reads that
    slot's memory for anything it keeps, so no other launch has to store them first. With COMBINES, the
    last split of a (row, kv head) to finish combines the group's splits (`_combine_head`, read through L2)
    and resets its counter, in place of a second launch. With FIRST_TILE_AHEAD the first tile of the cache
    loads before the query, and with LAUNCHES_EARLY (a programmatic dependent) the position, the block table
    and that tile load while the kernel before finishes: the caller vouches that they were written before it
    began (the step's metadata, positions held before this step); only the query and the new key and value
    wait for it."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    dims = tl.arange(0, HEAD_DIM)
    position = tl.load(positions_ptr + row)
    if FIRST_TILE_AHEAD:
        context, first_tile, last_tile = _split_tiles(position, split, max_blocks, BLOCK_SIZE, TILE, NUM_SPLITS)
        table_row = block_tables_ptr + row.to(tl.int64) * stride_table_row
        first_tokens, first_valid, first_addresses = _tile_slots(
            table_row, first_tile, context, kv_head, stride_cache_block, stride_cache_slot, stride_cache_head,
            HEAD_DIM, BLOCK_SIZE, TILE)
        first_keys = tl.load(key_cache_ptr + first_addresses, mask=first_valid[:, None], other=0.0)
        first_values = tl.load(value_cache_ptr + first_addresses, mask=first_valid[:, None], other=0.0)
    if LAUNCHES_EARLY:
        gdc_launch_dependents()
        gdc_wait()
    new_key = tl.load(key_ptr + row.to(tl.int64) * stride_kb + kv_head * stride_kh + dims)
    new_value = tl.load(value_ptr + row.to(tl.int64) * stride_vb + kv_head * stride_vh + dims)
    if split == 0:
        slot = _cache_slot(block_tables_ptr, row, position, kv_head, stride_table_row, max_blocks, scratch_block,
                           stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE)
        tl.store(key_cache_ptr + slot + dims, new_key)
        tl.store(value_cache_ptr + slot + dims, new_value)

    heads = tl.arange(0, BLOCK_H)
    head_valid = heads < GROUP
    query_heads = kv_head * GROUP + heads
    # Rows of the group beyond GROUP load zeros: tl.dot needs >= 16 rows, and zeros stay finite.
    query_rows = query_ptr + row.to(tl.int64) * stride_qb + query_heads[:, None] * stride_qh
    query = tl.load(query_rows + dims[None, :], mask=head_valid[:, None], other=0.0)
    if not FIRST_TILE_AHEAD:
        # Worked out after the loads, as this kernel always did: the only difference left from 36d0d5a's kernel
        # when 256 rows ran 0.9% slower than with it (BENCHMARKS.md at 2dbe081).
        context, first_tile, last_tile = _split_tiles(position, split, max_blocks, BLOCK_SIZE, TILE, NUM_SPLITS)
        table_row = block_tables_ptr + row.to(tl.int64) * stride_table_row

    running_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    # Every tile in [first_tile, last_tile) holds at least one valid token, so running_max is
    # finite after the first one and exp2(-inf - finite) = 0 rescales the empty start.
    if FIRST_TILE_AHEAD:  # noqa: SIM102 - a compile-time branch: the first tile's names exist only in it
        if first_tile < last_tile:
            running_max, running_sum, acc = _attend_tile(
                query, first_tokens, first_valid, first_addresses, key_cache_ptr, value_cache_ptr, first_keys,
                first_values, position, new_key, new_value, running_max, running_sum, acc, scale_log2,
                DOT_PRECISION, True)
    for tile in range(first_tile + FIRST_TILE_AHEAD, last_tile):
        tokens, valid, addresses = _tile_slots(table_row, tile, context, kv_head, stride_cache_block,
                                               stride_cache_slot, stride_cache_head, HEAD_DIM, BLOCK_SIZE, TILE)
        running_max, running_sum, acc = _attend_tile(query, tokens, valid, addresses, key_cache_ptr,
                                                     value_cache_ptr, None, None, position, new_key, new_value,
                                                     running_max, running_sum, acc, scale_log2, DOT_PRECISION,
                                                     False)

    out_rows = out_ptr + row.to(tl.int64) * stride_ob + query_heads[:, None] * stride_oh + dims[None, :]
    if NUM_SPLITS == 1:
        out = acc / running_sum[:, None]
        tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=head_valid[:, None])
    else:
        # A split past the row's last tile has seen nothing: it reports lse = -inf, weight 0.
        seen = running_sum > 0
        safe_sum = tl.where(seen, running_sum, 1.0)
        lse = tl.where(seen, running_max + tl.log2(safe_sum), float("-inf"))
        tl.store(out_rows + split * stride_osplit, acc / safe_sum[:, None], mask=head_valid[:, None])
        tl.store(lse_ptr + row.to(tl.int64) * stride_lb + query_heads * stride_lh + split, lse,
                 mask=head_valid)
        if COMBINES:
            # Released after every thread's stores, so the last split to count in sees them all (acquired).
            tl.debug_barrier()
            counter = arrivals_ptr + row.to(tl.int64) * tl.num_programs(1) + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
                tl.debug_barrier()
                for member in tl.static_range(GROUP):
                    _combine_head(out_ptr, lse_ptr, combined_ptr, row, kv_head * GROUP + member,
                                  stride_ob, stride_oh, stride_osplit, stride_lb, stride_lh, stride_cb,
                                  stride_ch, NUM_SPLITS, SPLITS_POW2, HEAD_DIM, ".cg")
                tl.store(counter, 0)


@triton.jit
def _combine_head(partial_ptr, lse_ptr, out_ptr, row, head, stride_pb, stride_ph, stride_psplit, stride_lb,
                  stride_lh, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr,
                  HEAD_DIM: tl.constexpr, CACHE: tl.constexpr):
    """One (row, head)'s output from its splits' partial outputs, weighted by their log-sum-exps."""
    splits = tl.arange(0, SPLITS_POW2)
    split_valid = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(lse_ptr + row.to(tl.int64) * stride_lb + head * stride_lh + splits,
                  mask=split_valid, other=float("-inf"), cache_modifier=CACHE)
    # Split 0 always covers the first tile, so the maximum is finite.
    weights = tl.exp2(lse - tl.max(lse, 0))
    partial = tl.load(partial_ptr + row.to(tl.int64) * stride_pb + head * stride_ph
                      + splits[:, None] * stride_psplit + dims[None, :],
                      mask=split_valid[:, None], other=0.0, cache_modifier=CACHE)
    out = tl.sum(partial * weights[:, None], 0) / tl.sum(weights, 0)
    out_row = out_ptr + row.to(tl.int64) * stride_ob + head * stride_oh
    tl.store(out_row + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _combine_splits_kernel(partial_ptr, lse_ptr, out_ptr,
                           stride_pb, stride_ph, stride_psplit, stride_lb, stride_lh,
                           stride_ob, stride_oh,
                           NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, HEAD_DIM: tl.constexpr):
    _combine_head(partial_ptr, lse_ptr, out_ptr, tl.program_id(0), tl.program_id(1), stride_pb, stride_ph,
                  stride_psplit, stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS, SPLITS_POW2, HEAD_DIM,
                  "")


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    # The kernels address head_dim as contiguous; a stride check is static, so capture-safe.
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _tile_for(dtype: torch.dtype) -> int:
    return _TILE_32BIT if dtype == torch.float32 else _TILE_16BIT


def _decode_tile(dtype: torch.dtype, span: int) -> int:
    # A row's span can be shorter than a tile (the code predictor holds 16 positions): a smaller tile skips
    # masked work. tl.dot needs at least 16.
    return min(_tile_for(dtype), max(16, triton.next_power_of_2(span)))


def store_kv_triton(layer_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    block_tables: torch.Tensor, positions: torch.Tensor, scratch_block: int) -> None:
    """key/value [B, KV, D] written at each row's position through its block table."""
    key_cache, value_cache = layer_cache[0], layer_cache[1]
    key, value = _unit_last_stride(key), _unit_last_stride(value)
    batch, kv_heads, head_dim = key.shape
    _store_kv_kernel[(batch, kv_heads)](
        key, value, key_cache, value_cache, block_tables, positions,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), block_tables.shape[1], scratch_block,
        HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1], num_warps=1)


def decode_attention_triton(layer_cache: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            block_tables: torch.Tensor, positions: torch.Tensor, scratch_block: int,
                            num_splits: int, split_arrivals: torch.Tensor | None = None,
                            early: bool = False) -> torch.Tensor:
    """Stores each row's new key/value [B, KV, D] at its position (as `store_kv_triton` does) and attends with
    query [B, H, D] over positions 0..positions[b] -> [B, H, D], in one launch; split-K when num_splits > 1,
    the splits combined by a second launch, or, given `split_arrivals` (int32 zeros, [>= B, KV] contiguous,
    left zero again), by the last split of each (row, kv head) to finish. With `early`, each program loads its
    first tile of the cache before the query and, on Hopper, launches as a programmatic dependent that reads the
    positions, block tables and that tile while the kernel before it finishes: the caller vouches that all of
    these were written before that kernel began."""
    key_cache, value_cache = layer_cache[0], layer_cache[1]
    query, key, value = _unit_last_stride(query), _unit_last_stride(key), _unit_last_stride(value)
    batch, num_heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    group = num_heads // kv_heads
    out = torch.empty(batch, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_splits == 1:
        target, lse = out, out  # lse is unused when there is one split
        target_strides = (out.stride(0), out.stride(1), 0)
        lse_strides = (0, 0)
    else:
        target = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=query.device)
        target_strides = (target.stride(0), target.stride(1), target.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    combines = num_splits > 1 and split_arrivals is not None
    dependent = early and launches_early(query.device)
    _decode_attention_kernel[(batch, kv_heads, num_splits)](
        query, key, value, key_cache, value_cache, block_tables, positions, target, lse, out,
        split_arrivals if combines else positions,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), *target_strides, *lse_strides, out.stride(0), out.stride(1),
        _LOG2_E / math.sqrt(head_dim), block_tables.shape[1], scratch_block,
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=key_cache.shape[1], TILE=_decode_tile(query.dtype, block_tables.shape[1] * key_cache.shape[1]),
        NUM_SPLITS=num_splits,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", COMBINES=combines,
        SPLITS_POW2=triton.next_power_of_2(num_splits), FIRST_TILE_AHEAD=early, LAUNCHES_EARLY=dependent,
        num_warps=4, launch_pdl=dependent)
    if num_splits > 1 and not combines:
        _combine_splits_kernel[(batch, num_heads)](
            target, lse, out, target.stride(0), target.stride(1), target.stride(2),
            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, SPLITS_POW2=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
            num_warps=4)
    return out


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, tile: int, num_sms: int) -> int:
    """Context splits so that small batches still put about two programs on every SM.

    A function of static sizes only, so a graph captured for a batch size keeps its split count.
    """
    programs = batch * num_kv_heads
    wanted = (2 * num_sms) // programs
    max_useful = max(1, -(-max_context // tile))
    return max(1, min(_MAX_SPLITS, wanted, max_useful))


# ---------------------------------------------------------------------------------------------
# Backends.
# ---------------------------------------------------------------------------------------------

def _check_shapes(cache: PagedKVCache, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    # Static checks only (shapes and dtypes), so they are safe inside graph capture.
    if key.shape != value.shape or key.shape[1] != cache.num_kv_heads or key.shape[3] != cache.head_dim:
        raise ValueError(f"key/value {tuple(key.shape)}/{tuple(value.shape)} do not fit the cache "
                         f"({cache.num_kv_heads} kv heads of {cache.head_dim})")
    grouped = query.shape[1] % cache.num_kv_heads == 0
    if query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2] or not grouped:
        raise ValueError(f"query {tuple(query.shape)} does not match key {tuple(key.shape)}")
    if key.dtype != cache.dtype or query.dtype != cache.dtype:
        raise ValueError(f"query/key dtype {query.dtype}/{key.dtype} differs from the cache's {cache.dtype}")


def validate_host_metadata(cache: PagedKVCache, block_tables: torch.Tensor, positions: torch.Tensor,
                            ends: torch.Tensor) -> None:
    """Value checks, run only on host tensors so that setting device metadata never syncs."""
    if block_tables.device.type != "cpu" or positions.device.type != "cpu" or ends.device.type != "cpu":
        return
    if block_tables.numel() and (block_tables.min() < 0 or block_tables.max() > cache.scratch_block):
        raise ValueError(f"block ids must lie in [0, {cache.scratch_block}]")
    if positions.numel() and positions.min() < 0:
        raise ValueError("positions must be >= 0")
    if ends.numel() and ends.max() > block_tables.shape[1] * cache.block_size:
        raise ValueError(f"a row reaches position {int(ends.max()) - 1}, past its "
                         f"{block_tables.shape[1]} blocks of {cache.block_size}")


class PagedDecodeBackend:
    """One new token per row (T == 1), graph-capturable.

    Static metadata, [max_batch_size] rows, of which a call with batch B uses the first B:
      block_tables [max_batch_size, max_blocks_per_seq] int32: the row's block ids in order;
      positions [max_batch_size] int64: where this step's token is written (context = position + 1).
    `set_metadata` fills them and points every row it is not given at the scratch block.
    """

    def __init__(self, cache: PagedKVCache, max_batch_size: int, max_blocks_per_seq: int,
                 implementation: Implementation = "auto", num_splits: int | None = None) -> None:
        if max_batch_size <= 0 or max_blocks_per_seq <= 0:
            raise ValueError("max_batch_size and max_blocks_per_seq must be > 0")
        kernel_serves = KernelPolicy.decode_attention_kernel(cache.device, cache.dtype, cache.head_dim)
        if implementation == "triton" and not kernel_serves:
            raise RuntimeError("the Triton decode path needs Triton, a CUDA cache, a power-of-two head_dim "
                               "and a bf16/fp16/fp32 cache")
        if num_splits is not None and not 1 <= num_splits <= _MAX_SPLITS:
            raise ValueError(f"num_splits must be in [1, {_MAX_SPLITS}], got {num_splits}")
        self.cache = cache
        self.use_triton = implementation == "triton" or (implementation == "auto" and kernel_serves)
        self.fixed_num_splits = num_splits
        self.block_tables = torch.full((max_batch_size, max_blocks_per_seq), cache.scratch_block,
                                       dtype=torch.int32, device=cache.device)
        self.positions = torch.zeros(max_batch_size, dtype=torch.int64, device=cache.device)
        # Each (row, kv head)'s count of finished splits, zero between launches (the last split resets it).
        self.split_arrivals = torch.zeros(max_batch_size, cache.num_kv_heads, dtype=torch.int32, device=cache.device)
        # A decode step's metadata is uploaded, and the positions it holds written, before the step's first
        # kernel, an ordinary launch that every later one follows: the kernel may read them while the one before
        # it finishes. At one row only: there a frame took 0.09-0.10 ms less, at two rows 0.09 less at 0.6B but
        # 0.05 more at 1.7B (BENCHMARKS.md at 2dbe081).
        self.launches_early = self.use_triton and launches_early(cache.device)
        self._num_sms = (torch.cuda.get_device_properties(cache.device).multi_processor_count
                         if self.use_triton else 0)

    @property
    def max_batch_size(self) -> int:
        return self.block_tables.shape[0]

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_tables.shape[1]

    def set_metadata(self, block_tables: torch.Tensor, positions: torch.Tensor) -> None:
        """Copy a step's metadata into the static tensors (outside any captured region).

        block_tables [n, <= max_blocks_per_seq], positions [n]; rows n.. become padding.
        """
        rows, width = block_tables.shape
        if rows > self.max_batch_size or width > self.max_blocks_per_seq or positions.shape != (rows,):
            raise ValueError(f"metadata {tuple(block_tables.shape)}/{tuple(positions.shape)} exceeds "
                             f"({self.max_batch_size}, {self.max_blocks_per_seq})")
        validate_host_metadata(self.cache, block_tables, positions, positions + 1)
        self.block_tables.fill_(self.cache.scratch_block)
        self.block_tables[:rows, :width].copy_(block_tables, non_blocking=True)
        self.positions.zero_()
        self.positions[:rows].copy_(positions, non_blocking=True)

    def num_splits(self, batch: int) -> int:
        if not self.use_triton:
            return 1
        if self.fixed_num_splits is not None:
            return self.fixed_num_splits
        span = self.max_blocks_per_seq * self.cache.block_size
        tile = _tile_for(self.cache.dtype)
        return choose_num_splits(batch, self.cache.num_kv_heads, span, tile, self._num_sms)

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        _check_shapes(self.cache, query, key, value)
        batch = query.shape[0]
        if query.shape[2] != 1:
            raise ValueError(f"decode takes one token per row, got {query.shape[2]}")
        if batch > self.max_batch_size:
            raise ValueError(f"batch {batch} exceeds max_batch_size {self.max_batch_size}")
        block_tables = self.block_tables[:batch]
        positions = self.positions[:batch]
        layer_cache = self.cache.layer(layer_index)
        if self.use_triton:
            out = decode_attention_triton(layer_cache, query[:, :, 0], key[:, :, 0], value[:, :, 0], block_tables,
                                          positions, self.cache.scratch_block, self.num_splits(batch),
                                          self.split_arrivals, self.launches_early and batch == 1)
            return out[:, :, None]
        slots = flat_slots(block_tables, positions, self.cache.block_size, self.cache.scratch_block)
        store_kv_torch(layer_cache, key[:, :, 0], value[:, :, 0], slots)
        return decode_attention_torch(layer_cache, query, block_tables, positions)


class PagedPrefillBackend:
    """New tokens for a batch of rows, right-padded to [B, T].

    Metadata (set with `set_metadata` before the forward, or bound once with `bind_static` to
    device tensors the caller refills in place, which makes the forward graph-capturable):
      block_tables [B, M] int32: each row's block ids; M bounds the attended span, so a table
        trimmed to the widest row's blocks keeps the dense gather small;
      lengths [B]: valid tokens per row (the rest of the T columns are padding);
      start_positions [B]: positions the row already holds (0..start-1), attended from the cache.
    Token j of row b is written at position start[b] + j. Padding tokens write to the scratch
    block, and their (unused) outputs stay finite.

    Rows that hold nothing yet (a new request's prompt, the runner's only case) can see no key but
    their own prompt's: attention then runs causally over the keys and values in hand instead of
    gathering the blocks just written, and the cache only receives them for the decode steps to come.
    A padding query, placed after its row's tokens, sees them and the padding before it, so its
    output stays finite. What the metadata implies (slots, masks) is worked out by the forward's
    first layer and reused by the others: it is the same for every layer.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.block_tables: torch.Tensor | None = None
        self.lengths: torch.Tensor | None = None
        self.start_positions: torch.Tensor | None = None  # None: every row starts empty
        self._derived: _PrefillLayout | None = None

    def set_metadata(self, block_tables: torch.Tensor, lengths: torch.Tensor,
                     start_positions: torch.Tensor | None = None) -> None:
        rows = block_tables.shape[0]
        held = torch.zeros_like(lengths) if start_positions is None else start_positions
        if lengths.shape != (rows,) or held.shape != (rows,):
            raise ValueError(f"lengths {tuple(lengths.shape)} and start_positions "
                             f"{tuple(held.shape)} must be [{rows}]")
        if lengths.device.type == "cpu" and lengths.numel() and lengths.min() < 0:
            raise ValueError("lengths must be >= 0")
        validate_host_metadata(self.cache, block_tables, held, held + lengths)
        device = self.cache.device
        self.block_tables = block_tables.to(device, torch.int32, non_blocking=True)
        self.lengths = lengths.to(device, torch.int64, non_blocking=True)
        is_fresh = start_positions is None or (start_positions.device.type == "cpu" and not start_positions.any())
        self.start_positions = None if is_fresh else held.to(device, torch.int64, non_blocking=True)
        self._derived = None

    def bind_static(self, block_tables: torch.Tensor, lengths: torch.Tensor) -> None:
        """Read metadata from these device tensors as they are at each forward (no copies, no checks:
        whoever refills them checks the host values with `validate_host_metadata` first). Every row
        starts empty."""
        self.block_tables, self.lengths, self.start_positions = block_tables, lengths, None
        self._derived = None

    def _layout(self, num_tokens: int) -> _PrefillLayout:
        """Where each new token goes and, for rows with history, which keys each query sees."""
        assert self.block_tables is not None and self.lengths is not None
        device, block_size = self.cache.device, self.cache.block_size
        offsets = torch.arange(num_tokens, device=device)[None, :]
        starts = self.start_positions
        positions = offsets.expand(self.lengths.shape[0], -1) if starts is None else starts[:, None] + offsets
        is_real = offsets < self.lengths[:, None]
        slots = flat_slots(self.block_tables, positions, block_size, self.cache.scratch_block)
        slots = torch.where(is_real, slots, self.cache.scratch_block * block_size).flatten()
        if starts is None:
            return _PrefillLayout(num_tokens, slots, None, None)
        span = self.block_tables.shape[1] * block_size
        key_positions = torch.arange(span, device=device)
        key_valid = key_positions[None, :] < (starts + self.lengths)[:, None]  # [B, S]
        # Padding queries see every held key (their positions lie past the end); key 0 is always
        # allowed so an all-padding row (length 0, nothing held) still has one finite term.
        causal = key_positions[None, None, :] <= positions[:, :, None]
        allowed = (causal & key_valid[:, None, :]) | (key_positions == 0)
        return _PrefillLayout(num_tokens, slots, key_valid, allowed[:, None])

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        if self.block_tables is None or self.lengths is None:
            raise RuntimeError("set_metadata must be called before the prefill forward")
        _check_shapes(self.cache, query, key, value)
        if query.shape[0] != self.block_tables.shape[0]:
            raise ValueError(f"batch {query.shape[0]} differs from the metadata's "
                             f"{self.block_tables.shape[0]} rows")
        num_heads, num_tokens = query.shape[1], query.shape[2]
        layout = self._derived
        if layer_index == 0 or layout is None or layout.num_tokens != num_tokens:
            layout = self._derived = self._layout(num_tokens)
        layer_cache = self.cache.layer(layer_index)
        store_kv_torch(layer_cache, key.transpose(1, 2).flatten(0, 1), value.transpose(1, 2).flatten(0, 1),
                       layout.slots)
        if layout.allowed is None or layout.key_valid is None:
            return F.scaled_dot_product_attention(query, repeat_kv(key, num_heads), repeat_kv(value, num_heads),
                                                  is_causal=True)
        keys = repeat_kv(_masked_dense(layer_cache[0], self.block_tables, layout.key_valid), num_heads)
        values = repeat_kv(_masked_dense(layer_cache[1], self.block_tables, layout.key_valid), num_heads)
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=layout.allowed)


@dataclass(frozen=True)
class _PrefillLayout:
    num_tokens: int
    slots: torch.Tensor  # [B * T]: each token's flat cache slot (padding: the scratch block)
    key_valid: torch.Tensor | None  # [B, S]: keys inside each row's context; None when rows start empty
    allowed: torch.Tensor | None  # [B, 1, T, S]: the keys each query sees; None when rows start empty
