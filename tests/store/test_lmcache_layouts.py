"""LMCache's three Redis layouts (``redis://``, ``resp://``, multiprocess mode) against golden vectors that LMCache
0.5.6's own connectors wrote into a real Redis server (``tests/store/fixtures/lmcache/``: README.md says how), and
kvcli's writers, inspect, purge and replay of them on real (embedded) Redis servers.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_inspect import assert_read_only, commands_since_reset
from test_replay import PROMPTS
from test_warm import cli_app
from typer.testing import CliRunner

from kvcli.live.inspect_lmcache import inspect_lmcache
from kvcli.store.lmcache import (
    LEGACY,
    MP,
    REDIS,
    RESP,
    UNKNOWN,
    KVGroup,
    LMCacheKey,
    RemoteRecord,
    classify_key,
    from_kv_2ltd,
    key_affixes,
    kv_record,
    pack_record,
    parse_key,
    unpack_record,
)
from kvcli.store.lmcache_mp import MPKey, check_salt, kv_rank, parse_mp_key, split_kv_rank
from kvcli.store.lmcache_store import LMCacheMPStore, LMCacheRespStore, LMCacheStore, count_namespace
from kvcli.store.records import StoreConfig

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "lmcache" / "golden.json").read_text())
MODEL = GOLDEN["model"]["model_name"]
SHAPE = (2, 2, 2, 4)  # kvcli's per-token KV shape of the golden model: layers, 2, kv heads, head dim
CHUNK = 4


def lmcache_kv(i: int) -> torch.Tensor:
    """Chunk ``i``'s KV as the fixture's README gives it, in LMCache's KV_2LTD order [2, layers, tokens, heads*dim]."""
    return (torch.arange(128, dtype=torch.float32) + i).to(torch.bfloat16).view(2, 2, CHUNK, 8)


def test_the_fixture_is_lmcache_0_5_6():
    assert GOLDEN["lmcache"] == {"version": "0.5.6", "commit": "3e11e108"}


# -- redis:// ------------------------------------------------------------------------------------------------------
def test_redis_keys_and_one_group_record_match_lmcache():
    keys = GOLDEN["redis"]["keys"]
    head, tail = key_affixes(MODEL, 2, 1, "bfloat16")
    plain = f"{head}1a2b3c4d5e6f7788{tail}"
    tagged = LMCacheKey(MODEL, 2, 1, 0x7F, "bfloat16", None, (("user", "acme"),)).to_string()
    assert sorted(keys) == sorted([plain + "kv_bytes", plain + "metadata", tagged + "kv_bytes", tagged + "metadata"])
    # one group: 4 * (2 + 5) = 28 bytes; length 2*2*4*8 elements * 2 bytes = 256, KV_2LTD (1), bfloat16 (3)
    record = pack_record(kv_record(SHAPE, CHUNK, torch.bfloat16))
    assert len(record) == 28 and keys[plain + "metadata"] == keys[tagged + "metadata"] == record.hex()
    assert unpack_record(record) == RemoteRecord(256, 1, (KVGroup(3, (2, 2, 4, 8)),))
    for i, key in enumerate((plain, tagged)):
        assert keys[key + "kv_bytes"] == lmcache_kv(i).view(torch.uint8).numpy().tobytes().hex()


def test_two_group_record_is_8_plus_20_per_group():
    """The connector passes a list of shapes and dtypes: one group per hybrid KV group, 20 bytes each."""
    (meta,) = [v for k, v in GOLDEN["redis"]["two_group_keys"].items() if k.endswith("metadata")]
    raw = bytes.fromhex(meta)
    # 256 bytes of [2, 2, 4, 8] bf16 + 256 bytes of [2, 1, 4, 16] fp16 (code 2)
    expect = RemoteRecord(512, 1, (KVGroup(3, (2, 2, 4, 8)), KVGroup(2, (2, 1, 4, 16))))
    assert len(raw) == 8 + 20 * 2 and unpack_record(raw) == expect and pack_record(expect) == raw
    assert expect.expected_length == 512


