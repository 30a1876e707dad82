"""The one chunk judge and its Lua twin, over one table of cases, on a live server.

Each case damages (or not) one stored chunk's two keys, then reads them three ways and judges them:

* the lookup's reads (GET of the metadata, STRLEN of a real payload): the Python judge on them, the lookup script
  (:data:`kvcli.store.judge.LOOKUP_SCRIPT`, the Lua twin) on the server, and ``ChunkStore.lookup``'s answer;
* the index-only reads (metadata alone, the payload not read): the batch script's Lua twin, through a Batcher;
* the bytes (GET of both, as the chunk map and warm's ``--verify`` read them): the Python judge with checksum.
"""
from __future__ import annotations

import dataclasses

import pytest
import redis
import torch

from kvcli.store.batch import Batcher, lookup_and_store
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.judge import (
    ACCOUNTED,
    BAD_METADATA,
    BAD_PAYLOAD,
    CHECKSUM,
    HITS,
    MISSING,
    NO_METADATA,
    NO_PAYLOAD,
    NOT_READ,
    OTHER_LAYOUT,
    TOKEN_MISMATCH,
    USABLE,
    WRONG_TYPE,
    judge,
    payload_ok,
)
from kvcli.store.layout import is_real
from kvcli.store.records import StoreConfig
from kvcli.store.serde import stored_as

KV_SHAPE = (2, 2, 2, 3)  # [layers, 2, kv_heads, head_dim] per token: 96 bytes/token in fp32
TOKENS = [5, 6, 7, 8]  # one full chunk at chunk size 4


def _store(client, payload="real") -> ChunkStore:
    return ChunkStore(client, StoreConfig("j", 4, "m", "raw", KV_SHAPE, torch.float32, payload=payload))


def _real(client, store, meta, data):
    store.store(TOKENS, torch.arange(24 * 4, dtype=torch.float32).view(2, 2, 2, 4, 3))


def _accounted(client, store, meta, data):
    _store(client, "accounted").store(TOKENS, None)


def _nothing(client, store, meta, data):
    pass


def _orphan_payload(client, store, meta, data):
    _real(client, store, meta, data)
    client.delete(meta)


def _meta_other_type(client, store, meta, data):
    _real(client, store, meta, data)
    client.delete(meta)
    client.hset(meta, "a", 1)


def _other_digest(client, store, meta, data):
    _real(client, store, meta, data)
    client.setrange(meta, 0, b"\xff" * 8)


def _no_payload(client, store, meta, data):
    _real(client, store, meta, data)
    client.delete(data)


def _truncated(client, store, meta, data):
    _real(client, store, meta, data)
    client.set(data, client.get(data)[:-1])


def _payload_other_type(client, store, meta, data):
    _real(client, store, meta, data)
    client.delete(data)
    client.rpush(data, b"x")


def _flipped_byte(client, store, meta, data):
    _real(client, store, meta, data)
    value = client.get(data)
    client.setrange(data, len(value) - 1, bytes([value[-1] ^ 1]))


def _dtype_lie(client, store, meta, data):
    _real(client, store, meta, data)
    client.set(data, client.get(data).replace(b'"dtype":"F32"', b'"dtype":"I32"'))  # same size, same bytes


def _neither_real_nor_accounted(client, store, meta, data):
    _real(client, store, meta, data)
    client.set(meta, client.get(meta).replace(b'"stored":"real"', b'"stored":"other"'))


def _unparsable_json(client, store, meta, data):
    _real(client, store, meta, data)
    value = client.get(meta)
    client.set(meta, value[:16] + b'{"stored":"real"')  # digest and checksum kept, the JSON cut


