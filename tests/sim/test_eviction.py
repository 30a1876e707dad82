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
    # S3-FIFO's small FIFO is 1 chunk of 10: a, then b, then c pass through it once and out (to its ghost), so r3
    # finds neither: no hit; r3 moves a and b to the main FIFO (seen in the ghost)
    assert simulate_policy(s, "s3fifo", 10).hit_chunks == 0


def test_s3fifo_below_ten_chunks_is_said_not_run():
    s = stream_of(4, [([A], 5)])
    assert simulate_policy(s, "s3fifo", 9).skipped and not simulate_policy(s, "s3fifo", 10).skipped


def test_parse_policies():
    assert parse_policies("lfu,S3-FIFO") == ("lru", "lfu", "s3fifo")
    assert parse_policies(None) == ()
    with pytest.raises(BadInputError, match="--policy.*known: lru, lfu, s3fifo"):
        parse_policies("arc")
