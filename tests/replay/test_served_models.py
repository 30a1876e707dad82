"""Requests naming different served models (a base model, its LoRA adapters) never share cached blocks: replay,
explain and stats on one hand-computed trace, and the note each gives."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import read_trace
from kvcli.traces.request import hash_salt, models_note, split_hash_salt

T = list(range(1000, 1200))  # distinct token ids


def lora_trace(path: Path) -> Path:
    """r1 names the base model (80 tokens T[:80]); r2 the adapter sql-lora (T[:40] then 10 others); r3 sql-lora
    again, 121 tokens: T[:70] then 51 others. At chunk 16, r3 shares 70 tokens with r1 (4 chunks, 64 tokens) but
    only 40 with r2, the one earlier request of its own model (2 chunks, 32 tokens): it reuses 32. r2 shares 40 with
    r1 only: it reuses 0. Hit tokens 0 + 0 + 32 = 32 of 80 + 50 + 121 = 251."""
    rows = [{"id": "r1", "model": "llama-base", "token_ids": T[:80]},
            {"id": "r2", "model": "sql-lora", "token_ids": T[:40] + list(range(5000, 5010))},
            {"id": "r3", "model": "sql-lora", "token_ids": T[:70] + list(range(6000, 6051))}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_explain_reuses_only_the_adapters_own_blocks(tmp_path):
    out = CliRunner().invoke(app, ["explain", str(lora_trace(tmp_path / "lora.jsonl")), "--chunk-size", "16",
                                   "--json"])
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    per = {r["id"]: r for r in t["per_request"]}
    assert [per[r]["reused_tokens"] for r in ("r1", "r2", "r3")] == [0, 0, 32]
    assert per["r3"]["model"] == "sql-lora" and per["r3"]["best_prefix_tokens"] == 40
    # the 30 tokens r3 shares with the base model's r1 beyond r2's 40 are lost to the other model (the salt cause),
    # the 8 past r2's last full chunk (40 - 32) to the chunk boundary
    assert per["r3"]["lost_tokens_by_cause"]["cache_salt"] == 30
    assert per["r3"]["lost_tokens_by_cause"]["chunk_boundary"] == 8
    assert t["models"] == {"llama-base": 1, "sql-lora": 2}
    assert any("the trace names 2 models, 'sql-lora' (2 requests), 'llama-base' (1 request)" in n
               for n in t["notes"])
    text = CliRunner().invoke(app, ["explain", str(tmp_path / "lora.jsonl"), "--chunk-size", "16", "--request",
                                    "r2"])
    assert "its model 'sql-lora' shares only 0 of them" in " ".join(text.stdout.split())
    hashed = CliRunner().invoke(app, ["explain", str(tmp_path / "lora.jsonl"), "--chunk-size", "16", "--request",
                                      "r2", "--hash", "vllm"])
    assert "request r2 names model 'sql-lora': if that is a LoRA adapter" in " ".join(hashed.output.split())


def test_stats_count_the_models_and_share_within_each(tmp_path):
    out = CliRunner().invoke(app, ["stats", str(lora_trace(tmp_path / "lora.jsonl")), "--json"])
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    assert t["models"] == {"llama-base": 1, "sql-lora": 2}
    assert t["shared_prefix_tokens"] == 40  # r3 shares T[:40] with r2; r2 shares nothing with a sql-lora request
    assert "the trace names 2 models" in t["note"]


def test_replay_hits_only_within_a_model(tmp_path, redis_url):
    out = CliRunner().invoke(app, ["replay", str(lora_trace(tmp_path / "lora.jsonl")), "--chunk-sizes", "16",
                                   "--measure", "0", "--prefill-tps", "1000", "--payload", "accounted", "--no-curve",
                                   "--json", "--redis-url", redis_url, "--jobs", "1"])
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    (row,) = t["per_chunk_size"]
    assert (row["hit_tokens"], row["prompt_tokens"], row["upper_bound_tokens"]) == (32, 251, 40)
    assert any("the trace names 2 models" in n for n in t["notes"])


def test_a_trace_naming_one_model_hashes_as_one_naming_none(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"model": "m", "token_ids": T[:20]}) + "\n")
    (r,) = read_trace(one)
    assert r.model == "m" and r.hash_salt == "\0model=m" and models_note({"m": 1}) is None
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps({"token_ids": T[:20], "cache_salt": "s"}) + "\n")
    (r,) = read_trace(none)
    assert r.model == "" and r.hash_salt == "s"


def test_a_model_that_is_not_a_string_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"model": 3, "token_ids": T[:20]}) + "\n")
    with pytest.raises(BadInputError, match="model must be a string, not a number"):
        list(read_trace(bad))


@given(st.text(max_size=8), st.text(max_size=8).filter(lambda m: "\0model=" not in m))
def test_hash_salt_splits_back(salt, model):
    if "\0model=" in salt:
        return
    assert split_hash_salt(hash_salt(salt, model)) == (salt, model)
    assert (hash_salt(salt, model) == salt) == (model == "")
