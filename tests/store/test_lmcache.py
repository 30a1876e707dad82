"""LMCache's Redis layout: keys and records byte for byte as LMCache 0.5.6 writes them, ``inspect --layout lmcache``
and ``replay --layout kvcli,lmcache`` against real (embedded) Redis servers.

The golden strings and bytes below were produced by LMCache 0.5.6's own code (``CacheEngineKey.to_string()``,
``LayerCacheEngineKey.to_string()``, ``RemoteMetadata(...).serialize()`` after ``init_remote_metadata_info``), not
by kvcli.
"""
from __future__ import annotations

import json

import pytest
import redis
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_inspect import assert_read_only, commands_since_reset
from test_replay import PROMPTS, requests
from test_warm import cli_app
from typer.testing import CliRunner

from kvcli.live.inspect_lmcache import inspect_lmcache
from kvcli.model.costcurve import CostCurve
from kvcli.model.llama import build_model
from kvcli.model.presets import ModelSpec
from kvcli.replay.replayer import ReplayConfig, Replayer
from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.lmcache import (
    KVGroup,
    LMCacheKey,
    RemoteRecord,
    kv_record,
    legacy_model,
    pack_record,
    parse_key,
    split_redis_key,
    unpack_record,
)
from kvcli.store.lmcache_store import LMCacheStore
from kvcli.store.namespace import purge
from kvcli.store.records import StoreConfig

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# (key fields, LMCache's to_string()) from LMCache 0.5.6
GOLDEN_KEYS = [
    (LMCacheKey(LLAMA, 1, 0, 0x1A2B3C4D5E6F7788, "bfloat16"), f"{LLAMA}@1@0@1a2b3c4d5e6f7788@bfloat16"),
    (LMCacheKey(LLAMA, 2, 1, -0x5F, "half", None, (("user", "acme"),)), f"{LLAMA}@2@1@-5f@half@user%acme"),
    (LMCacheKey("tiny", 1, 0, 0, "float"), "tiny@1@0@0@float"),
    (LMCacheKey("m", 1, 0, 255, "bfloat16", 3), "m@1@0@ff@bfloat16@3"),
]
# (record, RemoteMetadata.serialize() hex) from LMCache 0.5.6
REC_BF16_8B = "00000002010000000300000002000000200000000001000000040000"  # llama-3-8b, 256 tokens, bf16
REC_FP32_TINY = "00100000010000000400000002000000020000000400000040000000"  # [2, 2, 4, 64] fp32, 4096 bytes
REC_FP16_TINY = "00080000010000000200000002000000020000000400000040000000"  # [2, 2, 4, 64] fp16, 2048 bytes
GOLDEN_RECORDS = [
    (RemoteRecord(33554432, 1, (KVGroup(3, (2, 32, 256, 1024)),)), REC_BF16_8B),
    (RemoteRecord(4096, 1, (KVGroup(4, (2, 2, 4, 64)),)), REC_FP32_TINY),
    (RemoteRecord(2048, 1, (KVGroup(2, (2, 2, 4, 64)),)), REC_FP16_TINY),
    (RemoteRecord(17989632, 6, (KVGroup(3, (1, 61, 256, 576)),)),
     "008012010600000003000000010000003d0000000001000040020000"),
    (RemoteRecord(1000, 1, (KVGroup(3, (2, 4, 16, 128)), KVGroup(7, (2, 2, 16, 64)))),
     "e80300000100000003000000020000000400000010000000800000000700000002000000020000001000000040000000"),
]


# -- layout ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, text", GOLDEN_KEYS)
def test_key_strings_match_lmcache(key, text):
    assert key.to_string() == text
    assert parse_key(text) == key
    assert key.redis_keys() == (text + "metadata", text + "kv_bytes")
    assert split_redis_key((text + "kv_bytes").encode()) == (key, "kv_bytes")


@pytest.mark.parametrize("record, packed", GOLDEN_RECORDS)
def test_metadata_records_match_lmcache(record, packed):
    assert pack_record(record).hex() == packed
    assert unpack_record(bytes.fromhex(packed)) == record


