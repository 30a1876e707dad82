"""``--jobs`` and ``--ray``: a trace's independent units (chunk size x layout) replayed in worker processes or Ray
tasks give the report one process gives (timings aside), and an interrupted parallel run leaves no keys."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.replay.results import ReplayConfig
from kvcli.replay.runner import ModelOptions, run_replay
from kvcli.replay.work import plan_units
from kvcli.store import cluster
from kvcli.store.server import connect, describe

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
CHAT = ROOT / "sample_traces/chat_shared_system.jsonl"
# timed in the run (and what is computed from timings: overheads, net benefits), sampled from the server in an
# order that the interleaving of writes changes (MEMORY USAGE of SCANned keys), or placed by the namespace's
# random name: not compared
VARYING = {"namespace", "redis_memory_bytes", "lookup_p50_seconds", "lookup_p99_seconds", "lookup_seconds",
           "transfer_seconds_measured", "transfer_seconds_estimated", "deserialize_seconds",
           "deserialize_seconds_estimated", "store_seconds", "store_seconds_estimated", "overhead_seconds",
           "net_benefit_seconds", "overheads", "full_prefill_seconds_measured", "suffix_prefill_seconds_measured",
           "saved_prefill_seconds_measured",
           "store_mode",  # async unless the timed background stores outlast the trace's span
           "round_trips_by_shard"}  # on a cluster, the run's namespace name (random) places its keys on the shards
VARYING_SAVINGS = {"critical_path_seconds", "background_seconds", "net_benefit_sync_seconds",
                   "net_benefit_async_seconds"}


def comparable(result) -> dict[str, list[dict]]:
    """Every store's row, by layout, without what is timed."""
    out = {}
    for layout, rows in result.by_layout.items():
        out[layout] = []
        for r in rows:
            row = {k: v for k, v in r.to_dict().items() if k not in VARYING}
            if row["hit_curve"] is not None:
                row["hit_curve"] = {k: v for k, v in row["hit_curve"].items() if k != "seconds"}
            row["savings"] = {k: v for k, v in row["savings"].items() if k not in VARYING_SAVINGS}
            out[layout].append(row)
    return out


def differences(a, b, path: str = "") -> list[str]:
    """Where two comparable() reports differ: ``path: a != b`` per differing leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


_REFERENCES: dict[tuple, dict] = {}


def reference(url: str, server_kind: str, config: ReplayConfig, options: ModelOptions) -> dict:
    """comparable() of the one-process report (``jobs=1``) of the Mooncake sample for ``config``, replayed once per
    kind of server and kept for the module's other tests of the same config (the side-by-side layouts and Ray)."""
    key = (server_kind, repr(config), repr(options))
    if key not in _REFERENCES:
        _REFERENCES[key] = comparable(run(url, config, options, jobs=1)[0])
    return _REFERENCES[key]


def run(url: str, config: ReplayConfig, options: ModelOptions, trace: Path = MOONCAKE, **kw):
    client = connect(url)
    try:
        results, context = run_replay(client, describe(client, url, False), [trace], config, options, **kw)
        assert cluster.dbsize(client) == 0  # the run's namespace is gone, also after parallel units
        return results[0], context
    finally:
        client.close()


def test_plan_units_balances_work_and_keeps_the_report_order():
    kv = lambda *sizes: tuple(("kvcli", cs) for cs in sizes)  # noqa: E731
    # weights 1 + 256/cs: 16 -> 17, 64 -> 5, 256 -> 2, 1024 -> 1.25; the radix tree goes to the lightest unit
    assert plan_units(kv(16, 64, 256, 1024), 2, True) == [((0,), False), ((1, 2, 3), True)]
    assert plan_units(kv(1024, 16, 256, 64), 2, False) == [((1,), False), ((0, 2, 3), False)]
    assert plan_units(kv(64, 256), 4, True) == [((0,), False), ((1,), True)]
    assert plan_units(kv(16, 64, 256, 1024), 1, True) == [((0, 1, 2, 3), True)]
    both = (("kvcli", 256), ("lmcache", 256), ("kvcli", 64), ("lmcache", 64))
    assert plan_units(both, 3, True) == [((2,), False), ((3,), False), ((0, 1), True)]


# the first 150 requests: the capacity evicts, and costs hits (76,288 hit tokens, 97,792 without it, at every chunk
# size). On the single server the batches are cut at 65,536 chunks of 16 tokens (3 lookup round trips per store,
# the same in every unit); the cluster replays the same units without the 16-token store (its pipelined writes and
# evictions are per shard, ~4x the single server's time at 16), its smallest store 64.
CAPACITY_CHUNK_SIZES = {"single": (16, 64, 256, 512), "cluster": (64, 256, 512)}


