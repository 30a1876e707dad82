"""The chunk-hash store against a real (embedded) Redis server: exact hit counts computed by hand."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster

from kvcli.errors import redis_error_text
from kvcli.store.calls import execute_pipeline
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.hashing import chunk_prompt, namespace_root
from kvcli.store.records import ChunkTooLargeError, StoreConfig

KV_SHAPE = (2, 2, 2, 3)  # [layers, 2, kv_heads, head_dim] per token: 24 fp32 values = 96 bytes/token


def tok(a: int, b: int) -> list[int]:
    """Token ids a..b inclusive."""
    return list(range(a, b + 1))


def make_store(client, chunk_size=4, **kw) -> ChunkStore:
    cfg = StoreConfig(namespace="t", chunk_size=chunk_size, model_id="m", tokenizer="raw", kv_shape=KV_SHAPE,
                      dtype=torch.float32, **kw)
    return ChunkStore(client, cfg)


def fake_kv(tokens: list[int]) -> torch.Tensor:
    """KV whose values encode (token position, token id), so a wrong chunk shows up in comparisons."""
    n = len(tokens)
    kv = torch.zeros((KV_SHAPE[0], 2, KV_SHAPE[2], n, KV_SHAPE[3]))
    kv += torch.arange(n, dtype=torch.float32).view(1, 1, 1, n, 1) * 1000
    kv += torch.tensor(tokens, dtype=torch.float32).view(1, 1, 1, n, 1)
    return kv


def put(store: ChunkStore, tokens: list[int]):
    return store.store(tokens, fake_kv(tokens))


def test_partial_match_hits_8_of_11(redis_client):
    store = make_store(redis_client)
    put(store, tok(1, 11))
    assert store.lookup(tok(1, 9) + [50, 51]).hit_tokens == 8
    assert store.lookup(tok(1, 12)).hit_tokens == 8  # chunk [9..12] was a partial chunk, never stored


def test_short_query_hits_zero_and_writes_nothing(redis_client):
    store = make_store(redis_client)
    put(store, tok(1, 11))
    keys_before = redis_client.dbsize()
    res = store.lookup([5, 6, 7])
    assert (res.hit_tokens, res.full_chunks) == (0, 0)
    assert put(store, [5, 6, 7]).objects_created == 0
    assert redis_client.dbsize() == keys_before == 4  # 2 chunks x (metadata + payload)


def test_empty_prompt_is_zero_hits_and_no_round_trip(redis_client):
    store = make_store(redis_client)
    assert store.lookup([]).hit_tokens == 0
    assert store.stats.round_trips == 0


def test_gap_stops_the_run(redis_client):
    store = make_store(redis_client)
    put(store, tok(1, 16))
    h1 = store.chunk(tok(1, 16)).hashes[1]
    redis_client.delete(store.meta_key(h1), store.payload_key(h1))
    res = store.lookup(tok(1, 17))
    assert (res.hit_tokens, res.break_reason) == (4, "missing")


def test_similar_sequences_never_share_a_hash():
    root = namespace_root("m", "raw")
    a = chunk_prompt([10, 20, 30, 40], 4, root).hashes
    b = chunk_prompt([41, 19, 30, 40], 4, root).hashes
    assert len(a) == len(b) == 1 and a != b


def test_same_chunk_after_other_prefix_never_hits(redis_client):
    store = make_store(redis_client)
    put(store, [1, 2, 3, 4, 5, 6, 7, 8])
    assert store.lookup([9, 9, 9, 9, 5, 6, 7, 8]).hit_tokens == 0
    assert store.chunk([1, 2, 3, 4, 5, 6, 7, 8]).hashes[1] != store.chunk([9, 9, 9, 9, 5, 6, 7, 8]).hashes[1]


def test_cache_salt_and_model_separate_namespaces(redis_client):
    store = make_store(redis_client)
    store.store(tok(1, 8), fake_kv(tok(1, 8)), cache_salt="tenant-a")
    assert store.lookup(tok(1, 8), cache_salt="tenant-a").hit_tokens == 8
    assert store.lookup(tok(1, 8), cache_salt="tenant-b").hit_tokens == 0
    other_model = ChunkStore(redis_client, StoreConfig("t", 4, "m2", "raw", KV_SHAPE, torch.float32))
    assert other_model.lookup(tok(1, 8), cache_salt="tenant-a").hit_tokens == 0


def test_retrieve_returns_the_stored_kv(redis_client, server_kind):
    store = make_store(redis_client)
    put(store, tok(1, 11))
    res = store.retrieve(tok(1, 9) + [50, 51])
    assert res.hit_tokens == 8
    assert res.kv.shape == (2, 2, 2, 8, 3)
    assert torch.equal(res.kv, fake_kv(tok(1, 8)))
    assert res.payload_bytes == 8 * 96
    # store (on a cluster: payloads, then metadata), lookup, payload MGET
    assert store.stats.round_trips == (4 if server_kind == "cluster" else 3)


def test_store_writes_each_chunk_once(redis_client):
    store = make_store(redis_client)
    first = put(store, tok(1, 12))
    second = put(store, tok(1, 12))
    assert (first.chunks_written, first.objects_created, first.metadata_entries) == (3, 6, 3)
    assert (second.chunks_written, second.chunks_present, second.objects_created) == (0, 3, 0)


def test_corrupted_payload_is_a_miss_never_returned(redis_client):
    store = make_store(redis_client)
    put(store, tok(1, 12))
    h1 = store.chunk(tok(1, 12)).hashes[1]
    raw = bytearray(redis_client.get(store.payload_key(h1)))
    raw[-1] ^= 0xFF
    redis_client.set(store.payload_key(h1), bytes(raw))
    res = store.retrieve(tok(1, 12))
    assert (res.lookup.hit_tokens, res.hit_tokens, res.break_reason) == (12, 4, "checksum")
    assert torch.equal(res.kv, fake_kv(tok(1, 4)))


def test_lru_capacity_evicts_least_recent_chunk(redis_client):
    store = make_store(redis_client, capacity_tokens=12)  # 3 chunks of 4
    put(store, tok(1, 8))                 # A=[1..4], B=[5..8]; recency (oldest first): B, A
    put(store, [100, 101, 102, 103, 104, 105, 106, 107])  # C, D: one over capacity -> evict LRU
    # recency (oldest first): B, A, D, C -> B is evicted (a chain's tail before its head)
    assert store.stats.evicted_chunks == 1
    assert store.lookup(tok(1, 8)).hit_tokens == 4
    assert store.resident_chunks == 3


def test_accounted_payload_writes_metadata_only(redis_client):
    store = make_store(redis_client, payload="accounted")
    res = store.store(tok(1, 8), None)
    assert (res.objects_created, res.payload_bytes) == (2, 2 * 4 * 96)
    assert store.stats.payload_bytes_written == 0 and store.stats.payload_bytes_accounted == 768
    assert store.lookup(tok(1, 9)).hit_tokens == 8
    assert store.retrieve(tok(1, 9)).break_reason == "no-payload"


def test_proto_max_bulk_len_refuses_before_any_write(make_server):
    url = make_server(**{"proto-max-bulk-len": "1mb"})
    client = redis.Redis.from_url(url)
    # 1,024 KV bytes per token: [2 layers, 2, 2 kv heads, 32 head_dim] in fp32 (the tiny model's shape)
    shape = (2, 2, 2, 32)
    ok = ChunkStore(client, StoreConfig("t", 512, "m", "raw", shape, torch.float32))
    ok.check_value_size()
    tokens = np.arange(512, dtype=np.uint32)
    kv = torch.zeros((2, 2, 2, 512, 32))
    assert ok.store(tokens, kv).objects_created == 2
    big = ChunkStore(client, StoreConfig("t2", 2048, "m", "raw", shape, torch.float32))
    with pytest.raises(ChunkTooLargeError, match="proto-max-bulk-len"):
        big.check_value_size()
    assert client.dbsize() == 2


def _commands_since_reset(client) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


@pytest.mark.parametrize("chunks", [1, 10, 100, 1000])
def test_one_round_trip_per_lookup(redis_client, chunks, monkeypatch):
    """One MGET (a cluster: one GET per key, each shard's in one write) sent in ONE write to each server, counted
    once per shard."""
    store = make_store(redis_client, chunk_size=16)
    tokens = np.arange(16 * chunks, dtype=np.uint32)
    store.store(tokens, None if False else torch.zeros((2, 2, 2, 16 * chunks, 3)))
    redis_client.config_resetstat()
    sends, trips, before = Counter(), store.stats.round_trips, Counter(store.shard_trips.counts)
    original = redis.connection.Connection.send_packed_command
    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", lambda self, *a, **k: (
        sends.update([f"{self.host}:{self.port}"]), original(self, *a, **k))[1])
    res = store.lookup(tokens)
    monkeypatch.undo()
    assert res.hit_chunks == chunks
    assert store.stats.round_trips == trips + 1
    assert set(sends.values()) == {1}  # every server touched got the whole lookup in one write
    assert store.shard_trips.counts - before == sends  # round trips per shard: one on each shard touched
    keys = [store.meta_key(h) for h in store.chunk(tokens).hashes]
    keys += [store.payload_key(h) for h in store.chunk(tokens).hashes]
    stats = {k: v["calls"] for k, v in redis_client.info("commandstats").items()
             if k not in ("cmdstat_info", "cmdstat_config|resetstat")}
    if isinstance(redis_client, RedisCluster):
        # no script across slots: a GET (metadata) and a STRLEN (payload) per chunk, each shard's in one write
        slots = {redis_client.keyslot(k) for k in keys}
        assert stats == {"cmdstat_get": chunks, "cmdstat_strlen": chunks}
        assert set(sends) == {redis_client.nodes_manager.get_node_from_slot(s).name for s in slots}
    else:
        # one command from the client: the read-only lookup script, which reads each chunk's metadata and, its
        # payload being real, the payload's length (commands run by a script are counted by the server too)
        assert stats == {"cmdstat_eval_ro": 1, "cmdstat_get": chunks, "cmdstat_strlen": chunks}
        assert len(sends) == 1


def test_capacity_is_strict_and_keeps_a_prefix(redis_client):
    store = make_store(redis_client, capacity_tokens=4)  # one chunk of 4
    res = put(store, tok(1, 12))
    assert (res.chunks_written, store.resident_chunks) == (1, 1)  # only chunk [1..4], the reachable prefix
    assert store.lookup(tok(1, 12)).hit_tokens == 4
    tiny = ChunkStore(redis_client, StoreConfig("t2", 4, "m", "raw", KV_SHAPE, torch.float32, capacity_tokens=3))
    assert put(tiny, tok(1, 12)).chunks_written == 0 and tiny.lookup(tok(1, 12)).hit_tokens == 0


def test_a_prompt_never_evicts_the_prefix_it_extends(redis_client):
    store = make_store(redis_client, capacity_tokens=8)  # two chunks
    put(store, tok(1, 8))
    look = store.lookup(tok(1, 16))
    res = store.store(tok(1, 16), fake_kv(tok(1, 16)), start_chunk=look.hit_chunks, lookup=look)
    assert (res.chunks_written, res.evicted_chunks) == (0, 0)  # full: the hit run [1..8] stays, nothing admitted
    assert store.lookup(tok(1, 16)).hit_tokens == 8


@pytest.mark.parametrize("bad", [dict(namespace="a:b"), dict(namespace="a*"), dict(namespace=""),
                                 dict(capacity_tokens=0), dict(capacity_bytes=-1), dict(ttl=0)])
def test_store_config_is_validated(bad):
    from kvcli.errors import BadInputError

    args = dict(namespace="ok", chunk_size=4, model_id="m", tokenizer="raw", kv_shape=KV_SHAPE, dtype=torch.float32)
    with pytest.raises(BadInputError):
        StoreConfig(**{**args, **bad})


def test_lru_keeps_a_chains_head_over_its_tail(redis_client):
    """The smallest case where LRU order matters: chunk size 4, capacity 16 tokens; tok(1..16), [101..104], tok(1..16).

    After the first request its chunks are ordered (most recent first) c0, c1, c2, c3; the second evicts c3, so the
    third hits c0..c2: 12 of its 16 tokens (0 before the fix, which evicted the head c0 first).
    """
    store = make_store(redis_client, capacity_tokens=16)
    hits = []
    for tokens in (tok(1, 16), tok(101, 104), tok(1, 16)):
        look = store.lookup(tokens)
        hits.append(look.hit_tokens)
        store.store(tokens, fake_kv(tokens), start_chunk=look.hit_chunks, lookup=look)
    assert hits == [0, 0, 12]
    assert store.stats.evicted_chunks == 2  # c3 for [101..104]; then [101..104] when c3 is stored again
    assert store.resident_chunks == 4


def test_lru_request_longer_than_capacity_keeps_its_head(redis_client):
    store = make_store(redis_client, capacity_tokens=8)  # 2 chunks
    res = put(store, tok(1, 16))  # 4 chunks: only c0, c1 fit; c2, c3 are never written
    assert (res.chunks_written, res.evicted_chunks) == (2, 0)
    assert store.lookup(tok(1, 16)).hit_tokens == 8
    assert redis_client.dbsize() == 4  # metadata + payload of c0 and c1


def test_a_failed_pipeline_command_is_named_by_its_first_key_not_echoed_whole(redis_client, monkeypatch):
    """The first error reply of a single server's pipeline is raised in redis-py's form, naming the command and its
    first key, without redis-py's echo of all its arguments (never called here); the replies before it were
    applied. A cluster's pipeline fails as redis-py fails it."""
    def echoed(*args):
        raise AssertionError("redis-py's annotate_exception joined the command's arguments")

    cluster = isinstance(redis_client, RedisCluster)
    if not cluster:
        monkeypatch.setattr(redis.client.Pipeline, "annotate_exception", echoed)
    pipe = redis_client.pipeline(transaction=False)
    pipe.set("{t}a", "1")
    pipe.set("{t}b", "2")
    pipe.lpush("{t}a", b"\x00" * 100_000, "more")  # a string key: WRONGTYPE
    with pytest.raises(redis.ResponseError) as caught:
        execute_pipeline(pipe)
    assert "WRONGTYPE" in str(caught.value)
    if not cluster:
        assert str(caught.value).startswith("Command # 3 (LPUSH {t}a) of pipeline caused error: WRONGTYPE")
        assert len(str(caught.value)) < 200
    text = redis_error_text(caught.value)
    assert text.startswith("WRONGTYPE") and "(LPUSH {t}a" in text and (cluster or text.endswith("(LPUSH {t}a)"))
    assert redis_client.get("{t}b") == b"2"
    pipe = redis_client.pipeline(transaction=False)
    pipe.get("{t}a")
    pipe.strlen("{t}b")
    assert execute_pipeline(pipe) == [b"1", 1]
