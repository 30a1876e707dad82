"""replay's honest edges: what a read namespace supplies is counted only when an engine could load it
(payload present, right length, checksum sampled), the upper bound never falls below the hits, and figures that
were not computed or have no denominator are null / "–", with notes for prompts shorter than a chunk."""
from __future__ import annotations

import json

import numpy as np
import pytest
import redis
import torch
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import ModelSpec
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.records import StoreConfig
from kvcli.traces.request import Request

SPEC = ModelSpec("m", (2, 2, 2, 32), torch.float32)
# --jobs 1: this process alone (worker processes start in seconds, and give the same report: test_parallel)
FAST = ["--measure", "0", "--prefill-tps", "1000", "--payload", "accounted", "--jobs", "1"]


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def req(tokens, rid="r") -> Request:
    return Request(rid, np.asarray(tokens, dtype="<u4"), source=f"t:{rid}")


def fleet(client, tokens, cs=4) -> ChunkStore:
    store = ChunkStore(client, StoreConfig("fleet", cs, "m", "raw", SPEC.kv_shape, torch.float32))
    store.store(tokens, torch.randn(2, 2, 2, len(tokens), 32))
    return store


def replay(client, requests, **kw):
    config = ReplayConfig(**{"chunk_sizes": (4,), "measure": 0, "payload": "accounted", "namespace": "fleet", **kw})
    replayer = Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "raw", config, spec=SPEC)
    return replayer.replay("t", requests)


def _flip(client, key):
    raw = bytearray(client.get(key))
    raw[-3] ^= 0x40
    client.set(key, bytes(raw))


@pytest.mark.parametrize("damage, hit, verified, failures", [
    ("none", 16, 4, 0),
    ("payload of chunk 2 evicted", 8, 2, 0),
    ("payload of chunk 1 truncated", 4, 1, 0),
    ("payload of chunk 1 of another type", 4, 1, 0),
    ("payload of chunk 1 corrupted", 4, 4, 1),
])
def test_unmeasured_hits_are_what_an_engine_could_load(redis_client, damage, hit, verified, failures):
    """fleet holds tok(1..16) in 4 real chunks; one unmeasured request tok(1..17) (17 tokens: 16 reusable). A chunk
    whose payload is gone, cut short or of another type ends the hit run in the lookup's own round trip; a payload
    of the right length whose bytes are corrupted is caught by the checksum sample."""
    store = fleet(redis_client, tok(1, 16))
    h = store.chunk(tok(1, 16)).hashes
    if damage == "payload of chunk 2 evicted":
        redis_client.delete(store.payload_key(h[2]))
    elif damage == "payload of chunk 1 truncated":
        redis_client.set(store.payload_key(h[1]), redis_client.get(store.payload_key(h[1]))[:-8])
    elif damage == "payload of chunk 1 of another type":
        redis_client.delete(store.payload_key(h[1]))
        redis_client.rpush(store.payload_key(h[1]), b"x")
    elif damage == "payload of chunk 1 corrupted":
        _flip(redis_client, store.payload_key(h[1]))
    res = replay(redis_client, [req(tok(1, 17))]).per_chunk_size[0]
    assert (res.hit_tokens, res.hit_tokens_metadata_only) == (hit, 16)
    assert (res.checksum_verified_chunks, res.checksum_failures) == (verified, failures)
    assert res.upper_bound_tokens == hit  # the first request: only the namespace supplies anything


def test_the_upper_bound_counts_what_the_namespace_holds_at_each_chunk_size_only(redis_client):
    """fleet holds tok(1..16) at chunk size 4 and nothing at 8. Requests tok(1..17), then tok(1..10) + tok(50..55):
    at 4 the first reuses the namespace's 16 and the second 8 (two chunks); the radix tree of the trace alone gives
    0 and 10; so the bound at 4 is 16 + 10 = 26. At 8 the namespace holds nothing: the trace's own bound, 0 + 10."""
    fleet(redis_client, tok(1, 16))
    second = tok(1, 10) + tok(50, 55)
    rows = replay(redis_client, [req(tok(1, 17), "a"), req(second, "b")], chunk_sizes=(4, 8)).per_chunk_size
    assert [(r.chunk_size, r.hit_tokens, r.upper_bound_tokens) for r in rows] == [(4, 24, 26), (8, 8, 10)]


def test_the_checksum_sample_is_bounded_and_remembers_failures(redis_client):
    store = fleet(redis_client, tok(1, 16))
    h = store.chunk(tok(1, 16)).hashes
    _flip(redis_client, store.payload_key(h[0]))
    res = replay(redis_client, [req(tok(1, 17))] * 3, verify_sample=1).per_chunk_size[0]
    # chunk 0 is verified once (the budget), fails, and is a miss for all three requests
    assert (res.hit_tokens, res.checksum_verified_chunks, res.checksum_failures) == (0 + 0 + 0, 1, 1)
    assert res.hit_tokens_metadata_only == 3 * 16


