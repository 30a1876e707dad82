"""kvcli inspect against real (embedded) Redis servers: read-only proof, counts, integrity and chunk maps."""
from __future__ import annotations

import json

import numpy as np
import pytest
import redis
from test_warm import cli_app
from typer.testing import CliRunner

from kvcli.live.chunkmap import chunk_map
from kvcli.live.inspect import inspect_cache
from kvcli.live.reading import READ_COMMANDS
from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.llama import build_model
from kvcli.model.presets import model_spec
from kvcli.traces.request import Request

TINY = model_spec("tiny")
CONNECTION_COMMANDS = {"ping", "client|setinfo", "hello", "select", "auth"}


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def req(tokens, rid="r") -> Request:
    return Request(rid, np.asarray(tokens, dtype=np.uint32), source=f"test:{rid}")


def store16(client, namespace="i"):
    return make_stores(client, TINY, WarmConfig(namespace, (16,)))[0]


def commands_since_reset(client) -> dict[str, int]:
    """Commands the server ran since CONFIG RESETSTAT (the test's own INFO and RESETSTAT excluded), by name."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")}


def assert_read_only(client, ran: dict[str, int]) -> None:
    """Every command that ran is a read (kvcli's list, or connection set-up) and has no "write" flag at the server."""
    assert set(ran) <= READ_COMMANDS | CONNECTION_COMMANDS, ran
    for name in ran:
        info = client.execute_command("COMMAND", "INFO", name)[name]
        assert "write" not in info["flags"], name


def test_inspect_sends_only_read_commands(redis_client, redis_url, model, tmp_path):
    warm(redis_client, [req(range(1, 50)), req(range(100, 140), "b")], model, WarmConfig("i", (16,), ttl=600))
    redis_client.set("foreign", "x")
    before = {k: (redis_client.dump(k), redis_client.pttl(k)) for k in redis_client.scan_iter()}
    redis_client.config_resetstat()
    inspect_cache(redis_client, verify=True)
    inspect_cache(redis_client, sample=2, verify=True)
    chunk_map(redis_client, np.arange(1, 50), "i", 16, TINY.model_id, "cl100k_base")
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 50))))
    for args in (["inspect", "--json"], ["inspect", "--tokens", str(tokens), "--model", "tiny", "--namespace", "i"]):
        res = CliRunner().invoke(cli_app(), args + ["--redis-url", redis_url])
        assert res.exit_code == 0, res.output
    ran = commands_since_reset(redis_client)
    assert_read_only(redis_client, ran)
    assert ran["scan"] >= 3 and "keys" not in ran
    after = {k: (redis_client.dump(k), redis_client.pttl(k)) for k in redis_client.scan_iter()}
    assert {k: v for k, (v, _) in after.items()} == {k: v for k, (v, _) in before.items()}  # same keys, same values
    assert all(0 <= before[k][1] - t < 5000 or t == before[k][1] == -1 for k, (_, t) in after.items())  # TTLs kept


def test_counts_100000_foreign_keys_and_changes_nothing(redis_client, model, server_kind):
    for start in range(0, 100_000, 1000):
        redis_client.mset({f"app:{i}": i for i in range(start, start + 1000)})
    redis_client.set("kvcli:v1:not-a-chunk", "x")  # kvcli's prefix, not its layout: foreign too
    warm(redis_client, [req(range(1, 65))], model, WarmConfig("i", (16, 32)))  # 4 + 2 chunks = 12 keys
    redis_client.config_resetstat()
    result = inspect_cache(redis_client)
    assert (result.other_keys, result.kvcli_keys, result.scanned_keys) == (100_001, 12, 100_013)
    assert [(g.chunk_size, g.chunks, g.metadata_entries, g.payload_objects) for g in result.groups] == [
        (16, 4, 4, 4), (32, 2, 2, 2)]
    head16, head32 = (s.config.header_bytes for s in make_stores(redis_client, TINY, WarmConfig("i", (16, 32))))
    assert [g.payload_bytes for g in result.groups] == [4 * (16 * 1024 + head16), 2 * (32 * 1024 + head32)]
    assert all(not g.issues for g in result.groups) and result.verified
    ran = commands_since_reset(redis_client)
    assert_read_only(redis_client, ran)
    # per-key reads touch the 12 kvcli keys only (PTTL, STRLEN, MEMORY USAGE in one EVAL_RO per SCAN step; on a
    # cluster one command per key, metadata read with GET) and GET the 6 payloads to verify them: no foreign key is
    # ever read
    gets = 6 + (6 if server_kind == "cluster" else 0)
    assert (ran["pttl"], ran["strlen"], ran["memory|usage"], ran["get"]) == (12, 12, 12, gets)
    assert redis_client.dbsize() == 100_013 and redis_client.get("app:99999") == b"99999"