def test_jobs_give_the_single_process_report_with_a_capacity(redis_url, server_kind):
    sizes = CAPACITY_CHUNK_SIZES[server_kind]
    config = ReplayConfig(chunk_sizes=sizes, payload="accounted", measure=0, limit=150, capacity_tokens=60_000)
    options = ModelOptions("cpu", prefill_tps=2000.0)
    one, ctx1 = run(redis_url, config, options, jobs=1)
    two, ctx2 = run(redis_url, config, options, jobs=2)
    assert ctx1["units"] == "this process" and ctx2["units"] == "up to 2 worker processes"
    assert differences(comparable(one), comparable(two)) == []
    untimed = lambda notes: [n for n in notes if "background stores take" not in n]  # noqa: E731 (timed)
    assert (one.requests, one.skipped_empty, untimed(one.notes), one.span_seconds) == (
        two.requests, two.skipped_empty, untimed(two.notes), two.span_seconds)
    rows = {r.chunk_size: r for r in two.per_chunk_size}
    assert [r.chunk_size for r in two.per_chunk_size] == list(sizes)
    smallest = rows[sizes[0]]
    assert smallest.hit_tokens > 0 and smallest.evicted_chunks > 0  # the capacity evicted: LRU order kept
    assert len({r.upper_bound_tokens for r in two.per_chunk_size}) == 1 and smallest.upper_bound_tokens > 0
    assert smallest.hit_tokens < smallest.hit_tokens_unlimited  # the evictions cost hits
    assert [(r.hit_tokens, r.hit_tokens_unlimited) for r in two.per_chunk_size] == [(76_288, 97_792)] * len(sizes)
    if server_kind == "single":  # more than one batch: each cut at the same prompt token in every unit
        assert [r.lookup_round_trips for r in one.per_chunk_size] == [3] * len(sizes)


# both layouts, the first 50 requests (one batch of each kvcli store, as at 100 or 200; an LMCache lookup is a
# round trip per chunk); the Ray test replays the same config
SIDE_BY_SIDE = ReplayConfig(chunk_sizes=(64, 256), payload="accounted", measure=0, limit=50,
                            layouts=("kvcli", "lmcache"))


def test_jobs_give_the_single_process_report_side_by_side_layouts(redis_url, server_kind):
    config = SIDE_BY_SIDE
    options = ModelOptions("cpu", prefill_tps=10_000.0)
    one = reference(redis_url, server_kind, config, options)
    three, _ = run(redis_url, config, options, jobs=3)
    assert differences(one, comparable(three)) == []
    assert [(r.layout, r.chunk_size) for r in three.by_layout["lmcache"]] == [("lmcache", 64), ("lmcache", 256)]
    assert three.by_layout["lmcache"][0].hit_tokens == three.by_layout["kvcli"][0].hit_tokens > 0


@pytest.mark.single_server("the default's choice does not depend on the server")
def test_jobs_default_to_the_cores_without_a_timed_model_and_to_one_with_it(redis_url, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)  # 3 usable cores
    config = ReplayConfig(chunk_sizes=(64, 256), payload="accounted", measure=0, limit=50)
    # no model runs (--prefill-tps, --measure 0): min(3 cores, 2 units) workers; the report as with --jobs 1
    auto, ctx = run(redis_url, config, ModelOptions("cpu", prefill_tps=10_000.0), jobs=None)  # the CLI's default
    one, _ = run(redis_url, config, ModelOptions("cpu", prefill_tps=10_000.0), jobs=1)
    assert ctx["units"] == "up to 2 worker processes" and differences(comparable(auto), comparable(one)) == []
    # the model is timed (its calibration here): one process, whatever the cores
    timed = ReplayConfig(chunk_sizes=(64, 256), payload="accounted", measure=0, limit=50, calibrate_seconds=0.0)
    _, ctx = run(redis_url, timed, ModelOptions("tiny", seed=0), jobs=None)
    assert ctx["units"] == "this process"
    # a library caller who says nothing: this process (worker processes need a script's __main__ guard)
    _, ctx = run(redis_url, config, ModelOptions("cpu", prefill_tps=10_000.0))
    assert ctx["units"] == "this process"


@pytest.mark.single_server("a model per worker: slow; the cluster runs the same units")
def test_jobs_with_measured_requests_running_the_model(redis_url):
    config = ReplayConfig(chunk_sizes=(16, 64), payload="real", measure=2, measure_max_tokens=600,
                          calibrate_seconds=0.0)
    options = ModelOptions("tiny", seed=0, prefill_tps=50_000.0)
    one, _ = run(redis_url, config, options, CHAT, jobs=1)
    two, _ = run(redis_url, config, options, CHAT, jobs=2)
    assert one.measured_requests == two.measured_requests == 2
    for a, b in zip(one.per_chunk_size, two.per_chunk_size):
        assert (a.hit_tokens, a.objects_created, a.chunks_written, a.payload_bytes_written, a.measured_requests) == (
            b.hit_tokens, b.objects_created, b.chunks_written, b.payload_bytes_written, b.measured_requests)
        assert a.measured_requests == 2 and b.max_logit_diff < 1e-4
    # the measured log holds both chunk sizes per request, in the report's order, as one process writes it
    assert [[e["chunk_size"] for e in m["per_chunk_size"]] for m in two.measured] == [[16, 64], [16, 64]]
    assert [[(e["hit_tokens"], e["reused_tokens"]) for e in m["per_chunk_size"]] for m in one.measured] == \
        [[(e["hit_tokens"], e["reused_tokens"]) for e in m["per_chunk_size"]] for m in two.measured]


