"""Redis Cluster: detection, one round trip per shard, exact per-shard counts and deletes, refusal of a partial
view, warm's prefix writes, and the same hits as a single server, on real local clusters (tests/conftest.py)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster
from typer.testing import CliRunner

from kvcli.cli.app import app as cli_app
from kvcli.errors import BadInputError, RedisFailure
from kvcli.live.inspect import inspect_cache
from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.costcurve import CostCurve
from kvcli.model.llama import build_model
from kvcli.model.presets import ModelSpec, model_spec
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.route.cachemanager import CacheManagerIndex
from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.namespace import count, purge
from kvcli.store.records import StoreConfig
from kvcli.store.server import connect
from kvcli.traces.detect import read_trace
from kvcli.traces.request import Request

pytestmark = pytest.mark.cluster
MOONCAKE = Path(__file__).resolve().parents[2] / "sample_traces/mooncake_conversation_head1000.jsonl.gz"
SPEC = ModelSpec("m", (8, 2, 2, 64), torch.bfloat16)
TINY = model_spec("tiny")


@pytest.fixture
def single_url(_session_server):
    client = redis.Redis.from_url(_session_server)
    client.flushall()
    client.close()
    return _session_server


@pytest.fixture
def cluster_url(_session_cluster):
    client = connect(_session_cluster)
    for _, node in cluster.shards(client):
        node.flushall()
    client.close()
    return _session_cluster


@pytest.fixture
def cc(cluster_url):
    """A plain RedisCluster (no test conveniences) on the session cluster."""
    client = connect(cluster_url)
    yield client
    client.close()


def per_shard(client, pattern: str) -> dict[str, int]:
    """Keys matching ``pattern`` on each primary, counted by that primary's own SCAN."""
    return {name: sum(1 for _ in node.scan_iter(match=pattern, count=1000)) for name, node in cluster.shards(client)}


def test_a_cluster_is_detected_or_named_by_the_url(cluster_url, single_url):
    assert isinstance(connect(cluster_url), RedisCluster)  # plain redis:// to one node: INFO cluster says so
    named = connect(cluster_url.replace("redis://", "redis+cluster://"))
    assert isinstance(named, RedisCluster) and len(named.get_primaries()) == 3
    assert not isinstance(connect(single_url), RedisCluster)
    with pytest.raises(RedisFailure, match="not a Redis Cluster node"):
        connect(single_url.replace("redis://", "redis+cluster://"))
    with pytest.raises(BadInputError):
        connect("redis+cluster://host:notaport")


def test_one_node_through_a_plain_client_is_refused_not_counted_as_the_whole(cc, cluster_url):
    store = ChunkStore(cc, StoreConfig("w", 4, "m", "raw", (1, 2, 1, 2), torch.float32, payload="accounted"))
    store.store(np.arange(400, dtype=np.uint32), None)  # 100 chunks: metadata on every shard
    one_node = redis.Redis.from_url(cluster_url)
    with pytest.raises(RedisFailure, match="ONE node of a Redis Cluster"):
        count(one_node, "w")
    with pytest.raises(RedisFailure, match="ONE node of a Redis Cluster"):
        purge(one_node, "w")
    with pytest.raises(RedisFailure, match="ONE node of a Redis Cluster"):
        inspect_cache(one_node)
    assert count(cc, "w").keys == 100


def test_a_lookup_writes_to_every_shard_before_it_reads_any(cc, monkeypatch):
    """The shards work on one lookup at the same time: every shard's MGETs are sent before the first reply is
    read, so the lookup costs one round trip of wall time, counted once on each shard."""
    store = ChunkStore(cc, StoreConfig("c", 4, "m", "raw", (1, 2, 1, 2), torch.float32, payload="accounted"))
    tokens = np.arange(4 * 60, dtype=np.uint32)
    store.store(tokens, None)
    events = []
    conn = redis.connection.Connection
    send, read = conn.send_packed_command, conn.read_response
    monkeypatch.setattr(conn, "send_packed_command", lambda self, *a, **k: (
        events.append(("send", self.port)), send(self, *a, **k))[1])
    monkeypatch.setattr(conn, "read_response", lambda self, *a, **k: (events.append(("read", self.port)),
                                                                       read(self, *a, **k))[1])
    before = Counter(store.shard_trips.counts)
    assert store.lookup(tokens).hit_chunks == 60
    monkeypatch.undo()
    kinds = [kind for kind, _ in events]
    assert kinds.index("read") == len({port for kind, port in events if kind == "send"}) == 3
    assert store.shard_trips.counts - before == Counter({name: 1 for name, _ in cluster.shards(cc)})