def test_corrupted_payload_is_reported_and_never_returned(redis_client, model):
    tokens = np.arange(1, 49, dtype=np.uint32)  # 3 chunks of 16
    warm(redis_client, [req(tokens)], model, WarmConfig("i", (16,)))
    store = store16(redis_client)
    h = store.chunk(tokens).hashes
    raw = bytearray(redis_client.get(store.payload_key(h[1])))
    raw[-3] ^= 0x40
    redis_client.set(store.payload_key(h[1]), bytes(raw))
    found = inspect_cache(redis_client, verify=True).groups[0]
    assert found.issues["checksum_failures"] == [h[1].hex()]
    assert found.issues["unreachable"] == [h[2].hex()]  # its parent is corrupted: never reachable again
    assert found.chunks == 2 and not found.issues["orphan_metadata"]
    got = store.retrieve(tokens)
    assert (got.hit_tokens, got.break_reason, got.kv.shape[3]) == (16, "checksum", 16)
    m = chunk_map(redis_client, tokens, "i", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["hit", "checksum", "unreachable"]
    assert (m.hit_tokens, m.prefill_tokens, m.break_index) == (16, 32, 1)


def test_map_break_reasons_for_missing_and_half_chunks(redis_client, model):
    tokens = np.arange(1, 81, dtype=np.uint32)  # 5 chunks of 16, plus nothing partial
    warm(redis_client, [req(tokens)], model, WarmConfig("i", (16,)))
    store = store16(redis_client)
    h = store.chunk(tokens).hashes
    redis_client.delete(store.payload_key(h[3]))
    redis_client.delete(store.meta_key(h[4]))
    m = chunk_map(redis_client, np.concatenate([tokens, [7, 7, 7]]), "i", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["hit", "hit", "hit", "no-payload", "no-metadata"]
    assert (m.prompt_tokens, m.hit_tokens, m.prefill_tokens, m.break_reason) == (83, 48, 35, "no-payload")
    redis_client.delete(store.meta_key(h[1]), store.payload_key(h[1]))
    m = chunk_map(redis_client, tokens, "i", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["hit", "missing", "unreachable", "no-payload", "no-metadata"]
    g = inspect_cache(redis_client).groups[0]
    assert (g.issues["orphan_metadata"], g.issues["orphan_payloads"]) == ([h[3].hex()], [h[4].hex()])
    assert sorted(g.issues["unreachable"]) == sorted([h[2].hex(), h[3].hex()])  # h[4]: an orphan payload only


def test_lru_eviction_reported_consistently(make_server, model):
    client = redis.Redis.from_url(make_server(**{"maxmemory-policy": "allkeys-lru"}))
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 1_000_000)  # ~1 MB of room
    prompts = [req(np.arange(i * 5000, i * 5000 + 512), str(i)) for i in range(6)]  # 192 chunks of 16 KiB: 3 MiB+
    result = warm(client, prompts, model, WarmConfig("lru", (16,), batch_chunks=2))
    assert result.preflight.fits is False and not result.stopped
    client.config_set("maxmemory", "0")  # freeze what is left (the test's own write, not inspect's)
    store = store16(client, "lru")
    meta, pay, expect = set(), set(), {"orphan_metadata": [], "orphan_payloads": [], "unreachable": []}
    for p in prompts:
        hashes = [x.hex() for x in store.chunk(p.token_ids).hashes]
        has_m = [bool(client.exists(store.meta_key(bytes.fromhex(x)))) for x in hashes]
        has_p = [bool(client.exists(store.payload_key(bytes.fromhex(x)))) for x in hashes]
        broken = False
        for x, m_, p_ in zip(hashes, has_m, has_p):
            expect["orphan_metadata"] += [x] if m_ and not p_ else []
            expect["orphan_payloads"] += [x] if p_ and not m_ else []
            expect["unreachable"] += [x] if m_ and broken else []
            broken = broken or not (m_ and p_)
        meta |= {x for x, m_ in zip(hashes, has_m) if m_}
        pay |= {x for x, p_ in zip(hashes, has_p) if p_}
    found = inspect_cache(client)
    g = found.groups[0]
    assert found.server.evicted_keys > 0 and found.server.policy == "allkeys-lru"
    assert (g.metadata_entries, g.payload_objects) == (len(meta), len(pay)) and len(meta) + len(pay) < 384
    assert {k: sorted(v) for k, v in expect.items()} == {k: sorted(g.issues.get(k, [])) for k in expect}
    assert expect["unreachable"] or expect["orphan_metadata"] or expect["orphan_payloads"]
    # the first prompt with a broken chain: its map breaks at its first chunk that lost a key, and says why
    for p in prompts:
        hashes = store.chunk(p.token_ids).hashes
        has = [(client.exists(store.meta_key(x)), client.exists(store.payload_key(x))) for x in hashes]
        if any(h != (1, 1) for h in has):  # exists: something above is orphaned or unreachable
            break
    first = has.index(next(h for h in has if h != (1, 1)))
    later = any(any(h) for h in has[first + 1:])
    reason = {(1, 0): "no-payload", (0, 1): "no-metadata"}.get(has[first], "evicted" if later else "missing")
    m = chunk_map(client, p.token_ids, "lru", 16, TINY.model_id, "cl100k_base")
    assert (m.break_index, m.hit_tokens, m.break_reason) == (first, 16 * first, reason)
    assert [r.status for r in m.rows[:first]] == ["hit"] * first


def test_ttl_spread_age_and_sampled_memory(redis_client, model):
    warm(redis_client, [req(range(1, 65))], model, WarmConfig("i", (16,), ttl=300))
    found = inspect_cache(redis_client, sample=3)
    g = found.groups[0]
    d = g.to_dict()
    assert d["ttl_seconds"]["none"] == 0 and d["ttl_seconds"]["with_ttl"] == 8
    assert 0 < d["ttl_seconds"]["min"] <= d["ttl_seconds"]["max"] <= 300
    assert d["age_seconds"]["min"] is not None and d["age_seconds"]["max"] < 300
    assert (found.memory_sampled, g.memory_keys) == (3, 3)  # 3 of the 8 keys read, then scaled to 8
    assert g.memory_bytes > 8 * 100


def test_cli_inspect_json_and_request_map(redis_url, redis_client, model, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"token_ids": list(range(1, 40))}) + "\n"
                     + json.dumps({"token_ids": list(range(1, 33)) + [9, 9]}) + "\n")
    warm(redis_client, [req(range(1, 40))], model, WarmConfig("default", (16,)))
    runner = CliRunner()
    res = runner.invoke(cli_app(), ["inspect", "--sample", "2", "--json", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["keys"] == {"scanned": 4, "kvcli": 4, "route_index": 0, "other": 0} and doc["memory_sampled_keys"] == 2
    res = runner.invoke(cli_app(), ["inspect", "--request", f"{trace}:2", "--model", "tiny", "--chunk-size", "16",
                                    "--json", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["schema_version"], doc["command"]) == (2, "inspect")
    (m,) = doc["chunk_maps"]
    assert (m["hit_tokens"], m["prefill_tokens"], m["break_index"]) == (32, 2, None)
    res = runner.invoke(cli_app(), ["inspect", "--prompt", "x", "--tokens", str(trace), "--redis-url", redis_url])
    assert res.exit_code == 2 and "one of" in res.stderr


def test_read_only_acl_user_without_scripts_gets_the_same_answer(make_server, model):
    """A user allowed only reads (no EVAL_RO) is served by the pipelined per-key fallback, through a password URL."""
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.acl_setuser("reader", enabled=True, passwords=["+s3cret"], keys=["*"],
                      commands=["+@read", "+@connection", "+info", "-@scripting"])
    warm(admin, [req(range(1, 65))], model, WarmConfig("i", (16,), ttl=900))
    admin.set("foreign", "x")
    expected = inspect_cache(admin).to_dict()
    host_port = url.split("//", 1)[1]
    res = CliRunner().invoke(cli_app(), ["inspect", "--json", "--redis-url", f"redis://reader:s3cret@{host_port}"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    for doc in (expected, got):
        for g in doc["groups"]:
            g.pop("age_seconds"), g.pop("ttl_seconds")
    assert (got["keys"], got["groups"]) == (expected["keys"], expected["groups"])


def test_keys_with_kvcli_names_that_hold_no_string(make_server, model):
    """A hash at a chunk's metadata name is bad metadata; at its payload name it is not a payload (other). Both
    read paths (one EVAL_RO per SCAN step; per-key commands for a user without scripts) agree; no traceback."""
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.acl_setuser("reader", enabled=True, passwords=["+s3cret"], keys=["*"],
                      commands=["+@read", "+@connection", "+info", "-@scripting"])
    tokens = np.arange(1, 33)  # 2 chunks of 16
    warm(admin, [req(tokens)], model, WarmConfig("wt", (16,)))
    store = store16(admin, "wt")
    h = store.chunk(tokens).hashes
    admin.delete(store.meta_key(h[0]), store.payload_key(h[1]))
    admin.hset(store.meta_key(h[0]), "a", 1)
    admin.hset(store.payload_key(h[1]), "a", 1)
    admin.hset("kvcli:v1:wt:16:m:0123456789abcdef0123456789abcdef", "a", 1)
    reader_client = redis.Redis.from_url(f"redis://reader:s3cret@{url.split('//', 1)[1]}")
    docs = []
    for client in (admin, reader_client):
        found = inspect_cache(client, verify=True)
        assert (found.kvcli_keys, found.other_keys) == (4, 1)
        bad, tiny = found.groups  # models "?" and tiny
        assert (bad.model, bad.metadata_entries, bad.metadata_bytes, bad.payload_objects) == ("?", 2, 0, 0)
        assert sorted(bad.issues["bad_metadata"]) == sorted([h[0].hex(), "0123456789abcdef0123456789abcdef"])
        assert (tiny.chunks, tiny.metadata_entries, tiny.payload_objects) == (0, 1, 1)
        assert {k: v for k, v in tiny.issues.items() if v} == {"bad_payload": [h[1].hex()],
                                                               "unreachable": [h[1].hex()]}
        docs.append(found.to_dict())
        m = chunk_map(client, tokens, "wt", 16, TINY.model_id, "cl100k_base")
        assert [r.status for r in m.rows] == ["bad-metadata", "bad-payload"]  # the same judge as inspect's
    for doc in docs:
        for g in doc["groups"]:
            g.pop("age_seconds"), g.pop("ttl_seconds")
    assert docs[0]["groups"] == docs[1]["groups"]
    res = CliRunner().invoke(cli_app(), ["inspect", "--redis-url", url])
    assert res.exit_code == 0, res.output
    assert "bad_metadata 2" in res.stdout


def test_markup_in_namespace_names_is_printed_as_is(redis_url, redis_client):
    redis_client.set(f"kvcli:v1:[/]:16:m:{'ab' * 16}", "not metadata")
    redis_client.set(f"kvcli:v1:[bold]x:16:p:{'cd' * 16}", "payload")
    res = CliRunner().invoke(cli_app(), ["inspect", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    rows = [line for line in res.stdout.splitlines() if "[/]" in line or "[bold]x" in line]
    assert len(rows) == 2 and "bad_metadata 1" in rows[0] + rows[1] and "orphan_payloads 1" in rows[0] + rows[1]


def test_tokens_file_that_is_not_utf8_is_bad_input(redis_url, tmp_path):
    tokens = tmp_path / "ids.bin"
    tokens.write_bytes(b"1 2 3 \xff\xfe 4")
    res = CliRunner().invoke(cli_app(), ["inspect", "--tokens", str(tokens), "--model", "tiny", "--redis-url",
                                         redis_url])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"kvcli: error: {tokens}: not UTF-8 text (byte 6)") and res.stderr.count("\n") == 1


@pytest.mark.single_server("the file is refused before any connection")
@pytest.mark.parametrize("text, line, bad", [
    ("1 2 x 4", 1, "'x'"),
    ("1 2\n1.5\n", 2, "'1.5'"),
    ('{"token_ids": [1, 2], "timestamp": 3}\n', 1, "'{\"token_ids\":'"),
    ("1 -2", 1, "'-2'"),
    ("1 4294967296", 1, "'4294967296'"),
])
def test_a_tokens_file_with_anything_but_token_ids_is_bad_input(redis_url, redis_client, tmp_path, text, line,
                                                                  bad):
    """Every character is an id or a separator: a word, a decimal point, a JSON record or an id out of range is
    refused with the file, the line and the token (never read as the digits it holds)."""
    tokens = tmp_path / "t.txt"
    tokens.write_text(text)
    res = CliRunner().invoke(cli_app(), ["inspect", "--tokens", str(tokens), "--model", "tiny", "--chunk-size", "1",
                                         "--redis-url", redis_url])
    assert res.exit_code == 2, res.output
    (message,) = res.stderr.splitlines()
    assert message.startswith(f"kvcli: error: {tokens}:{line}: {bad} is not a token id (token ids are integers in "
                              "[0, 2**32)"), message
    assert res.stdout == "" and redis_client.dbsize() == 0


def test_quotas_spread_a_sample_over_groups():
    from kvcli.live.inspect import quotas

    assert quotas([8, 4], 2) == [1, 1]
    assert quotas([8, 4], 5) == [3, 2]  # one each, then 3 more in proportion to 7 : 3 (largest remainders)
    assert quotas([8, 4], 1) == [1, 0]
    assert quotas([8, 4], 12) == quotas([8, 4], 100) == [8, 4]
    assert quotas([1, 1, 30], 4) == [1, 1, 2]
    assert sum(quotas([5, 7, 11, 13], 17)) == 17


def test_sampled_memory_reaches_every_group_and_unmeasured_is_null(redis_url, redis_client, model):
    warm(redis_client, [req(range(1, 65))], model, WarmConfig("s1", (16,)))  # 4 chunks: 8 keys
    warm(redis_client, [req(range(1, 33))], model, WarmConfig("s2", (16,)))  # 2 chunks: 4 keys
    full = {g.namespace: g for g in inspect_cache(redis_client).groups}
    assert {ns: g.memory_keys for ns, g in full.items()} == {"s1": 8, "s2": 4}
    for sample, keys in ((2, (1, 1)), (5, (3, 2)), (1, (1, 0)), (0, (0, 0))):
        found = inspect_cache(redis_client, sample=sample)
        got = {g.namespace: g for g in found.groups}
        assert found.memory_sampled == sum(keys)
        assert (got["s1"].memory_keys, got["s2"].memory_keys) == keys
        for ns, k in zip(("s1", "s2"), keys):
            assert (got[ns].memory_bytes is None) == (k == 0)
    res = CliRunner().invoke(cli_app(), ["inspect", "--sample", "0", "--json", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    assert [g["memory_bytes"] for g in json.loads(res.stdout)["groups"]] == [None, None]
    res = CliRunner().invoke(cli_app(), ["inspect", "--sample", "0", "--redis-url", redis_url])
    rows = [line for line in res.stdout.splitlines() if " s1 " in line or " s2 " in line]
    assert len(rows) == 2 and all(" – " in r and "0 B" not in r for r in rows), res.stdout


def test_inspect_leaves_lfu_counters_alone_over_one_connection(make_server, model, tmp_path):
    """CLIENT NO-TOUCH ON, on the one connection every read of inspect goes over: LFU counters are unchanged
    (lfu-log-factor 0: every touching read would add 1; lfu-decay-time 0: no decay while the test runs)."""
    url = make_server(**{"maxmemory-policy": "allkeys-lfu", "lfu-log-factor": "0", "lfu-decay-time": "0"})
    client = redis.Redis.from_url(url)
    tokens = np.arange(1, 50)
    warm(client, [req(tokens)], model, WarmConfig("nt", (16,)))
    keys = sorted(client.scan_iter("kvcli:*"))

    def freqs():
        return [client.object("freq", k) for k in keys]

    before = freqs()
    connections = client.info("stats")["total_connections_received"]
    found = inspect_cache(client, verify=True)
    inspect_cache(client, sample=3, verify=True)
    m = chunk_map(client, tokens, "nt", 16, TINY.model_id, "cl100k_base")
    assert client.info("stats")["total_connections_received"] - connections == 3  # one connection per call
    assert found.no_touch is True and found.verified and [r.status for r in m.rows] == ["hit"] * 3
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, tokens)))
    res = CliRunner().invoke(cli_app(), ["inspect", "--tokens", str(ids), "--model", "tiny", "--namespace", "nt",
                                         "--chunk-size", "16,32", "--redis-url", url])
    assert res.exit_code == 0, res.output
    assert freqs() == before
    client.get(keys[0])  # a read without NO-TOUCH does count: the check above can see a touch
    assert freqs()[0] == before[0] + 1


def test_a_damaged_first_chunk_gets_its_state_not_a_warning_about_the_namespace(redis_client):
    """A first chunk that is there but damaged (its metadata gone, its payload left) is ``no-metadata`` in the map,
    and the map gets no "nothing stored for this prompt (another tokenizer?)" warning: that is for a first chunk
    with nothing at either key."""
    import torch

    from kvcli.live.chunkmap import absent_warnings, chunk_map
    from kvcli.store.chunkstore import ChunkStore
    from kvcli.store.records import StoreConfig

    store = ChunkStore(redis_client, StoreConfig("dmg", 4, "m", "raw", (1, 2, 1, 2), torch.float32))
    tokens = list(range(1, 9))
    store.store(tokens, torch.zeros(1, 2, 1, 8, 2))
    redis_client.delete(store.meta_key(store.chunk(tokens).hashes[0]))
    (m,) = absent_warnings(redis_client, [chunk_map(redis_client, tokens, "dmg", 4, "m", "raw")])
    assert ([r.status for r in m.rows], m.warning) == (["no-metadata", "unreachable"], "")
    (gone,) = absent_warnings(redis_client, [chunk_map(redis_client, [9] * 8, "dmg", 4, "m", "raw")])
    assert [r.status for r in gone.rows] == ["missing", "missing"] and "holds" in gone.warning


def test_a_chunk_stored_in_another_layout_breaks_replay_inspect_and_the_map_alike(redis_url, redis_client, tmp_path):
    """A prompt of 53 tokens at chunk size 4: 13 full chunks. warm (fp32) stores all 13; warm --kv-dtype fp8 of its
    first 20 tokens rewrites chunks 0-4 in fp8 (another layout: 4 x 64 one-byte values + 4 scales of 4 bytes = 272
    payload bytes, not fp32's 1,024); warm (fp32) of its first 16 tokens rewrites chunks 0-3 in fp32 again. Chunk 4
    is fp8 among fp32 chunks. By hand: replay (fp32) hits chunks 0-3 and stops at 4 (its payload is another length):
    16 hit tokens. inspect --verify names chunk 4 "other_layout" and chunks 4-12 unreachable (9); the chunk map
    breaks at chunk 4 ("other-layout"), chunks 5-12 unreachable, 16 tokens reused; with --kv-dtype fp8 it breaks at
    chunk 0; by a bare model id (no shapes) it judges against chunk 0's layout: chunk 4 again."""
    tokens = list(range(1, 54))
    files = {}
    for n in (53, 20, 16):
        files[n] = tmp_path / f"p{n}.jsonl"
        files[n].write_text(json.dumps({"token_ids": tokens[:n]}) + "\n")
    run = CliRunner()
    base = ["--model", "tiny", "--chunk-size", "4", "--namespace", "lay", "--redis-url", redis_url]
    for n, extra in ((53, []), (20, ["--kv-dtype", "fp8"]), (16, [])):
        out = run.invoke(cli_app(), ["warm", str(files[n]), *base, *extra])
        assert out.exit_code == 0, out.output
    store = make_stores(redis_client, TINY, WarmConfig("lay", (4,)))[0]
    hexes = [h.hex() for h in store.chunk(np.asarray(tokens, dtype=np.uint32)).hashes]
    assert len(hexes) == 13
    assert [b'"dtype":"F8_E4M3"' in redis_client.get(store.meta_key(bytes.fromhex(x))) for x in hexes] == \
        [False] * 4 + [True] + [False] * 8

    out = run.invoke(cli_app(), ["replay", str(files[53]), "--model", "tiny", "--chunk-sizes", "4", "--namespace",
                                 "lay", "--measure", "0", "--prefill-tps", "1000", "--payload", "accounted",
                                 "--redis-url", redis_url, "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]
    assert (row["hit_tokens"], row["namespace_hit_chunks"]) == (16, 4)

    out = run.invoke(cli_app(), ["inspect", "--namespace", "lay", "--verify", "--redis-url", redis_url, "--json"])
    assert out.exit_code == 0, out.output
    group, = json.loads(out.stdout)["groups"]
    assert group["integrity"] == {"other_layout": [hexes[4]], "unreachable": sorted(hexes[4:])}

    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, tokens)))
    mapped = ["inspect", "--tokens", str(ids), *base, "--json"]
    for extra, hit, where in (([], 16, 4), (["--kv-dtype", "fp8"], 0, 0), (["--model", TINY.model_id], 16, 4)):
        out = run.invoke(cli_app(), mapped + extra)
        assert out.exit_code == 0, out.output
        m, = json.loads(out.stdout)["chunk_maps"]
        assert (m["hit_tokens"], m["break_index"], m["break_reason"]) == (hit, where, "other-layout"), extra
        if where == 4:
            assert [r["status"] for r in m["rows"]] == ["hit"] * 4 + ["other-layout"] + ["unreachable"] * 8


def test_an_fp8_chunk_whose_scale_was_overwritten_is_never_reused(redis_url, redis_client, tmp_path):
    """warm --kv-dtype fp8 stores a 133-token prompt at chunk size 4: 33 full chunks, each payload its fp8 KV then
    its 2 x 2 float32 scales, the checksum over both. SETRANGE overwrites chunk 20's first scale (K of layer 0)
    with 1.0 on the server. By hand: replay --measure all retrieves chunks 0-19 and stops at 20 (its bytes no
    longer match the checksum): 80 hit tokens, 1 checksum failure, and the cached prefill on 80 fp8 tokens stays
    within fp8's bound (0.05); the chunk map breaks at chunk 20 ("checksum"); inspect --verify names it."""
    from test_fp8_kv import FP8_ATOL

    from kvcli.store.serde import payload_layout

    tokens = list(range(1, 134))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"token_ids": tokens}) + "\n")
    run = CliRunner()
    base = ["--model", "tiny", "--namespace", "f8", "--kv-dtype", "fp8", "--redis-url", redis_url]
    out = run.invoke(cli_app(), ["warm", str(prompts), "--chunk-size", "4", *base])
    assert out.exit_code == 0, out.output
    store = make_stores(redis_client, TINY, WarmConfig("f8", (4,), kv_dtype="fp8"))[0]
    hashes = store.chunk(np.asarray(tokens, dtype=np.uint32)).hashes
    key = store.payload_key(hashes[20])
    value = redis_client.get(key)
    scales = payload_layout(value).end  # the kv_scale tensor starts where the fp8 KV ends
    assert np.frombuffer(value[scales:scales + 4], dtype="<f4")[0] != 1.0
    redis_client.setrange(key, scales, np.float32(1.0).tobytes())

    out = run.invoke(cli_app(), ["replay", str(prompts), "--chunk-sizes", "4", *base, "--measure", "all", "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]
    assert (row["hit_tokens"], row["checksum_failures"], row["namespace_hit_chunks"]) == (80, 1, 20)
    assert 0 < row["max_logit_diff"] <= FP8_ATOL

    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, tokens)))
    out = run.invoke(cli_app(), ["inspect", "--tokens", str(ids), "--chunk-size", "4", *base, "--json"])
    assert out.exit_code == 0, out.output
    m, = json.loads(out.stdout)["chunk_maps"]
    assert (m["hit_tokens"], m["break_index"], m["break_reason"]) == (80, 20, "checksum")
    out = run.invoke(cli_app(), ["inspect", "--namespace", "f8", "--verify", "--redis-url", redis_url, "--json"])
    group, = json.loads(out.stdout)["groups"]
    assert group["integrity"]["checksum_failures"] == [hashes[20].hex()]
