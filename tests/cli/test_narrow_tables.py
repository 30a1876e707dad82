"""Tables at 80 columns: every number and every name is printed whole; a table too wide is split by
columns (its first column repeated), and only a name wider than the screen on its own is folded over lines."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.live.warm import WarmConfig, warm
from kvcli.model.llama import build_model
from kvcli.traces.request import Request
from kvcli.units import fmt_bytes

NARROW = {"COLUMNS": "80"}
BOX = "│┃║┆"


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def _check_width(text: str) -> None:
    lines = text.splitlines()
    assert "…" not in text and "..." not in text
    table_lines = [line for line in lines if any(c in line for c in BOX + "─━")]
    assert table_lines and max(len(line) for line in table_lines) <= 80, max(lines, key=len)


def _cells(text: str, column: int) -> list[str]:
    """The text of one column of every table row (folded cells come back as several entries)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.replace("┃", "│").split("│")]
        if len(parts) > column + 2:
            out.append(parts[column + 1])
    return out


def test_replay_at_80_columns(redis_url):
    trace = "".join(json.dumps({"token_ids": list(range(1, n))}) + "\n" for n in (5000, 5200, 300))
    # --jobs 1: this process alone (worker processes give the same report, so the same table: test_parallel)
    base = ["replay", "-", "--redis-url", redis_url, "--measure", "0", "--prefill-tps", "1000",
            "--payload", "accounted", "--model", "llama-3-8b", "--jobs", "1"]
    out = CliRunner().invoke(app, base, input=trace, env=NARROW)
    assert out.exit_code == 0, out.output
    _check_width(out.stdout)
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and lines[0].startswith("answer: ")  # the answer first (its verdict: timed)
    # the compact table: every chunk size side by side, in one table
    (head,) = [line for line in lines if line.startswith("chunk size")]
    assert re.findall(r"\d+", head) == ["16", "64", "256", "1024"]
    doc = json.loads(CliRunner().invoke(app, base + ["--json"], input=trace).stdout)
    for row in doc["traces"][0]["per_chunk_size"]:
        for text in (fmt_bytes(row["payload_bytes_accounted"]), f"{100 * row['hit_token_ratio']:.1f}%"):
            assert text in out.stdout, text
    # every row (--full): four chunk-size columns do not fit in 80 (the curve rows' "4.0 MiB / 1,024 tok" cells
    # are the widest): the table is split, each part repeating the "chunk size" column
    full = CliRunner().invoke(app, base + ["--full"], input=trace, env=NARROW)
    assert full.exit_code == 0, full.output
    _check_width(full.stdout)
    assert full.stdout.startswith("answer: ")  # its verdict may differ: overheads are timed in each run
    assert sum(line.startswith("┃ chunk size") for line in full.stdout.splitlines()) >= 2
    for row in doc["traces"][0]["per_chunk_size"]:
        for text in (f"{row['prompt_tokens']:,}", f"{row['hit_tokens']:,}", fmt_bytes(row["payload_bytes_accounted"]),
                     f"{100 * row['hit_token_ratio']:.1f}%"):
            assert text in full.stdout, text


def test_inspect_and_purge_print_whole_names_at_80_columns(redis_url, redis_client, model):
    long_name = "tenant-" + "x" * 90  # wider than the screen: folded, every character kept
    names = ["replay-1796043216-28774-c02fcc", long_name]
    for ns in names:
        warm(redis_client, [Request("r", np.arange(1, 40, dtype=np.uint32))], model, WarmConfig(ns, (16,)))
    out = CliRunner().invoke(app, ["inspect", "--redis-url", redis_url], env=NARROW)
    assert out.exit_code == 0, out.output
    _check_width(out.stdout)
    first = "".join(_cells(out.stdout, 0))
    assert names[0] in first and long_name in first
    assert "kvcli/tiny@seed0:fp32" in out.stdout
    res = CliRunner().invoke(app, ["purge", "--namespace", names[0], "--redis-url", redis_url], env=NARROW)
    assert res.exit_code == 2 and f"4 kvcli keys in namespace '{names[0]}'" in res.stderr
    assert redis_client.dbsize() == 8


def test_warm_and_chunk_map_at_80_columns(redis_url, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"token_ids": list(range(1, 3000))}) + "\n")
    args = ["warm", str(prompts), "--model", "tiny", "--chunk-size", "16,64,256,1024", "--namespace",
            "a-fairly-long-namespace-name", "--redis-url", redis_url]
    out = CliRunner().invoke(app, args, env=NARROW)
    assert out.exit_code == 0, out.output
    _check_width(out.stdout)
    assert "a-fairly-long-namespace-name" in out.stdout and "kvcli/tiny@seed0:fp32" in out.stdout
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 40))))
    out = CliRunner().invoke(app, ["inspect", "--tokens", str(tokens), "--model", "tiny", "--chunk-size", "16",
                                   "--namespace", "a-fairly-long-namespace-name", "--redis-url", redis_url],
                             env=NARROW)
    assert out.exit_code == 0, out.output
    _check_width(out.stdout)
    hashes = _cells(out.stdout, 1)
    assert all(len(h) == 16 for h in hashes if h not in ("hash", "")), hashes


def test_route_at_80_columns():
    trace = "".join(json.dumps({"token_ids": list(range(1, 600)), "timestamp": t}) + "\n" for t in range(6))
    out = CliRunner().invoke(app, ["route", "-", "--chunk-size", "16", "--prefill-tps", "1000", "--no-count-rtt",
                                   "-p", "all"], input=trace, env=NARROW)
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stdout.splitlines() if "─" in line or line.startswith(" ")]
    assert max(len(line) for line in lines) <= 80 and "…" not in out.stdout
    for policy in ("round-robin", "least-loaded", "cache-manager", "cache-aware"):
        assert sum(line.split()[:1] == [policy] for line in out.stdout.splitlines()) >= 3


def test_inspect_parts_repeat_namespace_model_and_chunk_size(redis_url, redis_client, model):
    for ns in ("replay-1796043216-28774-c02fcc", "fleet"):
        warm(redis_client, [Request("r", np.arange(1, 40, dtype=np.uint32))], model, WarmConfig(ns, (16,)))
    out = CliRunner().invoke(app, ["inspect", "--redis-url", redis_url], env=NARROW)
    assert out.exit_code == 0, out.output
    _check_width(out.stdout)
    parts = out.stdout.count("kvcli keys: 8; other keys: 0")  # the title, once per part
    heads = [line for line in out.stdout.splitlines() if line.startswith("┃ namespace")]
    assert parts == len(heads) > 1
    assert all(line.split("┃")[2].strip() == "model" and line.split("┃")[3].strip() == "chunk" for line in heads)
    rows = [line for line in out.stdout.splitlines() if line.startswith("│ fleet")]
    assert len(rows) == parts and all("kvcli/tiny@seed0:fp32" in line and "│    16 │" in line for line in rows)