def test_redis_store_writes_the_golden_values_and_records(redis_client):
    store = LMCacheStore(redis_client, StoreConfig("g", CHUNK, "m", "raw", SHAPE, torch.bfloat16), 2, 1)
    kv = torch.cat([from_kv_2ltd(lmcache_kv(i), 2) for i in range(2)], dim=3)
    store.store(list(range(1, 9)), kv)
    golden = GOLDEN["redis"]["keys"]
    lmcache_bases = [LMCacheKey(MODEL, 2, 1, 0x1A2B3C4D5E6F7788, "bfloat16").to_string(),
                     LMCacheKey(MODEL, 2, 1, 0x7F, "bfloat16", None, (("user", "acme"),)).to_string()]
    for h, theirs in zip(store.chunk(list(range(1, 9))).hashes, lmcache_bases):  # chunk 0, chunk 1
        base = store.base_key(h)
        assert redis_client.get(base + "metadata").hex() == golden[theirs + "metadata"]
        assert redis_client.get(base + "kv_bytes").hex() == golden[theirs + "kv_bytes"]


# -- resp:// -------------------------------------------------------------------------------------------------------
def test_resp_keys_are_the_bare_key_strings_holding_the_raw_chunk():
    keys = GOLDEN["resp"]["keys"]
    plain = LMCacheKey(MODEL, 2, 1, 0x1A2B3C4D5E6F7788, "bfloat16").to_string()
    tagged = LMCacheKey(MODEL, 2, 1, 0x7F, "bfloat16", None, (("user", "acme"),)).to_string()
    assert sorted(keys) == sorted([plain, tagged])
    assert keys[plain] == GOLDEN["redis"]["keys"][plain + "kv_bytes"]  # the same bytes as redis://'s kv_bytes
    for key in keys:
        assert classify_key(key.encode()) == (RESP, parse_key(key))


def test_resp_store_writes_lmcache_values_and_looks_up_in_one_batch(redis_client, server_kind):
    store = LMCacheRespStore(redis_client, StoreConfig("g", CHUNK, "m", "raw", SHAPE, torch.bfloat16), 2, 1)
    kv = torch.cat([from_kv_2ltd(lmcache_kv(i), 2) for i in range(2)], dim=3)
    done = store.store(list(range(1, 9)), kv)
    hashes = store.chunk(list(range(1, 9))).hashes
    golden = GOLDEN["resp"]["keys"]
    plain = LMCacheKey(MODEL, 2, 1, 0x1A2B3C4D5E6F7788, "bfloat16").to_string()
    tagged = LMCacheKey(MODEL, 2, 1, 0x7F, "bfloat16", None, (("user", "acme"),)).to_string()
    assert [redis_client.get(store.base_key(h)).hex() for h in hashes] == [golden[plain], golden[tagged]]
    assert parse_key(store.base_key(hashes[0])) == LMCacheKey("g/4/m", 2, 1, int.from_bytes(hashes[0][:8], "big"),
                                                               "bfloat16")
    # 2 chunks, 2 keys, no metadata bytes
    assert (done.chunks_written, done.objects_created, done.metadata_bytes, done.payload_bytes) == (2, 2, 0, 512)
    redis_client.config_resetstat()
    found = store.lookup(list(range(1, 13)))
    # LMCache's batched exists over 3 chunks, first 2 stored: 3 EXISTS (the golden vectors' count), 1 round trip
    assert commands_since_reset(redis_client) == {"exists": GOLDEN["resp"]["lookup"]["commands"]["exists"]} == {
        "exists": 3}
    assert (found.hit_chunks, found.hit_tokens, store.stats.lookup_round_trips) == (2, 8, 1)
    got = store.retrieve(list(range(1, 13)), lookup=found)
    assert got.hit_tokens == 8 and torch.equal(got.kv, kv)


def test_accounted_chunks_are_empty_values_that_hit_and_fail_to_retrieve(redis_client):
    store = LMCacheRespStore(redis_client, StoreConfig("g", CHUNK, "m", "raw", SHAPE, torch.bfloat16))
    done = store.store(list(range(1, 9)), None)
    assert [redis_client.get(k) for k in redis_client.keys("g/*")] == [b"", b""]
    assert (done.objects_created, done.payload_bytes) == (2, 512) and store.stats.payload_bytes_accounted == 512
    assert store.lookup(list(range(1, 9))).hit_chunks == 2
    assert store.retrieve(list(range(1, 9))).break_reason == "no-payload"
    prompt = store.chunk(list(range(1, 9)))
    assert store.accounted(prompt, store.lookup(prompt), 0)
    redis_client.set(store.base_key(prompt.hashes[0]), b"\x01" * 100)  # a value of another length
    assert store.retrieve(prompt).break_reason == "bad-record" and store.stats.checksum_failures == 1


