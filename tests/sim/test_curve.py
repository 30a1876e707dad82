"""The capacity/TTL curve without a server: the TTL rules against a direct simulation (one request at a time and in
batches), batches of requests equal to one request at a time, and each request's reused tokens at any capacity."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_stackdist import cut

from kvcli.sim.chunkids import ChunkIds
from kvcli.sim.curve import HitCurve
from kvcli.sim.ttlcurve import TtlCurve
from kvcli.store.hashing import chunk_prompt


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


# --- TTL ------------------------------------------------------------------------------------------------------

def ttl_hits(prompts, times, refresh, grid):
    ids, curve = ChunkIds(), TtlCurve(refresh, np.asarray(grid, float))
    for p, t in zip(prompts, times):
        curve.access(*ids.ids(chunk_prompt(p, 4, b"r" * 16).hashes), t)
    return curve.hits().tolist()


A, AB = tok(1, 4), tok(1, 8)  # chunk a; chunks a, b


def test_ttl_after_write_is_not_monotone_through_the_chain():
    """[a] at 0 s, [a, b] at 2 s and 3 s. T = 1 s: a expired at 2 s (rewritten with b), both hit at 3 s: 2 chunks.
    T = 2 s: a hits at 2 s (not rewritten), expires at 3 s, so the chain breaks: 1 chunk. T = 3 s: 1 + 2."""
    assert ttl_hits([A, AB, AB], [0.0, 2.0, 3.0], False, [1, 2, 3]) == [2, 1, 3]
    assert ttl_hits([A, AB, AB], [0.0, 2.0, 3.0], True, [1, 2, 3]) == [2, 3, 3]  # gaps 2; then 1, 1


def test_ttl_a_gap_equal_to_the_ttl_hits():
    assert ttl_hits([A, A], [10.0, 15.0], False, [4.999, 5, 6]) == [0, 1, 1]


def test_ttl_a_gap_equal_to_the_ttl_hits_to_the_microsecond_whatever_floating_point_makes_of_it():
    # 3.2 - 3.0 = 0.20000000000000018 and 1700000000.2 - 1700000000.0 = 0.20000004768371582: both are the 0.2 s
    # gap of the trace, which hits at TTL 0.2 s; a gap 2 microseconds over it does not
    for t0, t1 in ((3.0, 3.2), (1_700_000_000.0, 1_700_000_000.2)):
        for refresh in (False, True):
            assert ttl_hits([A, A], [t0, t1], refresh, [0.1, 0.2, 0.5]) == [0, 1, 1]
    assert ttl_hits([A, A], [3.0, 3.200002], False, [0.2, 0.5]) == [0, 1]


def _reference(prompts, times, ttl, refresh) -> int:
    """The store's rule, simulated per TTL: a lookup hits the present chunks from chunk 0; every absent chunk is then
    written (SET NX EX), and with refresh every chunk of the request renews its life."""
    written, hits = {}, 0
    for p, t in zip(prompts, times):
        hs = chunk_prompt(p, 4, b"r" * 16).hashes
        present = [h in written and t - written[h] <= ttl for h in hs]
        hits += next((k for k, ok in enumerate(present) if not ok), len(hs))
        for h, ok in zip(hs, present):
            if refresh or not ok:
                written[h] = t
    return hits


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=24), st.sampled_from([0, 0.5, 1, 2, 3, 7])),
                min_size=1, max_size=25), st.booleans())
def test_ttl_curve_equals_a_simulation_per_ttl(trace, refresh):
    prompts = [p for p, _ in trace]
    times = np.cumsum([dt for _, dt in trace]).tolist()
    grid = [0.5, 1, 2, 3, 5, 8, 13, 1e9]
    assert ttl_hits(prompts, times, refresh, grid) == [_reference(prompts, times, t, refresh) for t in grid]


# --- batches (observe_many, TtlCurve.access_many): the same as one request at a time ------------------------------

def _curve(requests, sizes, refresh, chunk_size=4):
    """Chains and result of a HitCurve fed ``requests`` ((hashes, time, tokens)) in groups of ``sizes`` (None:
    observe, one at a time)."""
    curve = HitCurve(chunk_size, refresh)
    if sizes is None:
        chains = [curve.observe(*r) for r in requests]
    else:
        chains = [c for group in cut(requests, sizes) for c in curve.observe_many(group)]
    return [c.tolist() for c in chains], curve.result(1000, 64)


batch_trace = st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=24),
                                 st.sampled_from([0, 0, 0.5, 1, 2, 3, 7, -1, -2.5]), st.integers(-1, 2)),
                       min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(batch_trace, st.lists(st.integers(1, 12), min_size=1, max_size=4), st.booleans(), st.booleans())
def test_observe_many_equals_observe_one_by_one(trace, sizes, refresh, untimed):
    """Random batch cuts of random traces (prefix sharing, a chunk hit by several requests of a batch, empty prompts,
    equal and decreasing timestamps, prompts of whole chunks or not, a request without a time), both TTL rules: the
    chains and every array of the result are the same."""
    times = np.cumsum([dt for _, dt, _ in trace]).tolist()
    if untimed:
        times[len(times) // 2] = None
    requests = [(chunk_prompt(p, 4, b"r" * 16).hashes, t, len(p) + extra)
                for (p, _, extra), t in zip(trace, times)]
    chains, one = _curve(requests, None, refresh)
    got, many = _curve(requests, sizes, refresh)
    assert got == chains
    for field in ("hit_chunks_by_capacity", "whole_hits_by_capacity", "ttl_seconds", "ttl_hit_chunks"):
        a, b = getattr(one, field), getattr(many, field)
        assert (a is None and b is None) or a.tolist() == b.tolist(), field
    assert (one.distinct_chunks, one.untimed_requests, one.span_seconds) == (
        many.distinct_chunks, many.untimed_requests, many.span_seconds)
    deferred = HitCurve(4, refresh)  # deferred in the same cuts, observed BATCH (256) at a time or at the end
    for group in cut(requests, sizes):
        deferred.defer(group)
    assert deferred.result(1000, 64).to_dict() | {"seconds": 0, "memory_bytes": 0} == \
        one.to_dict() | {"seconds": 0, "memory_bytes": 0}


def test_deferred_requests_come_first_and_in_batches():
    """defer() holds requests until BATCH of them (or an observe, or the result): 300 requests of one chunk then one
    more of it through observe: distances as one at a time."""
    from kvcli.sim.curve import BATCH

    h = chunk_prompt(tok(1, 4), 4, b"r" * 16).hashes
    other = [chunk_prompt([i] * 4, 4, b"r" * 16).hashes for i in range(1000, 1300)]
    curve = HitCurve(4)
    curve.defer([(other[0], 0.0, 4)])
    curve.defer([(h, 0.0, 4)])
    assert len(curve._pending) == 2
    curve.defer([(x, 0.0, 4) for x in other[1:BATCH]])
    assert not curve._pending  # BATCH + 1 deferred: observed
    curve.defer([(x, 0.0, 4) for x in other[BATCH:]])
    assert curve.observe(h, 1.0, 4).tolist() == [300]  # the 299 other chunks touched after it, then itself


def batched_ttl_hits(prompts, times, refresh, grid, sizes):
    """TtlCurve.access_many's hits per grid TTL over ``prompts`` at ``times``, cut in batches of ``sizes``."""
    ids, curve = ChunkIds(), TtlCurve(refresh, np.asarray(grid, float))
    for group in cut(list(zip(prompts, times)), sizes):
        hs = [chunk_prompt(p, 4, b"r" * 16).hashes for p, _ in group]
        got, first = ids.ids_many(hs)
        bounds = np.concatenate([[0], np.cumsum([len(h) for h in hs])]).astype(np.int64)
        curve.access_many(got, bounds, first, np.array([t for _, t in group], float))
    return curve.hits().tolist()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=24), st.sampled_from([0, 0.5, 1, 2, 3, 7, -1])),
                min_size=1, max_size=25), st.booleans(), st.lists(st.integers(1, 10), min_size=1, max_size=3))
