"""The cache manager's Redis index outlives a killed ``kvcli route`` only under kvcli's namespace, with a TTL:
``kvcli inspect`` counts it, ``kvcli purge --namespace kvcli-route`` deletes it (real processes, a private server)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.route.cachemanager import CacheManagerIndex
from kvcli.store.layout import ROUTE_INDEX_TTL_SECONDS, ROUTE_NAMESPACE, is_route_index_key
from kvcli.store.namespace import count

ROOT = Path(__file__).resolve().parents[2]


def _trace(path: Path, requests: int = 3000) -> Path:
    """Requests over 50 shared 1,024-token prefixes, each with a tail of its own: many index writes."""
    with path.open("w") as f:
        for i in range(requests):
            base = (i % 50) * 100_000
            f.write(json.dumps({"timestamp": i * 0.01, "token_ids": [*range(base, base + 1024), *[i] * 64],
                                "output_length": 8}) + "\n")
    return path


def test_a_killed_route_leaves_its_index_with_a_ttl_where_purge_and_inspect_find_it(tmp_path, make_server):
    url = make_server()
    client = redis.Redis.from_url(url)
    client.set("theirs", "x")
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "route", str(_trace(tmp_path / "t.jsonl")), "-p",
                             "cache-manager", "--chunk-size", "16", "--prefill-tps", "10000", "--node-capacity",
                             "20000", "--redis-url", url], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while client.dbsize() < 200 and proc.poll() is None:
            assert time.monotonic() < deadline, "route wrote no index"
            time.sleep(0.05)
        assert proc.poll() is None, "route ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    left = [k for k in client.scan_iter("*") if k != b"theirs"]
    assert len(left) >= 200 and all(is_route_index_key(k) for k in left)
    assert all(0 < client.ttl(k) <= ROUTE_INDEX_TTL_SECONDS for k in left)  # gone within the hour by themselves

    found = count(client, ROUTE_NAMESPACE)
    assert (found.route_index, found.metadata, found.payloads) == (len(left), 0, 0)
    inspected = CliRunner().invoke(app, ["inspect", "--redis-url", url, "--json"])
    assert json.loads(inspected.stdout)["keys"] == {"scanned": len(left) + 1, "kvcli": 0,
                                                    "route_index": len(left), "other": 1}
    shown = CliRunner().invoke(app, ["inspect", "--redis-url", url]).stdout
    assert f"route index keys: {len(left):,} (kvcli purge --namespace kvcli-route)" in shown

    dry = CliRunner().invoke(app, ["purge", "--namespace", ROUTE_NAMESPACE, "--redis-url", url])
    assert dry.exit_code == 2
    assert f"0 payloads, {len(left):,} route index keys)" in dry.stderr
    done = CliRunner().invoke(app, ["purge", "--namespace", ROUTE_NAMESPACE, "--yes", "--redis-url", url])
    assert done.exit_code == 0 and f"deleted {len(left):,} keys" in done.stdout, done.output
    assert list(client.scan_iter("*")) == [b"theirs"]


def test_purge_with_a_chunk_size_leaves_a_route_index_alone(redis_client):
    index = CacheManagerIndex(redis_client, nodes=2)
    index.publish(0, [bytes([i]) * 16 for i in range(5)], [])
    assert count(redis_client, ROUTE_NAMESPACE, 16).keys == 0
    assert count(redis_client, "fleet").keys == 0  # another namespace: none of its keys
    assert count(redis_client, ROUTE_NAMESPACE).route_index == 5
    assert index.drop() == 5


def test_an_index_drops_its_keys_after_an_interrupt_left_a_reply_unread(redis_client, server_kind):
    """A Ctrl-C between a pipeline's send and its replies leaves a pooled connection with an unread reply (an
    integer, SADD's); the cleanup's SCAN must not read it (it once raised, and left the index behind)."""
    from kvcli.store import cluster

    index = CacheManagerIndex(redis_client, nodes=2)
    index.publish(0, [bytes([i]) * 16 for i in range(5)], [])
    key = index.prefix + (bytes([0]) * 16).hex().encode()
    server = redis_client
    if cluster.is_cluster(redis_client):
        server = redis_client.get_redis_connection(redis_client.get_node_from_key(key))
    conn = server.connection_pool.get_connection()
    conn.send_command("SADD", key, "1")  # sent, its reply never read: as an interrupted publish leaves it
    server.connection_pool.release(conn)
    assert index.drop() == 5
    assert count(redis_client, ROUTE_NAMESPACE).route_index == 0


def test_a_server_that_evicts_the_index_is_named_in_a_note(make_server):
    """allkeys-lru with 400 kB of room: the index's keys are evicted as the run writes them, and its lookups miss
    what the nodes hold; the run says so (on stderr and in the JSON's notes) instead of reporting low hits as the
    policy's."""
    url = make_server()
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 400_000)
    client.config_set("maxmemory-policy", "allkeys-lru")
    out = CliRunner().invoke(app, ["route", str(ROOT / "sample_traces" / "mooncake_conversation_head1000.jsonl.gz"),
                                   "--chunk-size", "512", "--prefill-tps", "10000", "--no-count-rtt", "-p",
                                   "cache-manager", "--redis-url", url, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    (trace,) = doc["traces"] if "traces" in doc else [doc]
    evicted = trace["runs"][0]["lookups"]["server_evicted_keys"]
    assert evicted > 0
    (note,) = trace["notes"]
    assert note.startswith(f"cache-manager: the server evicted {evicted:,} keys during the run") and note in out.stderr
    client.close()