def test_unmeasured_hits_under_lru_eviction(make_server):
    """The server's LRU evicts payloads of a warmed namespace while their metadata stays (volatile-lru, payloads
    given a TTL, so only they are candidates, as allkeys-lru picks big idle values first): the replay counts only
    chunks whose payload is there; the metadata alone would count every chunk."""
    client = redis.Redis.from_url(make_server(**{"maxmemory-policy": "volatile-lru"}))
    store = ChunkStore(client, StoreConfig("fleet", 64, "m", "raw", SPEC.kv_shape, torch.float32))
    prompts = [np.arange(i * 1000, i * 1000 + 641, dtype="<u4") for i in range(8)]  # 10 chunks of 64 KiB each
    for p in prompts:
        store.store(p, torch.randn(2, 2, 2, 641, 32))
    for key in client.scan_iter("kvcli:v1:fleet:64:p:*"):
        client.expire(key, 3600)
    client.config_set("maxmemory", client.info("memory")["used_memory"] - 2_000_000)
    client.set("trigger", "x")  # a write makes the server evict down to maxmemory
    client.config_set("maxmemory", "0")  # freeze what eviction left
    assert client.info("stats")["evicted_keys"] > 0
    expected = 0
    for p in prompts:
        run = 0
        for h in store.chunk(p).hashes:
            if client.strlen(store.payload_key(h)) != store.config.header_bytes + store.config.payload_bytes:
                break
            run += 1
        expected += run * 64
    res = replay(client, [req(p) for p in prompts], chunk_sizes=(64,)).per_chunk_size[0]
    assert 0 < res.hit_tokens == expected < res.hit_tokens_metadata_only == 8 * 640


def test_upper_bound_counts_what_the_read_namespace_supplies(redis_client):
    """The issue's case: a warmed namespace gives the first request 8 hit tokens; a radix tree over the trace alone
    would say 0. The bound is never below the hits, and 'without capacity limit' counts the namespace too."""
    fleet(redis_client, tok(1, 12))
    res = replay(redis_client, [req(tok(1, 9)), req(tok(1, 9))], capacity_tokens=4).per_chunk_size[0]
    # R1: 8 from fleet; R2: 8 from fleet (the capacity holds the run's own chunks only, none of fleet's)
    assert (res.hit_tokens, res.hit_tokens_unlimited, res.upper_bound_tokens) == (16, 16, 16)
    d = res.to_dict()
    assert d["loss_to_chunking_tokens"] == 0 and d["upper_bound_ratio"] == pytest.approx(16 / 18)


def test_no_upper_bound_prints_a_dash_and_null(redis_url):
    trace = "".join(json.dumps({"token_ids": tok(1, 9)}) + "\n" for _ in range(2))
    base = ["replay", "-", "--chunk-sizes", "4", "--no-upper-bound", "--redis-url", redis_url] + FAST
    out = CliRunner().invoke(app, base + ["--json"], input=trace)
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    assert (row["upper_bound_tokens"], row["upper_bound_ratio"], row["loss_to_chunking_tokens"]) == (None, None, None)
    assert (row["hit_tokens"], row["max_logit_diff"]) == (8, None)
    table = CliRunner().invoke(app, base, input=trace)
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in table.stdout.splitlines()
            if line.count("│") == 3}
    assert rows["token-granular upper bound"] == "–" and rows["loss to chunking (tokens)"] == "–"
    assert rows["hit token ratio"] == "44.4%" and rows["max logit diff"] == "–"


def test_an_all_empty_trace_has_no_ratios(redis_url):
    trace = json.dumps({"token_ids": []}) + "\n" + json.dumps({"prompt": ""}) + "\n"
    base = ["replay", "-", "--chunk-sizes", "4,8", "--redis-url", redis_url] + FAST
    out = CliRunner().invoke(app, base + ["--json"], input=trace)
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    assert (t["requests"], t["skipped_empty"], t["recommended_chunk_size"]) == (0, 2, None)
    for row in t["per_chunk_size"]:
        assert [row[k] for k in ("hit_token_ratio", "hit_token_ratio_unlimited", "upper_bound_ratio",
                                 "lookup_p50_seconds", "lookup_p99_seconds")] == [None] * 5
    assert out.stderr.strip().splitlines()[-1] == "<stdin>: no prompt to replay (every request of 2 is empty)"
    table = CliRunner().invoke(app, base, input=trace)
    rows = {line.split("│")[1].strip(): line.split("│")[2:4] for line in table.stdout.splitlines()
            if line.count("│") == 4}
    assert [c.strip() for c in rows["hit token ratio"]] == ["–", "–"]
    assert not any(label.startswith("lookup p50") for label in rows)  # priced (--prefill-tps): nothing timed here
    assert "0.0%" not in table.stdout


