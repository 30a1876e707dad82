"""The one-pass LRU mechanism: chunk ids, the Fenwick tree and stack distances, against ChunkLru and by hand."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.sim.chunkids import ChunkIds
from kvcli.sim.lru import ChunkLru
from kvcli.sim.stackdist import NEVER, Fenwick, StackDistances, _smaller_before, batch_links, chain_max
from kvcli.store.hashing import chunk_prompt

ROOT = b"r" * 16


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def hashes(tokens, chunk_size: int = 4) -> list[bytes]:
    return chunk_prompt(tokens, chunk_size, ROOT).hashes


def distances(prompts, chunk_size: int = 4) -> list[list[int]]:
    ids, stack = ChunkIds(), StackDistances()
    out = []
    for p in prompts:
        d = chain_max(stack.access(*ids.ids(hashes(p, chunk_size))))
        out.append([int(x) if x != NEVER else None for x in d])
    return out


def test_issue_10_smallest_case_by_hand():
    """tok(1..16) leaves c0..c3 at distances 1..4; [101..104] pushes them to 2..5; so the third request's chunks
    hit at capacity 4 chunks (16 tokens) up to c2: 12 of 16 tokens, as ChunkLru does."""
    d = distances([tok(1, 16), tok(101, 104), tok(1, 16)])
    assert d == [[None] * 4, [None], [2, 3, 4, 5]]
    assert sum(x <= 4 for x in d[2]) * 4 == 12


def test_chain_max_makes_a_missing_head_end_the_run():
    assert chain_max(np.array([3, 1, 2, NEVER, 1])).tolist() == [3, 3, 3, NEVER, NEVER]


def test_ids_are_dense_and_stable():
    ids = ChunkIds(expected=1)
    a, b, c = (bytes([i]) * 16 for i in range(3))
    got, first = ids.ids([a, b])
    assert (sorted(got.tolist()), first) == ([0, 1], 0)
    got2, first2 = ids.ids([b, c, a, c])  # c twice in one call: one id
    assert first2 == 2 and got2.tolist() == [got[1], 2, got[0], 2]
    assert len(ids) == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 300), max_size=40), max_size=40))
def test_ids_match_a_dict_through_growth(batches):
    ids, ref = ChunkIds(expected=1), {}
    for batch in batches:
        keys = [x.to_bytes(16, "little") for x in batch]
        got, first = ids.ids(keys)
        for k, i in zip(keys, got.tolist()):
            if k not in ref:
                assert i >= first
                ref[k] = i
            assert ref[k] == i
    assert sorted(ref.values()) == list(range(len(ref))) and len(ids) == len(ref)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 90), st.data())
def test_fenwick_runs_and_prefixes_match_cumsum(size, data):
    """Up to 20 runs per call (both the plain-loop path, <= 8 runs or positions, and the numpy path)."""
    ones = data.draw(st.integers(0, size))
    tree, plain = Fenwick(size, ones=ones), np.zeros(size + 1, np.int64)
    plain[1:ones + 1] = 1
    for _ in range(data.draw(st.integers(1, 5))):
        cuts = sorted(data.draw(st.sets(st.integers(1, size), min_size=1, max_size=20)))
        runs = [(a, data.draw(st.integers(a, b - 1 if b > a else a))) for a, b in zip(cuts, cuts[1:] + [size + 1])]
        deltas = data.draw(st.lists(st.sampled_from([1, -1, 3]), min_size=len(runs), max_size=len(runs)))
        tree.add_runs(np.array([a for a, _ in runs]), np.array([b for _, b in runs]), np.array(deltas))
        for (a, b), d in zip(runs, deltas):
            plain[a:b + 1] += d
        assert tree.prefix(np.arange(size + 1)).tolist() == np.cumsum(plain).tolist()
        few = data.draw(st.lists(st.integers(0, size), max_size=8))
        assert tree.prefix(np.array(few, np.int64)).tolist() == np.cumsum(plain)[few].tolist()


prompts = st.lists(st.lists(st.integers(0, 3), max_size=24), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(prompts, st.sampled_from([1, 2, 3, 4]), st.lists(st.integers(0, 30), min_size=1, max_size=4))
def test_distances_decide_every_capacity_as_chunklru(trace, chunk_size, capacities):
    """At every capacity, chunk for chunk: ChunkLru's prefix match == chunks whose chain distance is <= capacity."""
    ids, stack = ChunkIds(expected=1), StackDistances()
    lrus = [ChunkLru(c) for c in capacities]
    for p in trace:
        h = hashes(p, chunk_size)
        chain = chain_max(stack.access(*ids.ids(h)))
        for c, lru in zip(capacities, lrus):
            assert lru.match(h) == int((chain <= c).sum())
            lru.store(h)


