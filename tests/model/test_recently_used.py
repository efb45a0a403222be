"""Values kept by key, the least recently used dropped first (the primed voice states, the inline clones)."""

from __future__ import annotations

from tts_service.model.recently_used import RecentlyUsed


def test_the_least_recently_used_value_goes_first_beyond_the_limit() -> None:
    kept: RecentlyUsed[str, int] = RecentlyUsed(max_entries=2)
    kept.put("a", 1)
    kept.put("b", 2)
    assert kept.get("a") == 1  # now b is the least recently used
    kept.put("c", 3)
    assert kept.get("b") is None and kept.get("a") == 1 and kept.get("c") == 3
    assert len(kept) == 2 and kept.num_hits == 3 and kept.num_misses == 1


def test_putting_a_kept_key_again_replaces_its_value_and_makes_it_the_most_recent() -> None:
    kept: RecentlyUsed[str, int] = RecentlyUsed(max_entries=2)
    kept.put("a", 1)
    kept.put("b", 2)
    kept.put("a", 10)
    kept.put("c", 3)
    assert kept.get("a") == 10 and kept.get("b") is None and len(kept) == 2


def test_with_no_room_nothing_is_kept() -> None:
    kept: RecentlyUsed[str, int] = RecentlyUsed(max_entries=0)
    kept.put("a", 1)
    assert len(kept) == 0 and kept.get("a") is None
