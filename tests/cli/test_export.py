"""kvcli export: anonymized hash-id traces that replay to exactly the original's hit tokens (private Redis)."""
from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_outfile import give_to_nobody, make_null_device, read_fifo, unprivileged
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import read_trace
from kvcli.traces.export import (
    ID_MAP_HEADER_BYTES,
    MAX_ROUND_SECONDS,
    MIN_ROUND_SECONDS,
    BlockNumbering,
    check_export_options,
    export_records,
)
from kvcli.traces.request import Request

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


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
    assert len(key.read_bytes()) == 32 and len(ids.read_bytes()) == ID_MAP_HEADER_BYTES + 14 * 32
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


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_export_to_a_fifo_a_symlink_and_a_device_leaves_each_as_it_was(tmp_path):
    """--out a FIFO: written through it, still a FIFO; a symbolic link: its target replaced, the link kept; a
    character device (a /dev/null of the test's own, made where mknod is allowed): still that device."""
    trace, key = SAMPLES / "tokens_small.jsonl", tmp_path / "k"
    expected = run("export", trace, "--key-file", key, "--out", "-").stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    thread, got = read_fifo(fifo)
    run("export", trace, "--key-file", key, "--out", fifo)
    thread.join(10)
    assert got == [expected.encode()] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    target, link = tmp_path / "target.jsonl", tmp_path / "link.jsonl"
    target.write_text("old\n")
    link.symlink_to(target)
    run("export", trace, "--key-file", key, "--out", link)
    assert os.readlink(link) == str(target) and target.read_text() == expected
    null = make_null_device(tmp_path / "null")
    run("export", trace, "--key-file", key, "--out", null)
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "k", "link.jsonl", "null", "target.jsonl"]


def test_export_never_touches_a_users_file_named_like_a_temporary(tmp_path):
    out = tmp_path / "o.jsonl"
    (tmp_path / "o.jsonl.partial").write_text("the user's\n")
    run("export", SAMPLES / "tokens_small.jsonl", "--key-file", tmp_path / "k", "--out", out)
    assert (tmp_path / "o.jsonl.partial").read_text() == "the user's\n" and len(out.read_text().splitlines()) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "o.jsonl", "o.jsonl.partial"]


@pytest.mark.parametrize("args, message", [
    (["--round-seconds", "inf"], "--round-seconds must be in [1e-06, 1e+09] seconds, got inf"),
    (["--round-seconds", "nan"], "--round-seconds must be in [1e-06, 1e+09] seconds, got nan"),
    (["--round-seconds", "1e-320"], "--round-seconds must be in [1e-06, 1e+09] seconds, got 1e-320"),
    (["--round-seconds", "0"], "--round-seconds must be in [1e-06, 1e+09] seconds, got 0.0"),
    (["--round-seconds", "2e9"], "--round-seconds must be in [1e-06, 1e+09] seconds, got 2000000000.0"),
    (["--block-size", "0"], "--block-size must be an integer in [1, 1,048,576], got 0"),
    (["--block-size", str(2**21)], "--block-size must be an integer in [1, 1,048,576], got 2097152"),
    (["--format", "csv"], "--format must be one of mooncake, bailian, got 'csv'"),
    (["--out", "{tmp}"], "--out {tmp} is a directory; give a file name"),
    (["--out", "{tmp}/no/o.jsonl"], "--out {tmp}/no/o.jsonl: no folder {tmp}/no to write it in"),
    (["--id-map", "{tmp}"], "--id-map {tmp} is a directory; give a file name"),
])
def test_bad_export_options_are_one_line_before_any_file_is_touched(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = ["--out", tmp_path / "o.jsonl"] if "--out" not in args else []
    done = _invoke("export", SAMPLES / "tokens_small.jsonl", "--key-file", tmp_path / "k", *out, *args)
    assert done.exit_code == 2, done.output
    assert done.stderr == "kvcli: error: " + message.replace("{tmp}", str(tmp_path)) + "\n"
    assert list(tmp_path.iterdir()) == []  # no key file created, no output


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))
def test_round_seconds_is_taken_exactly_in_its_bounds(seconds):
    if math.isfinite(seconds) and MIN_ROUND_SECONDS <= seconds <= MAX_ROUND_SECONDS:
        check_export_options("mooncake", 512, seconds)
        (record,) = export_records([Request("a", np.array([1], dtype="<u4"), 12.5)], "mooncake",
                                   BlockNumbering(b"k" * 32, 512), seconds)
        assert math.isfinite(record["timestamp"])
    else:
        with pytest.raises(BadInputError, match=r"^--round-seconds must be in \[1e-06, 1e\+09\] seconds, got "):
            check_export_options("mooncake", 512, seconds)


