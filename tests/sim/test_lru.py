"""ChunkLru (a set and a log of touches until the first eviction, then an OrderedDict) against a
reference LRU written as plainly as possible: a list, least recent first."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcli.sim.lru as lru
from kvcli.sim.lru import ChunkLru


class ListLru:
    """The order rule of kvcli.sim.lru, one list operation per chunk: touch last-to-first, evict from the front."""

    def __init__(self, capacity):
        self.capacity, self.order = capacity, []

    def store(self, hashes):
        new = []
        for h in reversed(hashes):
            if h in self.order:
                self.order.remove(h)
            elif h not in new:
                new.append(h)
            self.order.append(h)
        excess = 0 if self.capacity is None else max(len(self.order) - self.capacity, 0)
        evicted, self.order = self.order[:excess], self.order[excess:]
        return new, evicted


operations = st.lists(st.tuples(st.sampled_from(["store", "touch", "discard"]),
                                st.lists(st.integers(0, 12), max_size=6)), max_size=40)


@pytest.mark.parametrize("factor, slack", [(4, 4096), (0, 0), (1, 2)])  # the log replayed late, at once, early
@settings(max_examples=150, deadline=None)
@given(capacity=st.one_of(st.none(), st.integers(0, 8)), ops=operations)
def test_chunklru_is_the_list_lru(factor, slack, capacity, ops):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lru, "LOG_FACTOR", factor)
        patch.setattr(lru, "LOG_SLACK", slack)
        check_against_list_lru(capacity, ops)


def check_against_list_lru(capacity, ops):
    cache, ref = ChunkLru(capacity), ListLru(capacity)
    for op, hashes in ops:
        assert cache.match(hashes) == next((k for k, h in enumerate(hashes) if h not in ref.order), len(hashes))
        if op == "discard":
            for h in hashes[:1]:
                cache.discard(h)
                ref.order = [x for x in ref.order if x != h]
        elif op == "store":
            assert cache.store(hashes) == ref.store(hashes)
        else:
            assert cache.touch(hashes) == ref.store(hashes)[1]
        assert len(cache) == len(ref.order) and all(h in cache for h in ref.order)


def test_order_is_built_from_the_log_at_the_first_eviction():
    """Capacity 3: a0 a1 then b0 fit (no order kept yet); c0 is one too many: the replayed order is
    a1 a0 b0 (least recent first), so a1 goes, then a0 when a0's chain is not touched again."""
    cache = ChunkLru(3)
    assert cache.store(["a0", "a1"]) == (["a1", "a0"], [])
    assert cache.touch(["b0"]) == []
    assert cache.store(["c0"]) == (["c0"], ["a1"])
    assert cache.store(["b0", "b1"]) == (["b1"], ["a0"])
    assert cache.match(["b0", "b1"]) == 2 and cache.match(["a0"]) == 0 and len(cache) == 3


def test_log_is_bounded_without_an_eviction(monkeypatch):
    """Capacity 100 never reached: after LOG_FACTOR * 100 + LOG_SLACK logged chunks the order is built (an
    OrderedDict from then on), so the log never holds more than that."""
    monkeypatch.setattr(lru, "LOG_FACTOR", 1)
    monkeypatch.setattr(lru, "LOG_SLACK", 10)
    cache = ChunkLru(100)
    for _ in range(36):  # 36 x 3 = 108 logged chunks: 110 not passed yet
        cache.touch(["x", "y", "z"])
    assert cache._logged == 108 and type(cache._order) is set
    cache.touch(["x", "y", "z"])  # 111
    assert cache._logged == 0 and list(cache._order) == ["z", "y", "x"]


def test_forget_drops_chunks_of_an_unlimited_cache_only():
    cache = ChunkLru(None)
    cache.touch(["a0", "a1", "a2"])
    cache.forget(["a2", "a1", "zz"])  # a chunk not held is ignored
    assert len(cache) == 1 and cache.match(["a0", "a1"]) == 1
    with pytest.raises(ValueError, match="unlimited"):
        ChunkLru(3).forget(["a0"])
