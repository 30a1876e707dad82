"""kvcli route: the routing simulator, its policies, the Redis cache manager and the command, on hand-computed values.

Conventions: chunk size 4; prefill at 64 tokens/s (CostCurve.from_tokens_per_second), decode 1/64 s per token, so
every time below is a dyadic fraction and compares exactly with ``==``. Each "A" prompt is the shared 3-chunk
prefix P = tokens 1..12, then one chunk of its own, then 2 tokens: 18 tokens, 4 full chunks; a full prefill takes
18/64 s and one that hits P takes 6/64 s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
import typer
from typer.testing import CliRunner

from kvcli.cli.route import route
from kvcli.errors import BadInputError, KvcliError
from kvcli.model.costcurve import CostCurve
from kvcli.route.cachemanager import CacheManagerIndex, DelaySpec
from kvcli.route.nodecache import ChunkIndex
from kvcli.route.policies import POLICIES, Draws, make_policy, resolve_policies
from kvcli.route.report import run_routes, summarize, sweep_points
from kvcli.route.simulator import (
    STREAM_POLICY,
    ClusterView,
    SimConfig,
    prepare_requests,
    simulate,
    single_node_hit_tokens,
)
from kvcli.sim.lru import ChunkLru
from kvcli.traces.request import Request
from kvcli.units import parse_capacity, parse_duration

CS, TPS, TPOT = 4, 64.0, 1 / 64
COST = CostCurve.from_tokens_per_second(TPS)
P = list(range(1, 13))


def a_prompt(k: int) -> list[int]:
    """Shared prefix P, one chunk of its own (k), 2 more tokens: 18 tokens, 4 full chunks."""
    return P + [1000 * k + j for j in range(1, 5)] + [7, 7]


def requests(prompts, times, out=1, salts=None):
    """Hashed requests from token lists, arrival times and output lengths (1 = no decode time)."""
    outs = out if isinstance(out, list) else [out] * len(prompts)
    salts = salts or [""] * len(prompts)
    return prepare_requests([Request(str(i), np.array(p, dtype=np.uint32), t, None, s, o)
                             for i, (p, t, o, s) in enumerate(zip(prompts, times, outs, salts))], CS)


def config(**kw) -> SimConfig:
    return SimConfig(**{"nodes": 2, "capacity_tokens": None, "chunk_size": CS, "decode_tpot": TPOT,
                        "count_measured_latency": False, **kw})


def run(name, reqs, cfg, client=None):
    policy = make_policy(name, cfg, client)
    try:
        return simulate(reqs, policy, cfg, COST)
    finally:
        policy.close()


# --- two nodes, one request at a time: three share a 3-chunk prefix, one does not ---------------------------

B = list(range(201, 213)) + [5, 5, 5, 5, 9, 9]
SERIAL = dict(prompts=[a_prompt(1), a_prompt(2), a_prompt(3), B], times=[0.0, 10.0, 20.0, 30.0])


def test_prefix_keeps_the_shared_prefix_on_one_node():
    r = run("prefix", requests(**SERIAL), config())
    assert r.node.tolist() == [0, 0, 0, 0]  # B matches nothing: least loaded, all idle, lowest number
    assert r.hit_tokens.tolist() == [0, 12, 12, 0]
    assert int(r.hit_tokens.sum()) == 2 * 3 * CS
    assert (r.first_token - r.arrival).tolist() == [18 / 64, 6 / 64, 6 / 64, 18 / 64]


def test_round_robin_alternates_and_hits_once():
    r = run("round-robin", requests(**SERIAL), config())
    assert r.node.tolist() == [0, 1, 0, 1]
    assert r.hit_tokens.tolist() == [0, 0, 12, 0]  # A3 finds A1's prefix on node 0; A2 and B find nothing
    s = summarize(r, config(), single_node_hit_tokens(requests(**SERIAL), config()))
    assert s["hit_tokens"] == 12 and s["prefill_tokens"] == 4 * 18 - 12
    assert s["hit_token_ratio"] == 12 / 72 and s["single_node_hit_token_ratio"] == 24 / 72
    assert s["per_node"]["requests"] == [2, 2] and s["per_node"]["prefill_tokens"] == [24, 36]


# --- four nodes, eight requests with one prefix, all in flight at once ---------------------------------------

def burst():
    """Eight A prompts at t=0, each decoding 1000 tokens (15.6 s): all in flight together."""
    return requests([a_prompt(k) for k in range(8)], [0.0] * 8, out=1001)


def outstanding_at_every_event(r) -> list[list[int]]:
    """Outstanding requests per node right after every dispatch and finish, from the records alone."""
    times = sorted(set(r.dispatch.tolist()) | set(r.finish.tolist()))
    return [[int(np.sum((r.node == k) & (r.dispatch <= t) & (r.finish > t))) for k in range(r.nodes)]
            for t in times]


def test_prefix_without_load_tracking_piles_the_burst_on_one_node():
    r = run("prefix", burst(), config(nodes=4))
    assert np.bincount(r.node, minlength=4).tolist() == [8, 0, 0, 0]
    s = summarize(r, config(nodes=4), 0)
    assert s["per_node"]["requests_spread"]["max_over_mean"] == 4.0
    assert r.peak_imbalance == 8


def test_round_robin_spreads_the_burst_two_per_node():
    r = run("round-robin", burst(), config(nodes=4))
    assert np.bincount(r.node, minlength=4).tolist() == [2, 2, 2, 2]
    assert summarize(r, config(nodes=4), 0)["per_node"]["requests_spread"] == {"max_over_mean": 1.0, "cv": 0.0}


def test_cache_aware_bounds_the_imbalance():
    cfg = config(nodes=4, abs_threshold=2)
    r = run("cache-aware", burst(), cfg)
    # loads before each decision: [0000] prefix (no match: fewest) -> 0; [1000], [2000]: prefix match -> 0;
    # [3000] 3 > 2: fewest -> 1; [3100] -> 2; [3110] -> 3; [3111] diff 2, all match: fewest -> 1; [3211] -> 2.
    assert r.node.tolist() == [0, 0, 0, 1, 2, 3, 1, 2]
    assert r.peak_imbalance == 3
    assert max(max(n) - min(n) for n in outstanding_at_every_event(r)) <= 3


# --- the cache manager: one Redis round trip per request, injected delay and timeout -------------------------

def manager_trace():
    """r0 at 0 (decodes 1000 tokens, so still running at 10 s), r1 at 10 sharing r0's 3-chunk prefix."""
    return requests([a_prompt(1), a_prompt(2)], [0.0, 10.0], out=[1001, 1])


