"""``--reuse blend`` in kvcli replay and kvcli stats: a hand-made RAGPulse trace whose prefix and blend tokens are
computed by hand at three chunk sizes, replayed on a private Redis server, and the RAGPulse sample against an
independent reading of its files (ids and their lengths, no kvcli code)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.traces.ragpulse import COMPONENT_FILES

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces/ragpulse_head60/0_trace.jsonl"


def replay(redis_url, *args) -> CliRunner:
    out = CliRunner().invoke(app, ["replay", *map(str, args), "--measure", "0", "--prefill-tps", "1000",
                                   "--payload", "accounted", "--no-curve", "--redis-url", redis_url, "--jobs", "1"])
    assert out.exit_code == 0, out.output
    return out


def write_rag_trace(folder: Path) -> Path:
    """sys 1: 6 tokens; passages 10, 11: 4 each, 12: 6; questions 30: 2, 31: 3.
    r1 = 1 | 10 11 | 30 (16 tokens), r2 = 1 | 11 10 | 31 (17), r3 = 1 | 12 10 | 30 and 1 token of its own (19)."""
    lengths = {"1_sys_prompt.jsonl": {1: 6}, "2_passages.jsonl": {10: 4, 11: 4, 12: 6},
               "3_history.jsonl": {}, "4_user_input.jsonl": {30: 2, 31: 3}, "5_web_search.jsonl": {}}
    for name, key in COMPONENT_FILES:
        (folder / name).write_text("".join(json.dumps({key: i, "token_length": n}) + "\n"
                                           for i, n in lengths[name].items()))
    rows = [(1, [10, 11], [30], 16), (2, [11, 10], [31], 17), (3, [12, 10], [30], 19)]
    path = folder / "0_trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": str(t), "input_length": n, "output_length": 4, "hash_ids": {
        "sys_prompt": [1], "passages_ids": p, "history": [], "web_search": [], "user_input": q}}) + "\n"
        for t, p, q, n in rows))
    return path


def test_prefix_and_blend_tokens_by_hand_at_three_chunk_sizes(tmp_path, redis_url):
    """Every request shares only the system prompt's 6 tokens as a prefix (its passages differ at token 6):
    chunk 2: 6 a request, 4: 4, 8: 0, for r2 and r3. Blend, the tokens of units r1 (or r2) held, beyond the prefix,
    the last token excluded:
      chunk 2: r2 passages 11 and 10 (4 + 4); r3 passage 10 (4) and question 30 (2)       -> 8 + 6 = 14
      chunk 4: as at 2, and the system prompt's tokens 4..6 past the prefix (2 each)      -> 10 + 8 = 18
      chunk 8: the whole system prompt too (6 each)                                       -> 14 + 12 = 26
    Prompt tokens 16 + 17 + 19 = 52."""
    path = write_rag_trace(tmp_path)
    doc = json.loads(replay(redis_url, path, "--chunk-sizes", "2,4,8", "--reuse", "blend", "--json").stdout)
    (trace,) = doc["traces"]
    rows = {r["chunk_size"]: r for r in trace["per_chunk_size"]}
    assert {cs: (r["hit_tokens_unlimited"], r["blend"]["prefix_tokens"], r["blend"]["blend_tokens"])
            for cs, r in rows.items()} == {2: (12, 12, 14), 4: (8, 8, 18), 8: (0, 0, 26)}
    blend = rows[4]["blend"]
    assert (blend["prompt_tokens"], blend["recompute_fraction"], blend["reusable_tokens"]) == (52, 0.15, 26)
    assert blend["saved_tokens"] == pytest.approx(8 + 18 * 0.85)  # 15% of the 18 blended tokens recomputed
    assert blend["by_kind"] == {"sys_prompt": {"prompt_tokens": 18, "prefix_tokens": 8, "blend_tokens": 4},
                                "passages_ids": {"prompt_tokens": 26, "prefix_tokens": 0, "blend_tokens": 12},
                                "user_input": {"prompt_tokens": 7, "prefix_tokens": 0, "blend_tokens": 2},
                                "other": {"prompt_tokens": 1, "prefix_tokens": 0, "blend_tokens": 0}}
    text = replay(redis_url, path, "--chunk-sizes", "2,4,8", "--reuse", "blend", "--blend-recompute", "0.5").stdout
    # the compact table's rows: 14/52, 18/52, 26/52; saved (prefix + half the blend) 19/52, 17/52, 13/52
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "+ blend (any position, unbounded) 26.9% 34.6% 50.0%" in lines
    assert "prefix + blend, 50% recomputed 36.5% 32.7% 25.0%" in lines
    prefix_only = json.loads(replay(redis_url, path, "--chunk-sizes", "4", "--json").stdout)
    assert prefix_only["traces"][0]["per_chunk_size"][0]["blend"] is None


def sample_oracle() -> tuple[int, int, int]:
    """(prompt, prefix, blend) tokens of the RAGPulse sample read plainly: a request's prefix is the tokens of the
    longest run of leading ids an earlier request began with (capped at input_length - 1), its blend the tokens
    of its later ids that any earlier request held (the last token never: here the tail of 6 to 12 tokens of its
    own always ends the prompt)."""
    tokens = {}
    for name, key in COMPONENT_FILES:
        for line in (SAMPLE.parent / name).read_text().splitlines():
            row = json.loads(line)
            tokens[row[key]] = row["token_length"]
    rows = sorted((json.loads(line) for line in SAMPLE.read_text().splitlines()), key=lambda r: int(r["timestamp"]))
    prefixes, seen, total = set(), set(), [0, 0, 0]
    for row in rows:
        ids = [i for part in row["hash_ids"].values() for i in part]
        k = max((j for j in range(len(ids) + 1) if tuple(ids[:j]) in prefixes), default=0)
        total[0] += row["input_length"]
        total[1] += min(sum(tokens[i] for i in ids[:k]), row["input_length"] - 1)
        total[2] += sum(tokens[i] for i in ids[k:] if i in seen)
        prefixes.update(tuple(ids[:j]) for j in range(len(ids) + 1))
        seen.update(ids)
    return tuple(total)  # type: ignore[return-value]


def test_the_ragpulse_sample_replays_and_states_with_prefix_and_blend_figures(redis_url):
    """Every shared prefix of the sample is whole ids of 512 tokens, so chunk sizes 16 and 256 (and stats' token
    granularity) give the oracle's prefix; the blend is the oracle's at each."""
    prompt, prefix, blend = sample_oracle()
    assert (prompt, prefix, blend) == (183_037, 53_248, 35_191)
    out = replay(redis_url, SAMPLE, "--chunk-sizes", "16,256", "--reuse", "blend")
    assert "+ blend (any position, unbounded)" in out.stdout
    assert ("reuse at any position (CacheBlend; units: the trace's segments (one per hash id or part); an unbounded "
            "cache) at chunk size 256: prefix 29.1% + blend 19.2% = 48.3% of 183,037 prompt tokens reusable") in (
        " ".join(out.stdout.split()))
    doc = json.loads(replay(redis_url, SAMPLE, "--chunk-sizes", "16,256", "--reuse", "blend", "--json").stdout)
    for row in doc["traces"][0]["per_chunk_size"]:
        assert (row["prompt_tokens"], row["hit_tokens_unlimited"]) == (prompt, prefix)
        assert (row["blend"]["prefix_tokens"], row["blend"]["blend_tokens"]) == (prefix, blend)
    stats = CliRunner().invoke(app, ["stats", str(SAMPLE), "--reuse", "blend", "--json"])
    assert stats.exit_code == 0, stats.output
    (trace,) = json.loads(stats.stdout)["traces"]
    assert (trace["format"], trace["shared_prefix_tokens"]) == ("ragpulse", prefix)
    assert (trace["blend"]["prefix_tokens"], trace["blend"]["blend_tokens"]) == (prefix, blend)
    plain = CliRunner().invoke(app, ["stats", str(SAMPLE), "--json"])
    assert json.loads(plain.stdout)["traces"][0]["blend"] is None


def test_reuse_options_are_checked_before_anything_runs(tmp_path):
    path = write_rag_trace(tmp_path)
    for args, message in ((["--reuse", "all"], "--reuse must be one of prefix, blend, got 'all'"),
                          (["--blend-recompute", "0.2"], "--blend-recompute applies with --reuse blend"),
                          (["--reuse", "blend", "--blend-recompute", "-1"],
                           "--blend-recompute must be a number in [0, 1]")):
        for command in ("replay", "stats"):
            out = CliRunner().invoke(app, [command, str(path), *args])
            assert out.exit_code == 2 and out.stderr.startswith(f"kvcli: error: {message}"), (command, out.output)
