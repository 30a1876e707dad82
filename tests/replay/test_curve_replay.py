"""The capacity/TTL curve of a replay: by hand, equal to replays at every capacity (random traces and the Mooncake
sample) and to the store's lookups chunk for chunk, the TTL curve from timestamps, and the command's table, JSON and
plot. The curve's own rules, without a server: tests/sim/test_curve.py."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import ModelSpec
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.sim.curve import HitCurve
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.namespace import purge
from kvcli.store.records import StoreConfig
from kvcli.traces.detect import read_trace
from kvcli.traces.request import Request

SPEC = ModelSpec("m", (2, 2, 2, 32), torch.float32)  # 1,024 KV bytes per token
ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"


def tok(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def reqs(prompts, times=None) -> list[Request]:
    times = times or [None] * len(prompts)
    return [Request(f"t:{i + 1}", np.asarray(p, dtype="<u4"), t, source=f"t:{i + 1}")
            for i, (p, t) in enumerate(zip(prompts, times))]


def replay(client, requests, chunk_sizes=(4,), **kw):
    config = ReplayConfig(chunk_sizes=chunk_sizes, payload="accounted", measure=0, **kw)
    return Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "raw", config, spec=SPEC).replay(
        "t", requests)


SMALLEST = [tok(1, 16), tok(101, 104), tok(1, 16)]  # the smallest case where the LRU order matters, chunk size 4


def test_issue_10_smallest_case_replay_hits_12_and_the_curve_agrees(redis_client):
    limited = replay(redis_client, reqs(SMALLEST), capacity_tokens=16).per_chunk_size[0]
    assert (limited.hit_tokens, limited.prompt_tokens, limited.evicted_chunks) == (12, 36, 2)
    curve = replay(redis_client, reqs(SMALLEST)).per_chunk_size[0].hit_curve
    # third request's chain distances 2, 3, 4, 5: hits 0, 0, 4, 8, 12, 15 tokens at capacities 0..5 chunks (wholly
    # hit from 5 on: it still computes its last token, so it reuses 15 of its 16)
    assert [curve.hit_tokens(c) for c in range(7)] == [0, 0, 4, 8, 12, 15, 15]
    assert curve.distinct_chunks == 5 and curve.unlimited_hit_tokens == 15
    assert [curve.capacity_for(f) for f in (0.5, 0.9, 0.99, 1.0)] == [3, 5, 5, 5]
    assert curve.ttl_hit_chunks is None and curve.untimed_requests == 3  # no timestamps: no TTL curve


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 3), max_size=20), min_size=1, max_size=14).filter(lambda ps: any(ps)),
       st.lists(st.integers(1, 14), min_size=1, max_size=3))
def test_curve_equals_a_replay_at_every_capacity(redis_client, prompts, capacities):
    """Totals: --capacity-tokens C*chunk_size gives the curve's hit tokens at C, per chunk size (a trace with a
    prompt: one of only empty prompts is refused)."""
    requests = reqs(prompts)
    curves = {r.chunk_size: r.hit_curve for r in replay(redis_client, requests, (2, 3)).per_chunk_size}
    for c in capacities:
        for cs in (2, 3):
            got = replay(redis_client, requests, (cs,), capacity_tokens=c * cs, hit_curve=False).per_chunk_size[0]
            assert got.hit_tokens == curves[cs].hit_tokens(c), (cs, c)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 3), max_size=24), min_size=1, max_size=20), st.integers(1, 12))
def test_curve_equals_the_store_chunk_for_chunk(redis_client, prompts, capacity):
    """Per request: the store's lookup on Redis (capacity ``capacity`` chunks of 2) hits exactly the chunks whose
    chain distance is <= capacity."""
    store = ChunkStore(redis_client, StoreConfig("curve-prop", 2, "m", "raw", SPEC.kv_shape, SPEC.dtype,
                                                 payload="accounted", capacity_tokens=2 * capacity))
    curve = HitCurve(2)
    try:
        for p in prompts:
            prompt = store.chunk(p)
            chain = curve.observe(prompt.hashes, None)
            look = store.lookup(prompt)
            assert look.hit_chunks == int((chain <= capacity).sum())
            store.store(prompt, None, start_chunk=look.hit_chunks, lookup=look)
    finally:
        purge(redis_client, "curve-prop")


def test_curve_equals_replays_on_the_mooncake_sample(redis_client):
    """First 150 requests, index only: the curve of one replay at three capacities = three capacity replays."""
    read = lambda: read_trace(MOONCAKE)  # noqa: E731
    config = dict(chunk_sizes=(256, 1024), payload="accounted", measure=0, limit=150)
    spec = ModelSpec("m", (8, 2, 2, 64), torch.bfloat16)

    def run(**kw):
        r = Replayer(redis_client, None, CostCurve.from_tokens_per_second(3000.0), "cl100k_base",
                     ReplayConfig(**config, **kw), spec=spec)
        return {x.chunk_size: x for x in r.replay(str(MOONCAKE), read).per_chunk_size}

    full = run()
    curves = {cs: r.hit_curve for cs, r in full.items()}
    assert curves[256].unlimited_hit_tokens == full[256].hit_tokens > 0
    half = curves[1024].capacity_for(0.5) * 1024
    quarter = curves[256].capacity_for(0.25) * 256
    hits = {}
    for capacity_tokens in (quarter, half, 3 * half):
        limited = run(capacity_tokens=capacity_tokens, hit_curve=False)
        for cs in (256, 1024):
            hits[cs, capacity_tokens] = limited[cs].hit_tokens
            assert limited[cs].hit_tokens == curves[cs].hit_tokens(capacity_tokens // cs), (cs, capacity_tokens)
    assert 0 < hits[256, quarter] < hits[256, half] < full[256].hit_tokens  # the capacities bite
    assert 0 < hits[1024, half] < full[1024].hit_tokens


# --- TTL ------------------------------------------------------------------------------------------------------

A, AB = tok(1, 4), tok(1, 8)  # chunk a; chunks a, b (as in tests/sim/test_curve.py)


def test_replay_reports_the_ttl_curve_from_timestamps(redis_client):
    res = replay(redis_client, reqs([A, AB, AB], [0.0, 2.0, 3.0])).per_chunk_size[0]
    c = res.hit_curve
    assert (c.span_seconds, c.ttl_rule) == (3.0, "after write")
    ttl = dict(zip(c.ttl_seconds.tolist(), (c.ttl_hit_chunks * 4).tolist()))
    assert (ttl[0.5], ttl[1.0], ttl[2.0], ttl[5.0]) == (0, 8, 4, 12)  # the by-hand case in sim's test, in tokens
    assert (c.ttl_for(0.5), c.ttl_for(0.9), c.ttl_for(1.0)) == (1.0, 5.0, 5.0)  # of 12 unlimited hit tokens
    refreshed = replay(redis_client, reqs([A, AB, AB], [0.0, 2.0, 3.0]), ttl_refresh=True).per_chunk_size[0].hit_curve
    assert refreshed.ttl_rule == "after access" and refreshed.ttl_for(1.0) == 2.0


# --- the command ------------------------------------------------------------------------------------------------

def _trace(tmp_path, times=True) -> Path:
    path = tmp_path / "smallest.jsonl"
    path.write_text("".join(json.dumps({"token_ids": p, **({"timestamp": t} if times else {})}) + "\n"
                            for p, t in zip(SMALLEST, [0.0, 1.0, 2.0])))
    return path


def _cli(*args):
    return CliRunner().invoke(app, ["replay", *map(str, args), "--chunk-sizes", "4", "--measure", "0",
                                    "--prefill-tps", "1000", "--payload", "accounted", "--model", "tiny"])


def test_cli_json_table_and_plot(tmp_path, redis_url):
    out = _cli(_trace(tmp_path), "--redis-url", redis_url, "--json", "--plot", tmp_path / "c.png")
    assert out.exit_code == 0, out.output
    curve = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"]
    assert curve["unlimited_hit_tokens"] == 15 and curve["distinct_chunks"] == 5  # the last token is recomputed
    # tiny model: 1,024 KV bytes per token, so a chunk of 4 tokens is 4,096 payload bytes
    assert curve["capacity_for_fraction"]["0.9"] == {
        "capacity_chunks": 5, "capacity_tokens": 20, "capacity_payload_bytes": 20480, "hit_tokens": 15,
        "hit_token_ratio": 15 / 36}
    assert [p["hit_tokens"] for p in curve["capacity_points"]] == [0, 0, 4, 8, 12, 15]
    assert curve["ttl_for_fraction_seconds"]["1.0"] == 2.0 and curve["trace_span_seconds"] == 2.0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = _cli(_trace(tmp_path, times=False), "--redis-url", redis_url, "--full")  # the curve's rows: every row
    assert table.exit_code == 0, table.output
    assert "cache for 90% of unlimited hits" in table.stdout and "20.0 KiB / 20 tok" in table.stdout
    assert "no timestamps" in table.stdout
    # one request of three without a timestamp: no TTL curve, and the cell says how many lacked one
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps({"token_ids": p, **({"timestamp": t} if t is not None else {})}) + "\n"
                               for p, t in zip(SMALLEST, [0.0, None, 2.0])))
    table = _cli(partial, "--redis-url", redis_url, "--full")
    assert table.exit_code == 0 and "1 untimed" in table.stdout and "no timestamps" not in table.stdout
    refused = _cli(partial, "--redis-url", redis_url, "--no-curve", "--ttl-refresh")
    assert refused.exit_code == 2 and "--ttl-refresh sets the TTL curve's expiry rule" in refused.output


def test_cli_no_curve_and_bad_plot_paths(tmp_path, redis_url):
    off = _cli(_trace(tmp_path), "--redis-url", redis_url, "--no-curve", "--json")
    assert off.exit_code == 0 and json.loads(off.stdout)["traces"][0]["per_chunk_size"][0]["hit_curve"] is None
    bad = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "c.txt")
    assert bad.exit_code == 2 and "--plot must end in .png or .svg" in bad.stderr
    both = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "c.svg", "--no-curve")
    assert both.exit_code == 2 and "needs the curve" in both.stderr
    assert not (tmp_path / "c.svg").exists()
    nowhere = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "no" / "c.png")
    assert nowhere.exit_code == 2 and "no folder" in nowhere.stderr and "replaying" not in nowhere.stderr


def in_private_mount(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run shell ``script`` in a mount namespace of its own (``unshare -m``), where it may mount a small or
    read-only tmpfs that no other process sees; skipped where this process may not make one (not root, no
    unshare)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _replay_args(trace: Path, redis_url: str, plot: Path) -> str:
    return " ".join(shlex.quote(str(a)) for a in [
        sys.executable, "-m", "kvcli", "replay", trace, "--redis-url", redis_url, "--chunk-sizes", "4", "--measure",
        "0", "--prefill-tps", "1000", "--payload", "accounted", "--model", "tiny", "--plot", plot])


@pytest.mark.single_server("the plot is written after the run, whatever the server")
def test_a_plot_that_cannot_be_written_is_refused_before_the_run(tmp_path, redis_url):
    """--plot in a read-only file system (a tmpfs mounted read-only), or at a directory: exit 2 in one line before
    the replay starts."""
    folder = tmp_path / "ro"
    folder.mkdir()
    done = in_private_mount(f"mount -t tmpfs -o ro,size=64k tmpfs {folder} && exec "
                            + _replay_args(_trace(tmp_path), redis_url, folder / "c.png"))
    assert (done.returncode, done.stderr) == (2, f"kvcli: error: --plot {folder / 'c.png'}: the folder {folder} is not "
                                                 "writable\n")
    (tmp_path / "c.png").mkdir()
    at_dir = _cli(_trace(tmp_path), "--redis-url", redis_url, "--plot", tmp_path / "c.png")
    assert at_dir.exit_code == 2 and at_dir.stderr == f"kvcli: error: --plot {tmp_path / 'c.png'} is a directory; " \
                                                      "give a file name\n"


@pytest.mark.single_server("the plot is written after the run, whatever the server")
def test_a_full_disk_keeps_the_report_and_the_old_plot(tmp_path, redis_url):
    """--plot on a 16 KiB tmpfs holding an old figure: the report is printed, then one line says the plot could not
    be written and the old figure stays (no 0-byte PNG, no temporary file), exit 2."""
    folder = tmp_path / "full"
    folder.mkdir()
    plot = folder / "c.png"
    done = in_private_mount(f"mount -t tmpfs -o size=16k tmpfs {folder} && printf old > {plot} && "
                            + _replay_args(_trace(tmp_path), redis_url, plot)
                            + f"; rc=$?; ls -a {folder}; cat {plot}; exit $rc")
    assert done.returncode == 2, done.stderr
    assert "hit token ratio" in done.stdout  # the report
    assert done.stdout.splitlines()[-4:] == [".", "..", "c.png", "old"]
    assert done.stderr.splitlines()[-1] == (f"kvcli: error: --plot {plot}: cannot write: No space left on device; the "
                                            "file was left as it was")


@pytest.mark.parametrize("traces, names", [
    (["a.jsonl"], ["c.png"]),
    (["a.jsonl", "b.json.gz"], ["c-a.png", "c-b.png"]),
    (["p/x.jsonl", "q/x.jsonl", "x.json", "x-2.jsonl"], ["c-x.png", "c-x-2.png", "c-x-3.png", "c-x-2-2.png"]),
])
def test_one_plot_per_trace(traces, names):
    from kvcli.figures import plot_paths

    assert [p.name for p in plot_paths("out/c.png", traces)] == names


