"""The paged KV cache's torch path against dense attention and the eager cache (CPU, fp32)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.runner.triton_interpreter import run_interpreted
from tts_service.eager.generate import EagerKVCache
from tts_service.model.layers import repeat_kv
from tts_service.runner.kv_cache import (
    PagedDecodeBackend,
    PagedKVCache,
    PagedPrefillBackend,
    choose_num_splits,
    flat_slots,
)

HEADS, KV_HEADS, DIM = 16, 8, 32
TOLERANCE = 1e-5


def make_cache(num_blocks: int = 48, block_size: int = 4, num_layers: int = 2) -> PagedKVCache:
    return PagedKVCache(num_layers, num_blocks, block_size, KV_HEADS, DIM, torch.float32, "cpu")


def shuffled_tables(generator: torch.Generator, num_blocks: int, rows: int, width: int) -> torch.Tensor:
    """Disjoint, non-contiguous block ids for each row."""
    ids = torch.randperm(num_blocks, generator=generator)[: rows * width]
    return ids.view(rows, width).to(torch.int32)


def causal_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One row: query [H, T, D] as the last T positions of keys/values [KV, S, D]."""
    num_queries, num_keys = query.shape[1], keys.shape[1]
    query_positions = torch.arange(num_keys - num_queries, num_keys)[:, None]
    allowed = torch.arange(num_keys)[None, :] <= query_positions
    return F.scaled_dot_product_attention(query[None], repeat_kv(keys[None], HEADS),
                                          repeat_kv(values[None], HEADS), attn_mask=allowed)[0]


