"""The record of what a store wrote (kvcli.store.written): 16 bytes per chunk and kind, distinct, picklable, and
the keys rebuilt from it are exactly the store's keys on the server, deleted with batched UNLINKs."""
from __future__ import annotations

import pickle

import pytest
import redis
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.errors import RedisFailure
from kvcli.store import written as written_module
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.kvstore import purge_run
from kvcli.store.namespace import scan_keys
from kvcli.store.records import StoreConfig
from kvcli.store.written import METADATA, PAYLOAD, HashKeys, WrittenChunks, delete_keys, hexes, sorted_distinct

SHAPE = (2, 2, 2, 32)


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_a_record_holds_16_bytes_per_distinct_chunk():
    rec = WrittenChunks()
    rec.add(METADATA, [h(i) for i in range(1000)])
    rec.add(METADATA, [h(i) for i in range(500, 1500)])  # 500 written again
    rec.add(PAYLOAD, [h(7)])
    assert rec.chunks(METADATA) == 2000 and rec.nbytes == 16 * 2001
    assert rec.distinct(METADATA) == b"".join(h(i) for i in range(1500))  # sorted, each once
    assert rec.chunks(METADATA) == 1500 and rec.nbytes == 16 * 1501
    assert [len(s) for s in rec.slices(METADATA, 1000)] == [16_000, 8_000]
    copy = pickle.loads(pickle.dumps(rec))
    assert copy.distinct(METADATA) == rec.distinct(METADATA) and copy.distinct(PAYLOAD) == h(7)
    other = WrittenChunks()
    other.add(METADATA, [h(i) for i in range(1400, 1600)])
    rec.merge(other)
    assert rec.distinct(METADATA) == b"".join(h(i) for i in range(1600))
    assert hexes(h(1) + h(255)) == [h(1).hex(), h(255).hex()]


def test_a_record_compacts_itself_as_it_grows(monkeypatch):
    """Chunks written again and again (a capacity's churn) keep the record near 16 bytes per distinct chunk."""
    monkeypatch.setattr(written_module, "COMPACT_BYTES", 16 * 100)
    rec = WrittenChunks()
    for _ in range(50):
        rec.add(METADATA, [h(i) for i in range(80)])
    assert rec.chunks(METADATA) <= 2 * 100  # never past twice the larger of 100 and the last compaction
    assert rec.distinct(METADATA) == b"".join(h(i) for i in range(80))


def test_a_record_past_its_memory_share_spills_to_a_file_and_reads_the_same(monkeypatch):
    """With 100 hashes' room in memory, 1,000 recorded (300 twice) keep at most 100 in memory; counts, distinct,
    slices, a pickle and a merge read file and memory as one record."""
    monkeypatch.setattr(written_module, "SPILL_BYTES", 16 * 100)
    rec = WrittenChunks()
    for start in range(0, 1000, 70):
        rec.add(METADATA, [h(i) for i in range(start, min(start + 70, 1000))])
    rec.add(METADATA, [h(i) for i in range(300)])
    assert rec.chunks(METADATA) == 1300 and rec.nbytes < 16 * 100
    assert rec.distinct(METADATA) == b"".join(h(i) for i in range(1000))
    assert rec.distinct_chunks(METADATA) == 1000 and rec.nbytes < 16 * 100
    assert b"".join(rec.slices(METADATA, 64)) == rec.distinct(METADATA)
    assert [len(s) for s in rec.slices(METADATA, 300)] == [16 * 300] * 3 + [16 * 100]
    copy = pickle.loads(pickle.dumps(rec))
    assert copy.distinct(METADATA) == rec.distinct(METADATA)
    copy.merge(rec)
    assert copy.chunks(METADATA) == 2000 and copy.distinct(METADATA) == rec.distinct(METADATA)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=40))
def test_sorted_distinct_is_sorted_set_of_the_hashes(pairs):
    """Hashes made of few distinct 8-byte halves (many equal first halves, many repeats): byte order, each once."""
    hashes = [bytes([a]) * 8 + bytes([b]) * 8 for a, b in pairs]
    assert sorted_distinct(b"".join(hashes)) == b"".join(sorted(set(hashes)))


def _keys(client) -> set[bytes]:
    return {key for batch in scan_keys(client) for key in batch}


