"""Replay under Redis faults: a dropped connection, a stalled server, a server that goes away, a second
Ctrl-C or SIGTERM during cleanup. Faults come from the TCP proxy of bench/faultproxy.py (``fault_proxy`` fixture)
in front of a private server; every figure is computed by hand.

R1 = R2 = tok(1..10) at chunk size 4: two full chunks each; R1 misses and stores [1-4] [5-8]; R2 hits 8.
"""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from faultproxy import FaultProxy  # bench/faultproxy.py (tests/conftest.py puts bench/ on the path)
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import RedisFailure
from kvcli.store.runmark import SENTINEL_HEX, SENTINEL_TAIL

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
                                   fault_proxy.url(), "--pipeline", "1", "--full"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if "Redis retries / BUSY retries / errors / timeouts" in x)
    assert "1 / 0 / 0 / 0" in line


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
    sentinel = f"kvcli:v1:{namespace}:4:p:{SENTINEL_HEX}".encode()  # the run's (kvcli.store.runmark)
    assert sentinel in left and len(left) == 3  # R1's two chunks and the sentinel
    assert all(k.startswith(f"kvcli:v1:{namespace}:4:m:".encode()) for k in left if k != sentinel)
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
    assert len(_keys(redis_url)) == 3  # R1's two metadata entries and the run's sentinel, named in the message


BATCH_READ = (b"MGET", b":4:m:")  # a pipelined batch's read of every metadata key it names
BATCH_WRITE = (b"MSET", b":4:m:")  # a pipelined batch's writes
TWO_TRIPS = ("--capacity-tokens", "1000")  # a capacity (never reached here): the LRU is the client's, so batches
# take two round trips (MGET, then MSET) instead of the batch script
def test_the_runs_keys_deleted_mid_run_make_its_hits_a_lower_bound_and_say_so(tmp_path, fault_proxy, redis_client):
    """R1 = R2 = R3 = tok(1..10) at chunk size 4, and another client deletes the run's two chunks (their metadata
    keys; the server stays up, the run's sentinel stays) as R3's lookup arrives. R1 misses and stores 2 chunks, R2
    hits 8 tokens, R3 misses and stores the 2 chunks again: 8 hit tokens of 30 (16 without the deletion), 2
    vanished chunks, 4 metadata entries. The note, the summary line and the verdict say the hits are a lower
    bound."""
    deleted = []

    def delete_the_runs_chunks() -> None:
        keys = list(redis_client.scan_iter("kvcli:v1:replay-*:4:m:*"))
        deleted.append(redis_client.delete(*keys))

    fault_proxy.on(*LOOKUP_R2, skip=2, call=delete_the_runs_chunks)
    trace = _trace(tmp_path, 3)
    out = _replay(trace, fault_proxy.url())
    row = _row(out)
    assert deleted == [2]
    assert (row["hit_tokens"], row["prompt_tokens"], row["metadata_entries"]) == (8, 30, 4)
    assert (row["vanished_chunks"], row["redis_errors"]) == (2, 0)
    doc = json.loads(out.stdout)["traces"][0]
    assert ("chunk size 4: its hit figures, and the savings built on them, are a lower bound: 2 of the run's chunks "
            "vanished from the server and were written again (deleted by another client, or evicted or expired by "
            "the server)") in doc["notes"]
    assert doc["verdict"]["lower_bound_chunk_sizes"] == [4]
    assert doc["verdict"]["text"].endswith("; the hit figures at chunk size 4 are a lower bound (the run's chunks "
                                           "vanished from the server, or Redis calls failed: see the notes), so "
                                           "their savings may be understated")
    assert f"{trace}: " in out.stderr
    assert "; hit figures at chunk size 4 are a lower bound (2 of its chunks vanished)\n" in out.stderr
    assert list(redis_client.scan_iter("*")) == []  # the run's namespace was deleted


