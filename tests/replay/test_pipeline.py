"""Pipelined index-only replay (kvcli/store/batch.py) against one request at a time (``pipeline=1``): the same hits,
objects, bytes, evictions and server state, on a single server and on the cluster; exact values by hand."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import ModelSpec
from kvcli.replay import unit
from kvcli.replay.prefetch import Prefetch
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.store import cluster
from kvcli.store.batch import SAMPLE_EVERY
from kvcli.traces.detect import read_trace
from kvcli.traces.request import Request

ROOT = Path(__file__).resolve().parents[2]
SPEC = ModelSpec("m", (2, 2, 2, 32), "float32")


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


# chunk size 4, capacity 2 chunks (8 tokens). A=[1-4] B=[5-8] C=[9-12]; X=[101-104] Y=[105-108]; Z=[1-4] after X.
# P1 A B: miss, store A B.                         LRU (least recent first) B A
# P2 X Y: miss, store X Y, evict B A (deleted).    Y X
# P3 A B: miss, store A B, evict Y X.              B A
# P4 X Z: miss, store X Z, evict B A.              Z X
# P5 A B C: miss; C alone overflows: stored A B, C dropped; evict Z X.   B A
# P6 A B: hit 8 tokens, reuses 7 (its last token is computed).
# hit tokens 7; objects 2+2+2+2+2 = 10; evicted chunks 8; left on the server: A and B's metadata.
LRU_PROMPTS = [tok(1, 8), tok(101, 108), tok(1, 8), tok(101, 104) + tok(1, 4), tok(1, 12), tok(1, 8)]


def _requests(prompts) -> list[Request]:
    return [Request(f"t:{i + 1}", np.asarray(p, dtype="<u4"), source=f"t:{i + 1}") for i, p in enumerate(prompts)]


def _replay(client, requests, pipeline: int, chunk_sizes=(4,), **kw):
    config = ReplayConfig(chunk_sizes=chunk_sizes, payload="accounted", measure=0, pipeline=pipeline, **kw)
    replayer = Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config, spec=SPEC)
    return replayer.replay("t", requests)


def _own_keys(client, namespace: str) -> list[bytes]:
    return sorted(k for _, keys in cluster.scan(client, f"kvcli:v1:{namespace}:*") for k in keys)


@pytest.mark.parametrize("pipeline", [1, 2, 256])
def test_lru_capacity_by_hand(redis_client, pipeline):
    result = _replay(redis_client, _requests(LRU_PROMPTS), pipeline, capacity_tokens=8, keep=True)
    (res,) = result.per_chunk_size
    assert (res.hit_tokens, res.objects_created, res.metadata_entries, res.evicted_chunks) == (7, 10, 10, 8)
    assert (res.hit_requests, res.store_requests, res.chunks_hit) == (1, 5, 2)
    assert res.hit_tokens_unlimited == 7 + 4 + 8 + 7  # unlimited capacity: P3 (A B), P4 (X), P5 (A B), P6 (A B)
    assert res.upper_bound_tokens == 7 + 4 + 8 + 7  # P3 [1-8], P4 [101-104], P5 [1-8], P6 [1-8]
    assert res.lookups == 6 and res.lookups_pipelined == (0 if pipeline == 1 else 6)
    assert res.lookups_sampled == (0 if pipeline == 1 else 1)  # the first request of every SAMPLE_EVERY
    prefix = f"kvcli:v1:{res.namespace}:4:m:".encode()
    keys = _own_keys(redis_client, res.namespace)
    assert len(keys) == 2 and all(k.startswith(prefix) for k in keys)  # A and B
    one = _replay(redis_client, _requests(LRU_PROMPTS[:1]), pipeline, keep=True).per_chunk_size[0]
    assert sorted(k.replace(one.namespace.encode(), b"") for k in _own_keys(redis_client, one.namespace)) == \
        sorted(k.replace(res.namespace.encode(), b"") for k in keys)  # the same chunks: A and B
    for ns in (res.namespace, one.namespace):
        cluster.unlink(redis_client, _own_keys(redis_client, ns))


def test_a_batch_is_sent_once_it_holds_batch_chunks(redis_client, monkeypatch):
    """A batch closes at ``pipeline`` requests or BATCH_CHUNKS chunks of the smallest chunk size (in prompt tokens),
    whichever first: at 4 chunks of 4 tokens the six prompts (8, 8, 8, 8, 12, 8 tokens) go as batches of requests 1-2,
    3-4 and 5-6, one lookup round trip each, with the hand-counted LRU outcome of one request at a time."""
    monkeypatch.setattr(unit, "BATCH_CHUNKS", 4)
    result = _replay(redis_client, _requests(LRU_PROMPTS), 256, capacity_tokens=8)
    (res,) = result.per_chunk_size
    assert (res.hit_tokens, res.objects_created, res.metadata_entries, res.evicted_chunks) == (7, 10, 10, 8)
    assert (res.lookups_pipelined, res.lookup_round_trips) == (6, 3)


COMPARED = ("requests", "prompt_tokens", "hit_tokens", "hit_tokens_metadata_only", "hit_tokens_unlimited",
            "upper_bound_tokens", "chunks_hit", "hit_requests", "store_requests", "objects_created",
            "metadata_entries", "chunks_written", "payload_bytes_accounted", "metadata_bytes_written",
            "evicted_chunks", "lookups", "short_requests")

# the Mooncake sample's first 150 requests: the capacity evicts (at chunk size 512, 76,288 hit tokens of 97,792; at
# 2048, none of 20,480)
SAMPLES = [("mooncake_conversation_head1000.jsonl.gz", (512, 2048), 150, 120 * 512),
           ("sharegpt_multiturn.json", (16, 64), None, 640),
           ("chat_shared_system.jsonl", (16, 64), None, 600),
           ("tokens_small.jsonl", (4, 16), None, 16)]


@pytest.mark.parametrize("name,chunk_sizes,limit,capacity", SAMPLES, ids=[s[0].split(".")[0] for s in SAMPLES])
def test_pipelined_equals_one_by_one_on_sample_traces(redis_client, name, chunk_sizes, limit, capacity):
    """Every count, the capacity/TTL curve's points and the server's keys (kept) are the same both ways, with a
    capacity that evicts and without one."""
    path = ROOT / "sample_traces" / name
    unbounded = None
    for capacity_tokens in (None, capacity):
        rows, curves, keys = {}, {}, {}
        for pipeline in (1, 7, 256):
            result = _replay(redis_client, lambda: read_trace(path), pipeline, chunk_sizes, limit=limit,
                             capacity_tokens=capacity_tokens, keep=True)
            rows[pipeline] = [{f: getattr(r, f) for f in COMPARED} for r in result.per_chunk_size]
            curves[pipeline] = [{k: v for k, v in r.hit_curve.to_dict().items() if k not in ("seconds", "memory_bytes")}
                                for r in result.per_chunk_size]  # its own compute time; its arrays' lengths (the
            # curve takes each batch at once, so they grow in other steps)
            namespace = result.per_chunk_size[0].namespace
            own = _own_keys(redis_client, namespace)
            keys[pipeline] = sorted(k.replace(namespace.encode(), b"") for k in own)
            cluster.unlink(redis_client, own)
        assert rows[7] == rows[1] and rows[256] == rows[1]
        assert curves[7] == curves[1] and curves[256] == curves[1]
        assert keys[7] == keys[1] and keys[256] == keys[1]
        assert any(r["hit_tokens"] for r in rows[1])
        if capacity_tokens:  # the capacity changed the outcome (evictions, or chunks with no room)
            assert rows[1] != unbounded
        unbounded = rows[1]


def test_mooncake_sample_pipelined_counts_by_hand(redis_client):
    """At chunk size 512 the pipelined replay's hits equal the trace's own block reuse (as one by one does:
    tests/replay/test_replay.py), and 1 in SAMPLE_EVERY lookups is also timed unpipelined."""
    from test_replay import mooncake_block_reuse

    path = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
    expected = mooncake_block_reuse(path, 300, 512)
    result = _replay(redis_client, lambda: read_trace(path), 256, (512,), limit=300)
    (res,) = result.per_chunk_size
    assert res.hit_tokens == expected
    assert (res.lookups_pipelined, res.lookups_sampled) == (300, -(-300 // SAMPLE_EVERY))
    assert res.lookup_round_trips == 2  # batches of 256 and 44: one read each
    assert any("sampled unpipelined lookups" in note for note in result.notes)


def test_a_read_namespace_is_replayed_one_by_one(redis_client):
    """With --namespace the lookups must check payload lengths (a warmed namespace holds real payloads): no batch."""
    warm = _replay(redis_client, _requests([tok(1, 8)]), 256, keep=True).per_chunk_size[0].namespace
    result = _replay(redis_client, _requests([tok(1, 8), tok(1, 8)]), 256, namespace=warm)
    (res,) = result.per_chunk_size
    assert (res.hit_tokens, res.lookups_pipelined, res.namespace_hit_chunks) == (7 + 7, 0, 4)
    cluster.unlink(redis_client, _own_keys(redis_client, warm))


def test_the_index_only_cli_path_does_not_import_torch(tmp_path, redis_url):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    code = ("import sys, runpy; sys.argv = ['kvcli', 'replay', sys.argv[1], '--payload', 'accounted', '--measure', "
            "'0', '--prefill-tps', '3000', '--chunk-sizes', '4', '--redis-url', sys.argv[2], '--json']\n"
            "try:\n    runpy.run_module('kvcli', run_name='__main__')\nexcept SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "print(sorted(m for m in ('torch', 'tiktoken', 'matplotlib') if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code, str(trace), redis_url], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]"


def _values(client, namespace: str) -> dict[bytes, bytes]:
    """The namespace's keys (namespace taken out) and values (their "created" second taken out)."""
    import re

    return {k.replace(namespace.encode(), b""): re.sub(rb'"created":\d+', b"", client.get(k))
            for k in _own_keys(client, namespace)}


