"""kvcli warm against real (embedded) Redis servers and the tiny model: exact counts, bytes and hits."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import redis
import torch
import typer
from typer.testing import CliRunner

from kvcli.errors import BadInputError
from kvcli.live.inspect import inspect_cache
from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.costcurve import CostCurve
from kvcli.model.llama import build_model
from kvcli.model.presets import model_spec
from kvcli.model.tokenize import get_tokenizer
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.store.chunkstore import chunk_metadata, chunk_payload
from kvcli.store.layout import parse_metadata
from kvcli.traces.prompts import read_prompts
from kvcli.traces.request import Request
from kvcli.units import torch_dtype

TINY = model_spec("tiny")


def cli_app() -> typer.Typer:
    """kvcli's app when cli.py registers the cache commands, else a local app with them."""
    from kvcli.cli import app as cli
    from kvcli.cli import cache as cli_cache

    names = {c.name for c in cli.app.registered_commands}
    if {"warm", "inspect", "purge"} <= names:
        return cli.app
    app = typer.Typer()
    for name in ("warm", "inspect", "purge"):
        app.command(name)(cli.handle_errors(getattr(cli_cache, name)))
    return app


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def req(tokens, rid="r") -> Request:
    return Request(rid, np.asarray(tokens, dtype=np.uint32), source=f"test:{rid}")


def toks(a: int, b: int) -> list[int]:
    """Token ids a..b inclusive."""
    return list(range(a, b + 1))


# 70, 40, 16 and 5 tokens: 4 + 2 + 1 + 0 = 7 full chunks of 16 = 112 tokens; the 16-token prompt is the first
# chunk of the 70-token one, so 6 distinct chunks are written.
PROMPTS = [req(toks(1, 70), "a"), req(toks(1000, 1039), "b"), req(toks(1, 16), "c"), req(toks(500, 504), "d")]


def test_model_spec_names_the_built_model(model):
    assert TINY.model_id == model.model_id == "kvcli/tiny@seed0:fp32"
    assert TINY.kv_shape == (2, 2, 2, 32) and TINY.dtype == "float32"  # a name: no torch needed to know it
    assert torch_dtype(TINY.dtype) == model.spec.dtype == torch.float32


def test_value_helpers_write_what_store_writes(redis_client, model):
    """chunk_metadata/chunk_payload (used by warm) produce byte for byte what ChunkStore.store writes."""
    store = make_stores(redis_client, TINY, WarmConfig("guard", (16,)))[0]
    tokens = np.arange(1, 33, dtype=np.uint32)
    _, kv = model.prefill(tokens)
    store.store(tokens, kv)
    prompt = store.chunk(tokens)
    for k in (0, 1):
        stored_meta = redis_client.get(store.meta_key(prompt.hashes[k]))
        value, checksum = chunk_payload(store, kv[:, :, :, 16 * k:16 * (k + 1)])
        assert bytes(value) == redis_client.get(store.payload_key(prompt.hashes[k]))
        created = parse_metadata(stored_meta).created
        assert chunk_metadata(store, prompt, k, checksum, created) == stored_meta


def test_warm_then_replay_hits_exactly_the_warmed_full_chunks(redis_client, model):
    result = warm(redis_client, PROMPTS, model, WarmConfig("w", (16,)))
    assert result.per_size[0].full_chunks == 7
    assert result.total("chunks_written") == 6 and result.total("chunks_present") == 1
    replay = Replayer(redis_client, model, CostCurve.from_tokens_per_second(1e4), "cl100k_base",
                      ReplayConfig(chunk_sizes=(16,), namespace="w", measure=None))
    out = replay.replay("prompts", list(PROMPTS)).per_chunk_size[0]
    # 7 full chunks = 112 tokens hit; the 16-token prompt hits entirely and still computes its last token: 111
    assert out.chunks_hit == 7 and out.hit_tokens == 111 and out.prompt_tokens == 131
    assert out.chunks_written == 0 and out.checksum_failures == 0


