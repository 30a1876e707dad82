"""kvcli's multi-key commands on a single server or a Redis Cluster: one client, the same calls, each kind's way.

On a cluster every key lives in one of 16,384 hash slots and each primary (shard) serves a range of them; a
multi-key command (MGET, MSET, UNLINK, MULTI/EXEC, a script's KEYS) must name keys of ONE slot. kvcli's chunk
keys carry no hash tag, so a namespace spreads over every shard, and redis-py's cluster client
(:class:`redis.cluster.RedisCluster`) routes every key; nothing here computes a slot by hand.

* **Reads** (:func:`mget`): one MGET on a single server; on a cluster, redis-py's ``mget_nonatomic``: one MGET per
  slot, queued per shard in one cluster pipeline that WRITES every shard's commands before it reads any reply,
  so the shards work concurrently and a lookup costs one round trip per shard it touches, not one per chunk and
  not one shard after another (``bench/bench_cluster.py`` measures it). :class:`ShardTrips` counts round trips
  per shard.
* **Writes** (:func:`set_in_order`): a chunk's payload and metadata keys hash to different slots, so they can be
  on different shards, and one cluster pipeline gives no order between shards. Payloads go first (one pipelined
  round trip per shard), metadata only after every payload was acknowledged (one more). A write that fails part
  way therefore leaves payloads without metadata (orphans no lookup can see: ``kvcli inspect`` lists them) or
  metadata of later chunks without that of an earlier one (unreachable: a lookup stops at the first missing
  chunk), never metadata without its payload. On a single server the caller's atomic MSET / MULTI/EXEC stays.
* **Deletes** (:func:`unlink`, :func:`queue_delete`): one UNLINK per slot (redis-py splits them).
* **Scans** (:func:`scan`): SCAN runs on EVERY primary, after :func:`check_whole` made sure the cluster serves
  all 16,384 slots; a shard that fails fails the command (exit 3): a partial view is never presented as the
  whole. A key that migrates between shards during the scan (resharding) can be missed or seen twice, as with
  any cluster SCAN.
* **Server facts** (:func:`shard_info`, :func:`used_memory`, :func:`dbsize`): per primary, summed where a total
  is asked for.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from kvcli.errors import RedisFailure

SLOTS = 16384
#: What a Redis call can raise: redis-py's errors, and its cluster client's own family (not a RedisError: e.g. "All
#: slots are not covered", a cross-slot transaction).
REDIS_ERRORS = (redis.RedisError, RedisClusterException)


def is_cluster(client) -> bool:
    """Whether ``client`` is redis-py's cluster client (then every helper here works per shard)."""
    return isinstance(client, RedisCluster)


def shards(client) -> list[tuple[str, redis.Redis]]:
    """``[(name "host:port", a client of that server)]``: every primary of a cluster, or the one server."""
    if is_cluster(client):
        return [(node.name, client.get_redis_connection(node))
                for node in sorted(client.get_primaries(), key=lambda n: n.name)]
    kw = client.connection_pool.connection_kwargs
    name = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
    return [(str(name), client)]


def check_whole(client) -> None:
    """Refuse to read a cluster that does not serve every slot (``CLUSTER INFO`` of each primary: state ``ok``, all
    16,384 slots assigned, none failing), so a scan is never a partial view. A plain client is refused when its
    server is a cluster node (``INFO cluster``): it would see one shard's keys only.

    Raises:
        RedisFailure: a primary is unreachable or reports an incomplete cluster.
    """
    if not is_cluster(client):
        try:
            enabled = int(client.info("cluster").get("cluster_enabled", 0))
        except redis.ResponseError:  # INFO refused (an ACL): nothing to tell
            return
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis INFO failed: {exc}") from None
        if enabled:
            raise RedisFailure("this connection reaches ONE node of a Redis Cluster, which holds only its own slots' "
                               "keys: connect with the cluster client (kvcli.store.server.connect does)")
        return
    for name, node in shards(client):
        try:
            raw = node.execute_command("CLUSTER", "INFO")
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis Cluster primary {name}: {exc}") from None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        info = dict(line.split(":", 1) for line in text.split() if ":" in line)
        ok = (info.get("cluster_state") == "ok" and int(info.get("cluster_slots_assigned", 0)) == SLOTS
              and int(info.get("cluster_slots_fail", 0)) == 0)
        if not ok:
            raise RedisFailure(
                f"Redis Cluster primary {name} reports cluster_state:{info.get('cluster_state', '?')}, "
                f"{info.get('cluster_slots_assigned', '?')} of {SLOTS} slots assigned, "
                f"{info.get('cluster_slots_fail', '?')} failing: a scan would miss keys, so nothing was read")


def scan(client, match: str | bytes | None = None, count: int = 1000) -> Iterator[tuple[str, list[bytes]]]:
    """``(shard name, keys)`` batches of every key (matching ``match``) on every primary: SCAN with a cursor, one
    shard after another (never KEYS). Checks :func:`check_whole` first.

    Raises:
        RedisFailure: a SCAN failed on any shard (the keys already yielded are a partial view: do not use them
            as the whole).
    """
    check_whole(client)
    for name, node in shards(client):
        cursor = 0
        while True:
            try:
                cursor, keys = node.scan(cursor, match=match, count=count)
            except REDIS_ERRORS as exc:
                raise RedisFailure(f"Redis SCAN failed on {name}: {exc}") from None
            if keys:
                yield name, keys
            if cursor == 0:
                break