@pytest.mark.single_server("the batch script runs on a single server (a cluster's batches take two round trips)")
def test_the_batch_script_writes_the_values_one_by_one_writes(redis_client):
    """Without a capacity a batch is one EVAL of the batch script (no MGET of the batch's keys, no MSET sent by the
    client): the same counts as one by one and byte for byte the same metadata values (the script builds them from
    their constant parts). Inside it, each request that writes does so in one MSET, as one by one does (no SET per
    chunk), and no payload STRLEN is read for accounted metadata."""
    path = ROOT / "sample_traces/sharegpt_multiturn.json"
    values, rows, calls = {}, {}, {}
    for pipeline in (1, 256):
        redis_client.config_resetstat()
        result = _replay(redis_client, lambda: read_trace(path), pipeline, (16, 64), keep=True)
        ran = {k.removeprefix("cmdstat_"): v["calls"] for k, v in redis_client.info("commandstats").items()}
        rows[pipeline] = [{f: getattr(r, f) for f in COMPARED} for r in result.per_chunk_size]
        values[pipeline] = {}
        for r in result.per_chunk_size:
            values[pipeline].update(_values(redis_client, r.namespace))
            cluster.unlink(redis_client, _own_keys(redis_client, r.namespace))
        calls[pipeline] = ran
        if pipeline == 256:
            # every MSET, SET and MGET is one one by one makes too: the script's MSETs (one per request that writes),
            # the transfer calibration's probes (SET, MGET); the client sent no MSET nor a batch's MGET
            assert {c: ran.get(c) for c in ("mset", "set", "mget")} == {c: calls[1].get(c) for c in
                                                                         ("mset", "set", "mget")}
            assert "strlen" not in ran  # accounted metadata: no payload length read
            assert ran["eval"] >= sum(r.lookup_round_trips for r in result.per_chunk_size)  # scripts per batch
            assert all(r.round_trips == r.lookup_round_trips for r in result.per_chunk_size)  # one per batch
    assert rows[256] == rows[1] and any(r["hit_tokens"] for r in rows[1])
    assert values[256] == values[1] and len(values[1]) == sum(r["objects_created"] for r in rows[1])


