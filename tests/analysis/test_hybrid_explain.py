"""kvcli explain and replay on a hybrid model: vLLM's enlarged attention block and align-mode resumption (the
hybrid_block cause), on hand-computed traces."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.hf_tiny import tiny_config

T = list(range(1000, 1300))


def hybrid(tmp_path) -> str:
    """A config-only tiny Qwen3-Next whose vLLM attention block is 48 tokens (tests/model/test_hybridblock.py)."""
    folder = tmp_path / "hybrid"
    tiny_config("qwen3_next", layers=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_num_value_heads=8,
                linear_value_head_dim=16).save_pretrained(folder)
    return str(folder)


def write(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def explain(*args) -> dict:
    out = CliRunner().invoke(app, ["explain", *args, "--json"])
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    return t


def test_b56_vllm_resumes_48_of_168_where_the_chunk_cache_reuses_80(tmp_path):
    """r1: 90 tokens; r2: 168 tokens, its first 80 r1's. At chunk 16 kvcli's cache reuses 80 (5 chunks). vLLM's
    block is 48: r1 left a Mamba state at floor(90 / 48) * 48 = 48 only, so r2 resumes at 48; the 32 between are
    hybrid_block."""
    trace = write(tmp_path, [{"id": "r1", "token_ids": T[:90]},
                             {"id": "r2", "token_ids": T[:80] + list(range(5000, 5088))}])
    plain = explain(trace, "--chunk-size", "16")
    assert [r["reused_tokens"] for r in plain["per_request"]] == [0, 80]
    t = explain(trace, "--chunk-size", "16", "--model", hybrid(tmp_path))
    r2 = t["per_request"][1]
    assert (r2["prompt_tokens"], r2["reused_tokens"]) == (168, 48)
    assert r2["lost_tokens_by_cause"]["hybrid_block"] == 32 and r2["lost_tokens_by_cause"]["chunk_boundary"] == 0
    assert t["upper_bound_tokens"] == 80  # reused + hybrid_block: the token-granular bound is unchanged
    assert any("enlarges its attention block to 48 tokens" in n and "32 tokens the --chunk-size 16 cache reuses"
               in n for n in t["notes"])


def test_prompts_no_longer_than_a_block_never_resume(tmp_path):
    """The same 40-token prompt twice: kvcli's chunk-16 cache reuses 32 (2 chunks) of the second; vLLM keeps no
    state for a prompt shorter than its 48-token block: 0, all 32 hybrid_block; 2 of 2 requests are that short."""
    trace = write(tmp_path, [{"id": "a", "token_ids": T[:40]}, {"id": "b", "token_ids": T[:40]}])
    t = explain(trace, "--chunk-size", "16", "--model", hybrid(tmp_path))
    assert t["reused_tokens"] == 0 and t["lost_tokens_by_cause"]["hybrid_block"] == 32
    assert any("2 of 2 requests have at most 48 prompt tokens" in n for n in t["notes"])
    text = CliRunner().invoke(app, ["explain", trace, "--chunk-size", "16", "--model", hybrid(tmp_path)])
    assert "lost: hybrid block" in text.stdout
    assert "lost: hybrid block" not in CliRunner().invoke(app, ["explain", trace, "--chunk-size", "16"]).stdout


def test_a_state_left_by_any_earlier_request_counts(tmp_path):
    """r1: 100 tokens (state at 96); r2: its first 60 then others, 70 (state at 48); r3: r1's first 100 then
    others, 130. r3 shares 100 with r1: the longest boundary within 100 with a state of its prefix is 96 (r1's).
    r2 shares 60 with r1: boundary 48 holds no state of r1 (r1 kept 96 only): it resumes at 0, 48 lost."""
    trace = write(tmp_path, [{"id": "r1", "token_ids": T[:100]},
                             {"id": "r2", "token_ids": T[:60] + list(range(5000, 5010))},
                             {"id": "r3", "token_ids": T[:100] + list(range(6000, 6030))}])
    per = {r["id"]: r for r in explain(trace, "--chunk-size", "16", "--model", hybrid(tmp_path))["per_request"]}
    assert per["r2"]["reused_tokens"] == 0 and per["r2"]["lost_tokens_by_cause"]["hybrid_block"] == 48
    assert per["r3"]["reused_tokens"] == 96 and per["r3"]["lost_tokens_by_cause"]["hybrid_block"] == 0


def test_replay_notes_the_hybrid_block(tmp_path, redis_url):
    trace = write(tmp_path, [{"id": "a", "token_ids": T[:40]}, {"id": "b", "token_ids": T[:40]}])
    out = CliRunner().invoke(app, ["replay", trace, "--chunk-sizes", "16", "--model", hybrid(tmp_path), "--measure",
                                   "0", "--prefill-tps", "1000", "--payload", "accounted", "--no-curve", "--json",
                                   "--redis-url", redis_url, "--jobs", "1"])
    assert out.exit_code == 0, out.output
    (t,) = json.loads(out.stdout)["traces"]
    assert t["per_chunk_size"][0]["hit_tokens"] == 32  # kvcli's store: a state with every chunk
    assert any("enlarges its attention block to 48 tokens" in n and "2 of 2 requests have at most 48" in n
               for n in t["notes"])