def mget(client, keys: list) -> list:
    """Values of ``keys`` in order (None where missing): MGET, or on a cluster one MGET per slot, every shard's
    sent before any reply is read (one round trip per shard touched). Raises redis errors as they come."""
    if is_cluster(client):
        return client.mget_nonatomic(keys)
    return client.mget(keys)


def unlink(client, keys: list) -> int:
    """UNLINK ``keys`` (one per slot on a cluster, pipelined per shard). Returns the number removed."""
    if not keys:
        return 0
    return int(client.unlink(*keys))


def queue_delete(pipe, keys: list, cluster: bool) -> None:
    """Queue a DEL of ``keys`` on ``pipe``: one command on a single server, one per key in a cluster pipeline
    (redis-py refuses a multi-key DEL there)."""
    if not keys:
        return
    if cluster:
        for key in keys:
            pipe.delete(key)
    else:
        pipe.delete(*keys)


def set_in_order(client, pipe, first: list[tuple], then: list[tuple], nx: bool = False, ex: int | None = None
                 ) -> tuple[list, list]:
    """Cluster writes with an order between them: ``first``'s ``(key, value)`` SETs (queued on ``pipe`` after what
    it already holds, e.g. deletes of other keys) and only once all of them were acknowledged, ``then``'s. Two
    pipelined round trips; one when ``first`` is empty (``then`` joins ``pipe``). Returns the replies to ``first``
    and to ``then`` (replies to commands queued on ``pipe`` before are dropped). Raises redis errors; ``then`` is
    not sent when ``first`` failed.
    """
    queued = len(pipe)
    if not first:  # nothing to wait for: ``then`` goes with what ``pipe`` holds (its keys are others'), one round
        for key, value in then:
            pipe.set(key, value, nx=nx, ex=ex)
        return [], (pipe.execute()[queued:] if (then or queued) else [])
    for key, value in first:
        pipe.set(key, value, nx=nx, ex=ex)
    replies_first = pipe.execute()[queued:]
    if not then:
        return replies_first, []
    second = client.pipeline(transaction=False)
    for key, value in then:
        second.set(key, value, nx=nx, ex=ex)
    return replies_first, second.execute()


def write_prefix(client, chunks: list[tuple[tuple, tuple]], ex: int | None = None
                 ) -> tuple[int, redis.RedisError | None]:
    """Write ``chunks`` (``((payload key, value), (metadata key, value))`` in chain order) on a cluster so that what
    is stored is a PREFIX of them, as a MULTI/EXEC batch is on a single server: payloads first, then the metadata of
    the chunks before the first refused payload; when a write is refused, both halves of every chunk from the first
    refused one on are deleted again (UNLINK, which an out-of-memory server still runs).

    Returns ``(chunks stored, the first error or None)``.
    """
    pipe = client.pipeline(transaction=False)
    for (key, value), _ in chunks:
        pipe.set(key, value, ex=ex)
    replies = pipe.execute(raise_on_error=False)
    good = next((i for i, r in enumerate(replies) if isinstance(r, Exception)), len(chunks))
    error = replies[good] if good < len(chunks) else None
    if good:
        pipe = client.pipeline(transaction=False)
        for _, (key, value) in chunks[:good]:
            pipe.set(key, value, ex=ex)
        metas = pipe.execute(raise_on_error=False)
        bad = next((i for i, r in enumerate(metas) if isinstance(r, Exception)), good)
        if bad < good:
            good, error = bad, metas[bad]
    if error is not None:
        unlink(client, [key for chunk in chunks[good:] for key, _ in chunk])
    return good, error


class ShardTrips:
    """Round trips per shard of one store: a lookup that touches three shards counts one round trip on each (they
    run concurrently, so it costs one round trip of wall time). ``counts``: ``{shard name: round trips}``."""

    def __init__(self, client) -> None:
        self.counts: Counter[str] = Counter()
        self._client = client if is_cluster(client) else None
        self._single = None if self._client is not None else shards(client)[0][0]

    def add(self, keys: Iterable) -> None:
        """Count one round trip on every shard that holds one of ``keys`` (the one server: always one)."""
        if self._client is None:
            self.counts[self._single] += 1
            return
        manager, slot = self._client.nodes_manager, self._client.keyslot
        for name in {manager.get_node_from_slot(slot(k)).name for k in keys}:
            self.counts[name] += 1


def shard_info(client, *sections: str) -> dict[str, dict]:
    """``INFO sections`` of every primary (one server: itself), ``{shard name: info}``. Raises RedisFailure."""
    out = {}
    for name, node in shards(client):
        try:
            out[name] = node.info(*sections)
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis INFO failed on {name}: {exc}") from None
    return out


def used_memory(client) -> int:
    """``used_memory`` (bytes) summed over the primaries."""
    return sum(int(info.get("used_memory", 0)) for info in shard_info(client, "memory").values())


def dbsize(client) -> int:
    """Keys in database 0 (a single server's current database), summed over the primaries."""
    total = 0
    for name, node in shards(client):
        try:
            total += int(node.dbsize())
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis DBSIZE failed on {name}: {exc}") from None
    return total


def server_version(client) -> str:
    """The server's version (Valkey's or Redis's), of the first primary on a cluster."""
    info = shards(client)[0][1].info("server")
    return str(info.get("valkey_version") or info.get("redis_version", "?"))
