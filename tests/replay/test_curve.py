"""The capacity/TTL curve: by hand, equal to replays at every capacity (random traces and the Mooncake sample),
the TTL rules against a direct simulation, and the command's table, JSON and plot."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stackdist import cut
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import ModelSpec
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.sim.chunkids import ChunkIds
from kvcli.sim.curve import HitCurve
from kvcli.sim.ttlcurve import TtlCurve
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.hashing import chunk_prompt
from kvcli.store.namespace import purge
from kvcli.store.records import StoreConfig
from kvcli.traces.detect import read_trace
from kvcli.traces.request import Request

SPEC = ModelSpec("m", (2, 2, 2, 32), torch.float32)  # 1,024 KV bytes per token
MOONCAKE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def reqs(prompts, times=None) -> list[Request]:
    times = times or [None] * len(prompts)
    return [Request(f"t:{i + 1}", np.asarray(p, dtype="<u4"), t, source=f"t:{i + 1}")
            for i, (p, t) in enumerate(zip(prompts, times))]


def replay(client, requests, chunk_sizes=(4,), **kw):
    config = ReplayConfig(chunk_sizes=chunk_sizes, payload="accounted", measure=0, **kw)
    return Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "raw", config, spec=SPEC).replay(
        "t", requests)


SMALLEST = [tok(1, 16), tok(101, 104), tok(1, 16)]  # the smallest case where the LRU order matters, chunk size 4


def test_issue_10_smallest_case_replay_hits_12_and_the_curve_agrees(redis_client):
    limited = replay(redis_client, reqs(SMALLEST), capacity_tokens=16).per_chunk_size[0]
    assert (limited.hit_tokens, limited.prompt_tokens, limited.evicted_chunks) == (12, 36, 2)
    curve = replay(redis_client, reqs(SMALLEST)).per_chunk_size[0].hit_curve
    # third request's chain distances 2, 3, 4, 5: hits 0, 0, 4, 8, 12, 15 tokens at capacities 0..5 chunks (wholly
    # hit from 5 on: it still computes its last token, so it reuses 15 of its 16)
    assert [curve.hit_tokens(c) for c in range(7)] == [0, 0, 4, 8, 12, 15, 15]
    assert curve.distinct_chunks == 5 and curve.unlimited_hit_tokens == 15
    assert [curve.capacity_for(f) for f in (0.5, 0.9, 0.99, 1.0)] == [3, 5, 5, 5]
    assert curve.ttl_hit_chunks is None and curve.untimed_requests == 3  # no timestamps: no TTL curve


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 3), max_size=20), min_size=1, max_size=14),
       st.lists(st.integers(1, 14), min_size=1, max_size=3))
def test_curve_equals_a_replay_at_every_capacity(redis_client, prompts, capacities):
    """Totals: --capacity-tokens C*chunk_size gives the curve's hit tokens at C, per chunk size."""
    requests = reqs(prompts)
    curves = {r.chunk_size: r.hit_curve for r in replay(redis_client, requests, (2, 3)).per_chunk_size}
    for c in capacities:
        for cs in (2, 3):
            got = replay(redis_client, requests, (cs,), capacity_tokens=c * cs, hit_curve=False).per_chunk_size[0]
            assert got.hit_tokens == curves[cs].hit_tokens(c), (cs, c)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 3), max_size=24), min_size=1, max_size=20), st.integers(1, 12))
def test_curve_equals_the_store_chunk_for_chunk(redis_client, prompts, capacity):
    """Per request: the store's lookup on Redis (capacity ``capacity`` chunks of 2) hits exactly the chunks whose
    chain distance is <= capacity."""
    store = ChunkStore(redis_client, StoreConfig("curve-prop", 2, "m", "raw", SPEC.kv_shape, SPEC.dtype,
                                                 payload="accounted", capacity_tokens=2 * capacity))
    curve = HitCurve(2)
    try:
        for p in prompts:
            prompt = store.chunk(p)
            chain = curve.observe(prompt.hashes, None)
            look = store.lookup(prompt)
            assert look.hit_chunks == int((chain <= capacity).sum())
            store.store(prompt, None, start_chunk=look.hit_chunks, lookup=look)
    finally:
        purge(redis_client, "curve-prop")


