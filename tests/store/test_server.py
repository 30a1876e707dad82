"""Connections (kvcli/store/server.py): passwords never printed, explicit timeouts and redis-py's own retries
whatever redis-py is installed, counted per call. Faults come from the ``fault_proxy`` fixture (bench/faultproxy.py).

The lowest redis-py declared in pyproject.toml (5.0.8) is tested by running the suite with it first on the path
(README, "Exit codes and failures")::

    pip install --target /tmp/redis508 --no-deps "redis==5.0.8"
    PYTHONPATH=/tmp/redis508 python -m pytest -q
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError, RedisFailure
from kvcli.redact import mask_url, redact
from kvcli.store.calls import RedisUnavailable
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.records import StoreConfig
from kvcli.store.server import (
    DEFAULT_TIMEOUT,
    RETRIES,
    check_owner,
    connect,
    embedded_server,
    fault_counts,
    server_info,
)

SECRET = "Sekr3t-pw"


@pytest.mark.parametrize("url, shown", [
    (f"redis://user:{SECRET}@h:1/0", "redis://user:***@h:1/0"),
    (f"redis://:{SECRET}@h:1", "redis://:***@h:1"),
    (f"redis://{SECRET}@h:1", "redis://:***@h:1"),  # redis-py reads a bare userinfo as a user name: masked too
    (f"redis://h:1?password={SECRET}&db=2", "redis://h:1?password=***&db=2"),
    (f"redis://h:1/0?db=1&password={SECRET}", "redis://h:1/0?db=1&password=***"),
    (f"unix:///tmp/a@b.sock?password={SECRET}", "unix:///tmp/a@b.sock?password=***"),
    (f"rediss://u:{SECRET}%40x@h:1", "rediss://u:***@h:1"),
    (f"redis://u:{SECRET}/x#y@h:1", "redis://u:***@h:1"),  # unencoded '/' and '#': not even a valid URL
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_mask_url_masks_every_form(url, shown):
    assert mask_url(url) == shown
    password = SECRET + ("@x" if "%40x" in url else "/x#y" if "/x#y" in url else "")  # as redis-py would send it
    assert SECRET not in redact(f"failed at {url}, auth {password}", url) or SECRET not in url


def _invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def locked(make_server):
    """A private server that requires a password (set once started: the embedded server's readiness check has
    none)."""
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.config_set("requirepass", SECRET)
    admin.close()
    return url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("form", ["redis://:{pw}@127.0.0.1:{port}", "redis://default:{pw}@127.0.0.1:{port}",
                                  "redis://127.0.0.1:{port}?password={pw}", "redis://127.0.0.1:{port}/0?password={pw}"])
def test_a_wrong_password_is_never_printed(locked, form):
    url = form.format(pw=SECRET + "-wrong", port=_port(locked))
    for command in (["inspect"], ["purge", "--namespace", "x"]):
        out = _invoke(*command, "--redis-url", url)
        assert out.exit_code == 3, out.output
        assert SECRET not in out.output and "***" in out.output
    out = _invoke("inspect", env={"REDIS_URL": url})
    assert out.exit_code == 3 and SECRET not in out.output


def test_a_password_in_the_query_is_masked_in_the_replay_json(locked, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"token_ids": list(range(1, 11))}) + "\n")
    url = f"redis://127.0.0.1:{_port(locked)}?password={SECRET}"
    out = _invoke("replay", str(trace), "--chunk-sizes", "4", "--measure", "0", "--prefill-tps", "1000",
                  "--payload", "accounted", "--redis-url", url, "--json")
    assert out.exit_code == 0, out.output
    assert SECRET not in out.output
    assert json.loads(out.stdout)["context"]["redis"] == f"redis://127.0.0.1:{_port(locked)}?password=***"
    assert json.loads(out.stdout)["context"]["server_cpu_seconds"] is None  # a given server's count is not the run's


def test_an_unreachable_or_malformed_url_never_prints_its_password(unused_port):
    out = _invoke("inspect", "--redis-url", f"redis://u:{SECRET}@127.0.0.1:{unused_port}")
    assert out.exit_code == 3 and SECRET not in out.output and "redis://u:***@127.0.0.1" in out.output
    out = _invoke("inspect", "--redis-url", f"redis://u:{SECRET}/x@127.0.0.1:{unused_port}")  # '/' unencoded
    assert out.exit_code == 2 and SECRET not in out.output and "percent-encoded" in out.output


def test_a_server_that_needs_a_password_the_url_does_not_give_says_so(locked):
    out = _invoke("purge", "--namespace", "x", "--redis-url", locked)
    assert out.exit_code == 3
    assert "requires a password and the URL gives none" in out.output and "HELLO" not in out.output


@pytest.mark.parametrize("path", ["abc", "0x1", "1/2"])
def test_a_url_path_that_is_not_a_database_number_is_bad_input(redis_url, redis_client, path):
    """redis-py would ignore such a path and use database 0."""
    before = redis_client.dbsize()
    out = _invoke("replay", "sample_traces/tokens_small.jsonl", "--chunk-sizes", "4", "--measure", "0",
                  "--prefill-tps", "1000", "--payload", "accounted", "--redis-url", f"{redis_url}/{path}")
    assert out.exit_code == 2, out.output
    assert "not a Redis URL" in out.output and "must be a database number" in out.output
    assert redis_client.dbsize() == before
    assert connect(f"{redis_url}/0").ping() and connect(f"{redis_url}/").ping()


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_sets_its_own_timeouts_and_retry_policy(redis_url):
    """Explicit values, not redis-py's defaults (which differ between versions)."""
    client = connect(redis_url, timeout=0.75)
    pool = client.connection_pool if not isinstance(client, RedisCluster) else \
        client.get_redis_connection(client.get_primaries()[0]).connection_pool  # a cluster: each node's
    kwargs = pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.75
    if isinstance(client, RedisCluster):  # the cluster client's own policy counts into the same record
        assert client.retry._retries == RETRIES and fault_counts(client) is client.retry.counts
        client.close()
        return
    conn = pool.get_connection("PING") if int(redis.__version__.split(".")[0]) < 6 else pool.get_connection()
    try:
        assert conn.socket_timeout == 0.75 and conn.retry._retries == RETRIES
        assert redis.exceptions.ConnectionError in conn.retry._supported_errors
        assert redis.exceptions.TimeoutError not in conn.retry._supported_errors
        assert conn.retry.counts is fault_counts(client)  # every connection counts into the client's one record
    finally:
        client.connection_pool.release(conn)
        client.close()
    assert connect(redis_url).connection_pool.connection_kwargs["socket_timeout"] == DEFAULT_TIMEOUT
    with pytest.raises(BadInputError):
        connect(redis_url, timeout=0)