def test_hit_tokens_are_identical_on_a_single_server_and_on_the_cluster(single_url, cluster_url):
    # the first 150 requests: 76,288 hit tokens, 97,792 without the capacity (28,928 chunks evicted at 64)
    config = ReplayConfig(chunk_sizes=(64, 512), payload="accounted", measure=0, limit=150, capacity_tokens=60_000)
    rows = {}
    for url in (single_url, cluster_url):
        client = connect(url)
        replayer = Replayer(client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config, spec=SPEC)
        result = replayer.replay(str(MOONCAKE), lambda: read_trace(MOONCAKE))
        rows[url] = [(r.chunk_size, r.requests, r.prompt_tokens, r.hit_tokens, r.hit_tokens_unlimited,
                      r.objects_created, r.metadata_entries, r.evicted_chunks, r.metadata_bytes_written, r.lookups)
                     for r in result.per_chunk_size]
        trips = [(r.round_trips, r.round_trips_by_shard) for r in result.per_chunk_size]
        if url == cluster_url:  # a lookup or a write: at most one round trip on each shard it touches
            assert all(len(s) == 3 and max(s.values()) <= n for n, s in trips)
        else:  # a single server: every round trip on it
            assert all(len(s) == 1 and sum(s.values()) <= n for n, s in trips)
        assert cluster.dbsize(client) == 0  # the run's namespace is gone from every shard
        client.close()
    assert rows[single_url] == rows[cluster_url]
    assert rows[single_url][1][3] > 0 and rows[single_url][1][7] > 0  # hits, and the LRU evicted
    assert [(r[3], r[4]) for r in rows[single_url]] == [(76_288, 97_792)] * 2  # the evictions cost hits
    assert rows[single_url][0][7] == 28_928


def test_a_namespace_spreads_and_purge_removes_exactly_its_keys_on_every_shard(cc):
    store = ChunkStore(cc, StoreConfig("fleet", 16, "m", "raw", (1, 2, 1, 2), torch.float32))
    tokens = np.arange(16 * 200, dtype=np.uint32)
    store.store(tokens, torch.zeros((1, 2, 1, 16 * 200, 2)))  # 200 chunks: 400 keys
    foreign = [f"app:{i}" for i in range(300)] + [f"kvcli:v1:fleet2:16:m:{i:032x}" for i in range(30)]
    cc.mset_nonatomic({k: b"x" for k in foreign})
    mine = per_shard(cc, "kvcli:v1:fleet:*")
    assert sorted(mine) == sorted(name for name, _ in cluster.shards(cc))
    assert all(n > 60 for n in mine.values()) and sum(mine.values()) == 400  # no hash tag: every shard holds some
    found = count(cc, "fleet")
    assert (found.metadata, found.payloads, found.by_shard) == (200, 200, mine)
    seen = inspect_cache(cc, sample=0, verify=True)
    assert seen.cluster and seen.kvcli_keys == 430 and seen.other_keys == 300
    assert {s.name: s.keys for s in seen.shards} == {
        name: mine[name] + n for name, n in per_shard(cc, "kvcli:v1:fleet2:*").items()}
    assert sum(s.other_keys for s in seen.shards) == 300 and seen.server.keys == 730
    assert seen.skew["kvcli_keys"] == pytest.approx(max(s.keys for s in seen.shards) * 3 / 430)
    group = next(g for g in seen.groups if g.namespace == "fleet")
    assert (group.chunks, group.metadata_entries, group.payload_objects) == (200, 200, 200) and not group.issues
    done = purge(cc, "fleet")
    assert (done.deleted, done.by_shard) == (400, mine)
    assert per_shard(cc, "kvcli:v1:fleet:*") == {name: 0 for name in mine}
    assert cluster.dbsize(cc) == len(foreign)