# -- multiprocess mode -----------------------------------------------------------------------------------------------
def test_mp_keys_match_lmcache_object_keys():
    mp = GOLDEN["mp"]
    rank = kv_rank(2, 1)  # ComputeKVRank(2, 1, 2, 1) = 2<<24 | 1<<16 | 2<<8 | 1
    assert rank == mp["kv_rank"] == 0x02010201 and split_kv_rank(rank) == (2, 1, 2, 1)
    h0, h1 = (bytes.fromhex(h) for h in mp["chunk_hashes"])
    expect = [MPKey(MODEL, rank, 0, h0), MPKey(MODEL, rank, 0, h1), MPKey(MODEL, rank, 1, h0, "tenant-a")]
    assert sorted(mp["keys"]) == sorted(k.to_string() for k in expect)
    for key in expect:
        assert parse_mp_key(key.to_string()) == key and classify_key(key.to_string().encode()) == (MP, key)
    # each value is the raw chunk i (keys in store order)
    assert [mp["keys"][k.to_string()] for k in expect] == [lmcache_kv(i).view(torch.uint8).numpy().tobytes().hex()
                                                           for i in range(3)]


def test_mp_store_keys_values_and_lookup(redis_client):
    store = LMCacheMPStore(redis_client, StoreConfig("g", CHUNK, "m", "raw", SHAPE, torch.bfloat16), 2, 1)
    kv = torch.cat([from_kv_2ltd(lmcache_kv(i), 2) for i in range(2)], dim=3)
    store.store(list(range(1, 9)), kv)
    hashes = store.chunk(list(range(1, 9))).hashes
    keys = [store.base_key(h) for h in hashes]
    assert [parse_mp_key(k) for k in keys] == [MPKey("g/4/m", 0x02010201, 0, h) for h in hashes]
    golden = GOLDEN["mp"]["keys"]
    h0, h1 = (bytes.fromhex(h) for h in GOLDEN["mp"]["chunk_hashes"])
    assert [redis_client.get(k).hex() for k in keys] == [golden[MPKey(MODEL, 0x02010201, 0, h).to_string()]
                                                         for h in (h0, h1)]
    redis_client.config_resetstat()
    assert store.lookup(list(range(1, 13))).hit_chunks == 2
    assert commands_since_reset(redis_client) == {"exists": GOLDEN["mp"]["lookup"]["commands"]["exists"]}
    assert GOLDEN["mp"]["lookup"]["found"] == [True, True, False]


@pytest.mark.parametrize("text", ["m@1000100@0@ab", "m@01000100@0@abc", "m@01000100@-1@ab", "@01000100@0@ab",
                                  "m@01000100@0@ab@", "m@01000100@0@AB", "m@01000100@0@ab@x@y", "m@01000100@0"])
def test_parse_mp_key_refuses_what_lmcache_never_writes(text):
    with pytest.raises(ValueError):
        parse_mp_key(text)


@pytest.mark.parametrize("salt", ["a/b", "a\\b", "a\0b", "x" * 129])
def test_salts_lmcache_refuses(salt):
    with pytest.raises(ValueError):
        check_salt(salt)


_NAME = st.text(st.characters(blacklist_characters="@", blacklist_categories=("Cs",)), min_size=1, max_size=30)
_SALT = st.text(st.characters(blacklist_characters="@/\\\0", blacklist_categories=("Cs",)), max_size=20)


@given(model=_NAME, fields=st.tuples(*[st.integers(0, 255)] * 4), group=st.integers(0, 2**20),
       chunk_hash=st.binary(min_size=1, max_size=32), salt=_SALT)
def test_mp_keys_round_trip(model, fields, group, chunk_hash, salt):
    key = MPKey(model, kv_rank(*fields), group, chunk_hash, salt)
    assert parse_mp_key(key.to_string()) == key
    assert split_kv_rank(key.kv_rank) == fields
    layout = classify_key(key.to_string().encode())
    assert layout is not None and layout[0] in (MP, REDIS, LEGACY)  # a salt may end in "metadata": redis://