# The export command alone under typer, its errors as kvcli's CLI prints them (kvcli.cli.app loads redis-py, which
# the interpreter another user gets on some machines cannot import).
_EXPORT_ALONE = """
import sys, typer
from kvcli.cli.export import export
from kvcli.errors import KvcliError
app = typer.Typer(add_completion=False)
app.command()(export)
try:
    app(standalone_mode=False)
except KvcliError as exc:
    print(f"kvcli: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def test_a_read_only_out_folder_is_one_line_before_the_key_is_made(open_folder):
    (open_folder / "ro").mkdir(mode=0o555)
    give_to_nobody(open_folder)
    shutil.copy(SAMPLES / "tokens_small.jsonl", open_folder / "t.jsonl")
    done = unprivileged(["-c", _EXPORT_ALONE, "t.jsonl", "--key-file", "k", "--out", "ro/o.jsonl"], open_folder)
    assert (done.returncode, done.stderr) == (2, f"kvcli: error: --out ro/o.jsonl: the folder {open_folder / 'ro'} "
                                                 "is not writable\n")
    assert sorted(p.name for p in open_folder.iterdir()) == ["ro", "t.jsonl"]


def _export_ids(tmp_path, *extra, trace=SAMPLES / "tokens_small.jsonl", out="o.jsonl"):
    return _invoke("export", trace, "--block-size", 4, "--key-file", tmp_path / "k", "--id-map", tmp_path / "ids",
                   "--out", tmp_path / out, *extra)


def test_an_id_map_of_another_key_or_block_size_is_refused_before_anything_is_written(tmp_path):
    assert _export_ids(tmp_path).exit_code == 0
    before = _files(tmp_path)
    other_block = _export_ids(tmp_path, "--block-size", 8, out="p.jsonl")
    assert (other_block.exit_code, other_block.stderr) == (2, (
        f"kvcli: error: {tmp_path / 'ids'}: the id map was made with --block-size 4, not 8: its ids stand for blocks "
        "of 4 tokens; give --block-size 4, or another --id-map\n"))
    (tmp_path / "k2").write_bytes(bytes(range(32)))
    other_key = _invoke("export", SAMPLES / "tokens_small.jsonl", "--block-size", 4, "--key-file", tmp_path / "k2",
                        "--id-map", tmp_path / "ids", "--out", tmp_path / "p.jsonl")
    assert (other_key.exit_code, other_key.stderr) == (2, (
        f"kvcli: error: {tmp_path / 'ids'}: the id map was made with another --key-file: its ids number other "
        "digests; give the key it was made with, or another --id-map\n"))
    no_key = _invoke("export", SAMPLES / "tokens_small.jsonl", "--block-size", 4, "--key-file", tmp_path / "k3",
                     "--id-map", tmp_path / "ids", "--out", tmp_path / "p.jsonl")
    assert no_key.exit_code == 2 and f"{tmp_path / 'k3'} does not exist" in no_key.stderr
    assert _files(tmp_path) == {**before, "k2": (bytes(range(32)), (tmp_path / "k2").stat().st_mode)}


def test_an_id_map_without_a_header_is_read_extended_and_given_one(tmp_path):
    assert _export_ids(tmp_path).exit_code == 0
    first = (tmp_path / "o.jsonl").read_text()
    digests = (tmp_path / "ids").read_bytes()[ID_MAP_HEADER_BYTES:]
    (tmp_path / "ids").write_bytes(digests)  # as kvcli wrote maps before the header
    assert _export_ids(tmp_path, trace=SAMPLES / "no_reuse.jsonl", out="p.jsonl").exit_code == 0
    assert _export_ids(tmp_path, out="again.jsonl").exit_code == 0
    assert (tmp_path / "again.jsonl").read_text() == first
    data = (tmp_path / "ids").read_bytes()
    assert data.startswith(b"kvcli-id-map-v2\0") and data[ID_MAP_HEADER_BYTES:].startswith(digests)


def test_an_export_refuses_an_id_map_another_export_holds(tmp_path):
    assert _export_ids(tmp_path).exit_code == 0
    before = _files(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path / '.ids.kvcli-lock')!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        refused = _export_ids(tmp_path, trace=SAMPLES / "no_reuse.jsonl", out="p.jsonl")
    finally:
        holder.kill()
        holder.wait()
    assert (refused.exit_code, refused.stderr) == (2, (
        f"kvcli: error: --id-map {tmp_path / 'ids'} is in use by another kvcli export (it holds "
        f"{tmp_path / '.ids.kvcli-lock'}); run the exports that share a map one after another\n"))
    assert _files(tmp_path) == before


def test_exports_at_once_never_number_a_digest_twice(tmp_path):
    """Four real export processes started together on one map: each either extends it or is refused while another
    holds it; the map ends with distinct digests, and every export that ran has ids the map gives its blocks."""
    traces = [SAMPLES / n for n in ("tokens_small.jsonl", "no_reuse.jsonl", "chat_shared_system.jsonl",
                                    "bailian_handmade.jsonl")]
    (tmp_path / "k").write_bytes(bytes(range(32)))
    procs = [subprocess.Popen([sys.executable, "-m", "kvcli", "export", str(t), "--block-size", "4", "--key-file",
                               str(tmp_path / "k"), "--id-map", str(tmp_path / "ids"), "--out",
                               str(tmp_path / f"{i}.jsonl")], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for i, t in enumerate(traces)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    assert all(rc == 0 or (rc == 2 and "is in use by another kvcli export" in err) for rc, err in results), results
    assert any(rc == 0 for rc, _ in results)
    data = (tmp_path / "ids").read_bytes()[ID_MAP_HEADER_BYTES:]
    digests = [data[i:i + 32] for i in range(0, len(data), 32)]
    assert len(set(digests)) == len(digests)
    numbering = BlockNumbering(bytes(range(32)), 4, digests)
    for i, (rc, _) in enumerate(results):
        if rc == 0:  # its ids are the map's: numbering its trace again adds nothing and gives the same ids
            exported = [json.loads(line)["hash_ids"] for line in (tmp_path / f"{i}.jsonl").read_text().splitlines()]
            again = [numbering.ids_of(r.token_ids, r.cache_salt) for r in read_trace(traces[i], "auto", "cl100k_base")]
            assert again == exported and len(numbering.digests) == len(digests)


def test_an_id_map_that_cannot_be_written_leaves_no_output(tmp_path):
    """The map is written after the output's temporary file and before its rename: a map write that fails (files
    of the process limited to 1,000 bytes: the output's 810 fit, the map's 64 + 54 * 32 do not) leaves the old
    output as it was and the old map whole."""
    (tmp_path / "o.jsonl").write_text("old\n")
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\nfrom kvcli.__main__ import main\n"
            "sys.argv = ['kvcli', *sys.argv[1:]]\nmain()\n")
    done = subprocess.run([sys.executable, "-c", code, "export", str(SAMPLES / "tokens_small.jsonl"), "--block-size",
                           "1", "--key-file", str(tmp_path / "k"), "--id-map", str(tmp_path / "ids"), "--out",
                           str(tmp_path / "o.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, (
        f"kvcli: error: --id-map {tmp_path / 'ids'}: cannot write: File too large; the file was left as it was"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ids.kvcli-lock", "k", "o.jsonl"]
    assert (tmp_path / "o.jsonl").read_text() == "old\n"