@pytest.mark.single_server("an ACL on one server")
def test_without_scripts_batches_take_two_round_trips_with_the_same_answers(make_server):
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.acl_setuser("noscript", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
    user = redis.Redis.from_url(url.replace("redis://", "redis://noscript:pw@"))
    path = ROOT / "sample_traces/chat_shared_system.jsonl"
    rows = {}
    for pipeline in (1, 256):
        admin.config_resetstat()
        result = _replay(user, lambda: read_trace(path), pipeline, (16,))
        rows[pipeline] = [{f: getattr(r, f) for f in COMPARED} for r in result.per_chunk_size]
    ran = {k.removeprefix("cmdstat_") for k, v in admin.info("commandstats").items() if v["calls"]}
    assert "mset" in ran and not ran & {"eval", "evalsha", "eval_ro"}  # refused (rejected calls): none ran
    assert rows[256] == rows[1] and rows[1][0]["hit_tokens"] > 0
    assert admin.dbsize() == 0


def _replay_with(client, reader, pipeline, chunk_sizes, prefetch, **kw):
    config = ReplayConfig(chunk_sizes=chunk_sizes, payload="accounted", measure=0, pipeline=pipeline, **kw)
    replayer = Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config, spec=SPEC,
                        prefetch=prefetch)
    return replayer.replay("t", reader)


