"""kvcli export: anonymized hash-id traces that replay to exactly the original's hit tokens (private Redis)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.traces.export import BlockNumbering, export_records
from kvcli.traces.request import Request

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def run(*args) -> CliRunner:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


def hits(redis_url, trace, sizes: str) -> dict[int, int]:
    # --jobs 1: this process alone (worker processes start in seconds, and give the same report: test_parallel)
    out = run("replay", trace, "--chunk-sizes", sizes, "--measure", "0", "--prefill-tps", "1000", "--payload",
              "accounted", "--no-curve", "--no-upper-bound", "--json", "--redis-url", redis_url, "--jobs", "1")
    (result,) = json.loads(out.stdout)["traces"]
    return {r["chunk_size"]: r["hit_tokens"] for r in result["per_chunk_size"]}


@pytest.mark.parametrize("sample, fmt, block, sizes", [
    ("chat_shared_system.jsonl", "bailian", 16, "16,64,256"),  # tenants (cache_salt) and shared system prompts
    ("chat_shared_system.jsonl", "mooncake", 64, "64,128,256"),
    ("sharegpt_multiturn.json", "bailian", 16, "16,32,512"),
    ("tokens_small.jsonl", "mooncake", 4, "4,8,16"),
])
def test_an_export_replays_to_the_original_hit_tokens(tmp_path, redis_url, sample, fmt, block, sizes):
    out = tmp_path / "export.jsonl"
    run("export", SAMPLES / sample, "--format", fmt, "--block-size", block, "--key-file", tmp_path / "k",
        "--out", out)
    original, exported = hits(redis_url, SAMPLES / sample, sizes), hits(redis_url, out, sizes)
    assert exported == original and any(original.values())


def test_tokens_small_export_by_hand(tmp_path, redis_url):
    """tokens_small.jsonl at 4-token blocks: t2 shares t1's first two blocks, t3 all four of t1's, t4 is another
    tenant; at chunk size 4 the hits are 8 + 16 = 24 tokens (sample_traces/SOURCES.md)."""
    out = tmp_path / "e.jsonl"
    run("export", SAMPLES / "tokens_small.jsonl", "--block-size", "4", "--key-file", tmp_path / "k", "--out", out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["hash_ids"] for r in records] == [[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 2, 3, 6], [7, 8, 9, 10], [],
                                                [11, 12, 13]]
    assert [r["timestamp"] for r in records] == [0, 1000, 2000, 3000, 4000, 5000]
    assert all(set(r) == {"timestamp", "input_length", "session_id", "block_size", "hash_ids"} for r in records)
    assert hits(redis_url, out, "4,8,16,32") == {4: 24, 8: 24, 16: 16, 32: 0}


def test_the_key_and_the_id_map_keep_ids_across_exports(tmp_path):
    key, ids = tmp_path / "k", tmp_path / "ids"
    first, again, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    run("export", SAMPLES / "tokens_small.jsonl", "--block-size", "4", "--key-file", key, "--id-map", ids,
        "--out", first)
    assert len(key.read_bytes()) == 32 and len(ids.read_bytes()) == 14 * 32
    run("export", SAMPLES / "no_reuse.jsonl", "--block-size", "4", "--key-file", key, "--id-map", ids, "--out", other)
    run("export", SAMPLES / "tokens_small.jsonl", "--block-size", "4", "--key-file", key, "--id-map", ids,
        "--out", again)
    assert again.read_text() == first.read_text()  # no_reuse's ids came after: tokens_small's kept theirs
    assert min(json.loads(line)["hash_ids"][0] for line in other.read_text().splitlines()) == 14


def test_bailian_export_keeps_sessions_as_parent_chains_and_rounds_timestamps():
    numbering = BlockNumbering(b"k" * 32, 2)
    requests = [Request("a", np.array([1, 2, 3], dtype="<u4"), 0.26, "s", output_length=4),
                Request("b", np.array([1, 2, 3, 4], dtype="<u4"), 1.74, "s"),
                Request("c", np.array([1, 2], dtype="<u4"), 2.0, None)]
    assert list(export_records(requests, "bailian", numbering, round_seconds=0.5)) == [
        {"chat_id": 0, "parent_chat_id": -1, "turn": 1, "timestamp": 0.5, "input_length": 3, "output_length": 4,
         "block_size": 2, "hash_ids": [0, 1]},
        {"chat_id": 1, "parent_chat_id": 0, "turn": 2, "timestamp": 1.5, "input_length": 4, "block_size": 2,
         "hash_ids": [0, 2]},
        {"chat_id": 2, "parent_chat_id": -1, "turn": 1, "timestamp": 2, "input_length": 2, "block_size": 2,
         "hash_ids": [0]}]


def test_a_short_key_file_is_exit_2(tmp_path):
    key = tmp_path / "k"
    key.write_bytes(b"short")
    out = CliRunner().invoke(app, ["export", str(SAMPLES / "tokens_small.jsonl"), "--key-file", str(key), "--out",
                                   str(tmp_path / "o.jsonl")])
    assert out.exit_code == 2
    assert out.stderr.strip() == (f"kvcli: error: {key}: a key file of 5 bytes: a key needs at least 16 (kvcli writes "
                                  "32 random bytes to a key file that does not exist)")
    assert not (tmp_path / "o.jsonl").exists()


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and mode (a link: its target's)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("args, option, same_as", [
    (["t.jsonl", "--key-file", "k", "--out", "k"], "--out", "--key-file"),
    (["t.jsonl", "--key-file", "k", "--out", "link-to-k"], "--out", "--key-file"),  # os.path.samefile
    (["t.jsonl", "--key-file", "new.key", "--out", "new.key"], "--out", "--key-file"),  # neither exists yet
    (["t.jsonl", "--key-file", "k", "--out", "ids", "--id-map", "ids"], "--out", "--id-map"),
    (["t.jsonl", "--key-file", "k", "--out", "o.jsonl", "--id-map", "k"], "--id-map", "--key-file"),
    (["t.jsonl", "--key-file", "k", "--out", "t.jsonl"], "--out", "an input trace"),
    (["t.jsonl", "--key-file", "k", "--out", "sub/../t.jsonl"], "--out", "an input trace"),
    (["dir", "--key-file", "k", "--out", "dir/u.jsonl"], "--out", "an input trace"),  # a directory's file
    (["t.jsonl", "--key-file", "new.key", "--out", "o.jsonl", "--id-map", "t.jsonl"], "--id-map", "an input trace"),
])
def test_export_refuses_to_write_onto_a_file_it_reads(tmp_path, monkeypatch, args, option, same_as):
    """An --out or --id-map that is the key file, the id map or an input trace: exit 2, one line naming both
    options, and every file as it was (no key created, no partial output left)."""
    (tmp_path / "t.jsonl").write_bytes((SAMPLES / "tokens_small.jsonl").read_bytes())
    (tmp_path / "k").write_bytes(bytes(range(32)))
    (tmp_path / "k").chmod(0o600)
    (tmp_path / "link-to-k").symlink_to(tmp_path / "k")
    (tmp_path / "ids").write_bytes(b"\x01" * 64)
    (tmp_path / "dir").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "dir" / "u.jsonl").write_bytes((SAMPLES / "no_reuse.jsonl").read_bytes())
    before = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["export", *args])
    assert out.exit_code == 2, out.output
    (line,) = out.stderr.splitlines()
    assert line.startswith("kvcli: error: ") and f"{option} is the same file as {same_as}" in line, line
    assert _files(tmp_path) == before
    assert out.stdout == ""


def test_export_refuses_an_input_trace_as_its_key_file(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes((SAMPLES / "tokens_small.jsonl").read_bytes())
    out = CliRunner().invoke(app, ["export", str(trace), "--key-file", str(trace), "--out", str(tmp_path / "o")])
    assert out.exit_code == 2 and "--key-file is an input trace" in out.stderr, out.output
    assert trace.read_bytes() == (SAMPLES / "tokens_small.jsonl").read_bytes() and not (tmp_path / "o").exists()


def test_export_to_stdout_beside_its_key_file(tmp_path):
    key = tmp_path / "k"
    out = run("export", SAMPLES / "tokens_small.jsonl", "--key-file", key, "--out", "-")
    assert len(out.stdout.splitlines()) == 6 and len(key.read_bytes()) == 32