def test_shared_prefix_is_prefilled_once_across_prompts_and_chunk_sizes(redis_client, model):
    a = toks(1, 64)
    b = toks(1, 48) + toks(2000, 2031)  # shares 48 tokens (3 chunks of 16, no chunk of 64) with a
    result = warm(redis_client, [req(a, "a"), req(b, "b")], model, WarmConfig("s", (16, 64)))
    assert result.tokens_prefilled == 64 + 32 and result.tokens_reused == 48
    by_size = {t.chunk_size: t for t in result.per_size}
    assert (by_size[16].chunks_written, by_size[16].chunks_present) == (4 + 2, 3)
    assert (by_size[64].chunks_written, by_size[64].chunks_present) == (2, 0)
    # the stored KV of b (3 chunks reused + 2 prefilled after them) equals b's full prefill
    store16 = make_stores(redis_client, TINY, WarmConfig("s", (16,)))[0]
    got = store16.retrieve(np.asarray(b, dtype=np.uint32))
    _, full = model.prefill(np.asarray(b, dtype=np.uint32))
    assert got.hit_tokens == 80
    torch.testing.assert_close(got.kv, full, rtol=1e-4, atol=1e-5)


def test_second_run_writes_nothing_and_dry_run_equals_the_real_run(redis_client, model):
    config = WarmConfig("d", (16, 32))
    dry = warm(redis_client, PROMPTS, None, WarmConfig("d", (16, 32), dry_run=True), spec=TINY)
    assert redis_client.dbsize() == 0
    real = warm(redis_client, PROMPTS, model, config)
    assert dry.per_size == real.per_size
    assert real.total("bytes") == dry.total("bytes") == (
        real.total("payload_bytes") + real.total("header_bytes") + real.total("metadata_bytes"))
    # 6 + 3 distinct chunks of 16 and 32 tokens, 1,024 KV bytes per token: payload and metadata objects each
    assert real.total("objects_written") == 2 * (6 + 3) == redis_client.dbsize()
    assert real.total("payload_bytes") == 1024 * (6 * 16 + 3 * 32)
    again = warm(redis_client, PROMPTS, model, config)
    assert again.total("objects_written") == 0 and again.tokens_prefilled == 0
    assert again.total("chunks_present") == 7 + 3


def test_ttl_expires_metadata_and_payload_together(redis_client, model):
    warm(redis_client, PROMPTS[:1], model, WarmConfig("t", (16,), ttl=1))
    ttls = [redis_client.pttl(k) for k in redis_client.scan_iter("kvcli:*")]
    assert len(ttls) == 8 and all(0 < t <= 1000 for t in ttls)
    deadline = time.monotonic() + 10
    while redis_client.dbsize() and time.monotonic() < deadline:
        time.sleep(0.2)
        list(redis_client.scan_iter("kvcli:*"))  # touching expired keys removes them
    assert not [g for g in inspect_cache(redis_client).groups if g.namespace == "t" and g.chunks]
    replay = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1e4), "cl100k_base",
                      ReplayConfig(chunk_sizes=(16,), namespace="t", measure=0),
                      spec=TINY)
    assert replay.replay("p", PROMPTS[:1]).per_chunk_size[0].hit_tokens == 0


def small_server(make_server, room: int, **config) -> str:
    """A private server whose maxmemory leaves ``room`` bytes above what it uses empty."""
    url = make_server(**config)
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + room)
    return url


def test_out_of_memory_stops_cleanly_with_no_gap(make_server, model):
    client = redis.Redis.from_url(small_server(make_server, 400_000))  # noeviction: writes fail when full
    prompts = [req(np.arange(i * 10000, i * 10000 + 512), str(i)) for i in range(4)]  # 4 x 32 chunks of 16 KiB
    result = warm(client, prompts, model, WarmConfig("o", (16,), batch_chunks=4))
    assert result.preflight.fits is False and "does not fit" in result.preflight.message
    assert "OOM" in result.stopped or "memory" in result.stopped
    store = make_stores(client, TINY, WarmConfig("o", (16,)))[0]
    written = 0
    for p in prompts:
        hashes = store.chunk(p.token_ids).hashes
        meta = [client.exists(store.meta_key(h)) for h in hashes]
        payload = [client.exists(store.payload_key(h)) for h in hashes]
        assert meta == payload, result.stopped  # no half-written chunk
        assert meta == sorted(meta, reverse=True)  # present chunks form a prefix: no gap
        written += sum(meta)
    assert 0 < written == result.total("chunks_written") < 128, (result.stopped, result.preflight)
    assert client.dbsize() == 2 * written
    # the stop names the prompt and the refused batch, never redis-py's echo of the value (<memory at 0x...>)
    for p in prompts:
        has = [client.exists(store.meta_key(h)) for h in store.chunk(p.token_ids).hashes]
        if not all(has):
            k = has.index(0)
            break
    assert "<memory at" not in result.stopped
    assert f"the batch of chunks {k}-{k + 3} (tokens {16 * k}-{16 * (k + 4)}) of {p.source} at chunk size 16: OOM" \
        in result.stopped


