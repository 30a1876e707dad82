"""Read-only access to a live server shared by inspect, the chunk map and warm: a NO-TOUCH reader connection,
the server's memory facts (every primary's on a Redis Cluster), and checks of a chunk's metadata and payload.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import xxhash

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.layout import ChunkMeta, parse_metadata
from kvcli.store.serde import PayloadError, decode_kv
from kvcli.store.server import no_touch_client

READ_COMMANDS = frozenset({"scan", "mget", "get", "exists", "strlen", "pttl", "memory|usage", "info", "dbsize",
                           "eval_ro", "client|no-touch",
                           # a Redis Cluster: the slot map and command table redis-py's cluster client reads when
                           # it connects, and CLUSTER INFO (kvcli.store.cluster.check_whole)
                           "cluster|info", "cluster|slots", "cluster|shards", "command"})


@dataclass(frozen=True)
class ShardMemory:
    """One primary's memory state and counters (bytes; ``keys`` is its DBSIZE), ``name`` "host:port"."""

    name: str
    used_memory: int
    maxmemory: int
    policy: str
    evicted_keys: int
    expired_keys: int
    keys: int
    version: str


@dataclass(frozen=True)
class ServerMemory:
    """The server's memory state and counters: bytes; ``policy`` is maxmemory-policy; ``keys`` is DBSIZE. On a
    Redis Cluster the totals over its primaries, and ``shards`` each primary's own (empty for a single server)."""

    used_memory: int
    maxmemory: int
    policy: str
    evicted_keys: int
    expired_keys: int
    keys: int
    version: str
    shards: tuple[ShardMemory, ...] = ()


@contextlib.contextmanager
def reader(client: redis.Redis) -> Iterator[redis.Redis]:
    """A client for inspect's reads: ONE connection to ``client``'s server (to each primary of a cluster; a pool of
    one, so every command and pipeline goes over it; a second connection would be an error, not a silent bypass;
    made by :func:`kvcli.store.server.no_touch_client`), in ``CLIENT NO-TOUCH ON`` mode from its first command on
    (sent again after a reconnect), so reads leave the keys' LRU/LFU state as it was. Servers without NO-TOUCH
    (Redis < 7.2) or an ACL that refuses it: the error is ignored and the reads touch keys as any client's reads
    do. ``.kvcli_no_touch`` on the yielded client says whether every server accepted it (None until connected). A
    client from :func:`reader` is yielded as is. Closed on exit."""
    if getattr(client, "kvcli_no_touch", False) is not False:
        yield client
        return

    state: dict = {"no_touch": None, "client": None}  # a cluster client connects while it is being made

    def on_connect(conn) -> None:
        try:
            conn.send_command("CLIENT", "NO-TOUCH", "ON")
            conn.read_response()
            state["no_touch"] = state["no_touch"] is not False
        except redis.ResponseError:  # unknown subcommand (Redis < 7.2) or refused by an ACL
            state["no_touch"] = False
        if state["client"] is not None:
            state["client"].kvcli_no_touch = state["no_touch"]

    ours = state["client"] = no_touch_client(client, on_connect)
    ours.kvcli_no_touch = state["no_touch"]
    try:
        yield ours
    finally:
        ours.close()
        if not cluster.is_cluster(ours):
            ours.connection_pool.disconnect()


def server_memory(client: redis.Redis) -> ServerMemory:
    """INFO memory/stats/server and DBSIZE, read-only; on a cluster, of every primary: bytes and counters summed,
    ``maxmemory`` summed (0 when any primary has none), ``policy`` and ``version`` of the first primary (or
    "mixed"), and each primary's own figures in ``shards``. Raises RedisFailure."""
    facts = []
    for name, node in cluster.shards(client):
        try:
            info = node.info("memory", "stats", "server")
            keys = node.dbsize()
        except cluster.REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis INFO failed on {name}: {exc}") from None
        facts.append(ShardMemory(name, int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)),
                                 str(info.get("maxmemory_policy", "?")), int(info.get("evicted_keys", 0)),
                                 int(info.get("expired_keys", 0)), int(keys),
                                 str(info.get("valkey_version") or info.get("redis_version", "?"))))
    policies, versions = {f.policy for f in facts}, {f.version for f in facts}
    return ServerMemory(sum(f.used_memory for f in facts),
                        0 if any(not f.maxmemory for f in facts) else sum(f.maxmemory for f in facts),
                        facts[0].policy if len(policies) == 1 else "mixed", sum(f.evicted_keys for f in facts),
                        sum(f.expired_keys for f in facts), sum(f.keys for f in facts),
                        facts[0].version if len(versions) == 1 else "mixed",
                        tuple(facts) if cluster.is_cluster(client) else ())


def execute_read(pipe, raise_on_error: bool = True):
    """Run a read pipeline; a Redis error becomes RedisFailure (one line at the CLI)."""
    try:
        return pipe.execute(raise_on_error=raise_on_error)
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis read failed: {exc}") from None


def parse_or_none(raw: bytes) -> ChunkMeta | None:
    """Parsed metadata, or None when it is not kvcli metadata (bad or truncated)."""
    try:
        return parse_metadata(raw)
    except PayloadError:
        return None


def payload_ok(meta: ChunkMeta, value: bytes) -> bool:
    """True when ``value`` decodes to the metadata's shape and its tensor bytes match the metadata's checksum."""
    try:
        tensor, _ = decode_kv(value)
    except PayloadError:
        return False
    data = memoryview(value)[len(value) - meta.payload:]
    return (tuple(tensor.shape) == meta.shape and tensor.numel() * tensor.element_size() == meta.payload
            and xxhash.xxh3_64_digest(data) == meta.checksum)
