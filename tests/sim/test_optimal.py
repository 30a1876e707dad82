"""The optimal bound, every capacity in one pass: by hand, equal to exhaustive search over every keep/drop choice
on random tiny traces, equal to a per-capacity MIN simulation (a heap of next uses) at every capacity on random
traces and the Mooncake sample at 512, and between LRU and the unlimited cache at every capacity point."""
from __future__ import annotations

import heapq
import random
from functools import lru_cache
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tiers import MOONCAKE, A, B, C, D, curve_and_stream, random_stream

from kvcli.sim.optimal import optimal_by_capacity
from kvcli.sim.stream import NEVER, ChunkStream, stream_of
from kvcli.sim.tiers import simulate_tiers
from kvcli.traces.detect import read_trace


def reference_min(stream: ChunkStream, capacity: int) -> tuple[int, int]:
    """MIN at one capacity, simulated: after each request keep the ``capacity`` chunks, among those held and the
    request's own, whose next request comes soonest (never again: dropped; a tie: the deeper goes first), with a
    heap of next uses. Returns ``(hit chunks, whole-prompt hits)``."""
    nxt = stream.next_use().tolist()
    flat, cuts, _ = stream.lists()
    whole_prompt = stream.whole().tolist()
    held: dict[int, int] = {}  # chunk id -> its next request
    heap: list[tuple[int, int, int]] = []  # (-next request, -depth, id): the top is the first to go
    hits = whole = 0
    for r in range(len(cuts) - 1):
        a, b = cuts[r], cuts[r + 1]
        k = 0
        while a + k < b and flat[a + k] in held:
            k += 1
        hits += k
        whole += k == b - a > 0 and whole_prompt[r]
        for d in range(b - a):
            x, t = flat[a + d], nxt[a + d]
            if t == NEVER:
                held.pop(x, None)
            else:
                held[x] = t
                heapq.heappush(heap, (-t, -d, x))
        while len(held) > capacity:
            t, _, x = heapq.heappop(heap)
            if held.get(x) == -t:
                del held[x]
    return hits, int(whole)


def peak_live(stream: ChunkStream) -> int:
    """The most chunks awaiting a next request after some request: from there on MIN is the unlimited cache."""
    nxt, cuts = stream.next_use(), stream.bounds.tolist()
    live = np.cumsum([int((nxt[a:b] < NEVER).sum()) - int((nxt[:a] == r).sum())
                      for r, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))])
    return int(live.max(initial=0))


def test_by_hand_min_beats_lru():
    # capacity 2: [a,b], [c], [a,b], [c]. LRU keeps a,c after r2 (b evicted): r3 hits a only, and its touch of b
    # evicts c, so r4 misses: 1 chunk. MIN drops c at once (its next use is after a,b's): r3 hits a,b: 2 chunks.
    # At capacity 3 MIN keeps all: 3. Then [a,b],[c],[d],[a,b] at capacity 2: LRU 0, MIN 2.
    s = stream_of(4, [([A, B], 9), ([C], 5), ([A, B], 9), ([C], 5)])
    hits, whole = optimal_by_capacity(s)
    assert hits.tolist() == [0, 1, 2, 3] and whole.tolist() == [0, 0, 0, 0]  # capacity 1: a at r3
    assert simulate_tiers(s, [2]).hit_chunks == [1]
    s = stream_of(4, [([A, B], 8), ([C], 4), ([D], 4), ([A, B], 8)])
    assert simulate_tiers(s, [2]).hit_chunks == [0]
    hits, whole = optimal_by_capacity(s)
    # capacity 1: keep a alone (a chunk without its parent is never kept); 2: the whole prompt [a,b] of 8 tokens
    # hits, 7 tokens reused
    assert hits.tolist() == [0, 1, 2, 2, 2] and whole.tolist() == [0, 0, 1, 1, 1]
    assert [reference_min(s, c) for c in range(5)] == list(zip(hits.tolist(), whole.tolist()))


def test_an_empty_stream_and_prompts_without_chunks():
    hits, whole = optimal_by_capacity(stream_of(4, []))
    assert hits.tolist() == [0] and whole.tolist() == [0]
    hits, whole = optimal_by_capacity(stream_of(4, [([], 3), ([A], 4), ([], 2), ([A], 4)]))
    assert hits.tolist() == [0, 1] and whole.tolist() == [0, 1]


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
    hits, _ = optimal_by_capacity(s)
    for capacity in range(0, 4):
        assert hits[min(capacity, len(hits) - 1)] == brute_force(s, capacity), capacity


@given(st.integers(0, 2**32), st.sampled_from([5, 30, 120]))
@settings(max_examples=80, deadline=None)
def test_the_one_pass_equals_min_simulated_at_every_capacity(seed, requests):
    s = random_stream(random.Random(seed), requests)
    hits, whole = optimal_by_capacity(s)
    peak = peak_live(s)
    for c in range(0, min(len(hits) - 1, peak + 2) + 1):
        assert (hits[c], whole[c]) == reference_min(s, c), c
    assert (hits[-1], whole[-1]) == reference_min(s, 10**9)  # the unlimited cache
    assert (hits[peak:] == hits[-1]).all() and (peak == 0 or hits[peak - 1] < hits[-1])


@pytest.mark.parametrize("seed", range(20))
def test_min_lies_between_lru_and_unlimited_at_every_capacity(seed):
    rng = random.Random(seed)
    s = random_stream(rng, 60)
    unlimited = simulate_tiers(s, [10**9]).hit_tokens[0]
    hits, whole = optimal_by_capacity(s)
    for c in range(len(hits)):
        lru = simulate_tiers(s, [c]).hit_tokens[0]
        assert lru <= hits[c] * s.chunk_size - whole[c] <= unlimited
    assert hits[-1] * s.chunk_size - whole[-1] == unlimited


def test_on_the_mooncake_sample_at_512_at_every_curve_point():
    requests = list(read_trace(MOONCAKE))[:300]
    curve, stream = curve_and_stream([r.token_ids for r in requests], 512)
    hits, whole = optimal_by_capacity(stream)
    assert len(hits) == curve.distinct_chunks + 1
    points = [int(c) for c in curve.capacities()]
    for c in points:
        opt = int(hits[c]) * 512 - int(whole[c])
        assert curve.hit_tokens(c) <= opt <= curve.unlimited_hit_tokens, c
    for c in points[::8] + [peak_live(stream) - 1]:
        assert (hits[c], whole[c]) == reference_min(stream, c), c
    assert hits[-1] * 512 - whole[-1] == curve.unlimited_hit_tokens
    assert any(hits[c] > curve.hit_chunks_by_capacity[c] for c in points)