def test_token_outside_the_vocabulary_is_refused_before_any_write(redis_client, model):
    with pytest.raises(BadInputError, match="vocabulary"):
        warm(redis_client, [req(toks(1, 16)), req([200_000] * 16, "x")], model, WarmConfig("v", (16,)))
    assert redis_client.dbsize() == 0


def test_read_prompts_lines_jsonl_and_stdin(tmp_path):
    import io

    tok = get_tokenizer("cl100k_base")
    lines = tmp_path / "prompts.txt"
    lines.write_text("You are terse.\n\n  Translate to French:\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "Hello"}) + "\n" + json.dumps(
        {"messages": [{"role": "system", "content": "Be brief."}], "cache_salt": "acme"}) + "\n")
    got = read_prompts([str(lines), str(jsonl), "-"], stdin=io.StringIO("from stdin\n"))
    assert [list(r.token_ids) for r in got] == [
        list(tok.encode("You are terse.")), list(tok.encode("  Translate to French:")), list(tok.encode("Hello")),
        list(tok.encode_chat([{"role": "system", "content": "Be brief."}])), list(tok.encode("from stdin"))]
    assert [r.source for r in got] == [f"{lines}:1", f"{lines}:3", f"{jsonl}:1", f"{jsonl}:2", "<stdin>:1"]
    assert got[3].cache_salt == "acme"
    with pytest.raises(BadInputError, match="no such file"):
        read_prompts([str(tmp_path / "missing.txt")])


def test_cli_warm_dry_run_then_real_then_again(redis_url, tmp_path):
    prompts = tmp_path / "system.txt"
    prompts.write_text("You are a helpful assistant. Answer briefly and cite sources when you can.\n")
    args = ["warm", str(prompts), "--model", "tiny", "--chunk-size", "4,8", "--namespace", "cli",
            "--redis-url", redis_url]
    runner = CliRunner()
    dry = runner.invoke(cli_app(), args + ["--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    real = runner.invoke(cli_app(), args + ["--json"])
    assert real.exit_code == 0, real.output
    dry_doc, real_doc = json.loads(dry.stdout), json.loads(real.stdout)
    assert dry_doc["totals"] == real_doc["totals"] and real_doc["totals"]["objects_written"] > 0
    again = runner.invoke(cli_app(), args, env={"COLUMNS": "200"})
    assert again.exit_code == 0 and "wrote 0 objects" in again.stdout and "already present" in again.stdout
    stdin = runner.invoke(cli_app(), ["warm", "-", "--model", "tiny", "--chunk-size", "4", "--namespace", "cli",
                                      "--redis-url", redis_url, "--json"], input=prompts.read_text())
    assert stdin.exit_code == 0 and json.loads(stdin.stdout)["totals"]["objects_written"] == 0


def test_cli_warm_strict_refuses_then_oom_exits_3_with_the_summary(make_server, tmp_path):
    url = small_server(make_server, 300_000)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"token_ids": list(range(i * 1000, i * 1000 + 512))})
                                 for i in range(4)) + "\n")
    args = ["warm", str(prompts), "--model", "tiny", "--chunk-size", "16", "--redis-url", url]
    res = CliRunner().invoke(cli_app(), args + ["--strict"])
    assert res.exit_code == 3 and "does not fit" in res.stderr
    assert redis.Redis.from_url(url).dbsize() == 0
    res = CliRunner().invoke(cli_app(), args, env={"COLUMNS": "200"})
    assert res.exit_code == 3
    assert res.stderr.index("does not fit") < res.stderr.index("refused")  # said before writing, then the stop
    assert "stopped" in res.stdout and "does not fit" in res.stdout