def test_curve_equals_replays_on_the_mooncake_sample(redis_client):
    """First 150 requests, index only: the curve of one replay at three capacities = three capacity replays."""
    read = lambda: read_trace(MOONCAKE)  # noqa: E731
    config = dict(chunk_sizes=(256, 1024), payload="accounted", measure=0, limit=150)
    spec = ModelSpec("m", (8, 2, 2, 64), torch.bfloat16)

    def run(**kw):
        r = Replayer(redis_client, None, CostCurve.from_tokens_per_second(3000.0), "cl100k_base",
                     ReplayConfig(**config, **kw), spec=spec)
        return {x.chunk_size: x for x in r.replay(str(MOONCAKE), read).per_chunk_size}

    full = run()
    curves = {cs: r.hit_curve for cs, r in full.items()}
    assert curves[256].unlimited_hit_tokens == full[256].hit_tokens > 0
    half = curves[1024].capacity_for(0.5) * 1024
    quarter = curves[256].capacity_for(0.25) * 256
    hits = {}
    for capacity_tokens in (quarter, half, 3 * half):
        limited = run(capacity_tokens=capacity_tokens, hit_curve=False)
        for cs in (256, 1024):
            hits[cs, capacity_tokens] = limited[cs].hit_tokens
            assert limited[cs].hit_tokens == curves[cs].hit_tokens(capacity_tokens // cs), (cs, capacity_tokens)
    assert 0 < hits[256, quarter] < hits[256, half] < full[256].hit_tokens  # the capacities bite
    assert 0 < hits[1024, half] < full[1024].hit_tokens


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


def test_replay_reports_the_ttl_curve_from_timestamps(redis_client):
    res = replay(redis_client, reqs([A, AB, AB], [0.0, 2.0, 3.0])).per_chunk_size[0]
    c = res.hit_curve
    assert (c.span_seconds, c.ttl_rule) == (3.0, "after write")
    ttl = dict(zip(c.ttl_seconds.tolist(), (c.ttl_hit_chunks * 4).tolist()))
    assert (ttl[0.5], ttl[1.0], ttl[2.0], ttl[5.0]) == (0, 8, 4, 12)  # the by-hand test above, in tokens
    assert (c.ttl_for(0.5), c.ttl_for(0.9), c.ttl_for(1.0)) == (1.0, 5.0, 5.0)  # of 12 unlimited hit tokens
    refreshed = replay(redis_client, reqs([A, AB, AB], [0.0, 2.0, 3.0]), ttl_refresh=True).per_chunk_size[0].hit_curve
    assert refreshed.ttl_rule == "after access" and refreshed.ttl_for(1.0) == 2.0


# --- the command ------------------------------------------------------------------------------------------------

def _trace(tmp_path, times=True) -> Path:
    path = tmp_path / "smallest.jsonl"
    path.write_text("".join(json.dumps({"token_ids": p, **({"timestamp": t} if times else {})}) + "\n"
                            for p, t in zip(SMALLEST, [0.0, 1.0, 2.0])))
    return path


def _cli(*args):
    return CliRunner().invoke(app, ["replay", *map(str, args), "--chunk-sizes", "4", "--measure", "0",
                                    "--prefill-tps", "1000", "--payload", "accounted", "--model", "tiny"])


def test_cli_json_table_and_plot(tmp_path, redis_url):
    out = _cli(_trace(tmp_path), "--redis-url", redis_url, "--json", "--plot", tmp_path / "c.png")
    assert out.exit_code == 0, out.output
    curve = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"]
    assert curve["unlimited_hit_tokens"] == 15 and curve["distinct_chunks"] == 5  # the last token is recomputed
    # tiny model: 1,024 KV bytes per token, so a chunk of 4 tokens is 4,096 payload bytes
    assert curve["capacity_for_fraction"]["0.9"] == {
        "capacity_chunks": 5, "capacity_tokens": 20, "capacity_payload_bytes": 20480, "hit_tokens": 15,
        "hit_token_ratio": 15 / 36}
    assert [p["hit_tokens"] for p in curve["capacity_points"]] == [0, 0, 4, 8, 12, 15]
    assert curve["ttl_for_fraction_seconds"]["1.0"] == 2.0 and curve["trace_span_seconds"] == 2.0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = _cli(_trace(tmp_path, times=False), "--redis-url", redis_url)
    assert table.exit_code == 0, table.output
    assert "cache for 90% of unlimited hits" in table.stdout and "20.0 KiB / 20 tok" in table.stdout
    assert "no timestamps" in table.stdout
    # one request of three without a timestamp: no TTL curve, and the cell says how many lacked one
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps({"token_ids": p, **({"timestamp": t} if t is not None else {})}) + "\n"
                               for p, t in zip(SMALLEST, [0.0, None, 2.0])))
    table = _cli(partial, "--redis-url", redis_url)
    assert table.exit_code == 0 and "1 untimed" in table.stdout and "no timestamps" not in table.stdout
    refused = _cli(partial, "--redis-url", redis_url, "--no-curve", "--ttl-refresh")
    assert refused.exit_code == 2 and "--ttl-refresh sets the TTL curve's expiry rule" in refused.output


def test_cli_no_curve_and_bad_plot_paths(tmp_path, redis_url):
    off = _cli(_trace(tmp_path), "--redis-url", redis_url, "--no-curve", "--json")
    assert off.exit_code == 0 and json.loads(off.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"] is None
    bad = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "c.txt")
    assert bad.exit_code == 2 and "--plot must end in .png or .svg" in bad.stderr
    both = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "c.svg", "--no-curve")
    assert both.exit_code == 2 and "needs the curve" in both.stderr
    assert not (tmp_path / "c.svg").exists()
    nowhere = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "no" / "c.png")
    assert nowhere.exit_code == 2 and "no folder" in nowhere.stderr and "replaying" not in nowhere.stderr


@pytest.mark.parametrize("traces, names", [
    (["a.jsonl"], ["c.png"]),
    (["a.jsonl", "b.json.gz"], ["c-a.png", "c-b.png"]),
    (["p/x.jsonl", "q/x.jsonl", "x.json", "x-2.jsonl"], ["c-x.png", "c-x-2.png", "c-x-3.png", "c-x-2-2.png"]),
])
def test_one_plot_per_trace(traces, names):
    from kvcli.figures import plot_paths

    assert [p.name for p in plot_paths("out/c.png", traces)] == names


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
