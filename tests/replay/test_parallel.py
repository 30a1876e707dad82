"""``--jobs``: chunk sizes replayed in parallel processes give the report one process gives (timings aside)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.errors import BadInputError
from kvcli.replay.parallel import split
from kvcli.replay.results import ReplayConfig
from kvcli.replay.runner import ModelOptions, run_replay
from kvcli.store import cluster
from kvcli.store.server import connect, describe

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
CHAT = ROOT / "sample_traces/chat_shared_system.jsonl"
# measured in the run (timings), or sampled from the server in an order the jobs change: not compared
VARYING = {"namespace", "redis_memory_bytes"}


def comparable(result) -> list[dict]:
    return [{k: v for k, v in r.to_dict().items() if k not in VARYING and not k.endswith("_seconds")
             and not k.endswith("_seconds_measured") and not k.endswith("_seconds_estimated")}
            for r in result.per_chunk_size]


def test_split_balances_work_and_keeps_the_order():
    assert split((16, 64, 256, 1024), 2) == [(16,), (64, 256, 1024)]
    assert split((1024, 16, 256, 64), 2) == [(16,), (1024, 256, 64)]
    assert split((64, 256), 4) == [(64,), (256,)]
    assert split((512,), 1) == [(512,)]


def run(url: str, jobs: int, config: ReplayConfig, options: ModelOptions, trace: Path = MOONCAKE):
    client = connect(url)
    try:
        results, context = run_replay(client, describe(client, url, False), [trace], config, options, jobs=jobs)
        assert cluster.dbsize(client) == 0  # the run's namespace is gone, also with jobs
        return results[0], context
    finally:
        client.close()


def test_jobs_give_the_single_process_report(redis_url):
    config = ReplayConfig(chunk_sizes=(16, 64, 256, 512), payload="accounted", measure=0, limit=300,
                          capacity_tokens=60_000)
    options = ModelOptions("cpu", prefill_tps=2000.0)
    one, ctx1 = run(redis_url, 1, config, options)
    two, ctx2 = run(redis_url, 3, config, options)
    assert (ctx1["jobs"], ctx2["jobs"]) == (1, 3)
    assert comparable(one) == comparable(two)
    assert (one.requests, one.skipped_empty, one.measured_requests, one.notes) == (
        two.requests, two.skipped_empty, two.measured_requests, two.notes)
    rows = {r.chunk_size: r for r in two.per_chunk_size}
    assert [r.chunk_size for r in two.per_chunk_size] == [16, 64, 256, 512]
    assert rows[16].hit_tokens > 0 and rows[16].evicted_chunks > 0
    assert len({r.upper_bound_tokens for r in two.per_chunk_size}) == 1 and rows[16].upper_bound_tokens > 0


@pytest.mark.single_server("one model per job process: slow; the cluster runs the same code")
def test_jobs_with_measured_requests_and_real_payloads(redis_url):
    config = ReplayConfig(chunk_sizes=(16, 64), payload="real", measure=2, measure_max_tokens=600)
    options = ModelOptions("tiny", seed=0, threads=1)
    one, _ = run(redis_url, 1, config, options, CHAT)
    two, context = run(redis_url, 2, config, options, CHAT)
    assert comparable(one) == comparable(two)
    assert one.measured_requests == two.measured_requests == 2
    assert all(r.max_logit_diff < 1e-4 for r in two.per_chunk_size)
    assert context["torch_threads"]["threads"] == 1 and context["torch_threads"]["how"] == "given"


def test_cli_jobs_and_threads_options(tmp_path, redis_url):
    from kvcli.cli.app import app

    base = ["replay", str(MOONCAKE), "--chunk-sizes", "64,256", "--measure", "0", "--prefill-tps", "1000",
            "--payload", "accounted", "--limit", "50", "--redis-url", redis_url]
    res = CliRunner().invoke(app, [*base, "--jobs", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["context"]["jobs"] == 2 and doc["context"]["torch_threads_text"] == "model not run"
    assert "sampled" in doc["context"]["lookup_latency"]
    for bad, message in ((["--jobs", "0"], "--jobs must be >= 1"), (["--threads", "x"], "--threads must be")):
        res = CliRunner().invoke(app, [*base, *bad])
        assert res.exit_code == 2 and message in res.stderr


def test_threads_must_be_positive():
    from kvcli.replay.runner import prepare_model

    with pytest.raises(BadInputError, match="--threads"):
        prepare_model(ModelOptions("tiny", threads=0), measure=1)


def test_sigterm_stops_the_jobs_and_leaves_no_keys_behind(make_server):
    """SIGTERM to the parent stops every job (each finishes the write it is sending), then the parent deletes the
    run's namespace; foreign keys stay."""
    import signal
    import subprocess
    import sys
    import time

    import redis

    url = make_server()
    client = redis.Redis.from_url(url)
    client.set("foreign", "1")
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "replay", str(MOONCAKE), "--chunk-sizes", "16,64",
                             "--jobs", "2", "--measure", "0", "--prefill-tps", "1000", "--payload", "accounted",
                             "--redis-url", url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while client.dbsize() < 2000 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert b"Traceback" not in stderr
    assert [k for k in client.scan_iter("*")] == [b"foreign"]