def test_rewarm_writes_a_half_present_chunk_whole_with_one_ttl(redis_client, model):
    """A chunk that lost its payload (or its metadata) is written whole: both keys SET, the same TTL on both, the
    metadata's checksum that of the payload beside it; chunks that are present keep their value and no TTL."""
    from kvcli.store.judge import USABLE, judge

    warm(redis_client, PROMPTS[:1], model, WarmConfig("h", (16,)))  # 70 tokens: 4 chunks, no TTL
    store = make_stores(redis_client, TINY, WarmConfig("h", (16,)))[0]
    h = store.chunk(PROMPTS[0].token_ids).hashes
    redis_client.delete(store.payload_key(h[1]), store.meta_key(h[3]))
    kept = {k: redis_client.get(k) for x in (h[0], h[2]) for k in (store.meta_key(x), store.payload_key(x))}
    dry = warm(redis_client, PROMPTS[:1], None, WarmConfig("h", (16,), ttl=100, dry_run=True), spec=TINY)
    real = warm(redis_client, PROMPTS[:1], model, WarmConfig("h", (16,), ttl=100))
    assert dry.per_size == real.per_size
    t = real.per_size[0]
    assert (t.chunks_written, t.chunks_present, t.objects_written, t.payload_objects) == (2, 2, 4, 2)
    assert (real.tokens_reused, real.tokens_prefilled) == (16, 48)  # chunk 0 reused, chunks 1-3 prefilled
    for k in (1, 3):
        m, p_ = redis_client.get(store.meta_key(h[k])), redis_client.get(store.payload_key(h[k]))
        assert judge(m, p_) == USABLE and parse_metadata(m).stored == "real"
        assert 0 < redis_client.pttl(store.meta_key(h[k])) <= 100_000
        assert 0 < redis_client.pttl(store.payload_key(h[k])) <= 100_000
    assert {k: redis_client.get(k) for k in kept} == kept
    assert {redis_client.pttl(k) for k in kept} == {-1}  # present chunks: untouched, no TTL given
    (g,) = inspect_cache(redis_client, verify=True).groups
    assert (g.chunks, g.metadata_entries, g.payload_objects, dict(g.issues)) == (4, 4, 4, {})
    again = warm(redis_client, PROMPTS[:1], model, WarmConfig("h", (16,), ttl=100))
    assert again.total("objects_written") == 0 and again.total("chunks_present") == 4


def test_accounted_metadata_is_not_present_and_gets_a_real_payload(redis_client, model):
    """replay --payload accounted leaves metadata with no payload behind it: warm writes those chunks whole."""
    from dataclasses import replace

    from kvcli.store.chunkstore import ChunkStore
    from kvcli.store.judge import USABLE, judge

    real_store = make_stores(redis_client, TINY, WarmConfig("acc", (16,)))[0]
    accounted = ChunkStore(redis_client, replace(real_store.config, payload="accounted"))
    tokens = PROMPTS[0].token_ids  # 4 full chunks
    accounted.store(tokens, None)
    h = real_store.chunk(tokens).hashes
    assert [b'"stored":"accounted"' in redis_client.get(real_store.meta_key(x)) for x in h] == [True] * 4
    assert redis_client.dbsize() == 4
    dry = warm(redis_client, PROMPTS[:1], None, WarmConfig("acc", (16,), dry_run=True), spec=TINY)
    assert (dry.total("chunks_written"), dry.total("chunks_present"), dry.total("objects_written")) == (4, 0, 8)
    real = warm(redis_client, PROMPTS[:1], model, WarmConfig("acc", (16,)))
    assert real.per_size == dry.per_size and real.tokens_prefilled == 64 and real.tokens_reused == 0
    for x in h:
        raw = redis_client.get(real_store.meta_key(x))
        assert parse_metadata(raw).stored == "real"
        assert judge(raw, redis_client.get(real_store.payload_key(x)), real_store.chunk(tokens).digests[h.index(x)],
                     expect=real_store.expected) == USABLE
    assert real_store.retrieve(tokens).hit_tokens == 64
    assert warm(redis_client, PROMPTS[:1], model, WarmConfig("acc", (16,))).total("objects_written") == 0


def test_warm_reports_the_servers_evictions(make_server, redis_client, model, tmp_path):
    assert warm(redis_client, PROMPTS, model, WarmConfig("e", (16,))).evicted_keys == 0
    assert warm(redis_client, PROMPTS, None, WarmConfig("e", (16,), dry_run=True), spec=TINY).evicted_keys is None
    url = small_server(make_server, 1_000_000, **{"maxmemory-policy": "allkeys-lru"})  # < a third of the chunks
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"token_ids": list(range(i * 1000, i * 1000 + 512))})
                                 for i in range(4)) + "\n")
    res = CliRunner().invoke(cli_app(), ["warm", str(prompts), "--model", "tiny", "--chunk-size", "16",
                                         "--redis-url", url, "--json"])
    assert res.exit_code == 0, res.output
    evicted = redis.Redis.from_url(url).info("stats")["evicted_keys"]  # a fresh server: all of them this run's
    assert evicted > 0 and json.loads(res.stdout)["evicted_keys"] == evicted
    assert (f"warning: the server evicted {evicted:,} keys during this warm; what was written may already be gone"
            in res.stderr)