def test_the_keys_rebuilt_from_a_record_are_the_store_keys(redis_client):
    """Writes with a TTL, real payloads and a capacity's evictions: the record rebuilds every key left on the
    server (evicted ones too: absent, skipped by UNLINK), and the deletion leaves only others' keys."""
    redis_client.set("kvcli:v1:other:8:m:" + "ab" * 16, b"x")
    config = StoreConfig("rec", 8, "m", "raw", SHAPE, torch.float32, ttl=600, capacity_tokens=64)
    store = ChunkStore(redis_client, config)
    # 10 real chunks: the capacity (8 chunks) has no room for the last 2, which are not written
    store.store(list(range(1, 81)), torch.randn(2, 2, 2, 80, 32))
    store.store(list(range(100, 133)), None)  # 4 accounted chunks: the first prompt's chunks 0-3 evicted
    assert store.stats.evicted_chunks == 4
    on_server = _keys(redis_client) - {b"kvcli:v1:other:8:m:" + b"ab" * 16}
    assert len(on_server) == 4 * 2 + 4 and all(redis_client.ttl(k) > 0 for k in on_server)
    rebuilt = {k.encode() for batch in store.written_keys() for k in batch.keys()}
    assert (store.written.chunks(METADATA), store.written.chunks(PAYLOAD)) == (12, 8)  # 8 real + 4 accounted
    assert len(rebuilt) == 12 + 8 and on_server <= rebuilt  # the evicted chunks' keys too (absent now)
    assert purge_run(redis_client, "rec", ("kvcli",), stores=[store]) == len(on_server)
    assert _keys(redis_client) == {b"kvcli:v1:other:8:m:" + b"ab" * 16}


def test_delete_keys_in_batches(redis_client):
    for i in range(2500):
        redis_client.set(f"k:{i}", b"v")
    batches = [[f"k:{i}" for i in range(j, min(j + 1000, 2600))] for j in range(0, 2600, 1000)]
    assert delete_keys(redis_client, batches, pipeline_batches=2) == 2500  # 100 absent: skipped
    assert _keys(redis_client) == set()


def test_hash_keys_are_deleted_packed_with_lists_between_them(redis_client):
    """Keys named by hashes (``head + hash.hex()``) go as packed UNLINKs, lists of keys as UNLINKs of their own, in
    one round trip per ``pipeline_batches``: 3 of the 5 hashed keys exist, 1 of the 2 listed."""
    hashes = [bytes([i]) * 16 for i in range(5)]
    for h in hashes[:3]:
        redis_client.set("kvcli:v1:ns:8:m:" + h.hex(), b"v")
    redis_client.set("sentinel", b"v")
    redis_client.set("other", b"v")
    batches = [HashKeys("kvcli:v1:ns:8:m:", b"".join(hashes[:2])), ["sentinel", "absent"],
               HashKeys("kvcli:v1:ns:8:m:", b"".join(hashes[2:]))]
    assert delete_keys(redis_client, batches, pipeline_batches=2) == 4
    assert _keys(redis_client) == {b"other"}


@pytest.mark.single_server("an ACL user of one server")
def test_a_refused_unlink_says_how_many_keys_were_deleted_before_it(redis_client):
    redis_client.acl_setuser("only-k", enabled=True, nopass=True, keys=["k:*"], commands=["+@all"])
    where = redis_client.connection_pool.connection_kwargs
    user = redis.Redis(host=where["host"], port=where["port"], username="only-k")
    for key in ("k:0", "k:1", "s"):
        redis_client.set(key, b"v")
    with pytest.raises(RedisFailure, match=r"Redis UNLINK failed: .*; 2 keys deleted before it"):
        delete_keys(user, [["k:0", "k:1"], ["s"]], pipeline_batches=1)
    assert _keys(redis_client) == {b"s"}
    redis_client.acl_deluser("only-k")


def test_a_record_that_keeps_nothing_is_empty_and_still_works():
    """keep=False (a run on kvcli's own server, emptied whole): adds and merges keep nothing, reads see none."""
    full = WrittenChunks()
    full.add(METADATA, [bytes([i]) * 16 for i in range(3)])
    off = WrittenChunks(keep=False)
    off.add(METADATA, [b"\x01" * 16])
    off.merge(full)
    assert (off.nbytes, off.chunks(METADATA), off.distinct(METADATA), list(off.slices(METADATA))) == (0, 0, b"", [])
    assert full.nbytes == 48