@given(st.binary(max_size=60))
def test_classify_never_raises(raw):
    got = classify_key(raw)
    assert got is None or got[0] in (REDIS, RESP, MP, LEGACY, UNKNOWN)


# -- which layout --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, layout", [
    ("m@01000100@" + "ab" * 16, UNKNOWN),  # the three-field model@rank@hash: never read as a multiprocess key
    ("m@1@0@" + "ab" * 8, UNKNOWN),  # a CacheEngineKey without its dtype
    ("m@01@0@ff@half", None),  # a world size LMCache never writes (leading zero); "ff" too short to look like a hash
    ("m@01000100@0@abcd@half", MP),  # a multiprocess key salted "half", not a world size of 1,000,100
    ("m@1@0@ff@half", RESP), ("m@1@0@ff@halfmetadata", REDIS), ("vllm@m@1@0@ff@halfkv_bytes", LEGACY),
    ("kvcli:v1:ns@x:16:m:" + "ab" * 16, None), ("user@example.com", None), ("session:42", None),
])
def test_each_key_is_named_by_its_layout(key, layout):
    got = classify_key(key.encode())
    assert (got and got[0]) == layout or (got is None and layout is None)


# -- inspect: every layout on one server -----------------------------------------------------------------------------
def fill_all_layouts(client) -> None:
    """LMCache's own keys (the golden vectors: 4 redis://, 2 resp://, 3 multiprocess), kvcli's writers' (2 chunks
    in each layout, namespace "w"), an unknown layout's key and a foreign key."""
    for layout in ("redis", "resp", "mp"):
        for key, value in GOLDEN[layout]["keys"].items():
            client.set(key, bytes.fromhex(value))
    config = StoreConfig("w", CHUNK, "m", "raw", SHAPE, torch.bfloat16)
    kv = torch.cat([from_kv_2ltd(lmcache_kv(i), 2) for i in range(2)], dim=3)
    for cls in (LMCacheStore, LMCacheRespStore, LMCacheMPStore):
        cls(client, config).store(list(range(1, 9)), kv)
    client.set(f"{MODEL}@02010201@" + "cd" * 32, b"\x01" * 256)  # model@rank@hash: an earlier multiprocess form
    client.set("session:42", "x")


def test_inspect_names_all_three_layouts_on_one_server(redis_client):
    fill_all_layouts(redis_client)
    redis_client.config_resetstat()
    r = inspect_lmcache(redis_client)
    assert_read_only(redis_client, commands_since_reset(redis_client))
    # redis:// 4 golden + 4 kvcli; resp:// 2 + 2; multiprocess 3 + 2; 1 unknown; 1 other = 19
    assert (r.scanned_keys, r.lmcache_keys, r.resp_keys, r.mp_keys, r.unknown.keys, r.other_keys) == (
        19, 8, 4, 5, 1, 1)
    assert [x["name"] for x in r.layouts()] == ["lmcache", "lmcache-resp", "lmcache-mp", "unknown"]
    assert [(x["name"], x["keys"]) for x in r.layouts()] == [("lmcache", 8), ("lmcache-resp", 4), ("lmcache-mp", 5),
                                                              ("unknown", 1)]
    assert r.unknown.by_first_field == {MODEL: 1}
    assert [g.model_name for g in r.groups] == [MODEL, "w/4/m"] and all(g.chunks == 2 for g in r.groups)
    resp = {g.model_name: g for g in r.resp_groups}
    assert (resp[MODEL].keys, resp[MODEL].value_bytes, dict(resp[MODEL].by_tag)) == (2, 512, {"user%acme": 1})
    assert resp["w/4/m"].by_world_size == {1: 2} and resp["w/4/m"].by_value_bytes == {256: 2}
    mp = {g.model_name: g for g in r.mp_groups}
    assert (mp[MODEL].keys, mp[MODEL].salted_keys, mp[MODEL].salts) == (3, 1, 1)
    assert mp[MODEL].by_object_group == {0: 2, 1: 1} and mp[MODEL].by_hash_bytes == {32: 3}
    assert mp[MODEL].by_kv_rank == {"02010201": 3} and mp[MODEL].by_world_size == {2: 3}
    assert mp["w/4/m"].by_hash_bytes == {16: 2} and mp["w/4/m"].by_kv_rank == {"01000100": 2}
    assert mp[MODEL].example["kv_rank_fields"] == {"world_size": 2, "global_rank": 1, "local_world_size": 2,
                                                   "local_rank": 1}
    assert sum(s.keys for s in r.shards) == 17 and sum(s.other_keys for s in r.shards) == 2