def random_step(generator: torch.Generator, batch: int, tokens: int = 1,
                scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    query = torch.randn(batch, HEADS, tokens, DIM, generator=generator) * scale
    key = torch.randn(batch, KV_HEADS, tokens, DIM, generator=generator) * scale
    value = torch.randn(batch, KV_HEADS, tokens, DIM, generator=generator) * scale
    return query, key, value


def test_flat_slots_follow_the_block_table_and_send_out_of_table_positions_to_scratch() -> None:
    tables = torch.tensor([[7, 2, 5], [1, 0, 3]], dtype=torch.int32)
    positions = torch.tensor([[0, 5, 11, 12], [3, 4, 9, 40]])
    slots = flat_slots(tables, positions, block_size=4, scratch_block=9)
    assert slots.tolist() == [[28, 9, 23, 36], [7, 0, 13, 36]]


def test_decode_steps_through_shuffled_blocks_match_dense_attention_per_row() -> None:
    generator = torch.Generator().manual_seed(0)
    cache = make_cache()
    num_steps, start_steps, bucket = 14, (0, 3, 8), 4
    tables = shuffled_tables(generator, cache.num_blocks, len(start_steps), 4)
    backend = PagedDecodeBackend(cache, max_batch_size=bucket, max_blocks_per_seq=5, implementation="torch")
    history: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for step in range(num_steps):
        # Rows join at different steps, so lengths differ; rows that have not joined are padding.
        active = [row for row, start in enumerate(start_steps) if step >= start]
        positions = torch.tensor([step - start_steps[row] for row in active])
        backend.set_metadata(tables[active], positions)
        for layer in range(cache.num_layers):
            query, key, value = random_step(generator, bucket)
            out = backend(layer, query, key, value)
            assert torch.isfinite(out).all()
            for slot, row in enumerate(active):
                history.setdefault((row, layer), []).append((key[slot, :, 0], value[slot, :, 0]))
                keys = torch.stack([k for k, _ in history[row, layer]], dim=1)
                values = torch.stack([v for _, v in history[row, layer]], dim=1)
                expected = causal_reference(query[slot], keys, values)
                torch.testing.assert_close(out[slot], expected, atol=TOLERANCE, rtol=TOLERANCE)


def left_pad(tensor: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Right-padded [B, heads, T, D] -> the same valid tokens left-padded, as the eager path holds them."""
    out = torch.zeros_like(tensor)
    width = tensor.shape[2]
    for row, length in enumerate(lengths):
        out[row, :, width - length:] = tensor[row, :, :length]
    return out


def test_prefill_then_decode_matches_the_eager_cache() -> None:
    generator = torch.Generator().manual_seed(1)
    cache = make_cache()
    lengths, width, num_decode_steps = [5, 9, 2], 9, 6
    tables = shuffled_tables(generator, cache.num_blocks, len(lengths), 4)
    slots = torch.arange(width)[None, :]
    eager = EagerKVCache(slots >= (width - torch.tensor(lengths))[:, None])
    prefill = PagedPrefillBackend(cache)
    prefill.set_metadata(tables, torch.tensor(lengths))
    for layer in range(cache.num_layers):
        query, key, value = random_step(generator, len(lengths), width)
        paged_out = prefill(layer, query, key, value)
        eager_out = eager(layer, left_pad(query, lengths), left_pad(key, lengths), left_pad(value, lengths))
        assert torch.isfinite(paged_out).all()
        for row, length in enumerate(lengths):
            torch.testing.assert_close(paged_out[row, :, :length], eager_out[row, :, width - length:],
                                       atol=TOLERANCE, rtol=TOLERANCE)

    decode = PagedDecodeBackend(cache, max_batch_size=len(lengths), max_blocks_per_seq=4,
                                implementation="torch")
    for step in range(num_decode_steps):
        decode.set_metadata(tables, torch.tensor(lengths) + step)
        eager.append_valid(1)
        for layer in range(cache.num_layers):
            query, key, value = random_step(generator, len(lengths))
            torch.testing.assert_close(decode(layer, query, key, value), eager(layer, query, key, value),
                                       atol=TOLERANCE, rtol=TOLERANCE)


def test_prefill_with_start_positions_attends_over_the_held_history() -> None:
    generator = torch.Generator().manual_seed(2)
    cache = make_cache(num_layers=1)
    first_lengths, second_lengths = [6, 3, 0], [4, 7, 5]
    tables = shuffled_tables(generator, cache.num_blocks, 3, 3)
    backend = PagedPrefillBackend(cache)
    backend.set_metadata(tables, torch.tensor(first_lengths))
    _, first_keys, first_values = random_step(generator, 3, max(first_lengths))
    backend(0, torch.randn(3, HEADS, max(first_lengths), DIM, generator=generator), first_keys, first_values)

    # A resumed request (start > 0) next to a fresh one (row 2, start 0) in the same batch.
    backend.set_metadata(tables, torch.tensor(second_lengths), start_positions=torch.tensor(first_lengths))
    query, key, value = random_step(generator, 3, max(second_lengths))
    out = backend(0, query, key, value)
    for row, (held, new) in enumerate(zip(first_lengths, second_lengths, strict=True)):
        keys = torch.cat([first_keys[row, :, :held], key[row, :, :new]], dim=1)
        values = torch.cat([first_values[row, :, :held], value[row, :, :new]], dim=1)
        expected = causal_reference(query[row, :, :new], keys, values)
        torch.testing.assert_close(out[row, :, :new], expected, atol=TOLERANCE, rtol=TOLERANCE)
    assert torch.isfinite(out).all()


def test_bound_metadata_refilled_in_place_is_read_again_by_each_forward() -> None:
    """A captured prefill replays with new lengths and blocks in the bound tensors: every forward's first
    layer must work out the slots and masks again, and later layers must use that forward's."""
    generator = torch.Generator().manual_seed(6)
    cache = make_cache()
    tables = shuffled_tables(generator, cache.num_blocks, 2, 3)
    bound_tables, bound_lengths = torch.zeros_like(tables), torch.zeros(2, dtype=torch.int64)
    bound = PagedPrefillBackend(cache)
    bound.bind_static(bound_tables, bound_lengths)
    for lengths, order in (([9, 4], [0, 1]), ([2, 11], [1, 0])):
        cache.storage.zero_()
        bound_tables.copy_(tables[order])
        bound_lengths.copy_(torch.tensor(lengths))
        reference = PagedPrefillBackend(make_cache())
        reference.set_metadata(tables[order], torch.tensor(lengths))
        for layer in range(cache.num_layers):
            query, key, value = random_step(generator, 2, 12)
            out = bound(layer, query, key, value)
            for row, length in enumerate(lengths):
                expected = causal_reference(query[row, :, :length], key[row, :, :length], value[row, :, :length])
                torch.testing.assert_close(out[row, :, :length], expected, atol=TOLERANCE, rtol=TOLERANCE)
            torch.testing.assert_close(out, reference(layer, query, key, value), atol=0, rtol=0)
        assert torch.equal(cache.storage[:, :, :cache.scratch_block],
                           reference.cache.storage[:, :, :cache.scratch_block])


def test_padded_decode_rows_leave_real_rows_cache_and_outputs_untouched() -> None:
    generator = torch.Generator().manual_seed(3)
    cache = make_cache(num_layers=1)
    tables = shuffled_tables(generator, cache.num_blocks, 2, 3)
    positions = torch.tensor([5, 9])
    for row, position in enumerate(positions.tolist()):  # some history in every real row
        prefill = PagedPrefillBackend(cache)
        prefill.set_metadata(tables[row:row + 1], torch.tensor([position]))
        prefill(0, *random_step(generator, 1, position))
    query, key, value = random_step(generator, 2)

    unpadded = PagedDecodeBackend(cache, max_batch_size=2, max_blocks_per_seq=3, implementation="torch")
    unpadded.set_metadata(tables, positions)
    before = cache.storage.clone()
    expected = unpadded(0, query, key, value)
    expected_storage = cache.storage.clone()
    cache.storage.copy_(before)

    padded = PagedDecodeBackend(cache, max_batch_size=5, max_blocks_per_seq=3, implementation="torch")
    padded.set_metadata(tables, positions)
    garbage_query, garbage_key, garbage_value = random_step(generator, 3, scale=1e4)
    out = padded(0, torch.cat([query, garbage_query]), torch.cat([key, garbage_key]),
                 torch.cat([value, garbage_value]))
    # Rounding may differ with the batch shape; garbage leaking in would be off by orders of magnitude.
    torch.testing.assert_close(out[:2], expected, atol=TOLERANCE, rtol=TOLERANCE)
    assert torch.isfinite(out).all()
    real_blocks = slice(0, cache.num_blocks)  # everything but the scratch block
    assert torch.equal(cache.storage[:, :, real_blocks], expected_storage[:, :, real_blocks])


def test_padded_prefill_tokens_write_only_the_scratch_block() -> None:
    generator = torch.Generator().manual_seed(4)
    cache = make_cache(num_layers=1)
    tables = shuffled_tables(generator, cache.num_blocks, 2, 3)
    lengths = [3, 10]
    backend = PagedPrefillBackend(cache)
    backend.set_metadata(tables, torch.tensor(lengths))
    _, key, value = random_step(generator, 2, 12)
    out = backend(0, torch.randn(2, HEADS, 12, DIM, generator=generator), key, value)
    assert torch.isfinite(out).all()
    written = torch.zeros(cache.num_blocks + 1, cache.block_size, dtype=torch.bool)
    for row, length in enumerate(lengths):
        for position in range(length):
            block, offset = int(tables[row, position // cache.block_size]), position % cache.block_size
            written[block, offset] = True
            torch.testing.assert_close(cache.keys(0)[block, offset], key[row, :, position])
            torch.testing.assert_close(cache.values(0)[block, offset], value[row, :, position])
    written[cache.scratch_block] = True
    assert not cache.storage[:, :, ~written].any()  # the cache started at zero: nothing else moved


def test_grouped_query_heads_read_kv_head_h_div_group() -> None:
    generator = torch.Generator().manual_seed(5)
    cache = make_cache(num_layers=1)
    tables = shuffled_tables(generator, cache.num_blocks, 1, 4)
    length = 11
    prefill = PagedPrefillBackend(cache)
    prefill.set_metadata(tables, torch.tensor([length]))
    _, keys, values = random_step(generator, 1, length)
    prefill(0, torch.randn(1, HEADS, length, DIM, generator=generator), keys, values)
    decode = PagedDecodeBackend(cache, max_batch_size=1, max_blocks_per_seq=4, implementation="torch")
    decode.set_metadata(tables, torch.tensor([length]))
    query, key, value = random_step(generator, 1)
    out = decode(0, query, key, value)[0, :, 0].double()

    all_keys = torch.cat([keys, key], dim=2)[0].double()
    all_values = torch.cat([values, value], dim=2)[0].double()

    def attend(kv_head_of: list[int]) -> torch.Tensor:
        rows = []
        for head in range(HEADS):
            scores = all_keys[kv_head_of[head]] @ query[0, head, 0].double() / math.sqrt(DIM)
            rows.append(scores.softmax(0) @ all_values[kv_head_of[head]])
        return torch.stack(rows)

    group = HEADS // KV_HEADS
    grouped = attend([head // group for head in range(HEADS)])
    torch.testing.assert_close(out, grouped, atol=TOLERANCE, rtol=TOLERANCE)
    with_repeat_kv = F.scaled_dot_product_attention(query.double(), repeat_kv(all_keys[None], HEADS),
                                                    repeat_kv(all_values[None], HEADS))[0, :, 0]
    torch.testing.assert_close(out, with_repeat_kv, atol=TOLERANCE, rtol=TOLERANCE)
    # The interleaved mapping (h % KV) gives a clearly different answer, so this test can fail.
    assert (out - attend([head % KV_HEADS for head in range(HEADS)])).abs().max() > 1e-2


def test_set_metadata_turns_rows_and_columns_not_given_into_scratch_padding() -> None:
    cache = make_cache()
    backend = PagedDecodeBackend(cache, max_batch_size=4, max_blocks_per_seq=5, implementation="torch")
    backend.block_tables.fill_(3)
    backend.positions.fill_(7)
    backend.set_metadata(torch.tensor([[4, 1], [2, 6]], dtype=torch.int32), torch.tensor([5, 0]))
    scratch = cache.scratch_block
    assert backend.block_tables.tolist() == [[4, 1] + [scratch] * 3, [2, 6] + [scratch] * 3,
                                             [scratch] * 5, [scratch] * 5]
    assert backend.positions.tolist() == [5, 0, 0, 0]


def test_set_metadata_keeps_the_static_tensors_it_was_built_with() -> None:
    backend = PagedDecodeBackend(make_cache(), max_batch_size=2, max_blocks_per_seq=3, implementation="torch")
    tables_address, positions_address = backend.block_tables.data_ptr(), backend.positions.data_ptr()
    backend.set_metadata(torch.tensor([[1, 2, 3]], dtype=torch.int32), torch.tensor([9]))
    assert backend.block_tables.data_ptr() == tables_address
    assert backend.positions.data_ptr() == positions_address


@pytest.mark.parametrize(("tables", "positions"), [
    (torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([8])),  # past the two blocks given
    (torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([-1])),
    (torch.tensor([[1, 99]], dtype=torch.int32), torch.tensor([0])),  # not a block of this cache
    (torch.ones(1, 6, dtype=torch.int32), torch.tensor([0])),  # wider than max_blocks_per_seq
    (torch.ones(3, 2, dtype=torch.int32), torch.tensor([0, 0, 0])),  # more rows than max_batch_size
])
def test_set_metadata_rejects_host_metadata_that_would_escape_the_row(tables: torch.Tensor,
                                                                       positions: torch.Tensor) -> None:
    backend = PagedDecodeBackend(make_cache(), max_batch_size=2, max_blocks_per_seq=5, implementation="torch")
    with pytest.raises(ValueError):
        backend.set_metadata(tables, positions)


def test_prefill_rejects_rows_that_outgrow_their_blocks() -> None:
    backend = PagedPrefillBackend(make_cache())
    with pytest.raises(ValueError):
        backend.set_metadata(torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([5]),
                             start_positions=torch.tensor([4]))


def test_decode_rejects_more_than_one_token_per_row() -> None:
    backend = PagedDecodeBackend(make_cache(), max_batch_size=2, max_blocks_per_seq=3, implementation="torch")
    with pytest.raises(ValueError):
        backend(0, *random_step(torch.Generator().manual_seed(0), 2, tokens=2))


def test_forcing_triton_without_cuda_fails_loudly() -> None:
    with pytest.raises(RuntimeError):
        PagedDecodeBackend(make_cache(), max_batch_size=1, max_blocks_per_seq=1, implementation="triton")


def test_auto_picks_the_torch_path_for_a_cpu_cache() -> None:
    assert not PagedDecodeBackend(make_cache(), max_batch_size=1, max_blocks_per_seq=1).use_triton


def test_block_bytes_and_budget_count_every_layer_and_the_scratch_block() -> None:
    per_block = PagedKVCache.block_bytes(28, 16, 8, 128, torch.bfloat16)
    assert per_block == 28 * 2 * 16 * 8 * 128 * 2
    budget = 11 * per_block - 1  # ten whole blocks, one of them the scratch block
    assert PagedKVCache.num_blocks_for_budget(budget, 28, 16, 8, 128, torch.bfloat16) == 9
    with pytest.raises(ValueError):
        PagedKVCache.num_blocks_for_budget(2 * per_block - 1, 28, 16, 8, 128, torch.bfloat16)
    cache = PagedKVCache(3, 5, 4, 2, 16, torch.float32)
    assert cache.scratch_block == 5
    assert cache.total_bytes == 6 * cache.bytes_per_block == 6 * 3 * 2 * 4 * 2 * 16 * 4
    assert cache.layer(1).shape == (2, 6, 4, 2, 16)
    assert cache.keys(2).data_ptr() == cache.storage[2, 0].data_ptr()


def test_split_count_depends_on_batch_only_and_stays_within_useful_range() -> None:
    assert choose_num_splits(1, 8, 4096, 64, num_sms=132) == 16
    assert choose_num_splits(8, 8, 4096, 64, num_sms=132) == 4
    assert choose_num_splits(64, 8, 4096, 64, num_sms=132) == 1
    assert choose_num_splits(1, 8, 100, 64, num_sms=132) == 2  # never more splits than tiles


@pytest.mark.parametrize("num_splits", [2, 5])
def test_the_last_split_to_finish_combines_the_splits_in_the_interpreter(num_splits: int) -> None:
    pytest.importorskip("triton")
    run_interpreted("tests.runner.interpreted_decode_attention",
                    "check_the_last_split_combines_as_the_combine_launch_does", num_splits)


@pytest.mark.parametrize("early", [pytest.param(0, id="tiles-in-the-loop"), pytest.param(1, id="first-tile-ahead")])
@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_the_decode_kernel_attends_as_dense_attention_does_in_the_interpreter(num_splits: int, early: int) -> None:
    pytest.importorskip("triton")
    run_interpreted("tests.runner.interpreted_decode_attention", "check_the_kernel_attends_as_dense_attention_does",
                    num_splits, early)