def test_record_of_a_model_spec_and_what_it_says():
    assert pack_record(kv_record((32, 2, 8, 128), 256, torch.bfloat16)).hex() == REC_BF16_8B
    assert pack_record(kv_record((2, 2, 2, 32), 4, torch.float16)).hex() == REC_FP16_TINY  # float16 is code 2
    rec = unpack_record(bytes.fromhex(REC_BF16_8B))
    assert (rec.fmt_name, rec.tokens, rec.expected_length, rec.groups[0].dtype) == ("KV_2LTD", 256, 33554432,
                                                                                     torch.bfloat16)


@pytest.mark.parametrize("text", ["m@1@0@ff", "m@1@0@FF@half", "m@x@0@ff@half", "m@1@0@ff@fp16", "m@1@0@ff@half@tag",
                                  "m@1@0@0x1f@half"])
def test_parse_key_refuses_what_lmcache_never_writes(text):
    with pytest.raises(ValueError):
        parse_key(text)
    assert split_redis_key((text + "metadata").encode()) is None


@pytest.mark.parametrize("raw", [b"", b"\0" * 27, b"\0" * 29, b"\0" * 48 + b"\0", b"\xff" * 28])
def test_unpack_record_refuses_other_values(raw):
    with pytest.raises(ValueError):
        unpack_record(raw)