def test_inspect_cli_json_and_table_name_the_layouts(redis_url, redis_client):
    fill_all_layouts(redis_client)
    out = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [x["name"] for x in doc["layouts"]] == ["lmcache", "lmcache-resp", "lmcache-mp", "unknown"]
    assert doc["layouts"][2]["key_format"].startswith("{model_name}@{kv_rank:08x}@{object_group_id:x}@")
    assert doc["keys"] == {"scanned": 19, "lmcache": 8, "lmcache_resp": 4, "lmcache_mp": 5, "lmcache_legacy": 0,
                           "lmcache_unknown": 1, "other": 1}
    assert doc["unknown"]["examples"] == [f"{MODEL}@02010201@" + "cd" * 32]
    assert "by_dtype" not in doc["mp_groups"][0] and "by_object_group" not in doc["resp_groups"][0]
    table = CliRunner().invoke(cli_app(), ["inspect", "--layout", "lmcache-mp", "--redis-url", redis_url]).stdout
    assert ("LMCache layouts: redis:// (lmcache) 8 keys, resp:// (lmcache-resp) 4 keys, multiprocess (lmcache-mp) "
            "5 keys, UNKNOWN LMCache layout 1 keys") in table
    assert "unknown LMCache layout: 1 keys look like LMCache's" in table


# -- purge and replay ------------------------------------------------------------------------------------------------
def test_purge_deletes_one_layout_of_a_namespace(redis_url, redis_client):
    fill_all_layouts(redis_client)
    before = redis_client.dbsize()
    assert count_namespace(redis_client, "w", layouts=(RESP,)).payloads == 2
    for layout, n in (("lmcache-resp", 2), ("lmcache-mp", 2), ("lmcache", 4)):
        out = CliRunner().invoke(cli_app(), ["purge", "--namespace", "w", "--layout", layout, "--yes", "--json",
                                             "--redis-url", redis_url])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["deleted"] == n
        before -= n
        assert redis_client.dbsize() == before
    assert not redis_client.keys("w/*") and redis_client.dbsize() == 19 - 8  # LMCache's own keys are untouched
    bad = CliRunner().invoke(cli_app(), ["purge", "--namespace", "w", "--layout", "lmcache-mp", "--chunk-size", "4",
                                         "--redis-url", redis_url])
    assert bad.exit_code == 2