#: case, what was done, and the state: by the lookup's reads, by the metadata alone, by the bytes
CASES = [
    (_real, USABLE, BAD_PAYLOAD, USABLE),
    (_accounted, ACCOUNTED, ACCOUNTED, ACCOUNTED),
    (_nothing, MISSING, MISSING, MISSING),
    (_orphan_payload, MISSING, MISSING, NO_METADATA),  # a lookup reads no payload without metadata
    (_meta_other_type, BAD_METADATA, BAD_METADATA, BAD_METADATA),
    (_other_digest, TOKEN_MISMATCH, TOKEN_MISMATCH, TOKEN_MISMATCH),
    (_no_payload, NO_PAYLOAD, BAD_PAYLOAD, NO_PAYLOAD),
    (_truncated, BAD_PAYLOAD, BAD_PAYLOAD, BAD_PAYLOAD),
    (_payload_other_type, BAD_PAYLOAD, BAD_PAYLOAD, BAD_PAYLOAD),
    (_flipped_byte, USABLE, BAD_PAYLOAD, CHECKSUM),  # only the bytes show a checksum failure
    (_dtype_lie, USABLE, BAD_PAYLOAD, CHECKSUM),  # a header that says int32: its bytes match, its dtype does not
    (_neither_real_nor_accounted, BAD_METADATA, BAD_METADATA, BAD_METADATA),
    (_unparsable_json, USABLE, BAD_PAYLOAD, BAD_METADATA),  # the hot path reads bytes, never parses the JSON
]


def _get(client, key):
    try:
        return client.get(key)
    except redis.ResponseError:  # WRONGTYPE
        return WRONG_TYPE


@pytest.mark.single_server  # the scripts run on a single server (a cluster's lookup is judged in Python)
@pytest.mark.parametrize("damage, by_lookup, by_metadata, by_bytes", CASES, ids=[c[0].__name__[1:] for c in CASES])
def test_python_judge_and_lua_twin_agree(redis_client, damage, by_lookup, by_metadata, by_bytes):
    store = _store(redis_client)
    prompt = store.chunk(TOKENS)
    meta_key, payload_key = store.meta_key(prompt.hashes[0]), store.payload_key(prompt.hashes[0])
    damage(redis_client, store, meta_key, payload_key)
    digest, size = prompt.digests[0], store.value_bytes
    meta, payload = _get(redis_client, meta_key), _get(redis_client, payload_key)

    # the lookup's reads: GET of the metadata, STRLEN of the payload only where the metadata records a real one
    strlen = NOT_READ
    if isinstance(meta, bytes) and is_real(meta):
        strlen = WRONG_TYPE if payload is WRONG_TYPE else redis_client.strlen(payload_key)
    assert judge(meta, strlen, digest, size) == by_lookup
    assert store.batch_port().read_chunks(prompt)[1] == [by_lookup]  # the Lua twin, in the lookup script
    look = store.lookup(prompt)
    assert (look.hit_chunks, look.break_reason) == ((1, "") if by_lookup in HITS else (0, by_lookup))

    # the bytes, as the chunk map reads them (and warm with --verify)
    assert judge(meta, payload, digest) == by_bytes

    # the metadata alone (a lookup that reads no payload length), in Python
    assert judge(meta, NOT_READ, digest, size) == by_metadata
    assert store.batch_port().evaluate(prompt, [None if meta is WRONG_TYPE else meta]).break_reason in (
        "" if by_metadata in HITS else by_metadata, MISSING)  # an MGET answers nil for a key of another type

    # a batch (the script, and the two round trips) judges as the lookup: a real payload's STRLEN read in it
    batcher = Batcher(store)
    try:
        (index_look, _), = batcher.answers(batcher.submit([prompt]))
    finally:
        batcher.close()
    assert index_look.break_reason == ("" if by_lookup in HITS else by_lookup)


def test_warm_strictness_checks_the_fields_a_store_writes(redis_client):
    """With ``expect``, the metadata is parsed and its fields compared: another model, shape or parent is bad
    metadata, and accounted metadata is not present as a real chunk."""
    store = _store(redis_client)
    prompt = store.chunk(TOKENS)
    _real(redis_client, store, None, None)
    meta, payload = redis_client.get(store.meta_key(prompt.hashes[0])), redis_client.get(
        store.payload_key(prompt.hashes[0]))
    digest = prompt.digests[0]
    assert judge(meta, payload, digest, store.value_bytes, store.expected, "") == USABLE
    assert judge(meta, len(payload), digest, store.value_bytes, store.expected, "") == USABLE
    assert judge(meta, payload, digest, store.value_bytes, store.expected, "ab" * 16) == BAD_METADATA  # parent
    other = dataclasses.replace(store.expected, model="another")
    assert judge(meta, payload, digest, store.value_bytes, other, "") == BAD_METADATA
    assert judge(meta, None, digest, store.value_bytes, store.expected, "") == NO_PAYLOAD