def test_cache_manager_routes_to_the_holder(redis_client):
    r = run("cache-manager", manager_trace(), config(), redis_client)
    assert r.node.tolist() == [0, 0] and r.hit_tokens.tolist() == [0, 12]
    assert (r.first_token - r.arrival).tolist() == [18 / 64, 6 / 64]
    assert r.looked_up.tolist() == [True, True] and r.timed_out.tolist() == [False, False]


def test_fixed_delay_below_the_timeout_adds_exactly_the_delay(redis_client):
    base = run("cache-manager", manager_trace(), config(), redis_client)
    slow = run("cache-manager", manager_trace(),
               config(lookup_delay=DelaySpec.parse("250ms"), lookup_timeout=0.5), redis_client)
    assert slow.node.tolist() == base.node.tolist() == [0, 0]
    assert ((slow.first_token - slow.arrival) - (base.first_token - base.arrival)).tolist() == [0.25, 0.25]
    assert slow.injected.tolist() == [0.25, 0.25] and not slow.timed_out.any()


def test_delay_above_the_timeout_adds_the_timeout_and_goes_least_loaded(redis_client):
    r = run("cache-manager", manager_trace(), config(lookup_delay=DelaySpec("fixed", 1.0, 1.0), lookup_timeout=0.5),
            redis_client)
    # r1 waits 0.5 s, then least loaded: node 0 still decodes r0 (1 request), node 1 is idle -> node 1, no hit.
    assert r.node.tolist() == [0, 1] and r.hit_tokens.tolist() == [0, 0]
    assert (r.first_token - r.arrival).tolist() == [0.5 + 18 / 64, 0.5 + 18 / 64]
    assert r.timed_out.tolist() == [True, True]