def test_a_replay_whose_keys_stay_says_nothing_of_a_lower_bound(tmp_path, redis_url):
    """The same three requests with nothing deleted: 16 hit tokens, no vanished chunk, no lower bound anywhere."""
    out = _replay(_trace(tmp_path, 3), redis_url)
    row = _row(out)
    assert (row["hit_tokens"], row["vanished_chunks"], row["redis_errors"]) == (16, 0, 0)
    doc = json.loads(out.stdout)["traces"][0]
    assert doc["verdict"]["lower_bound_chunk_sizes"] == [] and "lower bound" not in out.output


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


CLEANUP = (b"UNLINK", SENTINEL_TAIL)  # the cleanup's first round trip: the UNLINK of the run's sentinel first


def _second_signal_during_cleanup(fault_proxy, redis_url, signum: int) -> tuple[int, str]:
    """Replay the Mooncake sample through the proxy; signal it mid-run; stall its cleanup's SCAN; signal again."""
    client = redis.Redis.from_url(redis_url)
    client.set("foreign", "1")
    trace = ROOT / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
    proc, lines = _spawn(["replay", str(trace), "--chunk-sizes", "16", "--measure", "0", "--prefill-tps", "1000",
                          "--payload", "accounted", "--redis-url", fault_proxy.url(), "--redis-timeout", "60s"])
    _wait(lambda: client.dbsize() >= 1000 or proc.poll() is not None)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    # the cleanup's first round trip hangs (up to the 60 s timeout): its UNLINKs, the sentinel's first
    fault_proxy.stall(*CLEANUP)
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
    fault_proxy.stall(*CLEANUP)  # the final cleanup's first round trip hangs
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