def test_batched_ttl_curve_equals_a_simulation_per_ttl(trace, refresh, sizes):
    """TtlCurve.access_many on random batch cuts == the store's rule simulated per TTL (decreasing times too)."""
    prompts = [p for p, _ in trace]
    times = np.cumsum([dt for _, dt in trace]).tolist()
    grid = [0.5, 1, 2, 3, 5, 8, 13, 1e9]
    assert batched_ttl_hits(prompts, times, refresh, grid, sizes) == [_reference(prompts, times, t, refresh)
                                                                      for t in grid]


def test_a_hot_chunk_in_every_request_of_a_batch():
    """One chunk in all 40 requests of a batch, 1 s apart (40 rounds of the write rule): T = 0.5 s rewrites it every
    time (no hit), T = 2 s writes it at 0, 3, 6, ... s (hits the other 26), T >= 39 s hits 39."""
    hs = chunk_prompt(tok(1, 4), 4, b"r" * 16).hashes
    ids, curve = ChunkIds(), TtlCurve(False, np.array([0.5, 2.0, 39.0]))
    got, first = ids.ids_many([hs] * 40)
    curve.access_many(got, np.arange(41, dtype=np.int64), first, np.arange(40, dtype=float))
    assert curve.hits().tolist() == [0, 26, 39]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=12), st.sampled_from([0, 0.25, 0.5, 1, 2, 3, 7, -1])),
                min_size=10, max_size=60), st.booleans(), st.lists(st.integers(10, 60), min_size=1, max_size=3))