def test_one_round_trip_per_lookup_whatever_the_prompt_length(redis_client, monkeypatch):
    index = CacheManagerIndex(redis_client, nodes=2)
    hashes = [bytes([i % 256, i // 256]) * 8 for i in range(1000)]
    index.publish(0, hashes, [])
    index.publish(1, hashes[:3], [])
    sends = []
    conn_type = redis.connection.Connection  # every connection, of a server or of each cluster node
    original = conn_type.send_packed_command
    monkeypatch.setattr(conn_type, "send_packed_command", lambda self, *a, **k: (sends.append(1),
                                                                                 original(self, *a, **k))[1])
    for n in (1, 10, 1000):
        sends.clear()
        assert index.query(hashes[:n])[0] == [n, min(n, 3)]
        assert len(sends) == 1
    index.drop()


def test_simulation_sends_one_query_per_request(redis_client):
    redis_client.config_resetstat()
    reqs = requests([a_prompt(k % 3) for k in range(20)], [float(k) for k in range(20)])
    policy = make_policy("cache-manager", config(), redis_client)
    simulate(reqs, policy, config(), COST)
    assert policy.stats()["query_round_trips"] == 20
    assert redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 20
    policy.close()
    assert redis_client.dbsize() == 0


def test_manager_depths_stop_at_the_first_gap(redis_client):
    """Redis and the in-process index agree: node 1 lacks chunk 1, so its depth is 1 although it holds chunk 2."""
    h = [bytes([i]) * 16 for i in range(4)]
    index, local = CacheManagerIndex(redis_client, 3), ChunkIndex(3, None)
    for node, chunks in ((0, h[:3]), (1, [h[0], h[2]])):
        index.publish(node, chunks, [])
        local.store(node, chunks)
    assert index.query(h)[0] == local.depths(h) == [3, 1, 0]
    index.publish(0, [], [h[1]])
    assert index.query(h)[0] == [1, 1, 0]
    index.drop()


# --- LRU capacity ---------------------------------------------------------------------------------------------

def test_lru_evicts_the_tail_of_the_least_recent_request():
    cache = ChunkLru(capacity=4)
    assert cache.store(["a0", "a1", "a2"]) == (["a2", "a1", "a0"], [])
    assert cache.store(["b0", "b1"]) == (["b1", "b0"], ["a2"])  # a's tail goes first, never its head
    assert cache.match(["a0", "a1", "a2", "a3"]) == 2
    assert cache.store(["a0", "a1", "a2", "a3"]) == (["a3", "a2"], ["b1", "b0"])
    assert cache.match(["b0", "b1"]) == 0


def test_node_capacity_of_four_chunks_in_the_simulation():
    a = list(range(1, 13)) + [8, 8]  # 3 chunks + 2 tokens
    b = list(range(101, 109))  # 2 chunks
    a_longer = list(range(1, 13)) + [50, 51, 52, 53]  # a's 3 chunks + 1
    reqs = requests([a, b, a_longer, b], [0.0, 10.0, 20.0, 30.0])
    r = run("round-robin", reqs, config(nodes=1, capacity_tokens=4 * CS))
    assert r.hit_tokens.tolist() == [0, 0, 2 * CS, 0]  # a's chunk 2 was evicted: the hit stops there
    # a2 when b is stored; b1, b0 when a_longer stores a2, a3; a3, a2 (its tail) when b is stored again.
    assert r.evictions == 1 + 2 + 2


def test_issue_10_smallest_case_on_one_node_hits_12():
    """tok(1..16), [101..104], tok(1..16) on one node of 16 tokens: the head c0..c2 outlives the tail c3, so the third
    request hits 12 of its 16 tokens (the replay's capacity limit hits the same: tests/replay/test_curve_replay.py)."""
    reqs = requests([list(range(1, 17)), list(range(101, 105)), list(range(1, 17))], [0.0, 10.0, 20.0])
    r = run("round-robin", reqs, config(nodes=1, capacity_tokens=4 * CS))
    assert r.hit_tokens.tolist() == [0, 0, 12]
    assert r.evictions == 2  # c3 for [101..104]; then [101..104] when c3 is stored again
def test_chunk_ids_number_the_distinct_hashes_in_order_of_first_appearance():
    reqs = requests(**SERIAL)  # A1, A2, A3 share P (3 chunks) and have one chunk of their own; B shares nothing
    assert [r.chunk_ids for r in reqs] == [(0, 1, 2, 3), (0, 1, 2, 4), (0, 1, 2, 5), (6, 7, 8, 9)]
    assert reqs[0].hashes[:3] == reqs[1].hashes[:3] and reqs[0].hashes[3] != reqs[1].hashes[3]
    salted = requests([a_prompt(1)] * 2, [0.0, 1.0], salts=["acme", "beta"])
    assert [r.chunk_ids for r in salted] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    table = reqs[0].numbering.hashes  # each distinct hash once, in id order
    assert len(table) == 10 and table[:4] == list(reqs[0].hashes) and table[9] == reqs[3].hashes[3]
    with pytest.raises(RuntimeError, match="closed"):
        reqs[0].numbering.number(reqs[0].hashes)


def test_requests_numbered_apart_are_refused():
    mixed = requests([a_prompt(1)], [0.0]) + requests([a_prompt(2)], [1.0])  # both number their chunks from 0
    with pytest.raises(ValueError, match="one call"):
        run("prefix", mixed, config())
    with pytest.raises(ValueError, match="one call"):
        single_node_hit_tokens(mixed, config())


@pytest.mark.parametrize("draw", [lambda rng, size: rng.integers(3, size=size), lambda rng, size: rng.random(size),
                                  lambda rng, size: rng.integers(2**40, size=size)])
def test_block_draws_equal_one_draw_per_call(draw):
    one_by_one = np.random.default_rng([5, STREAM_POLICY])
    want = [np.asarray(draw(one_by_one, None)).item() for _ in range(50)]
    blocks = np.random.default_rng([5, STREAM_POLICY])
    draws = Draws(lambda size: draw(blocks, size), block=7)
    assert [draws.next() for _ in range(50)] == want



def results_equal(a, b) -> bool:
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
               for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b)))


@pytest.mark.parametrize("name,extra", [("prefix", {}), ("cache-aware", {}), ("cost", {}),
                                        ("cost", {"temperature": 50.0})])
@pytest.mark.parametrize("capacity,max_batch", [(None, 64), (40, 64), (200, 2), (200, 64)])
def test_mirrored_node_caches_equal_their_own_lrus(name, extra, capacity, max_batch):
    """A router-indexed policy hands the event loop its index's evictions (Policy.mirror_nodes): the nodes then
    keep unlimited caches that drop what the index evicted. Busy nodes (queues, evictions at 40 and 200 tokens),
    three of them: every record equals the run where each node keeps its own LRU."""
    reqs, cfg = mixed_trace(), config(nodes=3, capacity_tokens=capacity, max_batch=max_batch, **extra)
    mirrored = make_policy(name, cfg)
    own = make_policy(name, cfg)
    own.mirror_nodes = lambda capacity_chunks: None
    a, b = simulate(reqs, mirrored, cfg, COST), simulate(reqs, own, cfg, COST)
    assert mirrored.evictions is not None and not any(mirrored.evictions)  # every eviction was handed over
    assert results_equal(a, b)
    if capacity == 40:
        assert a.evictions > 0 and np.any(a.prefill_start > a.dispatch)  # the case it is about: both happen


def test_mirror_only_from_an_empty_index_of_the_nodes_capacity():
    cfg = config(nodes=2, capacity_tokens=40)
    policy = make_policy("prefix", cfg)
    assert policy.mirror_nodes(None) is None and policy.mirror_nodes(11) is None
    assert [len(q) for q in policy.mirror_nodes(10)] == [0, 0]
    policy.choose(requests([a_prompt(1)], [0.0])[0], ClusterView([0, 0], [0, 0], CS), None)
    assert policy.mirror_nodes(10) is None and policy.evictions is None  # the index holds a decision already

# --- tenants --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(POLICIES))
def test_tenants_never_get_credit_for_each_other(name, redis_client):
    prompt = a_prompt(1)
    reqs = requests([prompt] * 4, [0.0, 10.0, 20.0, 30.0], salts=["acme", "beta", "acme", "beta"])
    assert not set(reqs[0].hashes) & set(reqs[1].hashes)
    r = run(name, reqs, config(nodes=1), redis_client)
    assert r.hit_tokens.tolist() == [0, 0, 16, 16]


# --- determinism ----------------------------------------------------------------------------------------------

