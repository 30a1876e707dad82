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

from kvcli.costcurve import CostCurve
from kvcli.errors import BadInputError
from kvcli.inspection import inspect_cache
from kvcli.model import build_model
from kvcli.replay import ReplayConfig, Replayer
from kvcli.store import chunk_metadata, chunk_payload, parse_metadata
from kvcli.tokenize import get_tokenizer
from kvcli.traces import Request
from kvcli.warm import WarmConfig, make_stores, model_spec, read_prompts, warm

TINY = model_spec("tiny")


def cli_app() -> typer.Typer:
    """kvcli's app when cli.py registers the cache commands, else a local app with them."""
    from kvcli import cli, cli_cache

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
    assert TINY.kv_shape == (2, 2, 2, 32) and TINY.dtype == torch.float32


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
    assert out.hit_tokens == 112 and out.prompt_tokens == 131
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
    client = redis.Redis.from_url(small_server(make_server, 300_000))  # noeviction: writes fail when full
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
        assert meta == payload  # no half-written chunk
        assert meta == sorted(meta, reverse=True)  # present chunks form a prefix: no gap
        written += sum(meta)
    assert 0 < written == result.total("chunks_written") < 128
    assert client.dbsize() == 2 * written


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
