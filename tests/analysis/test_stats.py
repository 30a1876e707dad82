"""kvcli stats: hand-computed statistics of a tiny token-id trace, the shared runs partitioning the shared tokens,
agreement with replay's radix upper bound on the sample traces, and the command's text and JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.analysis.stats import trace_stats
from kvcli.cli.app import app
from kvcli.traces.request import Request

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
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
                                               "saved_tokens": 16, "cache_salt": "", "model": "",
                                               "first_words": None}


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


def test_stats_shows_first_words_of_a_mooncake_trace_of_text_rows(tmp_path):
    # text_input is one user message; cl100k ChatML, each piece encoded as text: "<|im_start|>user\n" is 8 tokens
    # ("<", "|", "im", "_start", "|", ">", "user", "\n"), "Where is my order?" 5; the two rows differ after them
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ({"text_input": "Where is my order? It is late."},
                                                           {"text_input": "Where is my order? Please hurry."})))
    out = CliRunner().invoke(app, ["stats", str(path), "--json"])
    assert out.exit_code == 0, out.output
    (trace,) = json.loads(out.stdout)["traces"]
    assert trace["format"] == "mooncake"
    assert trace["top_shared_prefixes"] == [{"start_tokens": 0, "run_tokens": 13, "prefix_tokens": 13, "requests": 1,
                                             "saved_tokens": 13, "cache_salt": "", "model": "",
                                             "first_words": "<|im_start|>user Where is my order?"}]
    # a first row of token ids (a payload's prompt list) is no text: no words made up from its ids
    ids = tmp_path / "ids.jsonl"
    ids.write_text("".join(json.dumps({"payload": {"prompt": [5, 6, 7, k]}}) + "\n" for k in (8, 9)))
    out = CliRunner().invoke(app, ["stats", str(ids), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["traces"][0]["top_shared_prefixes"] == [
        {"start_tokens": 0, "run_tokens": 3, "prefix_tokens": 3, "requests": 1, "saved_tokens": 3, "cache_salt": "",
         "model": "", "first_words": None}]


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
                                                  "model": "", "first_words": None}


def test_stats_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"token_ids": [1]}\n{"token_ids": [-1]}\n')
    out = CliRunner().invoke(app, ["stats", str(bad)])
    assert out.exit_code == 2
    assert out.stderr == f"kvcli: error: {bad}:2: token_ids[0] = -1 is not an integer in [0, 2**32)\n"


def _hash_id_trace(path: Path, prompts: list[list[int]], block: int) -> Path:
    """A hash-id trace (``hash-ids`` format: ``block_size`` on each record) of whole blocks."""
    path.write_text("".join(json.dumps({"block_size": block, "input_length": block * len(ids), "hash_ids": ids})
                            + "\n" for ids in prompts))
    return path


def test_stats_holds_at_most_max_tokens_refusing_before_it_makes_them(tmp_path):
    """Blocks of 16 tokens, [1, 2] then [1, 3]: the second request may make 32 more tokens after the first's 32, so
    --max-tokens 64 reads the trace (48 distinct tokens held in the end) and 63 refuses it, naming the record."""
    trace = _hash_id_trace(tmp_path / "h.jsonl", [[1, 2], [1, 3]], 16)
    ok = CliRunner().invoke(app, ["stats", str(trace), "--max-tokens", "64", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["traces"][0]["shared_prefix_tokens"] == 16
    refused = CliRunner().invoke(app, ["stats", str(trace), "--max-tokens", "63"])
    assert (refused.exit_code, refused.stderr) == (2, (
        f"kvcli: error: {trace}:2: 32 prompt tokens after 32 distinct ones held would pass --max-tokens 63 (stats "
        "holds each distinct token once, 4 bytes); raise --max-tokens to read this trace\n"))
    zero = CliRunner().invoke(app, ["stats", str(trace), "--max-tokens", "0"])
    assert (zero.exit_code, zero.stderr) == (2, "kvcli: error: --max-tokens must be an integer >= 1, got 0\n")


def test_the_cli_default_is_the_librarys():
    import inspect

    from kvcli.analysis.stats import MAX_TOKENS
    from kvcli.cli.stats import stats

    assert inspect.signature(stats).parameters["max_tokens"].default == MAX_TOKENS == 134_217_728


# kvcli stats in this process, then its peak resident memory in bytes on stderr: VmHWM, the high-water mark of this
# process image (ru_maxrss would keep the forking parent's, the pytest worker's, across exec)
_PEAK = """
import sys
from kvcli.__main__ import main
sys.argv = ["kvcli", "stats", *sys.argv[1:]]
try:
    main()
finally:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print("peak", kib * 1024, file=sys.stderr)
"""


def _stats_peak(*args) -> tuple[int, str, int]:
    done = subprocess.run([sys.executable, "-c", _PEAK, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    lines = done.stderr.strip().splitlines()
    return done.returncode, "\n".join(lines[:-1]), int(lines[-1].split()[1])


def test_a_small_hash_id_file_cannot_make_stats_hold_gigabytes(tmp_path):
    """One Mooncake record of 270,000 ids (2 MB) stands for 138,240,000 tokens: refused before any is made, with
    the trace's bytes and little more in memory. One of 100,000 ids (51,200,000 tokens, 205 MB of token ids) is read
    holding its tokens once in the radix and once while they are inserted: under 700 MB at the peak (the whole
    trace's synthesized tokens kept besides, and 8-byte temporaries of every token, took 1.3 GB)."""
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"timestamp": 0, "input_length": 512 * 270_000, "hash_ids": list(range(270_000))}))
    rc, err, peak = _stats_peak(big)
    assert (rc, err) == (2, f"kvcli: error: {big}:1: 138,240,000 prompt tokens after 0 distinct ones held would pass "
                            "--max-tokens 134,217,728 (stats holds each distinct token once, 4 bytes); raise "
                            "--max-tokens to read this trace")
    assert peak < 300e6
    fits = tmp_path / "fits.jsonl"
    fits.write_text(json.dumps({"timestamp": 0, "input_length": 512 * 100_000, "hash_ids": list(range(100_000))}))
    rc, err, peak = _stats_peak(fits, "--json")
    assert rc == 0, err
    assert peak < 700e6