def test_prompts_shorter_than_a_chunk_get_a_note(redis_client):
    result = replay(redis_client, [req(tok(1, 5)), req(tok(1, 3)), req(tok(1, 20))], chunk_sizes=(8, 32),
                    namespace=None)
    rows = {r.chunk_size: r for r in result.per_chunk_size}
    assert (rows[8].short_requests, rows[8].short_prompt_tokens) == (2, 8)
    assert (rows[32].short_requests, rows[32].short_prompt_tokens) == (3, 28)
    assert result.notes == [
        "chunk size 8: 3 lookups pipelined, up to 256 requests per batch (--pipeline: 1 batch); lookup p50/p99 "
        "and each lookup's latency come from 1 sampled unpipelined lookup",
        "chunk size 8: 2 of 3 prompts (8 tokens) are shorter than one chunk: they can never hit",
        "chunk size 32: 3 of 3 prompts (28 tokens) are shorter than one chunk: they can never hit"]


def test_a_user_without_scripts_gets_the_same_loadable_hits(make_server):
    """The lookup's one round trip is a read-only script; where scripts are refused (an ACL without @scripting)
    it is MGET + STRLEN pipelined together: the same answer, payloads checked the same way."""
    url = make_server()
    admin = redis.Redis.from_url(url)
    store = fleet(admin, tok(1, 16))
    admin.delete(store.payload_key(store.chunk(tok(1, 16)).hashes[2]))
    admin.acl_setuser("noscript", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-@scripting"])
    user = redis.Redis.from_url(url.replace("redis://", "redis://noscript:pw@"))
    results = [replay(c, [req(tok(1, 17))] * 2).per_chunk_size[0] for c in (admin, user)]
    # R1: fleet's chunks 0-1 (chunk 2 lost its payload), then stores chunk 2 in the run's own namespace
    # (accounted); R2: 0-1 fleet, 2 own, 3 fleet = 16. Round trips: 2 lookups + 1 store, and for the user
    # without scripts the one refused script call, after which its lookups are pipelined.
    assert [(r.hit_tokens, r.hit_tokens_metadata_only, r.lookups, r.round_trips) for r in results] == \
        [(8 + 16, 16 + 16, 2, 3), (8 + 16, 16 + 16, 2, 3 + 1)]


def test_errors_never_print_payload_bytes(make_server):
    """A write refused by the server (OOM) fails with the server's words, not redis-py's echo of the value."""
    from kvcli.errors import RedisFailure

    url = make_server()
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 50_000)
    store = ChunkStore(client, StoreConfig("oom", 64, "m", "raw", SPEC.kv_shape, torch.float32, ttl=60))
    with pytest.raises(RedisFailure) as err:
        store.store(tok(1, 640), torch.randn(2, 2, 2, 640, 32))
    text = str(err.value)
    assert text.startswith("Redis EXECUTE failed: OOM command not allowed when used memory > 'maxmemory'. (SET "
                           "kvcli:v1:oom:64:p:")
    assert "b'" not in text and "<memory at" not in text and "\\x" not in text and len(text) < 300


def test_a_chunk_the_read_namespace_lost_is_stored_by_the_request_that_computed_it(redis_client):
    """fleet holds 6 chunks; the payloads of chunks 2 and 4 were evicted. R1 hits 0-1 and computes the rest: the
    run's own namespace gets 2 and 4 (not 3 and 5, which fleet still supplies), so R2 hits all 6."""
    store = fleet(redis_client, tok(1, 24))
    h = store.chunk(tok(1, 24)).hashes
    redis_client.delete(store.payload_key(h[2]), store.payload_key(h[4]))
    res = replay(redis_client, [req(tok(1, 25))] * 2).per_chunk_size[0]
    assert (res.hit_tokens, res.metadata_entries, res.namespace_hit_chunks) == (8 + 24, 2, 2 + 4)


def test_a_capacity_is_said_per_chunk_size_and_one_that_holds_no_chunk_is_named(redis_client):
    # 15 tokens: 3 chunks of 4 (R1 stores 5, the LRU keeps chunks 0-2, R2 hits them: 12), no chunk of 16
    result = replay(redis_client, [req(tok(1, 20)), req(tok(1, 20))], chunk_sizes=(4, 16), namespace=None,
                    capacity_tokens=15)
    assert [r.hit_tokens for r in result.per_chunk_size] == [12, 0]
    assert result.notes[-2:] == ["capacity 15 tokens: 3 chunks at chunk size 4; 0 chunks at chunk size 16",
                                 "chunk size 16: the capacity holds no chunk: nothing can hit"]
    # both limits: the smaller applies, and the note says so (2 chunks' payload bytes at chunk size 4)
    two = 2 * ChunkStore(redis_client, StoreConfig("x", 4, "m", "raw", SPEC.kv_shape, torch.float32)).value_bytes
    result = replay(redis_client, [req(tok(1, 20)), req(tok(1, 20))], chunk_sizes=(4,), namespace=None,
                    capacity_tokens=15, capacity_bytes=two)
    assert result.per_chunk_size[0].hit_tokens == 8
    assert result.notes[-1] == f"capacity 15 tokens and {two:,} bytes (the smaller applies): 2 chunks at chunk size 4"