def test_a_stalled_server_fails_the_connect_after_the_timeout(fault_proxy):
    fault_proxy.stall()  # the first packet (the handshake or PING) never gets a reply
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_try_connect(fault_proxy.url())), daemon=True)
    worker.start()
    worker.join(60)  # a hang detector, not a timing assertion: the timeout is 0.3 s
    assert outcome and isinstance(outcome[0], RedisFailure) and "Timeout" in str(outcome[0])


def _try_connect(url):
    try:
        return connect(url, timeout=0.3)
    except RedisFailure as exc:
        return exc


def _store(client, **kw) -> ChunkStore:
    return ChunkStore(client, StoreConfig("ns", 4, "m", "raw", (2, 2, 2, 8), torch.float32, payload="accounted"),
                      **kw)


TOKENS = np.arange(1, 11, dtype="<u4")


@pytest.mark.single_server("the fault proxy stands in front of one server")
def test_a_dropped_write_is_retried_once_and_counted(fault_proxy, redis_client):
    client = connect(fault_proxy.url())
    store = _store(client)
    fault_proxy.drop(b"MSET")
    look = store.lookup(TOKENS)
    written = store.store(TOKENS, None, lookup=look)
    assert fault_proxy.dropped == 1 and written.chunks_written == 2
    assert (store.stats.redis_retries, store.stats.redis_errors, store.stats.redis_timeouts) == (1, 0, 0)
    assert store.lookup(TOKENS).hit_tokens == 8
    assert len(list(redis_client.scan_iter("kvcli:v1:ns:4:m:*"))) == 2


@pytest.mark.single_server("the fault proxy stands in front of one server")
def test_a_connection_that_keeps_dropping_fails_after_the_retries(fault_proxy):
    client = connect(fault_proxy.url())
    strict, tolerant = _store(client), _store(client, tolerate_unavailable=True)
    fault_proxy.drop(b"EVAL_RO", times=None)  # every lookup (one EVAL_RO)
    with pytest.raises(RedisUnavailable, match="the connection kept dropping"):
        strict.lookup(TOKENS)
    assert fault_proxy.dropped == RETRIES + 1 and strict.stats.redis_retries == RETRIES
    look = tolerant.lookup(TOKENS)  # a tolerant store: a miss, counted
    assert (look.hit_tokens, look.break_reason, look.failed) == (0, "redis-error", True)
    assert tolerant.store(TOKENS, None, lookup=look).chunks_written == 0  # a failed lookup stores nothing
    assert (tolerant.stats.redis_errors, tolerant.stats.lookups) == (1, 0)
    with pytest.raises(RedisUnavailable, match="3 calls in a row"):  # the third failure in a row on this client
        tolerant.lookup(TOKENS)


