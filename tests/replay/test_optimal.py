"""The optimal bound: by hand, equal to exhaustive search over every keep/drop choice on random tiny traces, and
between LRU and the unlimited cache at every capacity point (random traces and the Mooncake sample at 512)."""
from __future__ import annotations

import random
from functools import lru_cache
from itertools import combinations

import pytest
from test_tiers import MOONCAKE, A, B, C, D, curve_and_stream, random_stream

from kvcli.replay.optimal import optimal_curve, optimal_hits, peak_live
from kvcli.replay.stream import ChunkStream, stream_of
from kvcli.replay.tiers import simulate_tiers
from kvcli.traces.detect import read_trace


def test_by_hand_min_beats_lru():
    # capacity 2: [a,b], [c], [a,b], [c]. LRU keeps a,c after r2 (b evicted): r3 hits a only, and its touch of b
    # evicts c, so r4 misses: 1 chunk. MIN drops c at once (its next use is after a,b's): r3 hits a,b: 2 chunks.
    # At capacity 3 MIN keeps all: 3. Then [a,b],[c],[d],[a,b] at capacity 2: LRU 0, MIN 2.
    s = stream_of(4, [([A, B], 9), ([C], 5), ([A, B], 9), ([C], 5)])
    assert optimal_hits(s, 2) == (2, 0)
    assert simulate_tiers(s, [2]).hit_chunks == [1]
    assert optimal_hits(s, 3) == (3, 0)
    s = stream_of(4, [([A, B], 8), ([C], 4), ([D], 4), ([A, B], 8)])
    assert simulate_tiers(s, [2]).hit_chunks == [0]
    assert optimal_hits(s, 2) == (2, 1)  # the whole prompt [a,b] of 8 tokens: 7 tokens reused
    assert optimal_hits(s, 1) == (1, 0)  # keep a alone: a chunk without its parent is never kept
    assert optimal_hits(s, 0) == (0, 0)


def brute_force(stream: ChunkStream, capacity: int) -> int:
    """The most hit chunks over every policy: after each request, keep any subset of (held + its chunks) of at most
    ``capacity`` chunks (exhaustive, memoized on the held set)."""
    b = stream.bounds.tolist()
    reqs = [tuple(stream.ids[b[r]:b[r + 1]].tolist()) for r in range(stream.requests)]

    @lru_cache(maxsize=None)
    def best(r: int, held: frozenset) -> int:
        if r == len(reqs):
            return 0
        h = reqs[r]
        k = 0
        while k < len(h) and h[k] in held:
            k += 1
        pool = sorted(held | set(h))
        return k + max(best(r + 1, frozenset(keep)) for n in range(min(capacity, len(pool)) + 1)
                       for keep in combinations(pool, n))

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(60))
def test_min_equals_exhaustive_search_on_tiny_traces(seed):
    rng = random.Random(seed)
    s = random_stream(rng, rng.randint(3, 7))
    for capacity in range(0, 4):
        assert optimal_hits(s, capacity)[0] == brute_force(s, capacity), capacity


@pytest.mark.parametrize("seed", range(20))
def test_min_lies_between_lru_and_unlimited(seed):
    rng = random.Random(seed)
    s = random_stream(rng, 60)
    unlimited = simulate_tiers(s, [10**9]).hit_chunks[0]
    peak = peak_live(s, s.next_use())
    for c in range(0, peak + 3):
        lru, opt = simulate_tiers(s, [c]).hit_chunks[0], optimal_hits(s, c)[0]
        assert lru <= opt <= unlimited
    assert optimal_hits(s, peak)[0] == unlimited
    assert peak == 0 or optimal_hits(s, peak - 1)[0] < unlimited


def test_on_the_mooncake_sample_at_512_min_lies_between_lru_and_unlimited_in_tokens():
    requests = list(read_trace(MOONCAKE))[:300]
    curve, stream = curve_and_stream([r.token_ids for r in requests], 512)
    caps = [int(c) for c in curve.capacities(12)]
    unlimited = (int(curve.hit_chunks_by_capacity[-1]), int(curve.whole_hits_by_capacity[-1]))
    for c, (hits, whole) in zip(caps, optimal_curve(stream, caps, unlimited)):
        assert curve.hit_tokens(c) <= hits * 512 - whole <= curve.unlimited_hit_tokens, c
    assert any(hits > curve.hit_chunks_by_capacity[c] for c, (hits, _) in zip(caps, optimal_curve(
        stream, caps, unlimited)))
