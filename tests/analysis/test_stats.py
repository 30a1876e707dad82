"""kvcli stats: hand-computed statistics of a tiny token-id trace, the shared runs partitioning the shared tokens,
agreement with replay's radix upper bound on the sample traces, and the command's text and JSON."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.analysis.stats import trace_stats
from kvcli.cli.app import app
from kvcli.traces.request import Request

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
# r1: 11 tokens; r2 shares r1's first 8 (then 20, 21, 22); r3 shares r2's first 10 (1..8, 20, 21), then 40, 41.
TINY = [{"id": "r1", "session_id": "a", "token_ids": list(range(1, 12))},
        {"id": "r2", "session_id": "a", "token_ids": list(range(1, 9)) + [20, 21, 22]},
        {"id": "r3", "session_id": "b", "token_ids": list(range(1, 9)) + [20, 21, 40, 41]}]


def write_tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY))
    return path


def requests(rows) -> list[Request]:
    return [Request(r["id"], np.array(r["token_ids"], dtype="<u4"), r.get("timestamp"), r.get("session_id"),
                    r.get("cache_salt", "")) for r in rows]


def test_tiny_trace_by_hand():
    s = trace_stats(requests(TINY))
    # lengths 11, 11, 12: p50 11; p90 at rank 0.9 * 2 = 1.8, 11 + 0.8 = 11.8; p99 11.98
    assert (s.requests, s.sessions, s.prompt_tokens, s.max_prompt_tokens) == (3, 2, 34, 12)
    assert s.percentiles == pytest.approx({50: 11.0, 90: 11.8, 99: 11.98})
    # shared: r1 0, r2 8, r3 10 -> 18 of 34
    assert (s.shared_tokens, s.shared_token_ratio) == (18, pytest.approx(18 / 34))
    # runs: tokens 0-8 reused by r2 and r3 (16 saved), tokens 8-10 reused by r3 (2 saved)
    assert [(p.start, p.end, p.requests, p.saved_tokens, p.head.tolist()) for p in s.top] == [
        (0, 8, 2, 16, list(range(1, 9))), (8, 10, 1, 2, [20, 21])]


def test_earlier_means_arrival_order_and_tenants_never_share():
    late_first = [dict(TINY[0], timestamp=2.0), dict(TINY[1], timestamp=1.0), dict(TINY[2], timestamp=3.0)]
    s = trace_stats(requests(late_first))
    assert (s.reordered, s.shared_tokens) == (2, 18)  # r2 first now: r1 shares 8, r3 shares 10 with r2
    salted = [dict(TINY[0]), dict(TINY[1], cache_salt="other"), dict(TINY[2])]
    assert trace_stats(requests(salted)).shared_tokens == 0 + 0 + 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=12))
def test_runs_partition_the_shared_tokens_which_are_the_longest_earlier_prefix(prompts):
    rows = [{"id": str(i), "token_ids": p} for i, p in enumerate(prompts)]
    s = trace_stats(requests(rows), top=10**6)

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    expected = sum(max((lcp(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts))
    assert s.shared_tokens == expected == sum(p.saved_tokens for p in s.top)


def test_stats_json_on_the_tiny_trace(tmp_path):
    out = CliRunner().invoke(app, ["stats", str(write_tiny(tmp_path)), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["command"] == "stats" and doc["granularity"].startswith("tokens")
    (trace,) = doc["traces"]
    assert {k: trace[k] for k in ("format", "requests", "sessions", "prompt_tokens", "prompt_tokens_p50",
                                  "prompt_tokens_max", "shared_prefix_tokens")} == {
        "format": "native", "requests": 3, "sessions": 2, "prompt_tokens": 34, "prompt_tokens_p50": 11.0,
        "prompt_tokens_max": 12, "shared_prefix_tokens": 18}
    assert trace["top_shared_prefixes"][0] == {"start_tokens": 0, "run_tokens": 8, "prefix_tokens": 8, "requests": 2,
                                               "saved_tokens": 16, "cache_salt": "", "first_words": None}


def test_a_trace_of_empty_prompts_has_no_shared_ratio(tmp_path):
    trace = tmp_path / "empty.jsonl"
    trace.write_text('{"token_ids": []}\n{"prompt": ""}\n')
    out = CliRunner().invoke(app, ["stats", str(trace), "--json"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["traces"]
    assert (row["prompt_tokens"], row["shared_prefix_tokens"], row["shared_prefix_token_ratio"]) == (0, 0, None)
    table = CliRunner().invoke(app, ["stats", str(trace)], env={"COLUMNS": "200"}).stdout
    assert "0.0%" not in table and table.splitlines()[4].rstrip().endswith("–" + " │")


def test_stats_text_shows_first_words_of_a_text_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the table's title starts with the trace's name: a long one would wrap the title
    path = Path("chat.jsonl")
    system = {"role": "system", "content": "You answer questions about the weather in one short line."}
    path.write_text("".join(json.dumps({"messages": [system, {"role": "user", "content": q}]}) + "\n"
                            for q in ("Rain in Paris?", "Snow in Oslo?", "Sun in Rome?")))
    out = CliRunner().invoke(app, ["stats", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "<|im_start|>system You answer questions about the weather" in out.stdout
    assert "top shared prefixes by tokens they would save" in out.stdout


def test_stats_on_the_sample_traces_agree_with_replays_upper_bound():
    out = CliRunner().invoke(app, ["stats", str(SAMPLES), "--json", "--top", "3"])
    assert out.exit_code == 0, out.output
    traces = {Path(t["trace"]).name: t for t in json.loads(out.stdout)["traces"]}
    assert len(traces) >= 11
    # replay's radix upper bound (the same radix) on these traces, chunk size 16: bailian 2,096, tokens_small 24
    assert traces["bailian_handmade.jsonl"]["shared_prefix_tokens"] == 2096
    assert traces["tokens_small.jsonl"]["shared_prefix_tokens"] == 24
    assert traces["no_reuse.jsonl"]["shared_prefix_tokens"] == 0
    mooncake = traces["mooncake_conversation_head1000.jsonl.gz"]
    assert mooncake["requests"] == 1000 and mooncake["sessions"] is None
    assert mooncake["top_shared_prefixes"][0] == {"start_tokens": 0, "run_tokens": 512, "prefix_tokens": 512,
                                                  "requests": 999, "saved_tokens": 511488, "cache_salt": "",
                                                  "first_words": None}


def test_stats_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"token_ids": [1]}\n{"token_ids": [-1]}\n')
    out = CliRunner().invoke(app, ["stats", str(bad)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {bad}:2: token_ids[0] = -1 is not an integer in [0, 2**32)\n"