def test_a_hot_chunk_s_rounds_after_every_other_chunk_s_equal_a_simulation_per_ttl(trace, refresh, sizes):
    """Every request starts with the same chunk, in batches of 10-60: the hot chunk's touches after every other
    chunk's last in the batch (rounds of one touch, taken on Python floats) == the store's rule per TTL."""
    prompts = [tok(1, 4) + [t + 10 for t in p] for p, _ in trace]
    times = np.cumsum([dt for _, dt in trace]).tolist()
    grid = [0.2, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 1e9]  # times are sums of exact binary fractions
    assert batched_ttl_hits(prompts, times, refresh, grid, sizes) == [_reference(prompts, times, t, refresh)
                                                                      for t in grid]


@settings(max_examples=100, deadline=None)
@given(batch_trace, st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_reused_tokens_per_request_add_up_to_the_curve_at_every_capacity(trace, sizes):
    """keep_hits: each request's reused tokens at a capacity (its leading chunks within it, less the last token of a
    prompt hit whole) sum to the curve's hit tokens at every capacity, and match a request's own chain."""
    requests = [(chunk_prompt(p, 4, b"r" * 16).hashes, None, len(p) + max(extra, 0))
                for p, _, extra in trace]
    curve = HitCurve(4, keep_hits=True)
    chains = [c for group in cut(requests, sizes) for c in curve.observe_many(group)]
    result = curve.result(1000, 64)
    for capacity in range(result.distinct_chunks + 2):
        prompt, reused = result.reused_tokens(capacity)
        assert int(reused.sum()) == result.hit_tokens(capacity)
        assert prompt.tolist() == [n for _, _, n in requests]
        for chain, (_, _, n), r in zip(chains, requests, reused.tolist()):
            assert r == max(0, min(4 * int((chain <= capacity).sum()), n - 1))


def test_reused_tokens_need_the_kept_hits():
    curve = HitCurve(4)
    curve.observe(chunk_prompt(tok(1, 8), 4, b"r" * 16).hashes, None, 8)
    with pytest.raises(ValueError, match="keep_hits"):
        curve.result(8, 64).reused_tokens(1)
