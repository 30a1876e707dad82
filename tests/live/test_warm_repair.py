"""warm finds and rewrites damaged chunks: every kind of damage to one chunk of a warmed chain is found
(presence, type, length, digest, parent, model always; checksums with --verify), rewritten whole, and counted;
and a chain's head never expires before the tail a later warm added."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.live.chunkmap import chunk_map
from kvcli.live.inspect import inspect_cache
from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.llama import build_model
from kvcli.model.presets import model_spec
from kvcli.traces.request import Request

TINY = model_spec("tiny")
TOKENS = np.arange(1, 49, dtype=np.uint32)  # 3 chunks of 16


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def req(tokens, rid="r") -> Request:
    return Request(rid, np.asarray(tokens, dtype=np.uint32), source=f"test:{rid}")


def _edit_meta(client, key, **changes):
    raw = client.get(key)
    info = json.loads(raw[16:])
    info.update(changes)
    client.set(key, raw[:16] + json.dumps(info, separators=(",", ":")).encode())


def _flip(client, key, offset=-3):
    raw = bytearray(client.get(key))
    raw[offset] ^= 0x40
    client.set(key, bytes(raw))


# each damages chunk 1 (m: its metadata key, p: its payload key; m0/m2, p0/p2: its neighbours' keys)
DAMAGE = {
    "payload missing": lambda c, k: c.delete(k["p"]),
    "metadata missing": lambda c, k: c.delete(k["m"]),
    "payload truncated": lambda c, k: c.set(k["p"], c.get(k["p"])[:-100]),
    "payload extended": lambda c, k: c.append(k["p"], b"junk"),
    "payload empty": lambda c, k: c.set(k["p"], b""),
    "payload of another type": lambda c, k: (c.delete(k["p"]), c.hset(k["p"], "x", "1")),
    "metadata of another type": lambda c, k: (c.delete(k["m"]), c.rpush(k["m"], "x")),
    "metadata garbage": lambda c, k: c.set(k["m"], b"\xff" * 40),
    "metadata truncated": lambda c, k: c.set(k["m"], c.get(k["m"])[:30]),
    "metadata of the next chunk": lambda c, k: c.copy(k["m2"], k["m"], replace=True),
    "both keys of the next chunk": lambda c, k: (c.copy(k["m2"], k["m"], replace=True),
                                                c.copy(k["p2"], k["p"], replace=True)),
    "metadata says accounted": lambda c, k: _edit_meta(c, k["m"], stored="accounted"),
    "metadata of another model": lambda c, k: _edit_meta(c, k["m"], model="kvcli/cpu@seed0:bf16"),
    "metadata names a wrong parent": lambda c, k: _edit_meta(c, k["m"], parent="0" * 32),
    "metadata of another shape": lambda c, k: _edit_meta(c, k["m"], shape=[2, 2, 2, 8, 32]),
}
CHECKSUM_ONLY = {  # same lengths and fields: only reading the payload finds these
    "payload bytes flipped": lambda c, k: _flip(c, k["p"]),
    "payload of the previous chunk": lambda c, k: c.copy(k["p0"], k["p"], replace=True),
    "metadata checksum flipped": lambda c, k: _flip(c, k["m"], offset=9),
}


def _keys(client):
    store = make_stores(client, TINY, WarmConfig("d", (16,)))[0]
    h = store.chunk(TOKENS).hashes
    return {"m": store.meta_key(h[1]), "p": store.payload_key(h[1]), "m0": store.meta_key(h[0]),
            "p0": store.payload_key(h[0]), "m2": store.meta_key(h[2]), "p2": store.payload_key(h[2])}


def _assert_whole(client):
    (g,) = inspect_cache(client, verify=True).groups
    assert (g.chunks, g.metadata_entries, g.payload_objects, dict(g.issues)) == (3, 3, 3, {})
    m = chunk_map(client, TOKENS, "d", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["hit", "hit", "hit"]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_warm_rewrites_a_damaged_chunk(redis_client, model, kind):
    warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,)))
    DAMAGE[kind](redis_client, _keys(redis_client))
    again = warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,)))
    t = again.per_size[0]
    assert (t.chunks_repaired, t.chunks_written, t.chunks_present) == (1, 1, 2), kind
    _assert_whole(redis_client)


@pytest.mark.parametrize("kind", sorted(CHECKSUM_ONLY))
def test_warm_verify_rewrites_a_chunk_that_fails_its_checksum(redis_client, model, kind):
    warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,)))
    DAMAGE.get(kind, CHECKSUM_ONLY.get(kind))(redis_client, _keys(redis_client))
    dry = warm(redis_client, [req(TOKENS)], None, WarmConfig("d", (16,), dry_run=True), spec=TINY)
    assert dry.per_size[0].chunks_repaired == 0  # without --verify, lengths and fields look right
    fixed = warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,), verify=True))
    t = fixed.per_size[0]
    assert (t.chunks_repaired, t.chunks_written, t.chunks_present) == (1, 1, 2), kind
    _assert_whole(redis_client)


def test_a_checksum_failure_met_while_reading_the_prefix_back_is_repaired(redis_client, model):
    """Without --verify, a prompt that extends the chain reads chunks 0-2 back for the model; chunk 1 fails its
    checksum there, so it is recomputed and rewritten with the new tail."""
    warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,)))
    _flip(redis_client, _keys(redis_client)["p"])
    longer = warm(redis_client, [req(np.arange(1, 65))], model, WarmConfig("d", (16,)))
    t = longer.per_size[0]
    assert (t.chunks_written, t.chunks_repaired, longer.tokens_reused, longer.tokens_prefilled) == (2, 1, 16, 48)
    (g,) = inspect_cache(redis_client, verify=True).groups
    assert (g.chunks, dict(g.issues)) == (4, {})


def test_cli_warm_says_what_it_repaired(redis_url, redis_client, model):
    warm(redis_client, [req(TOKENS)], model, WarmConfig("d", (16,)))
    _flip(redis_client, _keys(redis_client)["p"])
    args = ["warm", "-", "--model", "tiny", "--namespace", "d", "--chunk-size", "16", "--redis-url", redis_url]
    trace = json.dumps({"token_ids": TOKENS.tolist()}) + "\n"
    plain = CliRunner().invoke(app, args, input=trace)
    assert plain.exit_code == 0 and "everything was already present" in plain.stdout
    fixed = CliRunner().invoke(app, args + ["--verify", "--json"], input=trace)
    assert fixed.exit_code == 0, fixed.output
    doc = json.loads(fixed.stdout)
    assert (doc["totals"]["chunks_repaired"], doc["totals"]["chunks_written"], doc["verify"]) == (1, 1, True)


def test_a_chains_head_never_expires_before_its_tail(redis_client, model):
    """warm tok(1..8) --ttl, and 'later' (its TTL has run down to 2 s) warm tok(1..16) --ttl: the head's TTL is
    raised to the tail's, in the tail's first transaction; a head without TTL keeps none."""
    cfg = WarmConfig("t", (4,), ttl=100)
    warm(redis_client, [req(range(1, 9))], model, cfg)
    store = make_stores(redis_client, TINY, cfg)[0]
    h = store.chunk(np.arange(1, 17, dtype=np.uint32)).hashes
    head = [k for x in h[:2] for k in (store.meta_key(x), store.payload_key(x))]
    for key in head:
        redis_client.expire(key, 2)  # as if the first warm were 98 s old
    longer = warm(redis_client, [req(range(1, 17))], model, cfg)
    assert (longer.per_size[0].chunks_written, longer.per_size[0].ttl_refreshed) == (2, 2)
    ttls = [redis_client.pttl(k) for x in h for k in (store.meta_key(x), store.payload_key(x))]
    assert all(95_000 < t <= 100_000 for t in ttls), ttls
    for key in head:
        redis_client.persist(key)
    tail = [k for x in h[2:] for k in (store.meta_key(x), store.payload_key(x))]
    redis_client.delete(*tail)
    again = warm(redis_client, [req(range(1, 17))], model, cfg)
    assert again.per_size[0].ttl_refreshed == 0
    assert [redis_client.pttl(k) for k in head] == [-1] * 4
    assert all(95_000 < redis_client.pttl(k) <= 100_000 for k in tail)
