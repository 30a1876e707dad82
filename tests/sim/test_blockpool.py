"""vLLM's block pool (kvcli.sim.blockpool): the null block, the free queue's order, eviction only when a block is
taken, duplicate keys; counted by hand on pools of a few blocks, and its invariants under random use."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.sim.blockpool import NULL_BLOCK, BlockPool


def test_the_null_block_is_never_handed_out():
    pool = BlockPool(4)
    assert pool.free_blocks == 3 and pool.queue() == [1, 2, 3]
    assert pool.allocate(3) == [1, 2, 3]
    with pytest.raises(ValueError, match="cannot take 1 blocks from a free queue of 0"):
        pool.allocate(1)
    with pytest.raises(ValueError):
        BlockPool(0)


def test_a_freed_request_goes_back_tail_first_and_its_partial_block_to_the_head():
    # a request of 2 full blocks (keys a0, a1) and a partial one: blocks 1, 2, 3 of a pool of 5 (KV blocks 1..4)
    pool = BlockPool(5)
    blocks = pool.allocate(3)
    pool.cache(1, "a0")
    pool.cache(2, "a1")
    assert pool.queue() == [4]
    pool.free(blocks)  # freed last first: 3 (uncached) to the head, then 2 and 1 (cached) to the tail
    assert pool.queue() == [3, 4, 2, 1]
    assert pool.cached_run(["a0", "a1", "a2"]) == [1, 2]


def test_a_cached_block_is_evicted_only_when_taken_and_the_chain_tail_first():
    pool = BlockPool(5)
    pool.free(_request(pool, ["a0", "a1"], partial=True))  # queue [3, 4, 2, 1]
    assert pool.allocate(2) == [3, 4]  # uncached blocks first: nothing evicted
    assert pool.cached_run(["a0", "a1"]) == [1, 2]
    assert pool.allocate(1) == [2]  # a1, the chain's tail, goes first
    assert pool.cached_run(["a0", "a1"]) == [1] and "a1" not in pool and "a0" in pool
    assert (pool.cached_blocks, pool.stored, pool.evicted) == (1, 2, 1)


def test_a_touched_block_leaves_the_free_queue_and_comes_back_at_the_tail():
    pool = BlockPool(4)
    pool.free(_request(pool, ["a0"]))  # block 1 holds a0; queue [2, 3, 1]
    hits = pool.cached_run(["a0", "b1"])
    assert hits == [1] and pool.evictable(hits) == 1
    pool.touch(hits)
    assert pool.queue() == [2, 3] and pool.evictable(hits) == 0
    assert pool.allocate(2) == [2, 3]  # the touched block is pinned: no allocation can take it
    assert "a0" in pool
    pool.free([1, 2, 3])  # freed 3, 2, 1: the uncached 3 and 2 to the head in that order, the cached 1 to the tail
    assert pool.queue() == [3, 2, 1]


def test_two_blocks_can_hold_one_key_and_a_lookup_takes_the_earliest():
    pool = BlockPool(4)
    first = pool.allocate(1)
    pool.cache(first[0], "a0")
    pool.free(first)  # queue [2, 3, 1]
    again = pool.allocate(1)  # a request that computes a0 again (vLLM does not de-duplicate)
    pool.cache(again[0], "a0")
    assert again == [2] and pool.cached_run(["a0"]) == [1] and pool.cached_blocks == 2
    pool.free(again)  # queue [3, 1, 2]
    assert pool.allocate(2) == [3, 1]  # block 1 evicted: block 2 still holds a0
    assert pool.cached_run(["a0"]) == [2]


def test_a_block_keeps_its_first_key():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.cache(b, "a0")
    pool.cache(b, "other")
    assert "a0" in pool and "other" not in pool


def _request(pool: BlockPool, keys: list[str], partial: bool = False) -> list[int]:
    """Allocate a request's blocks and cache its full ones under ``keys``; its blocks."""
    blocks = pool.allocate(len(keys) + partial)
    for b, key in zip(blocks, keys):
        pool.cache(b, key)
    return blocks


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.booleans()), max_size=30))
def test_the_queue_holds_uncached_blocks_ahead_of_cached_ones_and_no_block_is_lost(n, requests):
    # each request: a prefix of a few shared chains (so hits happen), its run looked up and touched, its other full
    # blocks allocated and cached, a partial block or not, then freed
    pool = BlockPool(n)
    for length, chain, partial in requests:
        keys = [f"c{chain}-{k}" for k in range(length)]
        hits = pool.cached_run(keys)
        need = len(keys) - len(hits) + partial
        if need + pool.evictable(hits) > pool.free_blocks:
            continue
        pool.touch(hits)
        blocks = hits + pool.allocate(need)
        for k in range(len(hits), len(keys)):
            pool.cache(blocks[k], keys[k])
        pool.free(blocks)
        queue = pool.queue()
        assert sorted(queue) == list(range(1, n)) and NULL_BLOCK not in queue
        flags = [pool.key_of(b) is not None for b in queue]
        assert flags == sorted(flags)  # False (uncached) before True (cached)
