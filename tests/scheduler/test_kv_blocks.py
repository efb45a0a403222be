from __future__ import annotations

import pytest

from scheduler.kv_blocks import AllocationError, BlockAllocator, SlotAllocator


def test_blocks_needed_rounds_up_to_whole_blocks_and_subtracts_those_held() -> None:
    allocator = BlockAllocator(num_blocks=10, block_size=4)
    assert allocator.blocks_needed(0, 0) == 0
    assert allocator.blocks_needed(1, 0) == 1
    assert allocator.blocks_needed(4, 0) == 1
    assert allocator.blocks_needed(5, 0) == 2
    assert allocator.blocks_needed(5, 1) == 1
    assert allocator.blocks_needed(8, 2) == 0
    assert allocator.blocks_needed(4, 3) == 0  # holding more than needed never asks for a negative count


def test_block_allocate_and_free_track_counts() -> None:
    allocator = BlockAllocator(num_blocks=5, block_size=4)
    first = allocator.allocate(3)
    assert len(set(first)) == 3
    assert (allocator.num_used_blocks, allocator.num_free_blocks) == (3, 2)
    assert allocator.can_allocate(2)
    assert not allocator.can_allocate(3)
    second = allocator.allocate(2)
    assert not set(first) & set(second)
    allocator.free(first)
    assert (allocator.num_used_blocks, allocator.num_free_blocks) == (2, 3)


def test_block_allocate_beyond_free_raises_instead_of_returning_partial() -> None:
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    with pytest.raises(AllocationError):
        allocator.allocate(3)
    assert allocator.num_free_blocks == 2


def test_block_double_free_raises() -> None:
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    blocks = allocator.allocate(1)
    allocator.free(blocks)
    with pytest.raises(AllocationError):
        allocator.free(blocks)
    with pytest.raises(AllocationError):
        allocator.free([1, 1])


def test_slot_allocator_hands_out_lowest_free_slot_and_refuses_when_full() -> None:
    slots = SlotAllocator(max_slots=3)
    assert [slots.allocate() for _ in range(3)] == [0, 1, 2]
    assert not slots.can_allocate()
    with pytest.raises(AllocationError):
        slots.allocate()
    slots.free(1)
    assert slots.can_allocate()
    assert slots.allocate() == 1
    assert (slots.num_used_slots, slots.num_free_slots) == (3, 0)


def test_slot_double_free_raises() -> None:
    slots = SlotAllocator(max_slots=2)
    slot = slots.allocate()
    slots.free(slot)
    with pytest.raises(AllocationError):
        slots.free(slot)


@pytest.mark.parametrize("arguments", [(0, 4), (4, 0), (-1, 4)])
def test_block_allocator_rejects_non_positive_sizes(arguments: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        BlockAllocator(*arguments)