def test_replay_every_layout_side_by_side(tmp_path, redis_url, redis_client):
    trace = tmp_path / "tokens.jsonl"
    trace.write_text("".join(json.dumps({"token_ids": p}) + "\n" for p in PROMPTS))
    base = ["replay", str(trace), "--chunk-sizes", "4,8", "--measure", "0", "--prefill-tps", "1000", "--payload",
            "accounted", "--redis-url", redis_url, "--jobs", "1", "--json"]
    out = CliRunner().invoke(cli_app(), base + ["--layout", "kvcli,lmcache,lmcache-resp,lmcache-mp", "--keep"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)["traces"][0]
    rows = doc["by_layout"]
    # hits as in test_lmcache (28 of 53 at chunk size 4, 24 at 8) in every layout
    assert {name: [r["hit_tokens"] for r in rows[name]] for name in rows} == {
        name: [28, 24] for name in ("kvcli", "lmcache", "lmcache-resp", "lmcache-mp")}
    # a lookup is one round trip per request with a full chunk (4 of the 5 prompts) in the one-key layouts
    assert [r["lookup_round_trips"] for r in rows["lmcache-resp"]] == [4, 4] == [
        r["lookup_round_trips"] for r in rows["lmcache-mp"]]
    assert rows["lmcache-mp"][0]["metadata_bytes_written"] == 0
    namespace = doc["per_chunk_size"][0]["namespace"]
    note = next(n for n in doc["notes"] if "(--keep)" in n)
    for layout in ("lmcache", "lmcache-resp", "lmcache-mp"):
        assert f"kvcli purge --namespace {namespace} --layout {layout} --yes" in note
    # accounted payloads: one key per chunk in each LMCache layout (redis://: its metadata key alone)
    kinds = Counter(classify_key(k)[0] for k in redis_client.keys(f"{namespace}/*"))
    assert kinds[REDIS] == kinds[RESP] == kinds[MP] > 0 and set(kinds) == {REDIS, RESP, MP}


# -- warm ----------------------------------------------------------------------------------------------------------
WARM_PROMPTS = "You are a helpful assistant. Answer briefly and cite sources when you can.\n"


@pytest.mark.parametrize("layout", ["lmcache", "lmcache-resp", "lmcache-mp"])
def test_warm_in_each_layout_writes_what_kvcli_warm_computes(layout, redis_url, redis_client, tmp_path):
    from kvcli.model.load import resolve_spec
    from kvcli.store.chunkstore import ChunkStore
    from kvcli.store.lmcache_store import LMCACHE_STORES
    from kvcli.traces.prompts import read_prompts

    prompts = tmp_path / "system.txt"
    prompts.write_text(WARM_PROMPTS)
    args = ["warm", str(prompts), "--model", "tiny", "--chunk-size", "4,8", "--namespace", "wl", "--redis-url",
            redis_url, "--json"]
    runner = CliRunner()
    dry = runner.invoke(cli_app(), args + ["--layout", layout, "--dry-run"])
    real = runner.invoke(cli_app(), args + ["--layout", layout])
    assert dry.exit_code == 0 and real.exit_code == 0, real.output
    dry_doc, doc = json.loads(dry.stdout), json.loads(real.stdout)
    assert doc["layout"] == layout and dry_doc["totals"] == doc["totals"]
    # the prompt is 15 tokens (cl100k_base): 3 full chunks of 4, 1 of 8, each written once; objects: 2 per chunk
    # in redis:// (metadata, kv_bytes), else 1
    full = [t["full_chunks"] for t in doc["per_size"]]
    assert [t["chunks_written"] for t in doc["per_size"]] == full == [3, 1]
    assert doc["totals"]["objects_written"] == sum(full) * (2 if layout == "lmcache" else 1)
    assert doc["totals"]["metadata_bytes"] == (28 * sum(full) if layout == "lmcache" else 0)
    again = json.loads(runner.invoke(cli_app(), args + ["--layout", layout]).stdout)
    assert again["totals"]["chunks_written"] == 0 and again["totals"]["chunks_present"] == sum(full)
    # the KV read back in LMCache's layout is the KV kvcli's own warm stores for the same prompt
    kvcli_run = runner.invoke(cli_app(), args)
    assert kvcli_run.exit_code == 0, kvcli_run.output
    spec = resolve_spec("tiny", None, 0)
    ids = read_prompts([str(prompts)])[0].token_ids
    assert len(ids) == 15
    for cs in (4, 8):
        config = StoreConfig("wl", cs, spec.model_id, "cl100k_base", spec.kv_shape, spec.dtype)
        ours, theirs = ChunkStore(redis_client, config), LMCACHE_STORES[layout](redis_client, config)
        keys = redis_client.keys(f"wl/{cs}/*")
        assert keys and all(classify_key(k)[0] == layout for k in keys)
        a, b = ours.retrieve(ids), theirs.retrieve(ids)
        assert a.hit_tokens == b.hit_tokens == 12 // cs * cs and torch.equal(a.kv, b.kv)
    purge = runner.invoke(cli_app(), ["purge", "--namespace", "wl", "--layout", layout, "--yes", "--redis-url",
                                      redis_url])
    assert purge.exit_code == 0 and not redis_client.keys("wl/*")


@pytest.mark.parametrize("extra", [["--ttl", "60"], ["--verify"], ["--kv-dtype", "fp8"], ["--layout", "lmcache-x"]])
def test_warm_in_lmcache_layouts_refuses_what_they_have_no_counterpart_for(extra, redis_url, redis_client, tmp_path):
    prompts = tmp_path / "system.txt"
    prompts.write_text(WARM_PROMPTS)
    layout = [] if "--layout" in extra else ["--layout", "lmcache-resp"]
    out = CliRunner().invoke(cli_app(), ["warm", str(prompts), "--model", "tiny", "--chunk-size", "4",
                                         "--redis-url", redis_url, *layout, *extra])
    assert out.exit_code == 2, out.output
    assert redis_client.dbsize() == 0