def test_distances_stay_exact_across_renumbering():
    """5,000 requests: the tree fills and is renumbered several times; ChunkLru agrees throughout."""
    rng = np.random.default_rng(0)
    ids, stack = ChunkIds(expected=1), StackDistances()
    lrus = [ChunkLru(c) for c in (1, 7, 50, 400)]
    sizes = set()
    for _ in range(5000):
        h = hashes(rng.integers(0, 3, rng.integers(0, 40)).tolist(), 2)
        chain = chain_max(stack.access(*ids.ids(h)))
        sizes.add(stack._tree.size)
        for lru in lrus:
            assert lru.match(h) == int((chain <= lru.capacity).sum())
            lru.store(h)
    assert len(sizes) >= 3  # renumbered (and grown) at least twice


# --- several requests at once (access_many): the same distances as one call per request ---------------------------

def cut(items, sizes):
    """``items`` cut into consecutive groups of ``sizes`` (cycled), the last one what is left (also
    tests/sim/test_curve.py's)."""
    out, i, k = [], 0, 0
    while i < len(items):
        out.append(items[i:i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


def _many(stack, ids, groups):
    """Distances of ``groups`` (lists of hash lists) through access_many, one call per group."""
    out = []
    for group in groups:
        got, first = ids.ids_many(group)
        bounds = np.concatenate([[0], np.cumsum([len(h) for h in group])]).astype(np.int64)
        links = batch_links(got, bounds)
        chain = chain_max(stack.access_many(got, bounds, first, links), links.req)
        out += [chain[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]
    return out


@settings(max_examples=200, deadline=None)
@given(prompts, st.sampled_from([1, 2, 3, 4]), st.lists(st.integers(1, 9), min_size=1, max_size=4),
       st.lists(st.integers(0, 30), min_size=1, max_size=4))
def test_batched_distances_equal_one_request_at_a_time_and_chunklru(trace, chunk_size, sizes, capacities):
    """Random batch cuts (prefix sharing, repeated chunks, empty prompts, a chunk touched by several requests of one
    batch): access_many == access per request, and ChunkLru agrees at every capacity."""
    hs = [hashes(p, chunk_size) for p in trace]
    one = _many(StackDistances(), ChunkIds(expected=1), [[h] for h in hs])
    assert _many(StackDistances(), ChunkIds(expected=1), cut(hs, sizes)) == one
    lrus = [ChunkLru(c) for c in capacities]
    for h, chain in zip(hs, one):
        for lru in lrus:
            assert lru.match(h) == sum(d <= lru.capacity for d in chain)
            lru.store(h)


def test_batched_distances_by_hand():
    """[a b] [c] [a b] [b'] in one batch, a-b a chain: a request sees the state before it, chunk 0 ends latest."""
    a, b, c, b2 = (bytes([i]) * 16 for i in range(4))
    got = _many(StackDistances(), ChunkIds(expected=1), [[[a, b], [c], [a, b], [a, b2]]])
    assert got == [[NEVER, NEVER], [NEVER], [2, 3], [1, NEVER]]
    # [a] [b] then [b] [a] in a second batch: no chunk touched twice in it, yet b's touch counts once for a
    assert _many(StackDistances(), ChunkIds(expected=1), [[[a], [b]], [[b], [a]]]) == [[NEVER], [NEVER], [1], [2]]


def test_batched_distances_stay_exact_across_renumbering():
    """Batches of 1..60 requests fill the tree many times over; ChunkLru agrees throughout."""
    rng = np.random.default_rng(1)
    hs = [hashes(rng.integers(0, 3, rng.integers(0, 40)).tolist(), 2) for _ in range(3000)]
    stack = StackDistances()
    got = _many(stack, ChunkIds(expected=1), cut(hs, [1, 60, 7, 33]))
    lrus = [ChunkLru(c) for c in (1, 7, 50, 400)]
    for h, chain in zip(hs, got):
        for lru in lrus:
            assert lru.match(h) == sum(d <= lru.capacity for d in chain)
            lru.store(h)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60))
def test_smaller_before_counts_earlier_smaller_values(values):
    v = np.array(values, np.int64)
    want = [sum(v[j] < v[i] for j in range(i)) for i in range(len(v))]
    assert _smaller_before(v, max(values, default=0)).tolist() == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), unique=True, max_size=5), min_size=1, max_size=8))
def test_batch_links_and_segmented_chain_max(requests):
    ids = np.array([i for r in requests for i in r], np.int64)
    bounds = np.concatenate([[0], np.cumsum([len(r) for r in requests])]).astype(np.int64)
    links = batch_links(ids, bounds)
    for i, x in enumerate(ids.tolist()):
        earlier = [j for j in range(i) if ids[j] == x]
        assert links.prev[i] == (earlier[-1] if earlier else -1) and links.rank[i] == len(earlier)
        assert links.last[i] == (x not in ids[i + 1:].tolist())
        assert bounds[links.req[i]] <= i < bounds[links.req[i] + 1]
    d = np.where(ids % 3 == 0, NEVER, ids + 1)
    want = np.concatenate([chain_max(d[a:b]) for a, b in zip(bounds[:-1], bounds[1:])] + [np.empty(0, np.int64)])
    assert chain_max(d, links.req).tolist() == want.tolist()