def test_authentication_errors_are_not_retried(locked):
    client = redis.Redis.from_url(locked.replace("redis://", f"redis://:{SECRET}@"))
    client.set("x", "1")
    with pytest.raises(RedisFailure):
        connect(locked.replace("redis://", "redis://:wrong@"))
    url = locked.replace("redis://", "redis://:wrong@")
    from kvcli.store.server import CountingRetry, EqualJitterBackoff

    retry = CountingRetry(EqualJitterBackoff(), RETRIES)
    bare = redis.Redis.from_url(url, retry=retry, retry_on_error=[redis.exceptions.ConnectionError])
    with pytest.raises(redis.exceptions.AuthenticationError):
        bare.ping()
    assert retry.counts.retries == 0


def test_server_info_is_none_for_a_user_without_info(make_server):
    url = make_server()
    admin = redis.Redis.from_url(url)
    admin.execute_command("ACL", "SETUSER", "kv", "on", ">pw", "~kvcli:*", "+@all", "-@dangerous", "-@admin")
    client = connect(url.replace("redis://", "redis://kv:pw@"))
    assert server_info(client, "memory") is None
    assert server_info(admin, "memory")["used_memory"] > 0


def test_wait_closed_waits_for_every_connection_of_a_name_on_every_shard(redis_url, redis_client):
    """A named client's connections (on each node it reached) keep wait_closed waiting; once it closes them, it
    returns True; a name no connection holds returns at once."""
    from kvcli.store import cluster

    named = connect(redis_url, client_name="kvcli-test-writer")
    for i in range(20):  # keys in several slots: a cluster client then holds a connection on every primary
        named.set(f"k{i}", i)
    assert not cluster.wait_closed(redis_client, "kvcli-test-writer", 0.2)
    cluster.drop_connections(named)  # its sockets closed, as a dead process's are (a cluster client's close() keeps
    named.close()  # its nodes' pools open until it is collected)
    assert cluster.wait_closed(redis_client, "kvcli-test-writer", 10.0)
    assert cluster.wait_closed(redis_client, "nobody", 0.0)


# -- the embedded server is the command's own --------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]

