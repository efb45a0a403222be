"""At most a given number of values by key, the least recently used dropped first: the runner's primed voice states
and the front door's inline clones."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class RecentlyUsed(Generic[K, V]):
    """Values by key, at most `max_entries` (0: none kept); `get` counts its hits and misses."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._values: OrderedDict[K, V] = OrderedDict()
        self.num_hits = 0
        self.num_misses = 0

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: K) -> V | None:
        value = self._values.get(key)
        if value is None:
            self.num_misses += 1
            return None
        self._values.move_to_end(key)
        self.num_hits += 1
        return value

    def put(self, key: K, value: V) -> None:
        if not self.max_entries:
            return
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self.max_entries:
            self._values.popitem(last=False)