@pytest.mark.parametrize("name,chunk_sizes,limit,capacity", SAMPLES, ids=[s[0].split(".")[0] for s in SAMPLES])
def test_hashing_ahead_in_a_child_gives_the_same_replay(redis_client, monkeypatch, name, chunk_sizes, limit,
                                                        capacity):
    """kvcli.replay.prefetch: the trace read and hashed in a forked child (upper bound included) or here: every
    count, the upper bound, the curve and the keys the same; the child is gone afterwards."""
    import multiprocessing

    from kvcli.replay import unit as module

    made = []
    monkeypatch.setattr(module, "Prefetch", lambda *a: made.append(1) or Prefetch(*a))
    path = ROOT / "sample_traces" / name
    rows, curves, keys = {}, {}, {}
    for prefetch, capacity_tokens in ((False, None), (True, None), (False, capacity), (True, capacity)):
        result = _replay_with(redis_client, lambda: read_trace(path), 64, chunk_sizes, prefetch, limit=limit,
                              capacity_tokens=capacity_tokens, keep=True)
        run = (prefetch, capacity_tokens)
        rows[run] = [{f: getattr(r, f) for f in COMPARED} for r in result.per_chunk_size]
        curves[run] = [{k: v for k, v in r.hit_curve.to_dict().items() if k not in ("seconds", "memory_bytes")}
                       for r in result.per_chunk_size]
        namespace = result.per_chunk_size[0].namespace
        own = _own_keys(redis_client, namespace)
        keys[run] = sorted(k.replace(namespace.encode(), b"") for k in own)
        cluster.unlink(redis_client, own)
        assert not [p for p in multiprocessing.active_children() if p.name == "kvcli-prefetch"]
        assert len(made) == prefetch  # the child hashed the trace, or this process did
        made.clear()
    for c in (None, capacity):
        assert (rows[True, c], curves[True, c], keys[True, c]) == (rows[False, c], curves[False, c], keys[False, c])
    assert any(r["hit_tokens"] for r in rows[False, None]) and all(r["upper_bound_tokens"] for r in rows[False, None])
    assert rows[False, capacity] != rows[False, None]  # the capacity changed the outcome


class _FailsOnSecondRead:
    """A trace reader whose second pass (the replay's, after the validating one) fails at its third request."""

    def __init__(self, requests):
        self.requests, self.calls = requests, 0

    def __call__(self):
        self.calls += 1
        for i, request in enumerate(self.requests):
            if self.calls > 1 and i == 2:
                raise BadInputError("the trace changed", "t.jsonl", 3)
            yield request


@pytest.mark.parametrize("prefetch", [False, True])
def test_an_error_while_reading_ahead_is_raised_in_the_replay(redis_client, prefetch):
    reader = _FailsOnSecondRead(_requests([tok(1, 8)] * 4))
    with pytest.raises(BadInputError, match=r"^t.jsonl:3: the trace changed$"):
        _replay_with(redis_client, reader, 2, (4,), prefetch)
    assert redis_client.dbsize() == 0  # the run's namespace was deleted


@pytest.mark.single_server("the batch script runs on a single server")
def test_a_batch_goes_as_several_scripts_of_at_most_max_script_keys(redis_client, monkeypatch):
    """A script blocks the server: a batch is cut into scripts of at most MAX_SCRIPT_KEYS chunks (a longer prompt
    alone), with the same answers as one request at a time."""
    from kvcli.store import batch

    prompts = [tok(1, 8), tok(1, 12), tok(1, 40), tok(1, 4), tok(101, 108), tok(1, 8)]  # 2, 3, 10, 1, 2, 2 chunks
    monkeypatch.setattr(batch, "MAX_SCRIPT_KEYS", 5)
    rows = {}
    for pipeline in (1, 256):
        redis_client.config_resetstat()
        (res,) = _replay(redis_client, _requests(prompts), pipeline).per_chunk_size
        rows[pipeline] = {f: getattr(res, f) for f in COMPARED}
        ran = {k.removeprefix("cmdstat_"): v["calls"] for k, v in redis_client.info("commandstats").items()}
    # R1 stores [1-4] [5-8]; R2 hits 8, stores [9-12]; R3 hits 12, stores 7 more; R4 hits 3 (its 4 tokens, less
    # its last); R5 misses, stores 2; R6 hits 7
    assert rows[1]["hit_tokens"] == 8 + 12 + 3 + 7 and rows[256] == rows[1]
    # scripts of <= 5 chunks, a request never split: [R1 R2] (5), [R3] (10), [R4 R5 R6] (5)
    assert (ran["eval"], res.lookup_round_trips) == (3, 1)