def mixed_trace(n=300, seed=7):
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 5000, 24).tolist() for _ in range(6)]
    prompts = [heads[rng.integers(6)] + rng.integers(0, 5000, rng.integers(1, 30)).tolist() for _ in range(n)]
    times = np.cumsum(rng.exponential(0.05, n)).tolist()
    return requests(prompts, times, out=rng.integers(1, 40, n).tolist())


def runs_for(seed, url, rate=None):
    cfg = config(nodes=3, capacity_tokens=200, seed=seed, rate=rate, temperature=50.0,
                 lookup_delay=DelaySpec.parse("lognormal:1ms:20ms"), lookup_timeout=0.01)
    runs = run_routes(mixed_trace(), list(POLICIES), [({}, cfg)], COST, url)
    for r in runs:
        r["lookups"].pop("measured_seconds")  # wall clock: the one non-simulated figure
    return {r["policy"]: r for r in runs}


@pytest.mark.single_server("the timeout reaches open_redis the same way for a cluster")
def test_run_routes_connects_with_its_timeout(redis_url, monkeypatch):
    """``run_routes(..., timeout=)`` is the reply timeout of the client cache-manager's index uses."""
    import kvcli.route.report as report
    from kvcli.replay.parallel import reply_timeout

    seen = []

    def spy(name, cfg, client=None):
        seen.append(reply_timeout(client))
        return make_policy(name, cfg, client)

    monkeypatch.setattr(report, "make_policy", spy)
    runs = run_routes(requests([a_prompt(1)] * 2, [0.0, 1.0]), ["cache-manager"], [({}, config())], COST, redis_url,
                      timeout=0.75)
    assert seen == [0.75] and runs[0]["hit_tokens"] == 16


def test_same_seed_same_report(redis_url):
    assert runs_for(3, redis_url) == runs_for(3, redis_url)
    assert runs_for(3, redis_url, rate=20.0) == runs_for(3, redis_url, rate=20.0)


def test_other_seed_changes_only_the_random_parts(redis_url):
    one, two = runs_for(3, redis_url), runs_for(4, redis_url)
    for name in ("round-robin", "least-loaded", "prefix", "cache-aware"):
        assert {k: v for k, v in one[name].items() if k != "config"} == \
               {k: v for k, v in two[name].items() if k != "config"}
    for name in ("random", "cost", "cache-manager"):  # node draws, softmax draws, lognormal delays
        assert one[name]["ttft_seconds"] != two[name]["ttft_seconds"]


# --- options --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,tokens", [("3M tokens", 3_000_000), ("500k tok", 500_000), ("250000", 250_000),
                                         ("40GB", 40 * 10**9 // 131072), ("64GiB", 64 * 2**30 // 131072),
                                         ("unlimited", None)])
def test_parse_capacity(text, tokens):
    assert parse_capacity(text, 131072) == tokens


@pytest.mark.parametrize("bad", ["3X", "GB", "-1", "1.5.2k", "1e400", "1e400GB"])
def test_parse_capacity_rejects(bad):
    with pytest.raises(BadInputError, match="capacity"):
        parse_capacity(bad, 1)


def test_parse_capacity_refuses_a_suffix_without_a_unit():
    """``64G`` could be 64e9 tokens or 64 GB: refused, naming both spellings."""
    with pytest.raises(BadInputError) as err:
        parse_capacity("64G", 131072)
    assert str(err.value) == ("capacity '64G' is ambiguous: write '64G tokens', or bytes as '64GB' (decimal) or "
                              "'64GiB' (binary)")
    assert parse_capacity("64G tokens", 131072) == 64 * 10**9 and parse_capacity("64GB", 131072) == 488_281


def test_delay_spec():
    assert parse_duration("5ms") == 0.005 and parse_duration("200us") == 0.0002 and parse_duration("2") == 2.0
    assert DelaySpec.parse("fixed:5ms") == DelaySpec("fixed", 0.005, 0.005)
    spec = DelaySpec.parse("lognormal:1ms:50ms")
    draws = np.array([spec.sample(np.random.default_rng([0, k])) for k in range(20000)])
    assert spec.sample(np.random.default_rng([0, 5])) == draws[5]  # seeded
    assert np.all(draws > 0) and str(spec) == "lognormal:1ms:50ms"
    with pytest.raises(BadInputError):
        DelaySpec.parse("lognormal:50ms:1ms")


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(BadInputError, match="valid: all, round-robin, least-loaded, random, prefix"):
        resolve_policies(["prefix,nearest"])
    assert resolve_policies(["prefix,cost", "prefix"]) == ["prefix", "cost"]
    assert resolve_policies(["all"]) == list(POLICIES)


def test_sweep_points():
    points = sweep_points(config(), ["nodes=2,4", "abs-threshold=8"], 1)
    assert [(p, c.nodes, c.abs_threshold) for p, c in points] == [
        ({"nodes": "2", "abs-threshold": "8"}, 2, 8.0), ({"nodes": "4", "abs-threshold": "8"}, 4, 8.0)]
    with pytest.raises(BadInputError, match="nodes, node-capacity"):
        sweep_points(config(), ["chunk-size=4"], 1)


def test_config_rejects_nonsense():
    with pytest.raises(BadInputError, match="--nodes"):
        SimConfig(nodes=0)
    assert dataclasses.replace(config(), nodes=3).nodes == 3


# --- the command ----------------------------------------------------------------------------------------------

@pytest.fixture
def cli():
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("route")(route)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["route", *map(str, args)])


