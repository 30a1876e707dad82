"""Replay under Redis faults: a dropped connection, a stalled server, a server that goes away, a second
Ctrl-C or SIGTERM during cleanup. Faults come from the TCP proxy of bench/faultproxy.py (``fault_proxy`` fixture)
in front of a private server; every figure is computed by hand.

R1 = R2 = tok(1..10) at chunk size 4: two full chunks each; R1 misses and stores [1-4] [5-8]; R2 hits 8.
"""
from __future__ import annotations

import hashlib
import json
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
from kvcli.store.namespace import _PURGE_OWN_STEP

pytestmark = pytest.mark.single_server("the fault proxy stands in front of one server")

ROOT = Path(__file__).resolve().parents[2]
TOKENS = list(range(1, 11))
LOOKUP_R2 = (b"EVAL_RO", b":4:m:")  # a lookup (one EVAL_RO) at chunk size 4; the first one is R1's


def _trace(tmp_path, n: int = 2) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i + 1}", "token_ids": TOKENS}) + "\n" for i in range(n)))
    return path


def _replay(trace: Path, url: str, *extra: str, pipeline: str = "1"):
    """Replay through ``url``; ``pipeline`` "1" (default): one lookup (EVAL_RO) and one store per request, which
    the faults below aim at; more: pipelined batches (kvcli.store.batch)."""
    return CliRunner().invoke(app, ["replay", str(trace), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps",
                                    "1000", "--payload", "accounted", "--redis-url", url, "--json",
                                    "--pipeline", pipeline, *extra])


def _row(out) -> dict:
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    return doc["traces"][0]["per_chunk_size"][0]