def test_a_payload_whose_header_lies_about_its_dtype_is_a_counted_miss(redis_client):
    """Its bytes match the checksum, but they are not this store's dtype: retrieve ends the run there (a miss, one
    checksum failure), never hands the model a tensor of another dtype."""
    store = _store(redis_client)
    prompt = store.chunk(TOKENS)
    _dtype_lie(redis_client, store, None, store.payload_key(prompt.hashes[0]))
    got = store.retrieve(prompt)
    assert (got.hit_tokens, got.kv, got.break_reason) == (0, None, "checksum")
    assert (store.stats.checksum_verified_chunks, store.stats.checksum_failures) == (1, 1)


@pytest.mark.parametrize("damage, by_lookup, by_metadata, by_bytes", CASES, ids=[c[0].__name__[1:] for c in CASES])
def test_a_batch_of_two_round_trips_judges_as_the_lookup(redis_client, damage, by_lookup, by_metadata, by_bytes):
    # lookup_and_store (a cluster, a capacity, scripts refused) reads a real chunk's payload length in one more
    # round trip: its answer is the lookup's on every damage
    store = _store(redis_client)
    prompt = store.chunk(TOKENS)
    damage(redis_client, store, store.meta_key(prompt.hashes[0]), store.payload_key(prompt.hashes[0]))
    (look, _), = lookup_and_store(store, [prompt])
    if by_lookup in HITS:
        assert (look.hit_chunks, look.break_reason) == (1, "")
    else:  # an MGET answers nil for a metadata key of another type
        assert look.hit_chunks == 0 and look.break_reason in (by_lookup, MISSING)


def _fp8_store(client) -> ChunkStore:
    return ChunkStore(client, StoreConfig("j8", 4, "m", "raw", KV_SHAPE, torch.float32, kv_dtype="fp8"))


def test_an_fp8_chunk_is_usable_as_fp8_and_nowhere_else(redis_client):
    """An fp8 store's chunk: 2 x 2 x 2 x 4 x 3 = 96 one-byte values + 2 x 2 float32 scales = 112 payload bytes (the
    fp32 store's 384), ``"dtype":"F8_E4M3"`` in its metadata. It is usable by the store that wrote it (retrieve
    dequantizes to the model's fp32); to an fp32 store of the same chunk it is another length (a lookup's
    bad-payload), another dtype (its bytes' checksum state) and, judged with the fp32 store's fields, another
    layout; a header relabelled U8 is refused by the judge."""
    store, plain = _fp8_store(redis_client), _store(redis_client)
    assert (store.config.payload_bytes, plain.config.payload_bytes) == (112, 384)
    prompt = store.chunk(TOKENS)
    kv = torch.arange(96, dtype=torch.float32).view(2, 2, 2, 4, 3) / 8
    store.store(prompt, kv)
    meta, payload = (redis_client.get(store.meta_key(prompt.hashes[0])),
                     redis_client.get(store.payload_key(prompt.hashes[0])))
    assert b'"dtype":"F8_E4M3"' in meta and len(payload) == store.value_bytes
    digest = prompt.digests[0]
    assert judge(meta, payload, digest, store.value_bytes, store.expected, "") == USABLE
    got = store.retrieve(prompt)
    assert got.kv.dtype == torch.float32 and got.payload_bytes == 112
    assert torch.equal(got.kv, stored_as(kv, "float8_e4m3fn"))
    assert 0 < float((got.kv - kv).abs().max()) <= float(kv.abs().max()) / 16  # e4m3: 3 mantissa bits
    assert judge(meta, len(payload), digest, plain.value_bytes) == BAD_PAYLOAD
    assert not payload_ok(payload, meta[8:16], plain.config.chunk_shape, plain.expected.dtype)
    assert judge(meta, payload, digest, store.value_bytes, plain.expected, "") == OTHER_LAYOUT
    lie = payload.replace(b'"dtype":"F8_E4M3"', b'"dtype":"U8"     ', 1)  # same length, same bytes
    redis_client.set(store.payload_key(prompt.hashes[0]), lie)
    assert judge(meta, lie, digest) == CHECKSUM
    got = store.retrieve(prompt)
    assert (got.hit_tokens, got.kv, got.break_reason) == (0, None, "checksum")