@pytest.fixture
def serial_trace(tmp_path):
    path = tmp_path / "serial.jsonl"
    rows = [{"id": f"r{i}", "token_ids": p, "timestamp": t, "output_length": 1}
            for i, (p, t) in enumerate(zip(SERIAL["prompts"], SERIAL["times"]))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


COMMON = ("--chunk-size", CS, "--prefill-tps", TPS, "--decode-tpot", TPOT, "--nodes", 2, "--node-capacity",
          "unlimited", "--json")


def test_cli_json_matches_the_hand_computed_runs(cli, serial_trace):
    res = cli(serial_trace, "-p", "prefix,round-robin", *COMMON)
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)["traces"]
    by = {r["policy"]: r for r in report["runs"]}
    assert by["prefix"]["hit_tokens"] == 24 and by["round-robin"]["hit_tokens"] == 12
    assert by["prefix"]["per_node"]["requests"] == [4, 0]
    assert by["prefix"]["ttft_seconds"]["p50"] == 12 / 64  # median of 18, 6, 6, 18 (/64)
    assert report["winners"][0]["hit_token_ratio"]["policy"] == "prefix"
    assert report["winners"][0]["hit_token_ratio"]["by"] == 2.0


def test_cli_cache_manager_with_sweep_and_plots(cli, serial_trace, redis_url, tmp_path):
    for suffix in ("png", "svg"):
        out = tmp_path / f"route.{suffix}"
        res = cli(serial_trace, "-p", "cache-manager,prefix", *COMMON, "--redis-url", redis_url,
                  "--no-count-lookup-latency", "--sweep", "lookup-delay=0,250ms", "--plot", out)
        assert res.exit_code == 0, res.output
        assert out.stat().st_size > 1000
    runs = json.loads(res.stdout)["traces"][0]["runs"]
    assert [(r["policy"], r["sweep"]) for r in runs] == [  # the delay does not change prefix: it runs once
        ("cache-manager", {"lookup-delay": "0"}), ("cache-manager", {"lookup-delay": "250ms"}), ("prefix", {})]
    assert runs[1]["ttft_seconds"]["p50"] == runs[0]["ttft_seconds"]["p50"] + 0.25
    assert runs[1]["lookups"]["count"] == 4 and runs[1]["lookups"]["injected_seconds"]["p99"] == 0.25


def test_a_plot_on_a_full_disk_keeps_the_report_and_the_old_plot(serial_trace, tmp_path):
    """--plot on a 16 KiB tmpfs holding an old figure: the tables are printed, then one line says the plot could not
    be written, exit 2; the old figure stays, with no temporary file beside it."""
    import shlex

    from test_curve_replay import in_private_mount

    folder = tmp_path / "full"
    folder.mkdir()
    plot = folder / "r.png"
    command = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "kvcli", "route", serial_trace, "-p",
                                                     "round-robin", *COMMON, "--plot", plot])
    done = in_private_mount(f"mount -t tmpfs -o size=16k tmpfs {folder} && printf old > {plot} && {command}; "
                            f"rc=$?; ls -a {folder}; cat {plot}; exit $rc")
    assert done.returncode == 2, done.stderr
    assert "round-robin" in done.stdout and done.stdout.splitlines()[-4:] == [".", "..", "r.png", "old"]
    assert done.stderr.splitlines()[-1] == (f"kvcli: error: --plot {plot}: cannot write: No space left on device; the "
                                            "file was left as it was")


def test_cli_table_and_errors(cli, serial_trace, tmp_path):
    res = cli(serial_trace, "-p", "round-robin", "--chunk-size", CS, "--prefill-tps", TPS)
    assert res.exit_code == 0 and "round-robin" in res.stdout and "TTFT p99" in res.stdout
    assert cli(serial_trace, "-p", "nearest", "--prefill-tps", 1).exit_code == 2
    assert cli(serial_trace, "--prefill-tps", 1, "--plot", tmp_path / "x.pdf").exit_code == 2
    assert cli(serial_trace, "--prefill-tps", 1, "--sweep", "colour=1").exit_code == 2
    untimed = tmp_path / "untimed.jsonl"
    untimed.write_text(json.dumps({"token_ids": [1, 2, 3]}) + "\n")
    res = cli(untimed, "-p", "random", "--prefill-tps", 1)
    assert res.exit_code == 2 and "--rate" in res.stderr
    assert f"kvcli: error: {untimed}:1: request " in res.stderr  # the file and line of the first untimed request
    assert cli(untimed, "-p", "random", "--prefill-tps", 1, "--rate", 2).exit_code == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"timestamp": 1, "token_ids": []}) + "\n" + json.dumps({"timestamp": 2, "prompt": ""}))
    res = cli(empty, "--prefill-tps", 1)
    assert res.exit_code == 2 and f"{empty}: the trace's 2 prompts are all empty: nothing to route" in res.stderr


def test_redis_down_is_exit_3(cli, serial_trace):
    res = cli(serial_trace, "-p", "cache-manager", "--prefill-tps", 1, "--redis-url", "redis://127.0.0.1:1")
    assert res.exit_code == 3 and "Traceback" not in res.output


def test_cache_manager_needs_redis():
    with pytest.raises(KvcliError, match="needs a Redis"):
        make_policy("cache-manager", config(), None)


# --- review fixes: bad input is one line on stderr with exit code 2; sweeps; summary; plot; help ---------------

def kvcli_route(*args, env=None):
    """``kvcli route ARGS`` through the real app (kvcli.cli, with its error handler)."""
    from kvcli.cli.app import app

    return CliRunner().invoke(app, ["route", *map(str, args)], env=env)


