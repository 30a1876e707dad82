"""Policies through libCacheSim with the prefix rule on top: LRU equals the replay's ChunkLru, LFU and S3-FIFO by
hand, and --policy parsing."""
from __future__ import annotations

import random

import pytest
from test_tiers import A, B, C, D, random_stream

from kvcli.errors import BadInputError
from kvcli.sim.eviction import parse_policies, simulate_policy
from kvcli.sim.stream import stream_of
from kvcli.sim.tiers import simulate_tiers

pytest.importorskip("libcachesim")


@pytest.mark.parametrize("seed", range(15))
def test_lru_through_libcachesim_is_the_replays_lru(seed):
    s = random_stream(random.Random(seed), 80)
    longest = int(max(s.bounds[1:] - s.bounds[:-1]))
    for c in (1, 3, 8, 20, longest):
        lru, ours = simulate_policy(s, "lru", c), simulate_tiers(s, [c])
        assert lru.hit_tokens(4) == ours.hit_tokens[0], c
        # libCacheSim inserts one chunk at a time, so a held chunk of the request not touched yet can go and come
        # back (written again); ChunkLru evicts after the whole request: the same contents after it, fewer writes
        assert lru.written_chunks >= ours.written_chunks[0]


def test_lfu_keeps_the_frequent_chunk_by_hand():
    # capacity 2: [a] x3, [b], [c], [a]. LRU: b and c push a out, the last a misses: 2 hits. LFU: c's insert
    # evicts the least frequent, b (1 use) not a (3): the last a hits: 3 hits.
    s = stream_of(4, [([A], 5), ([A], 5), ([A], 5), ([B], 5), ([C], 5), ([A], 5)])
    assert simulate_policy(s, "lru", 2).hit_chunks == 2
    assert simulate_policy(s, "lfu", 2).hit_chunks == 3


def test_prefix_rule_on_top_a_chunk_behind_a_miss_is_no_hit():
    # capacity 10 holds everything: [a,b], [c], [a,b]: 2 hits; with a's hit broken nothing after it counts
    s = stream_of(4, [([A, B], 9), ([C], 5), ([A, B], 9), ([D, B], 9)])
    for p in ("lru", "lfu"):
        counts = simulate_policy(s, p, 10)
        assert (counts.hit_chunks, counts.written_chunks) == (2, 4), p  # [d,b]'s b is held, d is not: no hit
    # S3-FIFO at 20 chunks (its smallest that holds anything): a small FIFO of 2 holds a and b through r2's c,
    # as the others do
    assert (simulate_policy(s, "s3fifo", 20).hit_chunks, simulate_policy(s, "s3fifo", 20).written_chunks) == (2, 4)


@pytest.mark.parametrize("capacity, held", [(9, 0), (10, 0), (19, 0), (20, 1), (21, 1)])
def test_s3fifo_runs_from_the_smallest_capacity_that_holds_anything(capacity, held):
    """[a], [a]: LRU and LFU hit a at every capacity from 1. libCacheSim's S3-FIFO keeps nothing below 20 chunks
    (its small FIFO, 10% of the cache, is 1 chunk from 10 to 19, and aborts the process below 10): there it is not
    run and says so in one line; from 20 it hits a."""
    s = stream_of(4, [([A], 5), ([A], 5)])
    for policy in ("lru", "lfu"):
        assert simulate_policy(s, policy, capacity).hit_chunks == 1, policy
    got = simulate_policy(s, "s3fifo", capacity)
    assert got.hit_chunks == held
    if held:
        assert got.skipped == ""
    else:
        assert got.skipped == ("not run: S3-FIFO holds nothing below 20 chunks (libCacheSim's small FIFO, 10% of "
                               "the cache, keeps nothing under 2)")


def test_libcachesim_s3fifo_holds_nothing_at_19_chunks_and_something_at_20():
    """The threshold itself, on libCacheSim directly: 40 distinct objects in, how many are held after."""
    import libcachesim as lcs

    def held(capacity: int) -> int:
        cache, req = lcs.S3FIFO(cache_size=capacity, hashpower=10), lcs.Request()
        req.obj_size = 1
        for x in range(1, 41):
            req.obj_id = x
            cache.get(req)
        found = 0
        for x in range(1, 41):
            req.obj_id = x
            found += cache.find(req, False) is not None
        return found

    assert (held(10), held(19), held(20)) == (0, 0, 20)


def test_parse_policies():
    assert parse_policies("lfu,S3-FIFO") == ("lru", "lfu", "s3fifo")
    assert parse_policies(None) == ()
    with pytest.raises(BadInputError, match="--policy.*known: lru, lfu, s3fifo"):
        parse_policies("arc")