_FIELD = st.text(st.characters(blacklist_characters="@%", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(model=_FIELD, world=st.integers(1, 64), worker=st.integers(0, 63), chunk_hash=st.integers(-2**63, 2**64 - 1),
       dtype=st.sampled_from(["half", "bfloat16", "float", "fp8_e4m3fn"]),
       layer=st.none() | st.integers(0, 200), tags=st.lists(st.tuples(_FIELD, _FIELD), max_size=3))
def test_key_strings_round_trip(model, world, worker, chunk_hash, dtype, layer, tags):
    key = LMCacheKey(model, world, worker, chunk_hash, dtype, layer, tuple(tags))
    if layer is None and tags and tags[0][0].isdigit():
        return  # LMCache itself would read that tag as a layer id
    assert parse_key(key.to_string()) == key


@given(st.binary(max_size=80))
def test_unpack_record_never_raises_anything_but_value_error(raw):
    try:
        unpack_record(raw)
    except ValueError:
        pass


# -- inspect --layout lmcache ------------------------------------------------------------------------------------
def write_like_lmcache(client, key: str, kv: bytes, record_hex: str) -> None:
    """RedisConnector._put: SET <key>kv_bytes, then SET <key>metadata with the packed record."""
    client.set(key + "kv_bytes", kv)
    client.set(key + "metadata", bytes.fromhex(record_hex))


def fill_lmcache(client) -> None:
    """Model A (fp16, 2048-byte chunks): 3 complete chunks on 2 workers, one orphan record, one orphan kv value,
    one length mismatch. Model B (fp32): 2 layer-wise chunks with a tag. Plus 3 foreign keys."""
    a = f"{LLAMA}@2@{{w}}@{{h}}@half"
    for worker, h in ((0, "1a2b"), (1, "1a2b"), (0, "-5f")):
        write_like_lmcache(client, a.format(w=worker, h=h), b"\x01" * 2048, REC_FP16_TINY)
    client.set(a.format(w=0, h="abc") + "metadata", bytes.fromhex(REC_FP16_TINY))  # kv bytes evicted
    client.set(a.format(w=0, h="abd") + "kv_bytes", b"\x02" * 2048)  # metadata evicted
    write_like_lmcache(client, a.format(w=0, h="abe"), b"\x03" * 100, REC_FP16_TINY)  # truncated kv bytes
    for layer in (0, 1):
        write_like_lmcache(client, f"tiny@1@0@ff@float@{layer}@user%acme", b"\x04" * 4096, REC_FP32_TINY)
    client.set("session:42", "x")
    client.set(f"{LLAMA}@1@0@zz@halfmetadata", bytes.fromhex(REC_FP16_TINY))  # not hex: not LMCache's
    client.rpush(f"{LLAMA}@1@0@ab@halfkv_bytes", "x")  # a list: not a kv value


def test_inspect_counts_chunks_bytes_orphans_exactly(redis_client):
    fill_lmcache(redis_client)
    redis_client.config_resetstat()
    result = inspect_lmcache(redis_client)
    assert_read_only(redis_client, commands_since_reset(redis_client))
    assert (result.scanned_keys, result.lmcache_keys, result.other_keys) == (17, 14, 3)
    # per primary (the one server when not a cluster): what its own SCAN holds, summing to the totals
    assert result.cluster == cluster.is_cluster(redis_client)
    assert {s.name: s.keys + s.other_keys for s in result.shards} == {
        name: node.dbsize() for name, node in cluster.shards(redis_client)}
    assert (sum(s.keys for s in result.shards), sum(s.other_keys for s in result.shards)) == (14, 3)
    a, b = result.groups
    assert a.model_name == LLAMA and b.model_name == "tiny"
    assert (a.chunks, a.metadata_keys, a.kv_keys) == (3, 5, 5)
    assert a.metadata_value_bytes == 5 * 28 and a.kv_value_bytes == 4 * 2048 + 100
    assert {k: len(v) for k, v in a.issues.items()} == {"orphan_metadata": 1, "orphan_kv_bytes": 1,
                                                       "length_mismatch": 1}
    assert a.issues["orphan_metadata"] == [f"{LLAMA}@2@0@abc@half"]
    assert a.issues["orphan_kv_bytes"] == [f"{LLAMA}@2@0@abd@half"]
    assert a.by_worker_id == {0: 5, 1: 1} and a.by_world_size == {2: 6} and a.by_dtype == {"half": 6}
    assert a.by_format == {"KV_2LTD": 5} and a.by_chunk_tokens == {4: 5} and a.by_shape == {"2x2x4x64": 5}
    assert a.example["key"] == f"{LLAMA}@2@0@-5f@half" and a.example["metadata"]["length_bytes"] == 2048
    assert a.example["metadata"]["groups"] == [{"dtype": "float16", "dtype_code": 2, "shape": [2, 2, 4, 64]}]
    assert (b.chunks, b.layerwise_chunks, b.kv_value_bytes, dict(b.by_tag)) == (2, 2, 8192, {"user%acme": 2})
    assert not b.issues
    # MEMORY USAGE of every key (no sample), summed per model
    keys_a = [k for k in redis_client.scan_iter(match=f"{LLAMA}@2@*")]
    assert a.memory_bytes == sum(redis_client.memory_usage(k) for k in keys_a) and a.memory_sampled_keys == 10


def test_inspect_sampled_memory_and_cli(redis_url, redis_client):
    fill_lmcache(redis_client)
    sampled = inspect_lmcache(redis_client, sample=4)
    assert sampled.memory_sampled == 4 and sum(g.memory_sampled_keys for g in sampled.groups) == 4
    assert all(g.memory_bytes > 0 for g in sampled.groups)
    assert inspect_lmcache(redis_client, sample=0).groups[0].memory_bytes is None
    out = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["layout"]["matched"].startswith("LMCache 0.5.6")
    group = doc["groups"][0]
    assert group["integrity"] == {"length_mismatch": 1, "orphan_kv_bytes": 1, "orphan_metadata": 1}
    assert group["kv_value_bytes"] == 8292 and group["by_chunk_tokens"] == {"4": 5}
    table = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--redis-url", redis_url])
    assert table.exit_code == 0 and "LMCache keys: 14; other keys: 3" in table.stdout
    shards = cluster.shards(redis_client)
    assert [s["lmcache_keys"] + s["other_keys"] for s in doc["shards"]] == [node.dbsize() for _, node in shards]
    assert sum(s["lmcache_keys_share"] for s in doc["shards"]) == pytest.approx(1.0)
    assert doc["cluster"] == (len(shards) > 1) and ("Redis Cluster: 3 primaries, all scanned" in table.stdout) == (
        len(shards) > 1)


# Key strings as LMCache 0.3.x's CacheEngineKey.to_string() / LayerCacheEngineKey.to_string() wrote them, each
# followed by the connector's suffix: 0.3.1 (a SHA-256 hex digest), 0.3.3 (a Python int in decimal, here negative),
# 0.3.6-0.3.9 (hex, a layer, a tag), 0.3.10-0.3.12 (hex, then the dtype).
LEGACY_KEYS = [
    (f"vllm@{LLAMA}@1@0@{'ab' * 32}", LLAMA),
    (f"vllm@{LLAMA}@2@1@-8046412345678901234", LLAMA),
    ("huggingface@tiny@1@0@1a2b@3@user%acme", "tiny"),
    (f"vllm@{LLAMA}@1@0@7f3a@bfloat16", LLAMA),
    (f"vllm@{LLAMA}@1@0@7f3a@fp8_e4m3@12", LLAMA),
]


@pytest.mark.parametrize("key, model", LEGACY_KEYS)
def test_keys_of_the_older_layout_name_their_model(key, model):
    for suffix in ("metadata", "kv_bytes"):
        assert split_redis_key((key + suffix).encode()) is None  # not today's layout
        assert legacy_model((key + suffix).encode()) == model
    assert legacy_model(key.encode()) is None  # no suffix: not a key LMCache wrote


@pytest.mark.parametrize("key", [f"{LLAMA}@1@0@7f3a@halfmetadata",  # today's layout
                                 "vllm@m@x@0@7f3ametadata", "VLLM@m@1@0@7fmetadata", "vllm@m@1@0@xyzmetadata",
                                 "vllm@m@1@0@7f@badtagmetadata", "vllm@@1@0@7fmetadata", "session:42"])
def test_other_keys_are_not_of_the_older_layout(key):
    assert legacy_model(key.encode()) is None


def test_inspect_counts_and_names_the_older_layout(redis_url, redis_client):
    fill_lmcache(redis_client)
    for key, _ in LEGACY_KEYS:
        redis_client.set(key + "kv_bytes", b"\x01" * 64)
        redis_client.set(key + "metadata", b"\x00" * 28)
    result = inspect_lmcache(redis_client)
    assert (result.scanned_keys, result.lmcache_keys, result.legacy_keys, result.other_keys) == (27, 14, 10, 3)
    assert result.legacy_models == {LLAMA: 8, "tiny": 2}
    assert [g.model_name for g in result.groups] == [LLAMA, "tiny"]  # their chunks are not read as today's
    out = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--json", "--redis-url", redis_url])
    doc = json.loads(out.stdout)
    assert doc["keys"] == {"scanned": 27, "lmcache": 14, "lmcache_resp": 0, "lmcache_mp": 0, "lmcache_legacy": 10,
                           "lmcache_unknown": 0, "other": 3}
    assert [(x["name"], x["keys"]) for x in doc["layouts"]] == [("lmcache", 14), ("legacy", 10)]
    assert doc["legacy_layout"]["matched"] == "LMCache 0.3.1-0.3.12"
    assert doc["legacy_layout"]["keys_by_model"] == {LLAMA: 8, "tiny": 2}
    table = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--redis-url", redis_url]).stdout
    assert "LMCache keys: 14; LMCache 0.3.1-0.3.12 keys (older layout): 10; other keys: 3" in table
    assert "older layout: 10 keys in LMCache 0.3.1-0.3.12's layout {fmt}@{model_name}@" in table
    assert f"by model: {LLAMA} (8), tiny (2); counted, not read" in table


def test_inspect_as_a_read_only_acl_user_without_scripts_gets_the_same_answer(make_server):
    """Only reads allowed (no EVAL_RO): the pipelined per-key fallback gives the same counts and bytes."""
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.acl_setuser("reader", enabled=True, passwords=["+s3cret"], keys=["*"],
                      commands=["+@read", "+@connection", "+info", "-@scripting"])
    fill_lmcache(admin)
    expected = inspect_lmcache(admin).to_dict()
    host_port = url.split("//", 1)[1]
    out = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--json", "--redis-url",
                                         f"redis://reader:s3cret@{host_port}"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert (got["keys"], got["groups"]) == (expected["keys"], expected["groups"])
    assert got["groups"][0]["integrity"] == {"length_mismatch": 1, "orphan_kv_bytes": 1, "orphan_metadata": 1}


@pytest.mark.parametrize("args", [["--namespace", "x"], ["--prompt", "hi"], ["--verify"], ["--layout", "vllm"]])
def test_inspect_lmcache_refuses_kvcli_only_options(redis_url, args):
    layout = [] if "--layout" in args else ["--layout", "lmcache"]
    out = CliRunner().invoke(cli_app(), ["inspect", *layout, *args, "--redis-url", redis_url])
    assert out.exit_code == 2, out.output


# -- the store and replay in LMCache's layout --------------------------------------------------------------------------
def stores(client, dtype=torch.float32):
    config = StoreConfig("lay", 4, "m", "raw", (2, 2, 2, 32), dtype, payload="accounted")
    return ChunkStore(client, config), LMCacheStore(client, config)


def test_lookup_of_3_chunks_with_2_hits_is_3_exists_vs_1_round_trip(redis_client, server_kind):
    ours, lmc = stores(redis_client)
    for store in (ours, lmc):
        store.store(list(range(1, 9)), None)
    redis_client.config_resetstat()
    prompt = list(range(1, 13))
    assert ours.lookup(prompt).hit_tokens == lmc.lookup(prompt).hit_tokens == 8
    ran = commands_since_reset(redis_client)
    # kvcli: one EVAL_RO (its 3 GETs of metadata run inside the server: one round trip); LMCache: 3 EXISTS
    # kvcli: one EVAL_RO (its GETs counted by the server), on a cluster a GET and a STRLEN per chunk in one write
    # per shard; LMCache: one EXISTS per chunk up to the miss
    assert ran == ({"eval_ro": 1, "get": 3, "exists": 3} if server_kind == "single" else
                   {"get": 3, "strlen": 3, "exists": 3})
    assert (ours.stats.lookup_round_trips, lmc.stats.lookup_round_trips) == (1, 3)
    redis_client.config_resetstat()
    assert lmc.lookup(list(range(100, 113))).hit_chunks == 0  # the first chunk misses: one EXISTS, no more
    assert commands_since_reset(redis_client) == {"exists": 1}


def test_store_writes_what_lmcache_writes(redis_client):
    _, lmc = stores(redis_client)
    kv = torch.randn(2, 2, 2, 9, 32)
    lmc.store(list(range(1, 10)), kv)
    prompt = lmc.chunk(list(range(1, 10)))
    for k in range(2):
        base = lmc.base_key(prompt.hashes[k])
        key = parse_key(base)
        assert (key.model_name, key.world_size, key.worker_id, key.dtype) == ("lay/4/m", 1, 0, "float")
        assert key.chunk_hash == int.from_bytes(prompt.hashes[k][:8], "big")
        assert redis_client.get(base + "metadata") == bytes.fromhex(REC_FP32_TINY)
        expect = kv[:, :, :, 4 * k:4 * k + 4, :].permute(1, 0, 3, 2, 4).reshape(2, 2, 4, 64).contiguous()
        assert redis_client.get(base + "kv_bytes") == expect.numpy().tobytes()
    got = lmc.retrieve(list(range(1, 10)))
    assert got.hit_tokens == 8 and torch.equal(got.kv, kv[:, :, :, :8, :])
    assert redis_client.dbsize() == 4
    assert inspect_lmcache(redis_client).groups[0].chunks == 2


def _replayer(client, model=None, layouts=("kvcli", "lmcache"), **kw):
    config = ReplayConfig(chunk_sizes=(4, 8), layouts=layouts, **kw)
    spec = None if model else ModelSpec("m", (2, 2, 2, 32), torch.float32)
    return Replayer(client, model, CostCurve.from_tokens_per_second(1000.0), "raw", config, spec=spec)


def test_replay_side_by_side_same_hits_counted_round_trips(redis_client):
    redis_client.set("foreign@1@0@ab@halfmetadata", "x")
    redis_client.config_resetstat()
    # pipeline=1: kvcli's lookups one by one too (pipelined, kvcli's would be 2 round trips: tests/replay)
    result = _replayer(redis_client, measure=0, payload="accounted", pipeline=1).replay("t", requests())
    ran = commands_since_reset(redis_client)
    rows = {(r.layout, r.chunk_size): r for rows in result.by_layout.values() for r in rows}
    assert [r.layout for r in result.per_chunk_size] == ["kvcli", "kvcli"]
    # hits (PROMPTS in test_replay): 28 of 53 at chunk size 4, 24 at 8, in both layouts
    for cs, hit in ((4, 28), (8, 24)):
        assert rows["kvcli", cs].hit_tokens == rows["lmcache", cs].hit_tokens == hit
        assert rows["kvcli", cs].objects_created == rows["lmcache", cs].objects_created
    # lookups (4 of 5 prompts have a full chunk): kvcli one MGET each; LMCache one EXISTS per chunk to the miss:
    # chunk size 4: R1 1 (miss), R2 2 (2 hits), R3 3 (2 hits + miss), R6 4 (3 hits + miss) = 10
    # chunk size 8: R1 1, R2 1, R3 1, R6 2 = 5; stores: cs 4 R1 R3 R6, cs 8 R1 R6, one pipeline each (metadata)
    assert [rows["lmcache", cs].lookup_round_trips for cs in (4, 8)] == [10, 5]
    assert [rows["kvcli", cs].lookup_round_trips for cs in (4, 8)] == [4, 4]
    assert [rows["lmcache", cs].round_trips for cs in (4, 8)] == [10 + 3, 5 + 2]
    assert [rows["kvcli", cs].round_trips for cs in (4, 8)] == [4 + 3, 4 + 2]
    assert ran["exists"] == 15 and ran.get("mget", 0) + ran.get("get", 0) >= 8
    assert rows["lmcache", 4].metadata_bytes_written == 4 * 28 and rows["lmcache", 4].to_dict()[
        "metadata_bytes_per_chunk"] == 28
    assert redis_client.keys("*") == [b"foreign@1@0@ab@halfmetadata"]  # the run's keys deleted, nothing else


def test_replay_measured_real_kv_in_lmcache_layout(redis_client):
    model = build_model("tiny", "float32", "cpu", seed=0)
    result = _replayer(redis_client, model, measure=None, payload="real", keep=True).replay("t", requests())
    for kvcli_row, lmc_row in zip(*result.by_layout.values()):
        assert kvcli_row.hit_tokens == lmc_row.hit_tokens
        assert lmc_row.max_logit_diff < 1e-3 and lmc_row.serialized_bytes_read == lmc_row.hit_tokens * 1024
        assert lmc_row.payload_bytes_written == kvcli_row.payload_bytes_written
    inspected = inspect_lmcache(redis_client)
    by_tokens = {g.by_chunk_tokens.most_common(1)[0][0]: g for g in inspected.groups}
    assert by_tokens[4].chunks == 4 and by_tokens[8].chunks == 2 and not any(g.issues for g in inspected.groups)


def test_cli_replay_both_layouts_json_and_refusals(tmp_path, redis_url, redis_client):
    trace = tmp_path / "tokens.jsonl"
    trace.write_text("".join(json.dumps({"token_ids": p}) + "\n" for p in PROMPTS))
    # --jobs 1: this process alone (both layouts in worker processes give the same report: test_parallel)
    base = ["replay", str(trace), "--chunk-sizes", "4,8", "--measure", "0", "--prefill-tps", "1000", "--payload",
            "accounted", "--redis-url", redis_url, "--jobs", "1"]
    out = CliRunner().invoke(cli_app(), base + ["--layout", "kvcli,lmcache", "--json"])
    assert out.exit_code == 0, out.output
    by_layout = json.loads(out.stdout)["traces"][0]["by_layout"]
    assert [r["hit_tokens"] for r in by_layout["kvcli"]] == [r["hit_tokens"] for r in by_layout["lmcache"]] == [28, 24]
    assert [r["lookup_round_trips"] for r in by_layout["lmcache"]] == [10, 5]
    table = CliRunner().invoke(cli_app(), base + ["--layout", "kvcli,lmcache"])
    assert table.exit_code == 0 and "8 lmcache" in table.stdout
    for extra in (["--layout", "lmcache", "--capacity-tokens", "8"], ["--layout", "redis"]):
        bad = CliRunner().invoke(cli_app(), base + extra)
        assert bad.exit_code == 2 and "--layout" in bad.output
    assert redis_client.dbsize() == 0
    # --keep: a note names the namespace, the purge of its kvcli keys, and how its LMCache keys are named
    kept = CliRunner().invoke(cli_app(), base + ["--layout", "kvcli,lmcache", "--keep", "--json"])
    assert kept.exit_code == 0, kept.output
    doc = json.loads(kept.stdout)["traces"][0]
    namespace = doc["per_chunk_size"][0]["namespace"]
    note = next(n for n in doc["notes"] if "(--keep)" in n)
    assert f"namespace {namespace} kept (--keep)" in note and f"kvcli purge --namespace {namespace} --yes" in note
    assert f"kvcli purge --namespace {namespace} --layout lmcache --yes" in note
    lmcache_keys = redis_client.keys(f"{namespace}/*")
    assert lmcache_keys and redis_client.dbsize() == purge(redis_client, namespace).deleted + len(lmcache_keys)


def test_lmcache_store_refuses_options_it_has_no_counterpart_for(redis_client):
    with pytest.raises(Exception, match="capacity or TTL"):
        LMCacheStore(redis_client, StoreConfig("n", 4, "m", "raw", (2, 2, 2, 32), torch.float32, capacity_tokens=8))
    with pytest.raises(Exception, match="--namespace"):
        LMCacheStore(redis_client, StoreConfig("n", 4, "m", "raw", (2, 2, 2, 32), torch.float32,
                                               read_namespace="w"))
    assert redis_client.dbsize() == 0


def test_measured_request_materializes_accounted_chunks_in_both_layouts(redis_client, monkeypatch):
    import kvcli.replay.replayer as replay_mod

    monkeypatch.setattr(replay_mod, "pick_measured", lambda *a: {2})  # only R3 = tokens 1..12 runs the model
    model = build_model("tiny", "float32", "cpu", seed=0)
    result = _replayer(redis_client, model, measure=1).replay("t", requests())
    for rows in result.by_layout.values():
        cs4, cs8 = rows
        # as in test_replay: R1 wrote [1-4] [5-8] accounted; R3 hits both and gives them real KV, reads 8 tokens
        # back, stores [9-12] for real; R6 stores [13-16] accounted. cs 8: R3 materializes [1-8].
        assert (cs4.materialized_chunks, cs8.materialized_chunks) == (2, 1)
        assert (cs4.hit_tokens, cs8.hit_tokens) == (28, 24)
        assert cs4.payload_bytes_written == 3 * 4 * 1024 and cs8.payload_bytes_written == 8 * 1024
        assert cs4.payload_bytes_accounted == 4 * 1024 and cs8.payload_bytes_accounted == 8 * 1024
        assert cs4.max_logit_diff < 1e-4
    lmc4, lmc8 = result.by_layout["lmcache"]
    assert lmc4.serialized_bytes_read == lmc8.serialized_bytes_read == 8 * 1024  # KV bytes, no header
