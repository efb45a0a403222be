"""Fixed-size pools the scheduler hands out: talker KV blocks and runner slots.

Both follow the same contract: callers ask `can_allocate` first and only then `allocate`, so an
`allocate` that cannot be satisfied is a scheduler bug and raises instead of returning nothing.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable


class AllocationError(RuntimeError):
    """An allocate() the pool cannot satisfy, or a free() of something not held."""


class BlockAllocator:
    """Hands out KV-cache block ids in [0, num_blocks); each block holds `block_size` positions."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        # Tracked so a double free corrupts nothing silently: it would hand one block to two requests.
        self._used: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self._used)

    def blocks_needed(self, num_tokens: int, num_blocks_held: int) -> int:
        """How many more blocks a sequence of `num_tokens` positions needs beyond those it holds."""
        if num_tokens < 0 or num_blocks_held < 0:
            raise ValueError(f"negative size: num_tokens={num_tokens}, num_blocks_held={num_blocks_held}")
        num_blocks_total = -(-num_tokens // self.block_size)
        return max(0, num_blocks_total - num_blocks_held)

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise AllocationError(f"cannot allocate {num_blocks} blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        blocks = list(blocks)
        not_held = [block for block in blocks if block not in self._used]
        if not_held or len(set(blocks)) != len(blocks):
            raise AllocationError(f"freeing blocks that are not held (or twice): {sorted(blocks)}")
        self._used.difference_update(blocks)
        self._free.extend(blocks)


class SlotAllocator:
    """Hands out runner slot ids in [0, max_slots): the row that holds a request's GPU state."""

    def __init__(self, max_slots: int) -> None:
        if max_slots <= 0:
            raise ValueError(f"max_slots must be > 0, got {max_slots}")
        self.max_slots = max_slots
        # Lowest id first keeps the occupied rows packed at the front of the runner's buffers.
        self._free: list[int] = list(range(max_slots))
        self._used: set[int] = set()

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        return len(self._used)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise AllocationError(f"all {self.max_slots} slots are in use")
        slot = heapq.heappop(self._free)
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise AllocationError(f"freeing slot {slot}, which is not in use")
        self._used.remove(slot)
        heapq.heappush(self._free, slot)
