"""The per-process TTL cache."""

from __future__ import annotations

from app.core.cache import TTLCache


def test_entries_expire_and_can_be_dropped():
    cache = TTLCache[str, int](ttl=60)
    cache.put("a", 1)
    assert cache.get("a") == 1
    cache.drop("a")
    assert cache.get("a") is None
    expired = TTLCache[str, int](ttl=-1)
    expired.put("a", 1)
    assert expired.get("a") is None


def test_zero_ttl_keeps_nothing_and_a_full_cache_starts_afresh():
    assert TTLCache[str, int](ttl=0).get("a") is None
    cache = TTLCache[int, int](ttl=60, max_size=2)
    for i in range(3):
        cache.put(i, i)
    assert [cache.get(i) for i in range(3)] == [None, None, 2]