# One process of test_concurrent_embedded_servers_are_private: argv = barrier dir, its name, how many processes.
# All start their server at once (barrier "ready"), each writes a key of its own (barrier "wrote"), lists the keys on
# its server, empties it as kvcli does after a trace, and waits for every other process to have listed (barrier
# "listed") before it stops its server; it prints its URL and what it listed as JSON.
_PRIVATE_SERVER = """
import json, sys, time
from pathlib import Path
import redis
from kvcli.store.server import embedded_server

barriers, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def barrier(name):
    (barriers / f"{name}-{me}").touch()
    deadline = time.monotonic() + 60
    while len(list(barriers.glob(f"{name}-*"))) < n:
        assert time.monotonic() < deadline, f"barrier {name}: not every process came"
        time.sleep(0.01)

barrier("ready")
with embedded_server() as url:
    client = redis.Redis.from_url(url)
    client.set(f"key-{me}", me)
    barrier("wrote")
    keys = sorted(k.decode() for k in client.keys("*"))
    client.flushdb()
    barrier("listed")
print(json.dumps({"url": url, "keys": keys}))
"""


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_embedded_servers_are_private(tmp_path, round_):
    """4 processes start their embedded servers at the same moment: each gets a server of its own (its own unix
    socket), sees only the key it wrote there, and none loses its key to another's FLUSHDB."""
    n = 4
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    procs = [subprocess.Popen([sys.executable, "-c", _PRIVATE_SERVER, str(tmp_path), str(i), str(n)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [err for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    assert [r["keys"] for r in reports] == [[f"key-{i}"] for i in range(n)]
    assert all(r["url"].startswith("unix:///") and r["url"].endswith("/redis.sock") for r in reports)
    assert len({r["url"] for r in reports}) == n
    assert not any(Path(r["url"][len("unix://"):]).parent.exists() for r in reports)  # removed when stopped


@pytest.fixture
def foreign_server():
    """Factory: ``foreign_server(*args) -> (client, pid)`` starts a plain redis-server from PATH (not kvcli's:
    started here, with ``args``, e.g. a port or a unix socket), waits until it answers; all stop at teardown."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("no redis-server on PATH")
    started: list[tuple[subprocess.Popen, redis.Redis, str]] = []

    def start(*args: str) -> tuple[redis.Redis, int]:
        workdir = tempfile.mkdtemp(prefix="kvcli-foreign-")
        proc = subprocess.Popen([path, "--save", "", "--appendonly", "no", "--dir", workdir, *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = args[args.index("--unixsocket") + 1] if "--unixsocket" in args else None
        client = redis.Redis(unix_socket_path=sock) if sock else redis.Redis(port=int(args[args.index("--port") + 1]))
        started.append((proc, client, workdir))
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                return client, proc.pid
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    yield start
    for proc, client, workdir in started:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_check_owner_refuses_a_server_that_is_not_the_child():
    """The ownership check passes for the process a server is, and refuses it for any other pid."""
    with embedded_server() as url:
        client = redis.Redis.from_url(url)
        pid = client.info("server")["process_id"]
        check_owner(client, pid)
        with pytest.raises(RedisFailure, match=f"is not the one started here: its process id is {pid}, the "
                                               f"child's is {os.getpid()}"):
            check_owner(client, os.getpid())
        client.close()


def test_check_owner_refuses_a_plain_redis_server_started_elsewhere(foreign_server):
    sock = os.path.join(tempfile.mkdtemp(prefix="kvcli-foreign-"), "redis.sock")
    client, pid = foreign_server("--port", "0", "--unixsocket", sock)
    check_owner(client, pid)
    for other in (pid + 1, os.getpid()):
        with pytest.raises(RedisFailure, match=f"unix://{sock} is not the one started here"):
            check_owner(client, other)
    shutil.rmtree(os.path.dirname(sock))


def test_a_tcp_embedded_server_never_takes_a_port_another_server_holds(foreign_server, unused_port, monkeypatch):
    """``embedded_server(tcp=True)`` handed a port another server already holds: its own child cannot bind it, the
    server answering there is not the child, and another port is tried; the other server keeps its key."""
    from kvcli.store import server as server_module

    port = unused_port
    theirs, _ = foreign_server("--port", str(port), "--bind", "127.0.0.1")
    theirs.set("theirs", "1")
    real, picks = server_module.free_ports, []
    monkeypatch.setattr(server_module, "free_ports",
                        lambda n: picks.append(n) or ([port] if len(picks) == 1 else real(n)))
    with embedded_server(tcp=True) as url:
        mine = redis.Redis.from_url(url)
        assert url != f"redis://127.0.0.1:{port}" and mine.dbsize() == 0
        mine.flushdb()
        mine.close()
    assert len(picks) == 2
    assert theirs.keys("*") == [b"theirs"]


def test_two_replays_at_once_each_on_its_embedded_server_give_the_figures_of_one_alone():
    """Two ``kvcli replay`` runs without a URL at once (one ends, and empties its server, while the other is
    mid-replay): each reports the hits it reports alone (figures of a run alone, chunk size 64)."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    alone = {"chat_shared_system.jsonl": {"hit_tokens": 10112, "chunks_hit": 158, "hit_requests": 21, "lookups": 24},
             "mooncake_conversation_head1000.jsonl.gz": {"hit_tokens": 2962304, "chunks_hit": 46286,
                                                         "hit_requests": 999, "lookups": 1000}}
    procs = {name: subprocess.Popen([sys.executable, "-m", "kvcli", "replay", f"sample_traces/{name}", "--payload",
                                     "accounted", "--measure", "0", "--prefill-tps", "5000", "--chunk-sizes", "64",
                                     "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
             for name in alone}
    outs = {name: p.communicate(timeout=300) for name, p in procs.items()}
    for name, (out, err) in outs.items():
        assert procs[name].returncode == 0, err
        doc = json.loads(out)
        assert doc["context"]["redis"].startswith("unix:///") and doc["context"]["redis"].endswith(" (embedded)")
        assert doc["context"]["server_cpu_seconds"] > 0  # its own server's INFO cpu, that server's work alone
        row = doc["traces"][0]["per_chunk_size"][0]
        assert {k: row[k] for k in alone[name]} == alone[name], name