@pytest.mark.single_server("a Ray instance per run: slow; the cluster runs the same units")
def test_ray_gives_the_single_process_report(redis_url, monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'kvcli[ray]' to run this test")
    config = SIDE_BY_SIDE
    options = ModelOptions("cpu", prefill_tps=10_000.0)
    one = reference(redis_url, "single", config, options)
    # the local instance's processes, and so its workers, inherit this environment: they import this checkout's
    # kvcli (a runtime_env's env_vars would start other workers for the tasks, besides the ones Ray starts at once)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        by_ray, context = run(redis_url, config, options, ray="local", jobs=None)  # None: the cluster's CPUs
    finally:
        ray.shutdown()
    assert context["units"] == "Ray (local), up to 2 tasks per trace"
    assert differences(one, comparable(by_ray)) == []


def test_cli_checks_jobs_and_ray(monkeypatch):
    base = ["replay", str(MOONCAKE), "--measure", "0", "--prefill-tps", "1000", "--limit", "5"]
    res = CliRunner().invoke(app, [*base, "--jobs", "0"])
    assert res.exit_code == 2 and "--jobs must be >= 1, got 0" in res.stderr
    res = CliRunner().invoke(app, [*base, "--ray", "ray://head:10001"])
    assert res.exit_code == 2 and "cannot reach the embedded Redis server" in res.stderr
    assert "give --redis-url" in res.stderr
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: its import fails
    res = CliRunner().invoke(app, [*base, "--ray", "local"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines()[-1] == ("kvcli: error: --ray needs Ray, which is not installed: "
                                                   "pip install 'kvcli[ray]'")


def _start_parallel_replay(url: str) -> tuple[subprocess.Popen, list[str], redis.Redis]:
    """A --jobs 2 replay of the Mooncake sample in its own session, once it has written 3,000 keys; a foreign key
    set before it."""
    client = redis.Redis.from_url(url)
    client.set("foreign", "1")
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "replay", str(MOONCAKE), "--chunk-sizes", "16,64",
                             "--jobs", "2", "--measure", "0", "--prefill-tps", "1000", "--payload", "accounted",
                             "--redis-url", url], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 120
    while client.dbsize() < 3000 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    return proc, lines, client


def _workers(proc: subprocess.Popen) -> list[int]:
    """The pids of a replay's worker processes (its children started by multiprocessing's spawn)."""
    return [int(pid) for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()
            if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]


def _finished(proc: subprocess.Popen, lines: list[str], client: redis.Redis, code: int) -> str:
    proc.wait(timeout=120)
    time.sleep(0.2)
    err = "".join(lines)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert client.keys("*") == [b"foreign"]
    time.sleep(0.5)  # no worker writes after the cleanup
    assert client.keys("*") == [b"foreign"]
    return err


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_parallel_replay_stops_its_workers_and_deletes_its_keys(make_server, signum, code):
    """SIGINT to the whole process group (a terminal's Ctrl-C) or SIGTERM to the parent alone: the workers stop,
    then the parent deletes the run's namespace; a foreign key stays."""
    proc, lines, client = _start_parallel_replay(make_server())
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    err = _finished(proc, lines, client, code)
    assert "deleting namespace replay-" in err


def test_a_killed_worker_fails_the_run_in_one_line_and_its_keys_are_deleted(make_server):
    proc, lines, client = _start_parallel_replay(make_server())
    workers = _workers(proc)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    err = _finished(proc, lines, client, 1)
    assert "kvcli: error: a replay worker process died (killed, out of memory" in err and "rerun with --jobs 1" in err


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped by its new parent, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_parallel_replay_killed_with_sigkill_takes_its_workers_with_it(make_server):
    """kill -9 of the parent: nothing of it runs to stop the workers, yet they die with it and stop writing."""
    proc, _, client = _start_parallel_replay(make_server())
    workers = _workers(proc)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60  # a bound on the wait, not a measurement
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # a failed test leaves no writer behind
        os.kill(pid, signal.SIGKILL)
    assert left == []
    # what the dead workers had already sent (a batch script in the server's input buffer) may still be applied on
    # a loaded machine: wait, bounded, for the count to settle; a live writer would keep it moving for minutes
    keys, deadline = client.dbsize(), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = client.dbsize()
        if now == keys:
            break
        keys = now
    time.sleep(1.0)
    assert client.dbsize() == keys  # nothing writes any more