def test_the_route_index_lives_in_one_slot_and_its_query_is_one_command(cc):
    index = CacheManagerIndex(cc, nodes=2)
    hashes = [bytes([i % 256, i // 256]) * 8 for i in range(300)]
    index.publish(0, hashes, [])
    index.publish(1, hashes[:5], [])
    assert index.query(hashes)[0] == [300, 5]
    keys = [k for _, batch in cluster.scan(cc, index.prefix + b"*") for k in batch]
    assert len(keys) == 300 and len({cc.keyslot(k) for k in keys}) == 1
    assert index.drop() == 300 and cluster.dbsize(cc) == 0


@pytest.fixture(scope="module")
def _own_clusters(request, cluster_in_background):
    """One cluster for each of this module's selected tests that uses :func:`own_cluster`, all started at once
    (each new cluster waits ~2 s before it accepts writes: they wait together) when the first of those tests
    starts, and all up before it runs: no cluster starts in the background while another test runs (tests here
    count the commands redis-py sends, from every thread)."""
    wanted = sum(item.module is request.module and "own_cluster" in item.fixturenames
                 for item in request.session.items)
    started = [cluster_in_background() for _ in range(wanted)]
    for one in started:
        one.wait()
    yield started
    for one in started:
        one.close()


@pytest.fixture
def own_cluster(_own_clusters, cluster_in_background):
    """A cluster of its own for tests that break it or fill it, stopped after the test."""
    started = _own_clusters.pop() if _own_clusters else cluster_in_background()
    try:
        client = connect(started.url())
        yield client
        client.close()
    finally:
        started.close()


def test_a_cluster_that_does_not_serve_every_slot_is_refused(own_cluster):
    store = ChunkStore(own_cluster, StoreConfig("p", 4, "m", "raw", (1, 2, 1, 2), torch.float32,
                                                payload="accounted"))
    store.store(np.arange(400, dtype=np.uint32), None)
    assert count(own_cluster, "p").keys == 100
    name, node = cluster.shards(own_cluster)[1]
    node.execute_command("CLUSTER", "DELSLOTS", *range(6000, 6010))
    with pytest.raises(RedisFailure, match="slots assigned"):
        count(own_cluster, "p")
    with pytest.raises(RedisFailure, match="nothing was read|slots are not covered"):
        inspect_cache(own_cluster)
    with pytest.raises(RedisFailure):
        purge(own_cluster, "p")
    node.execute_command("CLUSTER", "ADDSLOTS", *range(6000, 6010))


def test_warm_out_of_memory_on_one_shard_leaves_a_prefix_and_no_half_chunk(own_cluster):
    model = build_model("tiny", device="cpu")
    name, node = cluster.shards(own_cluster)[0]
    node.config_set("maxmemory", int(node.info("memory")["used_memory"]) + 400_000)  # noeviction
    prompts = [Request(str(i), np.arange(i * 10000, i * 10000 + 512, dtype=np.uint32), source=f"t:{i}")
               for i in range(4)]  # 4 x 32 chunks of 16 KiB
    result = warm(own_cluster, prompts, model, WarmConfig("o", (16,), batch_chunks=4))
    assert "OOM" in result.stopped or "memory" in result.stopped
    store = make_stores(own_cluster, TINY, WarmConfig("o", (16,)))[0]
    written = 0
    for p in prompts:
        hashes = store.chunk(p.token_ids).hashes
        meta = [own_cluster.exists(store.meta_key(h)) for h in hashes]
        payload = [own_cluster.exists(store.payload_key(h)) for h in hashes]
        assert meta == payload  # no half-written chunk, also across shards
        assert meta == sorted(meta, reverse=True)  # what is stored is a prefix: no gap
        written += sum(meta)
    assert 0 < written == result.total("chunks_written") < 128
    assert cluster.dbsize(own_cluster) == 2 * written
    assert not any(g.issues for g in inspect_cache(own_cluster, sample=0).groups)


def test_a_stale_slot_map_is_followed_not_trusted(cc):
    """When redis-py's slot map is out of date (resharding), a shard answers MOVED and the read is retried through
    redis-py: the lookup still sees every chunk."""
    store = ChunkStore(cc, StoreConfig("m", 4, "m", "raw", (1, 2, 1, 2), torch.float32, payload="accounted"))
    tokens = np.arange(4 * 30, dtype=np.uint32)
    store.store(tokens, None)
    keys = [store.meta_key(h) for h in store.chunk(tokens).hashes]
    cache = cc.nodes_manager.slots_cache
    moved = {}
    for key in keys[:10]:  # point these slots at a shard that does not serve them
        s = cc.keyslot(key)
        wrong = next(n for n in cc.get_primaries() if n.name != cache[s][0].name)
        moved[s] = cache[s]
        cache[s] = [wrong]
    assert cluster.mget(cc, keys) == [cc.get(k) for k in keys] and None not in cluster.mget(cc, keys)
    assert store.lookup(tokens).hit_chunks == 30


def test_replay_refuses_when_one_shard_would_evict(own_cluster):
    """One primary of three is small and evicts (allkeys-lru), the others have no limit: the memory check is per
    shard (each gets a third of the keys), so the replay is refused before it writes, as on a single server."""
    name, node = cluster.shards(own_cluster)[1]
    node.config_set("maxmemory", int(node.info("memory")["used_memory"]) + 300_000)
    node.config_set("maxmemory-policy", "allkeys-lru")
    own_cluster.set("theirs", "x")
    config = ReplayConfig(chunk_sizes=(64,), payload="accounted", measure=0, limit=300)
    replayer = Replayer(own_cluster, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config, spec=SPEC)
    with pytest.raises(RedisFailure, match=f"replay refused: .*does not fit on {name}"):
        replayer.replay(str(MOONCAKE), lambda: read_trace(MOONCAKE))
    assert cluster.dbsize(own_cluster) == 1 and own_cluster.get("theirs") == b"x"
    assert int(node.info("stats")["evicted_keys"]) == 0


def test_a_cluster_missing_slots_is_refused_before_anything_is_written(own_cluster):
    shards = dict(cluster.shards(own_cluster))
    ranges = next(iter(shards.values())).execute_command("CLUSTER", "SLOTS")
    (owner,) = [f"{host.decode() if isinstance(host, bytes) else host}:{port}"
                for start, end, (host, port, *_), *_ in ranges if start <= 16000 <= end]
    # the slots' owner gives them up (a node that does not own them would get them back from it by gossip); the
    # client starts from another node, whose map still covers every slot, and kvcli's own check asks every node
    node = shards[owner]
    url = "redis://" + next(name for name in shards if name != owner)
    node.execute_command("CLUSTER", "DELSLOTS", *range(16000, 16010))
    try:
        with pytest.raises(RedisFailure, match="slots assigned"):
            connect(url)
        out = CliRunner().invoke(cli_app, ["replay", str(MOONCAKE), "--limit", "50", "--measure", "0",
                                           "--prefill-tps", "3000", "--redis-url", url])
        assert out.exit_code == 3 and "slots assigned" in out.stderr, out.output
        out = CliRunner().invoke(cli_app, ["route", str(MOONCAKE), "--limit", "50", "--policy", "cache-manager",
                                           "--prefill-tps", "3000", "--redis-url", url])
        assert out.exit_code == 3, out.output
        assert sum(int(n.dbsize()) for _, n in cluster.shards(own_cluster)) == 0  # no probe, no route index
    finally:
        node.execute_command("CLUSTER", "ADDSLOTS", *range(16000, 16010))


def test_a_database_number_on_a_cluster_is_bad_input(cluster_url):
    with pytest.raises(BadInputError, match="only database 0"):
        connect(cluster_url + "/1")
    with pytest.raises(BadInputError, match="host:port"):
        connect("redis+cluster:///tmp/kvcli.sock")
