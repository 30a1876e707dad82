"""kvcli route --tier: each node's own tiers and a shared one, on a hand-computed case, against --node-capacity on
the Mooncake sample, and bad values.

Conventions as tests/route/test_route.py: chunk size 4, prefill 64 tokens/s, one output token, arrivals 10 s apart
(one request at a time), round-robin (request i on node i % 2).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve
from kvcli.route.policies import POLICIES
from kvcli.route.report import run_routes
from kvcli.route.simulator import RouteTier, SimConfig, load_requests, node_cache_options, prepare_requests
from kvcli.traces.request import Request

CS, TPS = 4, 64.0
MOONCAKE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


def chunks(*names: str, tail: int = 2) -> list[int]:
    """A prompt of the named 4-token chunks (chained: a chunk's hash is its prefix's), then ``tail`` tokens."""
    return [ord(name) * 10 + j for name in names for j in range(CS)] + [7] * tail


# Hand-computed, gpu = 1 chunk per node, redis = 4 chunks shared (LRU, a request's chunks touched last to first):
# r0 n0 a b       miss; gpu0 {a}, redis {a b}
# r1 n1 a b c     redis a b (8); gpu1 {a}, redis {a b c}
# r2 n0 a b c d   gpu a (4), redis b c (8); gpu0 {a}, redis {a b c d}, a least recent
# r3 n1 e         miss; gpu1 {e}, redis {b c d e}: a evicted from both
# r4 n0 a b       whole prompt: gpu a (4), redis b (4 - 1: the engine computes the last token)
# r5 n1 a b c     miss: node 1 lost a, and so did redis (node 0's gpu still holds it, out of node 1's reach)
PROMPTS = [chunks("a", "b"), chunks("a", "b", "c"), chunks("a", "b", "c", "d"), chunks("e"),
           chunks("a", "b", tail=0), chunks("a", "b", "c")]
HITS = [0, 8, 12, 0, 7, 0]
BY_TIER = {"gpu": 8, "redis": 19}


def rows() -> list[dict]:
    return [{"id": f"r{i}", "token_ids": p, "timestamp": 10.0 * i, "output_length": 1} for i, p in enumerate(PROMPTS)]


def test_hand_computed_gpu_and_shared_tiers():
    reqs = prepare_requests([Request(r["id"], np.array(r["token_ids"], dtype=np.uint32), r["timestamp"], None, "", 1)
                             for r in rows()], CS)
    cfg = SimConfig(nodes=2, capacity_tokens=CS, chunk_size=CS, first_tier="gpu",
                    lower_tiers=(RouteTier("redis", 4 * CS, True),), count_measured_latency=False)
    (run,) = run_routes(reqs, ["round-robin"], [({}, cfg)], CostCurve.from_tokens_per_second(TPS))
    assert run["hit_tokens"] == sum(HITS) and run["hit_tokens_by_tier"] == BY_TIER
    assert list(run["config"]["lower_tiers"]) == [{"name": "redis", "tokens": 16, "shared": True}]


def test_cli_tiers_hits_and_ttft(tmp_path):
    from kvcli.cli.app import app

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    args = ["route", str(trace), "-p", "round-robin", "--chunk-size", "4", "--prefill-tps", "64", "--nodes", "2"]
    res = CliRunner().invoke(app, [*args, "--tier", "gpu=4", "--tier", "redis=16", "--json"])
    assert res.exit_code == 0, res.output
    (run,) = json.loads(res.stdout)["traces"][0]["runs"]
    assert run["hit_tokens_by_tier"] == BY_TIER and run["hit_tokens"] == 27
    # The prefill starts after the whole hit run: each TTFT is (prompt - hit) / 64 s; the median is r2's or r1's.
    ttfts = sorted((len(p) - h) / TPS for p, h in zip(PROMPTS, HITS))
    assert run["ttft_seconds"]["p50"] == (ttfts[2] + ttfts[3]) / 2
    gpu_only = CliRunner().invoke(app, [*args, "--node-capacity", "4", "--json"])
    assert json.loads(gpu_only.stdout)["traces"][0]["runs"][0]["hit_tokens"] == 4 + 4  # r2's a, r4's a
    table = CliRunner().invoke(app, [*args, "--tier", "gpu=4", "--tier", "redis=16"])
    assert table.exit_code == 0 and "hit tokens by tier" in table.stdout


def test_per_node_host_tier_keeps_what_the_gpu_evicts():
    # One node, gpu 1 chunk, host 2 chunks: r1 finds a in gpu and b in host.
    reqs = prepare_requests([Request(str(i), np.array(p, dtype=np.uint32), 10.0 * i, None, "", 1)
                             for i, p in enumerate([chunks("a", "b"), chunks("a", "b", "c")])], CS)
    cfg = SimConfig(nodes=1, capacity_tokens=CS, chunk_size=CS, first_tier="gpu",
                    lower_tiers=(RouteTier("host", 2 * CS, False),))
    (run,) = run_routes(reqs, ["round-robin"], [({}, cfg)], CostCurve.from_tokens_per_second(TPS))
    assert run["hit_tokens_by_tier"] == {"gpu": 4, "host": 4}


def test_one_gpu_tier_equals_node_capacity_for_every_policy(redis_url):
    # the first 300 requests: the capacity still binds under every policy (round-robin 153,600 hit tokens, 248,320
    # unlimited; prefix 153,088 and 345,600)
    requests = load_requests(MOONCAKE, chunk_size=512, limit=300)
    cost = CostCurve.from_tokens_per_second(10_000)
    base = SimConfig(nodes=4, capacity_tokens=300_000, chunk_size=512, count_measured_latency=False)
    tiered = SimConfig(nodes=4, chunk_size=512, count_measured_latency=False,
                       **node_cache_options(None, ["gpu=300k tokens"], lambda: 1))
    assert tiered.capacity_tokens == 300_000 and tiered.lower_tiers == ()
    plain = run_routes(requests, list(POLICIES), [({}, base)], cost, redis_url)
    tiers = run_routes(requests, list(POLICIES), [({}, tiered)], cost, redis_url)
    for a, b in zip(plain, tiers):
        assert b.pop("hit_tokens_by_tier") == {"gpu": a["hit_tokens"]}
        for run in (a, b):
            del run["config"], run["lookups"]["measured_seconds"]
        assert a == b, a["policy"]


@pytest.mark.parametrize("tiers,message", [
    (["gpu=abc"], "--tier gpu: bad capacity 'abc'; use tokens (3M tokens, 500k tok, 250000), bytes (40GB, 64GiB) "
                  "or 'unlimited'"),
    (["gpu"], "--tier must be NAME=SIZE (e.g. gpu=40GB, host=2M tokens), got 'gpu'"),
    (["redis=16"], "--tier redis: the first tier is each node's own cache; name it gpu, hbm, host, cpu or dram "
                   "(other names are shared by all nodes)"),
    (["gpu=4", "redis=16", "host=8"], "--tier host: a per-node tier must come before the shared ones (redis); "
                                      "tiers are fastest first"),
    (["gpu=4", "gpu=8"], "--tier names must differ, got gpu, gpu"),
    (["gpu=4", "host=2"], "--tier host must be at least one chunk (>= --chunk-size, 4 tokens), got 2"),
])
def test_bad_tiers_are_one_line_exit_2(tmp_path, tiers, message):
    from kvcli.cli.app import app

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    res = CliRunner().invoke(app, ["route", str(trace), "--chunk-size", "4", "--prefill-tps", "64",
                                   *(a for t in tiers for a in ("--tier", t))])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"kvcli: error: {message}"] and res.stdout == ""


def test_tier_and_node_capacity_exclude_each_other():
    with pytest.raises(BadInputError, match="give one"):
        node_cache_options("3M tokens", ["gpu=1M tokens"], lambda: 1)
    assert node_cache_options(None, [], lambda: 1) == {"capacity_tokens": 3_000_000}
    assert node_cache_options(None, ["gpu=80B", "host=160B"], lambda: 8)["lower_tiers"] == (
        RouteTier("host", 20, False),)