def _keys(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return sorted(client.scan_iter("*"))
    finally:
        client.close()


def test_a_dropped_connection_on_a_lookup_is_retried_and_counted_once(tmp_path, fault_proxy, redis_client):
    redis_client.set("foreign", "1")
    fault_proxy.drop(*LOOKUP_R2, skip=1)  # the proxy closes the connection on R2's lookup
    row = _row(_replay(_trace(tmp_path), fault_proxy.url()))
    assert fault_proxy.dropped == 1
    assert (row["hit_tokens"], row["prompt_tokens"], row["lookups"]) == (8, 20, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (1, 0, 0)
    assert sorted(redis_client.scan_iter("*")) == [b"foreign"]  # the run's namespace was deleted


def test_a_stalled_lookup_waits_the_timeout_then_counts_as_a_miss(tmp_path, fault_proxy, redis_client):
    fault_proxy.stall(*LOOKUP_R2, skip=1)  # R2's lookup never gets a reply
    row = _row(_replay(_trace(tmp_path), fault_proxy.url(), "--redis-timeout", "300ms"))
    assert fault_proxy.stalled == 1
    # R1 misses (0), R2's lookup timed out: a miss, and it stores nothing; a timeout is not retried
    assert (row["hit_tokens"], row["prompt_tokens"], row["lookups"], row["metadata_entries"]) == (0, 20, 1, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (0, 1, 1)
    assert list(redis_client.scan_iter("*")) == []


def test_the_report_table_shows_retries_errors_and_timeouts(tmp_path, fault_proxy):
    fault_proxy.drop(*LOOKUP_R2, skip=1)
    out = CliRunner().invoke(app, ["replay", str(_trace(tmp_path)), "--chunk-sizes", "4", "--measure", "0",
                                   "--prefill-tps", "1000", "--payload", "accounted", "--redis-url",
                                   fault_proxy.url(), "--pipeline", "1"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if "Redis retries / errors / timeouts" in x)
    assert "1 / 0 / 0" in line


def test_a_server_that_stops_answering_ends_the_run_and_names_what_was_left(tmp_path, fault_proxy, redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("foreign", "1")
    fault_proxy.stall(*LOOKUP_R2, skip=1, for_good=True)  # from R2's lookup on, nothing is answered
    t0 = time.monotonic()
    out = _replay(_trace(tmp_path, 5), fault_proxy.url(), "--redis-timeout", "300ms")
    assert time.monotonic() - t0 < 60  # bounded: 3 failed lookups + the cleanup's SCAN, 0.3 s each
    assert out.exit_code == 3, out.output
    assert "Traceback" not in out.output
    err = out.stderr
    assert "the Redis server stopped answering: 3 calls in a row failed" in err
    assert "deleting namespace replay-" in err
    namespace = err.split("deleting namespace ")[1].split("…")[0]
    command = f"kvcli purge --namespace {namespace} --yes --redis-url {fault_proxy.url()}"
    assert command in err and "was not deleted" in err
    left = [k for k in _keys(redis_url) if k != b"foreign"]
    assert len(left) == 2 and all(k.startswith(f"kvcli:v1:{namespace}:4:m:".encode()) for k in left)  # R1's
    fault_proxy.heal()
    done = CliRunner().invoke(app, command.split()[1:])  # the command exactly as printed
    assert done.exit_code == 0, done.output
    assert _keys(redis_url) == [b"foreign"]


def test_a_server_gone_mid_run_ends_it_with_exit_3_and_the_purge_command(tmp_path, fault_proxy, redis_url):
    fault_proxy.kill(*LOOKUP_R2, skip=1)  # the "server" dies at R2's lookup: connections are refused from then on
    out = _replay(_trace(tmp_path, 5), fault_proxy.url())
    assert out.exit_code == 3, out.output
    assert "Traceback" not in out.output
    assert "the Redis server stopped answering: 3 calls in a row failed" in out.stderr
    assert "was not deleted" in out.stderr
    assert "kvcli purge --namespace replay-" in out.stderr and f"--redis-url {fault_proxy.url()}" in out.stderr
    assert len(_keys(redis_url)) == 2  # R1's two metadata entries, named in the message


BATCH_READ = (b"MGET", b":4:m:")  # a pipelined batch's read of every metadata key it names
BATCH_WRITE = (b"MSET", b":4:m:")  # a pipelined batch's writes
TWO_TRIPS = ("--capacity-tokens", "1000")  # a capacity (never reached here): the LRU is the client's, so batches
# take two round trips (MGET, then MSET) instead of the batch script
BATCH_SCRIPT = (b"meta_hit", b":4:m:")  # a batch script (its body names meta_hit; a sampled lookup's does not)


def test_a_dropped_connection_on_a_batch_read_is_retried_and_counted_once(tmp_path, fault_proxy, redis_client):
    redis_client.set("foreign", "1")
    fault_proxy.drop(*BATCH_READ)  # the proxy closes the connection on the first batch's MGET
    row = _row(_replay(_trace(tmp_path), fault_proxy.url(), *TWO_TRIPS, pipeline="256"))
    assert fault_proxy.dropped == 1
    # one batch: R1 misses and stores [1-4] [5-8]; R2 hits them (the batch's own writes): 8
    assert (row["hit_tokens"], row["lookups"], row["lookups_pipelined"], row["metadata_entries"]) == (8, 2, 2, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (1, 0, 0)
    assert sorted(redis_client.scan_iter("*")) == [b"foreign"]


def test_a_stalled_batch_write_stores_nothing_and_the_next_batch_misses(tmp_path, fault_proxy, redis_client):
    fault_proxy.stall(*BATCH_WRITE)  # the first batch's write (R1, R2) never gets a reply
    row = _row(_replay(_trace(tmp_path, 4), fault_proxy.url(), "--redis-timeout", "300ms", *TWO_TRIPS,
                       pipeline="2"))
    assert fault_proxy.stalled == 1
    # batch 1: R1 misses, R2 hits R1's chunks in the batch (8), their write times out: nothing counted as stored.
    # Batch 2: R3 reads what the server holds (the proxy held the write back: nothing), misses and stores
    # [1-4] [5-8]; R4 hits 8
    assert (row["hit_tokens"], row["lookups"], row["metadata_entries"]) == (16, 4, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (0, 1, 1)
    assert list(redis_client.scan_iter("*")) == []


def test_a_dropped_batch_script_fails_its_lookups_and_is_not_sent_again(tmp_path, fault_proxy, redis_client):
    """A batch script is not retried (run twice, its second run would see its own writes as hits): its lookups
    fail, counted once, and the batches after it go on on a new connection."""
    redis_client.set("foreign", "1")
    fault_proxy.drop(*BATCH_SCRIPT)  # the first batch (R1, R2), answered before anything else is sent
    row = _row(_replay(_trace(tmp_path, 4), fault_proxy.url(), pipeline="2"))
    assert fault_proxy.dropped == 1
    # batch 1 failed: two misses that store nothing. Batch 2: R3 misses and stores [1-4] [5-8]; R4 hits 8
    assert (row["hit_tokens"], row["lookups"], row["lookups_pipelined"], row["metadata_entries"]) == (8, 4, 4, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (0, 1, 0)
    assert sorted(redis_client.scan_iter("*")) == [b"foreign"]


def test_a_batch_lost_in_flight_fails_alone(tmp_path, fault_proxy, redis_client):
    """The second batch is dropped while this process hashes the third: its reply fails when the third is
    submitted; the third goes on a new connection."""
    fault_proxy.drop(*BATCH_SCRIPT, skip=1)
    row = _row(_replay(_trace(tmp_path, 6), fault_proxy.url(), pipeline="2"))
    assert fault_proxy.dropped == 1
    # batch 1: R1 misses and stores [1-4] [5-8], R2 hits 8; batch 2 (R3, R4) failed; batch 3: R5 and R6 hit 8 each
    assert (row["hit_tokens"], row["lookups"], row["metadata_entries"], row["hit_requests"]) == (24, 6, 2, 3)
    assert (row["redis_errors"], row["lookup_round_trips"]) == (1, 2)


def test_a_stalled_batch_script_times_out_and_the_next_batch_misses(tmp_path, fault_proxy, redis_client):
    fault_proxy.stall(*BATCH_SCRIPT)  # the first batch's script never reaches the server
    row = _row(_replay(_trace(tmp_path, 4), fault_proxy.url(), "--redis-timeout", "300ms", pipeline="2"))
    assert fault_proxy.stalled == 1
    # batch 1 timed out: two misses that store nothing. Batch 2: R3 misses and stores [1-4] [5-8]; R4 hits 8
    assert (row["hit_tokens"], row["lookups"], row["metadata_entries"]) == (8, 4, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (0, 1, 1)
    assert list(redis_client.scan_iter("*")) == []


def _spawn(args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    return proc, lines


def _wait(predicate, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _second_signal_during_cleanup(fault_proxy, redis_url, signum: int) -> tuple[int, str]:
    """Replay the Mooncake sample through the proxy; signal it mid-run; stall its cleanup's SCAN; signal again."""
    client = redis.Redis.from_url(redis_url)
    client.set("foreign", "1")
    trace = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
    proc, lines = _spawn(["replay", str(trace), "--chunk-sizes", "16", "--measure", "0", "--prefill-tps", "1000",
                          "--payload", "accounted", "--redis-url", fault_proxy.url(), "--redis-timeout", "60s"])
    _wait(lambda: client.dbsize() >= 1000 or proc.poll() is not None)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    # the cleanup's first step hangs (up to the 60 s timeout): its script (by SHA, once the server holds it; loaded,
    # its body holds SCAN) or a client-side SCAN
    fault_proxy.stall(hashlib.sha1(_PURGE_OWN_STEP.encode()).hexdigest().encode())
    fault_proxy.stall(b"SCAN")
    proc.send_signal(signum)
    _wait(lambda: any("deleting namespace" in x for x in lines) or proc.poll() is not None)
    time.sleep(0.3)
    proc.send_signal(signum)
    proc.wait(timeout=60)
    time.sleep(0.2)
    return proc.returncode, "".join(lines)


def test_a_second_sigint_during_cleanup_prints_the_purge_command_and_exits_130(fault_proxy, redis_url):
    code, err = _second_signal_during_cleanup(fault_proxy, redis_url, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    namespace = err.split("deleting namespace ")[1].split("…")[0]
    command = f"kvcli purge --namespace {namespace} --yes --redis-url {fault_proxy.url()}"
    assert f"namespace {namespace} was not deleted (interrupted again)" in err and command in err
    assert "kvcli: interrupted" in err
    assert len(_keys(redis_url)) > 1000  # the run's keys are left, as said
    fault_proxy.heal()
    done = CliRunner().invoke(app, command.split()[1:])
    assert done.exit_code == 0, done.output
    assert _keys(redis_url) == [b"foreign"]


def test_a_second_sigterm_during_cleanup_prints_the_purge_command_and_exits_143(fault_proxy, redis_url):
    code, err = _second_signal_during_cleanup(fault_proxy, redis_url, signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err
    assert "was not deleted (interrupted again)" in err and "kvcli purge --namespace replay-" in err
    assert "kvcli: terminated (SIGTERM)" in err


def test_one_signal_during_the_final_cleanup_lets_it_finish(fault_proxy, redis_url):
    """The run is done and deleting its namespace when one Ctrl-C comes: the deletion goes on (on a new
    connection, as after any interruption) and completes; only a second signal would stop it."""
    client = redis.Redis.from_url(redis_url)
    client.set("foreign", "1")
    fault_proxy.stall(hashlib.sha1(_PURGE_OWN_STEP.encode()).hexdigest().encode())  # the final cleanup's first
    fault_proxy.stall(b"SCAN")  # step hangs (the script by SHA, or a client-side SCAN)
    trace = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
    proc, lines = _spawn(["replay", str(trace), "--chunk-sizes", "64", "--limit", "200", "--measure", "0",
                          "--prefill-tps", "1000", "--payload", "accounted", "--redis-url", fault_proxy.url(),
                          "--redis-timeout", "60s"])
    _wait(lambda: fault_proxy.stalled >= 1 or proc.poll() is not None)
    assert proc.poll() is None, "".join(lines)
    fault_proxy.heal()  # the other rule too: the stalled connection stays stalled, a new one goes through
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    time.sleep(0.2)
    err = "".join(lines)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "deleting namespace replay-" in err and "was not deleted" not in err
    assert _keys(redis_url) == [b"foreign"]