# -- a server busy with a script, a script of ours killed, a server restarted ------------------------------------------
SPIN = ("local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + ARGV[1] * 1e6 "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop return 1")  # busy for ARGV[1] seconds
BATCH_EVAL = b"$4\r\nEVAL\r\n"  # the batch script's EVAL (not EVAL_RO, not EVALSHA)


def _spin(url: str, seconds: float) -> None:
    with contextlib.suppress(redis.exceptions.ResponseError):  # killed
        redis.Redis.from_url(url, socket_timeout=120).eval(SPIN, 0, seconds)


def _busy_for(url: str, seconds: float) -> threading.Thread:
    """Another client's script that holds the server ``seconds`` (unless killed: it writes nothing); returns once
    other clients get BUSY."""
    spinner = threading.Thread(target=_spin, args=(url, seconds), daemon=True)
    spinner.start()
    probe = redis.Redis.from_url(url, socket_timeout=60)
    deadline = time.monotonic() + 30  # a bound on the wait, not a measurement
    while time.monotonic() < deadline:
        try:
            probe.ping()
        except redis.exceptions.ResponseError as exc:
            assert str(exc).startswith("BUSY")
            return spinner
        time.sleep(0.005)
    raise AssertionError("the other client's script never made the server BUSY")


@pytest.mark.parametrize("pipeline, match", [("1", LOOKUP_R2), ("256", (BATCH_EVAL,))])
def test_busy_from_another_clients_script_is_waited_out_and_counted(tmp_path, make_server, pipeline, match):
    """R2's lookup (pipeline 1: its EVAL_RO; 256: the one batch script holding R1 and R2) gets BUSY while another
    client's 1-second script runs: it is sent again until the script ends, and R2 hits its 8 tokens."""
    url = make_server(**{"busy-reply-threshold": "10"})  # ms: others get BUSY once a script runs longer
    spinners = []
    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        proxy.on(*match, skip=1 if pipeline == "1" else 0, call=lambda: spinners.append(_busy_for(url, 1.0)))
        out = _replay(_trace(tmp_path), proxy.url(), pipeline=pipeline)
        assert proxy.fired == 1
    row = _row(out)
    assert (row["hit_tokens"], row["prompt_tokens"], row["lookups"]) == (8, 20, 2)
    assert row["redis_busy_retries"] >= 1 and (row["redis_errors"], row["redis_timeouts"]) == (0, 0)
    spinners[0].join()
    assert redis.Redis.from_url(url).dbsize() == 0


def test_info_waits_out_another_clients_script_up_to_the_reply_timeout(make_server):
    """INFO answered BUSY is sent again while the reply timeout lasts: a 1 s script is waited out with a 10 s
    timeout; a 60 s one fails the INFO, in one line, once a 0.3 s timeout has passed (the script is then killed)."""
    from kvcli.store.server import connect, server_info

    url = make_server(**{"busy-reply-threshold": "10"})
    patient, hasty = connect(url, 10.0), connect(url, 0.3)  # connected (a PING) before the server is held
    spinner = _busy_for(url, 1.0)
    assert "used_memory" in server_info(patient, "memory")
    spinner.join()
    spinner = _busy_for(url, 60)
    with pytest.raises(RedisFailure, match=r"^Redis INFO failed: BUSY"):
        server_info(hasty, "memory")
    redis.Redis.from_url(url).script_kill()
    spinner.join()


def test_busy_past_the_timeout_fails_that_call_only(tmp_path, make_server):
    """R2's lookup stays BUSY for longer than the timeout; the other client's script is killed at the replay's next
    command (the SCAN of its Redis memory), so the rest of the run finds the server free."""
    url = make_server(**{"busy-reply-threshold": "10"})
    spinners = []
    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        def busy() -> None:
            spinners.append(_busy_for(url, 60))
            proxy.on(b"SCAN", call=redis.Redis.from_url(url).script_kill)

        proxy.on(*LOOKUP_R2, skip=1, call=busy)
        out = _replay(_trace(tmp_path), proxy.url(), "--redis-timeout", "300ms")
    row = _row(out)  # R2's lookup stayed BUSY for the 300 ms timeout: a failed lookup (a miss), stores nothing
    assert (row["hit_tokens"], row["lookups"], row["metadata_entries"]) == (0, 1, 2)
    assert row["redis_busy_retries"] >= 1 and (row["redis_errors"], row["redis_timeouts"]) == (1, 1)
    spinners[0].join()


def test_a_script_kill_of_a_batch_script_fails_that_batch_only(tmp_path, make_server):
    """Eight copies of one 100,001-token prompt at chunk size 4, two requests per batch: each request's lookup is
    one script (25,000 chunks, past the 4,096 a script holds). Once the first batch ran (R1 writes the chunks, R2
    hits), another client SCRIPT KILLs the first script it can (a later batch's: they only read, so they can be
    killed): that batch's two lookups fail (misses, one Redis error) and the run goes on. Hit tokens: 7 requests x
    100,000 without the kill, 5 with it."""
    url = make_server(**{"busy-reply-threshold": "1"})
    admin = redis.Redis.from_url(url, socket_timeout=60)
    path = tmp_path / "t.jsonl"
    line = json.dumps({"token_ids": list(range(1, 100_002))})
    path.write_text("".join(f"{line}\n" for _ in range(8)))
    kills, stop = [], threading.Event()

    def killer() -> None:
        while not stop.is_set():
            try:
                ran = admin.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
            except redis.exceptions.ResponseError:  # BUSY: a script runs
                continue
            if ran >= 2:  # the first batch's two scripts are done
                break
        while not stop.is_set():
            try:
                kills.append(admin.script_kill())
                return
            except redis.exceptions.ResponseError:  # NOTBUSY (between scripts), UNKILLABLE
                time.sleep(0.001)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = _replay(path, url, pipeline="2")
    stop.set()
    thread.join()
    assert kills == [True], "no script was killed"
    row = _row(out)
    assert (row["hit_tokens"], row["prompt_tokens"], row["lookups"]) == (500_000, 800_008, 8)
    assert (row["redis_errors"], row["redis_timeouts"], row["vanished_chunks"]) == (1, 0, 0)
    doc = json.loads(out.stdout)["traces"][0]
    assert ("chunk size 4: its hit figures, and the savings built on them, are a lower bound: 1 Redis call failed "
            "(a failed lookup is a miss that stores nothing)") in doc["notes"]
    assert doc["verdict"]["lower_bound_chunk_sizes"] == [4] and "are a lower bound" in doc["verdict"]["text"]
    assert "; hit figures at chunk size 4 are a lower bound (1 Redis call failed)\n" in out.stderr
    assert admin.dbsize() == 0


def test_a_killed_lookup_script_is_a_failed_lookup(tmp_path, make_server):
    """pipeline 1: R2's lookup script (EVAL_RO) is killed while it runs: a miss, and the run goes on."""
    url = make_server(**{"busy-reply-threshold": "1"})
    admin = redis.Redis.from_url(url, socket_timeout=60)
    path = tmp_path / "t.jsonl"
    # 400,000 tokens: R2's lookup reads 200,000 keys, a script long enough for the kill to land while it runs on a
    # loaded machine (a script that ends first leaves the kill answered NOTBUSY, and the lookup a hit)
    line = json.dumps({"token_ids": list(range(1, 400_002))})
    path.write_text(f"{line}\n{line}\n")
    kills = []

    def kill_it() -> None:
        def loop():
            while True:
                try:
                    kills.append(admin.script_kill())
                    return
                except redis.exceptions.ResponseError:
                    time.sleep(0.001)
        threading.Thread(target=loop, daemon=True).start()

    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        proxy.on(*LOOKUP_R2, skip=1, call=kill_it)
        out = _replay(path, proxy.url())
    assert kills == [True]
    row = _row(out)
    assert (row["hit_tokens"], row["lookups"], row["redis_errors"]) == (0, 1, 1)


def test_a_server_restarted_empty_mid_run_stops_the_replay(tmp_path):
    """The server is restarted (no persistence: empty) when R2's lookup arrives; the connection drops, redis-py
    reconnects to the new server, whose run_id differs: the replay stops with exit 3, no report."""
    from servers import Server  # bench/servers.py

    with Server(appendonly=False) as server, FaultProxy("127.0.0.1", server.port) as proxy:
        proxy.on(*LOOKUP_R2, skip=1, call=server.restart)
        out = _replay(_trace(tmp_path, 5), proxy.url())
        assert proxy.fired == 1
        assert out.exit_code == 3, out.output
        assert out.stdout == ""
        error = out.stderr.strip().splitlines()[-1]
        assert error.startswith(f"kvcli: error: the Redis server at {proxy.url()} restarted during the replay "
                                f"(INFO run_id changed)"), error
        assert "Traceback" not in out.stderr
        assert redis.Redis(port=server.port).dbsize() == 0  # what it wrote after the restart was deleted


# -- a server that stalls (DEBUG SLEEP), whichever call the stall lands on ---------------------------------------------
INFO_MEMORY = (b"$4\r\nINFO\r\n", b"$6\r\nmemory\r\n")  # the replay's reads of the server's memory (used_memory)
INFO_CLUSTER = (b"$4\r\nINFO\r\n", b"$7\r\ncluster\r\n")  # the check before a SCAN (the store's Redis memory)
STALLS = {"lookup": LOOKUP_R2, "INFO memory": INFO_MEMORY, "INFO cluster": INFO_CLUSTER}
DEBUG = {"enable-debug-command": "yes"}  # DEBUG SLEEP: the whole server stops answering, every client alike


def _stall_at(proxy: FaultProxy, url: str, where: str, seconds: float) -> None:
    """On R2's lookup (``where`` "lookup"), or on the first INFO of ``where`` after it ("INFO memory": the read of the
    server's used_memory after the requests; "INFO cluster": the check before the SCAN of the store's keys for its
    Redis memory), another client sends ``DEBUG SLEEP seconds``, and the packet goes on only once the server wakes:
    the call that sent it, and every call made meanwhile, get no reply for that long."""
    def sleep() -> None:
        redis.Redis.from_url(url, socket_timeout=60).execute_command("DEBUG", "SLEEP", seconds)

    if where == "lookup":
        proxy.on(*LOOKUP_R2, skip=1, call=sleep)
    else:
        proxy.on(*LOOKUP_R2, skip=1, call=lambda: proxy.on(*STALLS[where], call=sleep))


@pytest.mark.parametrize("where", list(STALLS))
def test_a_stall_past_three_reply_timeouts_ends_the_run_wherever_it_lands(tmp_path, make_server, where):
    """A 4.5 s stall with a 1 s reply timeout, on R2's lookup or on an INFO after it: the same end every way. On an
    INFO: it gets no reply and is sent again twice, 3 failed calls in a row. On the lookup: R2's lookup fails (a
    miss, which stores nothing), then the INFO of the check before the SCAN of the store's keys twice. The run stops
    (exit 3, no report) and its cleanup, with tries of its own, deletes the run's keys once the server is back: only
    the foreign key is left."""
    url = make_server(**DEBUG)
    redis.Redis.from_url(url).set("foreign", "1")
    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        _stall_at(proxy, url, where, 4.5)
        out = _replay(_trace(tmp_path), proxy.url(), "--redis-timeout", "1s")
        assert proxy.fired == (1 if where == "lookup" else 2)
    assert out.exit_code == 3, out.output
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert lines[-1] == ("kvcli: error: the Redis server stopped answering: 3 calls in a row failed after retries "
                         f"(last: INFO, no reply within the timeout: Timeout reading from 127.0.0.1:{proxy.port})")
    assert lines[-2].startswith("deleting namespace replay-")
    assert "was not deleted" not in out.stderr and "Traceback" not in out.stderr
    assert _keys(url) == [b"foreign"]


@pytest.mark.parametrize("where", ["INFO memory", "INFO cluster"])
def test_a_stall_on_info_shorter_than_three_reply_timeouts_is_waited_out(tmp_path, make_server, where):
    """A 1.5 s stall with a 1 s reply timeout on an INFO after R2's lookup: the INFO gets no reply, is sent again
    and answered. Nothing is lost: the figures of a run without the stall (R2 hits 8 of the 20 tokens, no Redis
    error at chunk size 4), used_memory and the store's Redis memory read, and the run's keys deleted."""
    url = make_server(**DEBUG)
    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        _stall_at(proxy, url, where, 1.5)
        out = _replay(_trace(tmp_path), proxy.url(), "--redis-timeout", "1s")
        assert proxy.fired == 2
    row = _row(out)
    assert (row["hit_tokens"], row["prompt_tokens"], row["lookups"], row["metadata_entries"]) == (8, 20, 2, 2)
    assert (row["redis_retries"], row["redis_errors"], row["redis_timeouts"]) == (0, 0, 0)
    assert row["redis_memory_sampled_keys"] == 2  # R1's two metadata entries
    trace = json.loads(out.stdout)["traces"][0]
    assert isinstance(trace["used_memory_delta_bytes"], int)
    assert not any("not read" in note for note in trace["notes"])
    assert _keys(url) == []


def test_a_stall_on_a_workers_connect_shorter_than_three_reply_timeouts_is_waited_out(tmp_path, make_server):
    """--jobs 2, chunk sizes 4 and 8: each size a unit in a worker process, which connects on its own. A 1.5 s stall
    with a 1 s reply timeout that begins as the first worker's connect names itself (CLIENT SETNAME): that connect
    gets no reply, is made again and answered. Nothing is lost: at both sizes R2 hits 8 of the 20 tokens (at 8, R1
    stores [1-8]), as without the stall, and the run's keys are deleted."""
    url = make_server(**DEBUG)
    with FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
        proxy.on(b"SETNAME", b"-worker", call=lambda: redis.Redis.from_url(url, socket_timeout=60).execute_command(
            "DEBUG", "SLEEP", 1.5))
        out = CliRunner().invoke(app, ["replay", str(_trace(tmp_path)), "--chunk-sizes", "4,8", "--measure", "0",
                                       "--prefill-tps", "1000", "--payload", "accounted", "--redis-url", proxy.url(),
                                       "--json", "--pipeline", "1", "--jobs", "2", "--redis-timeout", "1s"])
        assert proxy.fired == 1
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["context"]["units"] == "up to 2 worker processes"
    rows = doc["traces"][0]["per_chunk_size"]
    assert [(r["chunk_size"], r["hit_tokens"], r["prompt_tokens"], r["redis_errors"]) for r in rows] == \
        [(4, 8, 20, 0), (8, 8, 20, 0)]
    assert _keys(url) == []