def assert_one_line_error(res, message: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no exception escaped
    assert res.stderr.splitlines() == [f"kvcli: error: {message}"]
    assert res.stdout == ""


FAST = ("-p", "round-robin", "--chunk-size", CS, "--prefill-tps", TPS)


@pytest.mark.parametrize("sweep,message", [
    ("nodes=2,x", "--sweep nodes=x: expected an integer"),
    ("w=abc", "--sweep w=abc: expected a number"),
    ("seed=x", "--sweep seed=x: expected an integer"),
    ("cache-threshold=x", "--sweep cache-threshold=x: expected a number"),
    ("max-batch=2.5", "--sweep max-batch=2.5: expected an integer"),
    ("nodes=2,0", "--sweep nodes=0: --nodes must be in [1, 100,000] (one cache each), got 0"),
    ("w=1,-1", "--sweep w=-1: --w must be >= 0, got -1"),
    ("abs-threshold=nan", "--sweep abs-threshold=nan: --abs-threshold must be a finite number, got nan"),
    ("cache-threshold=0.5,2", "--sweep cache-threshold=2: --cache-threshold must be in [0, 1], got 2"),
    ("node-capacity=3X", ("--sweep node-capacity=3X: bad capacity '3x'; use tokens (3M tokens, 500k tok, 250000), "
                          "bytes (40GB, 64GiB) or 'unlimited'")),
    ("lookup-timeout=0", "--sweep lookup-timeout=0: --lookup-timeout must be > 0 seconds, got 0"),
    ("w=", ("bad --sweep 'w='; use PARAM=v1,v2,... with PARAM one of nodes, node-capacity, max-batch, "
            "decode-tpot, rate, seed, abs-threshold, rel-threshold, cache-threshold, w, temperature, lookup-delay, "
            "lookup-timeout")),
])
def test_bad_sweep_value_is_a_one_line_error(serial_trace, sweep, message):
    assert_one_line_error(kvcli_route(serial_trace, *FAST, "--sweep", sweep), message)


def test_sweep_of_one_parameter_twice_is_an_error(serial_trace):
    assert_one_line_error(kvcli_route(serial_trace, *FAST, "--sweep", "w=1", "--sweep", "w=2"),
                          "--sweep w given twice; list all its values in one: w=v1,v2,...")


@pytest.mark.parametrize("limit", [-1, 0])
def test_limit_below_one_is_a_one_line_error(serial_trace, limit):
    assert_one_line_error(kvcli_route(serial_trace, *FAST, "--limit", limit), f"--limit must be >= 1, got {limit}")
    with pytest.raises(BadInputError, match="--limit must be >= 1"):
        from kvcli.route.simulator import load_requests
        load_requests(serial_trace, limit=limit)


def test_limit_keeps_the_first_requests(serial_trace):
    res = kvcli_route(serial_trace, *FAST, "--limit", 2, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["traces"][0]["runs"][0]["requests"] == 2


@pytest.mark.parametrize("option,value,message", [
    ("--abs-threshold", "nan", "--abs-threshold must be a finite number, got nan"),
    ("--rel-threshold", "inf", "--rel-threshold must be a finite number, got inf"),
    ("--cache-threshold", "nan", "--cache-threshold must be a finite number, got nan"),
    ("--w", "nan", "--w must be a finite number, got nan"),
    ("--temperature", "inf", "--temperature must be a finite number, got inf"),
    ("--decode-tpot", "nan", "--decode-tpot must be a finite number, got nan"),
    ("--rate", "inf", "--rate must be a finite number, got inf"),
    ("--prefill-tps", "inf", "--prefill-tps must be a finite number > 0, got inf"),
    ("--prefill-tps", "nan", "--prefill-tps must be a finite number > 0, got nan"),
    ("--lookup-timeout", "1e999", "bad duration '1e999': not a finite number"),
    ("--lookup-delay", "1e999ms", "bad duration '1e999ms': not a finite number"),
    ("--node-capacity", "1e999", "bad capacity '1e999': not a finite number"),
    ("--w", "-1", "--w must be >= 0, got -1"),
    ("--nodes", "0", "--nodes must be in [1, 100,000] (one cache each), got 0"),
    ("--nodes", "100000000", "--nodes must be in [1, 100,000] (one cache each), got 100,000,000"),
    ("--node-capacity", "0", "--node-capacity must be at least one chunk (>= --chunk-size, 4 tokens), got 0"),
    ("--node-capacity", "3", "--node-capacity must be at least one chunk (>= --chunk-size, 4 tokens), got 3"),
    ("--decode-tpot", "-0.5", "--decode-tpot must be >= 0, got -0.5"),
    ("--max-batch", "0", "--max-batch must be >= 1, got 0"),
    ("--rate", "0", "--rate must be > 0, got 0"),
    ("--rate", "-2", "--rate must be > 0, got -2"),
    ("--temperature", "-1", "--temperature must be >= 0, got -1"),
    ("--lookup-timeout", "0", "--lookup-timeout must be > 0 seconds, got 0"),
    ("--rel-threshold", "0.5", "--rel-threshold must be >= 1 (below 1 it acts as 1), got 0.5"),
    ("--abs-threshold", "-1", "--abs-threshold must be >= 0, got -1"),
    ("--cache-threshold", "1.5", "--cache-threshold must be in [0, 1], got 1.5"),
    ("--cache-threshold", "-0.1", "--cache-threshold must be in [0, 1], got -0.1"),
    ("--seed", "-1", "--seed must be an integer in [0, 2**63 - 1], got -1"),
])
def test_invalid_option_values_are_one_line_errors(serial_trace, option, value, message):
    assert_one_line_error(kvcli_route(serial_trace, *FAST, option, value), message)


def test_unknown_model_is_rejected_even_with_prefill_tps(serial_trace):
    from kvcli.model.configs import SOURCES
    from kvcli.model.presets import PRESETS

    assert_one_line_error(kvcli_route(serial_trace, *FAST, "--model", "nope"),
                          f"unknown model preset 'nope'; valid: {', '.join(PRESETS)}; config only (shapes, no "
                          f"weights: --measure 0 --payload accounted): {', '.join(SOURCES)}; or a checkpoint folder")
    assert "deepseek-v3" in SOURCES


def test_markup_in_a_bad_value_is_printed_as_is(serial_trace):
    assert_one_line_error(kvcli_route(serial_trace, "--prefill-tps", 1, "-p", "[/x]"),
                          f"unknown policy '[/x]'; valid: all, {', '.join(POLICIES)}")


@pytest.mark.parametrize("field,value,message", [
    ("cost_weight", -1.0, "--w must be >= 0, got -1"),
    ("abs_threshold", float("nan"), "--abs-threshold must be a finite number, got nan"),
    ("capacity_tokens", 0, r"--node-capacity must be at least one chunk \(>= --chunk-size, 4 tokens\), got 0"),
    ("nodes", 250_000, r"--nodes must be in \[1, 100,000\] \(one cache each\), got 250,000"),
    ("rel_threshold", 0.99, r"--rel-threshold must be >= 1 \(below 1 it acts as 1\), got 0.99"),
    ("cache_threshold", 1.01, r"--cache-threshold must be in \[0, 1\], got 1.01"),
    ("lookup_timeout", 0.0, "--lookup-timeout must be > 0 seconds, got 0"),
    ("seed", -1, r"--seed must be an integer in \[0, 2\*\*63 - 1\], got -1"),
])
def test_library_config_validates_too(field, value, message):
    with pytest.raises(BadInputError, match=f"^{message}$"):
        config(**{field: value})


def test_a_capacity_below_a_large_chunk_is_named_in_whole_tokens():
    with pytest.raises(BadInputError, match=r"^--node-capacity must be at least one chunk \(>= --chunk-size, "
                                            r"2,000,000 tokens\), got 1,500,000$"):
        config(chunk_size=2_000_000, capacity_tokens=1_500_000)


def test_delay_spec_rejects_non_finite_delays():
    with pytest.raises(BadInputError, match="^a lookup delay must be a finite number of seconds$"):
        DelaySpec("fixed", float("inf"), float("inf"))
    with pytest.raises(BadInputError, match="^a lookup delay must be a finite number of seconds$"):
        DelaySpec("lognormal", 0.001, float("nan"))


def test_sweep_runs_each_policy_only_where_the_parameter_matters():
    from kvcli.route.report import plan_runs

    def plan(sweeps, policies, **kw):
        return [(name, labels) for name, labels, _ in plan_runs(policies, sweep_points(config(**kw), sweeps, 1))]

    assert plan(["abs-threshold=2,8"], ["prefix", "cache-aware", "cost"]) == [
        ("prefix", {}), ("cache-aware", {"abs-threshold": "2"}), ("cache-aware", {"abs-threshold": "8"}),
        ("cost", {})]
    assert plan(["nodes=2,4", "w=0,1"], ["round-robin", "cost"]) == [
        ("round-robin", {"nodes": "2"}), ("round-robin", {"nodes": "4"}),
        ("cost", {"nodes": "2", "w": "0"}), ("cost", {"nodes": "2", "w": "1"}),
        ("cost", {"nodes": "4", "w": "0"}), ("cost", {"nodes": "4", "w": "1"})]
    # seed: only policies that draw at this config, unless arrivals are Poisson (then all)
    assert plan(["seed=0,1"], ["prefix", "random", "cost"]) == [
        ("prefix", {}), ("random", {"seed": "0"}), ("random", {"seed": "1"}), ("cost", {})]
    assert plan(["seed=0,1"], ["prefix"], rate=2.0) == [("prefix", {"seed": "0"}), ("prefix", {"seed": "1"})]
    assert plan(["temperature=0,5", "seed=0,1"], ["cost"]) == [
        ("cost", {"temperature": "0"}), ("cost", {"temperature": "5", "seed": "0"}),
        ("cost", {"temperature": "5", "seed": "1"})]
    assert plan(["lookup-delay=0,5ms", "w=1,2"], ["cache-manager"]) == [
        ("cache-manager", {"lookup-delay": "0"}), ("cache-manager", {"lookup-delay": "5ms"})]
    assert plan(["w=1,1.0,2"], ["cost"]) == [("cost", {"w": "1"}), ("cost", {"w": "2"})]  # a value once


def test_cli_sweep_has_no_duplicate_rows_and_compares_every_policy(serial_trace):
    res = kvcli_route(serial_trace, "-p", "prefix,cache-aware", *COMMON, "--sweep", "abs-threshold=2,8")
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)["traces"]
    assert [(r["policy"], r["sweep"]) for r in report["runs"]] == [
        ("prefix", {}), ("cache-aware", {"abs-threshold": "2"}), ("cache-aware", {"abs-threshold": "8"})]
    assert [w["sweep"] for w in report["winners"]] == [{"abs-threshold": "2"}, {"abs-threshold": "8"}]
    for w in report["winners"]:  # serial arrivals: cache-aware routes as prefix does, so the two tie
        assert w["hit_token_ratio"] == {"policy": "prefix", "value": 24 / 72, "runner_up": "cache-aware",
                                  "runner_up_value": 24 / 72, "by": 1.0}
    res = kvcli_route(serial_trace, "-p", "prefix", *COMMON, "--sweep", "w=1,2")
    assert res.exit_code == 0 and [r["sweep"] for r in json.loads(res.stdout)["traces"][0]["runs"]] == [{}]
    assert res.stderr == "kvcli: note: --sweep w changes none of the policies run (prefix); each runs once\n"


def test_summary_says_ties_with_on_a_tie(serial_trace):
    res = kvcli_route(serial_trace, "-p", "prefix,cache-aware,round-robin", *COMMON[:-1])
    assert res.exit_code == 0, res.output
    # TTFT: prefix and cache-aware 18, 6, 6, 18 (/64): p99 = 18/64 s; round-robin 18, 18, 6, 18: also 18/64
    # hits: prefix and cache-aware 24 of 72 tokens; round-robin 12
    assert res.stdout.splitlines()[-1] == ("lowest TTFT p99: prefix 0.281 s, ties with cache-aware; "
                                           "highest hit ratio: prefix 33.3%, ties with cache-aware")


def test_summary_margin_wording():
    from kvcli.route.report import margin

    def entry(value, runner_up_value, by, runner_up="cost"):
        return {"policy": "prefix", "value": value, "runner_up": runner_up, "runner_up_value": runner_up_value,
                "by": by}

    def show(v):
        return f"{v:.3g} s"

    assert margin(entry(1.0, 1.43, 1.43), "below ", show) == ", 1.43x below cost"
    assert margin(entry(1.0, 1.004, 1.004), "below ", show) == ", ties with cost"  # prints as 1.00x
    assert margin(entry(1.0, 1.006, 1.006), "below ", show) == ", 1.01x below cost"
    assert margin(entry(0.0, 0.0, None), "below ", show) == ", ties with cost"
    assert margin(entry(0.25, 0.0, None), "", lambda v: f"{100 * v:.1f}%") == ", cost 0.0%"
    assert margin(entry(1.0, None, None, runner_up=None), "below ", show) == ""  # ran alone


def test_cli_count_rtt_and_its_old_name(serial_trace):
    def counted(*flag):
        res = kvcli_route(serial_trace, *FAST, "--json", *flag)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["traces"][0]["runs"][0]["config"]["count_measured_latency"]

    assert counted() is True and counted("--count-rtt") is True and counted("--count-lookup-latency") is True
    assert counted("--no-count-rtt") is False and counted("--no-count-lookup-latency") is False


def test_help_fits_80_columns():
    import re

    from kvcli.cli.app import app

    res = CliRunner().invoke(app, ["route", "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    assert "…" not in res.stdout and max(map(len, res.stdout.splitlines())) <= 80
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", res.stdout))
    command = typer.main.get_command(app).commands["route"]
    names = {n for p in command.params if not getattr(p, "hidden", False) for n in p.opts + p.secondary_opts
             if n.startswith("--")}
    assert names <= shown, names - shown
    assert {"--count-rtt", "--no-count-rtt", "--lookup-timeout", "--cache-threshold"} <= names


def plot_report(trace: str) -> dict:
    """Runs shaped like the Mooncake sample's: TTFT p99 from 8.67 s to 866 s (two decades), labels at the right edge."""
    def run(policy, nodes, p99, hit):
        return {"policy": policy, "sweep": {"nodes": nodes}, "ttft_seconds": {"p99": p99}, "hit_token_ratio": hit,
                "single_node_hit_token_ratio": 0.215}

    return {"trace": trace, "runs": [
        run("round-robin", "4", 32.3, 0.090), run("round-robin", "8", 12.4, 0.060),
        run("prefix", "4", 866.0, 0.128), run("prefix", "8", 866.0, 0.128),
        run("cache-manager", "4", 11.9, 0.215), run("cache-manager", "8", 8.67, 0.215),
        run("cost", "4", 13.1, 0.166), run("cost", "8", 8.67, 0.171)]}


def test_plot_layout_keeps_everything_readable_and_inside():
    import matplotlib.pyplot as plt

    from kvcli.route.report import plot_figure

    name = "a_very_long_directory_name_and_an_even_longer_trace_file_name_2024-06-01_head1000.jsonl.gz"
    fig = plot_figure(plot_report(name))
    try:
        fig.canvas.draw()
        renderer, ax = fig.canvas.get_renderer(), fig.axes[0]
        assert ax.get_title() == ("Cache hits vs tail latency (up and left is better)\n"
                                  "a_very_long_directory_name_an…e_2024-06-01_head1000.jsonl.gz")  # 29 + 1 + 30
        title = ax.title.get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= fig.bbox.x1
        inside = ax.get_window_extent(renderer)
        notes = [t for t in ax.texts]
        assert sorted(t.get_text() for t in notes) == sorted(
            ["nodes=4"] * 3 + ["nodes=8"] * 3 + ["nodes=4, nodes=8"])  # prefix's two points share one spot
        boxes = [t.get_window_extent(renderer) for t in notes]
        for box in boxes:
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b)
        lo, hi = ax.get_xlim()
        ticks = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
        assert ax.get_xscale() == "log" and ticks == ["10", "20", "50", "100", "200", "500", "1000"]
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.x0 >= inside.x1  # beside the axes, covering no point
    finally:
        plt.close(fig)


def test_route_with_prefill_tps_never_imports_torch(tmp_path):
    """With ``--prefill-tps`` no model runs, so torch (over a second to import) stays out of the process, byte
    capacities included (a preset's KV bytes per token is known by dtype name). A fresh interpreter: this one has
    torch already."""
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kvcli.cli.app import app\n"
        "res = CliRunner().invoke(app, ['route', sys.argv[1], '--chunk-size', '32', '--prefill-tps', '3000',\n"
        "                               '--node-capacity', '40MB', '--json'])\n"
        "assert res.exit_code == 0, res.output\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", script, str(root / "sample_traces" / "chat_shared_system.jsonl")],
                          capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