def test_duplicate_chunk_sizes_are_counted_once(redis_url, redis_client, model, tmp_path):
    assert WarmConfig("dup", (16, 64, 16)).chunk_sizes == (16, 64)
    prompts = tmp_path / "p.txt"
    prompts.write_text("You are a helpful assistant. Answer briefly and cite sources when you can. " * 3 + "\n")
    runner = CliRunner()
    base = ["warm", str(prompts), "--model", "tiny", "--namespace", "dup", "--redis-url", redis_url, "--json"]
    once = json.loads(runner.invoke(cli_app(), base + ["--chunk-size", "16", "--dry-run"]).stdout)
    res = runner.invoke(cli_app(), base + ["--chunk-size", "16,16", "--dry-run"])
    assert res.exit_code == 0, res.output
    twice = json.loads(res.stdout)
    assert len(twice["per_size"]) == 1 and twice["per_size"] == once["per_size"]
    chunks = len(get_tokenizer("cl100k_base").encode(prompts.read_text().rstrip("\n"))) // 16
    assert twice["totals"] == once["totals"] and once["totals"]["objects_written"] == 2 * chunks > 0
    res = runner.invoke(cli_app(), base + ["--chunk-size", "16,16"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["totals"] == once["totals"] and redis_client.dbsize() == 2 * chunks


def test_directory_of_txt_prompt_files(tmp_path, redis_url):
    tok = get_tokenizer("cl100k_base")
    d = tmp_path / "prompts"
    d.mkdir()
    (d / "b.txt").write_text("second file\n")
    (d / "a.txt").write_text("[INST] be brief [/INST]\n\nsecond line\n")  # .txt: lines, even if it starts with [
    (d / "c.jsonl").write_text(json.dumps({"prompt": "from a trace"}) + "\n")
    (d / "README.md").write_text("notes, skipped\n")
    (d / ".hidden.txt").write_text("skipped\n")
    got = read_prompts([str(d)])
    assert [list(r.token_ids) for r in got] == [list(tok.encode(t)) for t in (
        "[INST] be brief [/INST]", "second line", "second file", "from a trace")]
    assert [r.source for r in got] == [f"{d / 'a.txt'}:1", f"{d / 'a.txt'}:3", f"{d / 'b.txt'}:1", f"{d / 'c.jsonl'}:1"]
    only_txt = tmp_path / "only_txt"
    only_txt.mkdir()
    (only_txt / "system.txt").write_text("You are a helpful assistant.\n")
    res = CliRunner().invoke(cli_app(), ["warm", str(only_txt), "--model", "tiny", "--chunk-size", "4",
                                         "--dry-run", "--json", "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["prompts"] == 1
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "README.md").write_text("x\n")
    with pytest.raises(BadInputError, match="no prompt"):
        read_prompts([str(empty)])


def test_summary_says_already_present_only_when_it_is_true(make_server, redis_url, tmp_path):
    runner = CliRunner()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    res = runner.invoke(cli_app(), ["warm", str(empty), "--model", "tiny", "--redis-url", redis_url],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "wrote 0 objects, 0 B: no prompts" in res.stdout and "already present" not in res.stdout
    short = tmp_path / "short.txt"
    short.write_text("hi\n")
    res = runner.invoke(cli_app(), ["warm", str(short), "--model", "tiny", "--chunk-size", "16",
                                    "--redis-url", redis_url], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "no prompt is as long as a chunk" in res.stdout, res.output
    url = small_server(make_server, 1000)  # noeviction, no room: the first batch is refused
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"token_ids": list(range(1, 65))}) + "\n")
    res = runner.invoke(cli_app(), ["warm", str(prompts), "--model", "tiny", "--chunk-size", "16",
                                    "--redis-url", url], env={"COLUMNS": "200"})
    assert res.exit_code == 3, res.output
    assert "wrote 0 objects, 0 B;" in res.stdout and "already present" not in res.stdout
    assert "stopped: the server refused" in res.stdout and "<memory at" not in res.stdout + res.stderr
    assert (f"kvcli: error: the server refused the batch of chunks 0-3 (tokens 0-64) of {prompts}:1 at chunk size "
            f"16: OOM, command not allowed when used memory > 'maxmemory'; stopped there, everything before it is "
            f"stored\n") in res.stderr
