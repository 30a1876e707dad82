"""The one-pass LRU mechanism: chunk ids, the Fenwick tree and stack distances, against ChunkLru and by hand."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.store.chunkids import ChunkIds
from kvcli.store.hashing import chunk_prompt
from kvcli.store.lru import ChunkLru
from kvcli.store.stackdist import NEVER, Fenwick, StackDistances, chain_max

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
