"""kvcli's multi-key commands on a single server or a Redis Cluster: one client, the same calls, each kind's way.

On a cluster every key lives in one of 16,384 hash slots and each primary (shard) serves a range of them; a
multi-key command (MGET, MSET, UNLINK, MULTI/EXEC, a script's KEYS) must name keys of ONE slot. kvcli's chunk
keys carry no hash tag, so a namespace spreads over every shard, and redis-py's cluster client
(:class:`redis.cluster.RedisCluster`) and its slot map say where every key lives; nothing here computes a
slot by hand.

* **Reads** (:func:`mget`): one MGET on a single server. On a cluster a lookup's keys hash to as many slots as
  there are keys, and one MGET per slot through redis-py's cluster pipeline costs ~10 us of client time per key
  (``bench/bench_cluster.py``). :func:`by_shard` groups the keys by the shard redis-py's slot map names, packs
  each shard's GETs into one write, sends every shard's write before reading any reply, and so costs one round
  trip per shard touched, the shards working concurrently (3-10x less client time than ``mget_nonatomic``). A
  reply that says a slot moved is retried through redis-py, which follows MOVED/ASK and refreshes its map.
  :class:`ShardTrips` counts round trips per shard.
* **Writes** (:func:`set_in_order`): a chunk's payload and metadata keys hash to different slots, so they can be
  on different shards, and requests to different shards have no order. Payloads go first (one round trip per
  shard), metadata only after every payload was acknowledged (one more). A write that fails part way therefore
  leaves payloads without metadata (orphans no lookup can see: ``kvcli inspect`` lists them) or metadata of later
  chunks without that of an earlier one (unreachable: a lookup stops at the first missing chunk), never metadata
  without its payload. Index-only writes (metadata, no payload) need no order: one round trip. On a single server
  the caller's atomic MSET stays. :func:`write_prefix` (warm's batches) keeps a batch a prefix of its chain: one
  MULTI/EXEC on a single server whose user may run it (:func:`transactions`), else payloads, then metadata, with
  the refused part deleted again; either way what it reports stored is what the server ran.
* **Deletes** (:func:`unlink`): one UNLINK per key, one round trip per shard.
* **Scans** (:func:`scan`): SCAN runs on EVERY primary, after :func:`check_whole` made sure the cluster serves
  all 16,384 slots; a shard that fails fails the command (exit 3): a partial view is never presented as the
  whole. A key that migrates between shards during the scan (resharding) can be missed or seen twice, as with
  any cluster SCAN.
* **Server facts** (:func:`shard_info`, :func:`used_memory`, :func:`dbsize`): per primary, summed where a total
  is asked for.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import NamedTuple

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from kvcli.errors import RedisFailure
from kvcli.store.noreply import raise_no_reply

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
        NoReply: INFO (CLUSTER INFO) got no reply (within the timeout, or the connection kept dropping).
        RedisFailure: a primary refused it or reports an incomplete cluster.
    """
    if not is_cluster(client):
        try:
            enabled = int(client.info("cluster").get("cluster_enabled", 0))
        except redis.ResponseError:  # INFO refused (an ACL): nothing to tell
            return
        except REDIS_ERRORS as exc:
            raise_no_reply(exc, "INFO", f"Redis INFO failed: {exc}")
        if enabled:
            raise RedisFailure("this connection reaches ONE node of a Redis Cluster, which holds only its own slots' "
                               "keys: connect with the cluster client (kvcli.store.server.connect does)")
        return
    for name, node in shards(client):
        try:
            raw = node.execute_command("CLUSTER", "INFO")
        except REDIS_ERRORS as exc:
            raise_no_reply(exc, "CLUSTER INFO", f"Redis Cluster primary {name}: {exc}")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        info = dict(line.split(":", 1) for line in text.split() if ":" in line)
        ok = (info.get("cluster_state") == "ok" and int(info.get("cluster_slots_assigned", 0)) == SLOTS
              and int(info.get("cluster_slots_fail", 0)) == 0)
        if not ok:
            raise RedisFailure(
                f"Redis Cluster primary {name} reports cluster_state:{info.get('cluster_state', '?')}, "
                f"{info.get('cluster_slots_assigned', '?')} of {SLOTS} slots assigned, "
                f"{info.get('cluster_slots_fail', '?')} failing: a scan would miss keys, so nothing was read")


def scan(client, match: str | bytes | None = None, count: int = 1000) -> Iterator[tuple[str, list]]:
    """``(shard name, keys)`` batches of every key (matching ``match``) on every primary: SCAN with a cursor, one
    shard after another (never KEYS). Checks :func:`check_whole` first.

    Raises:
        NoReply: a SCAN (or the check before it) got no reply; RedisFailure: one failed otherwise. Either way on
            any shard, and the keys already yielded are a partial view: do not use them as the whole.
    """
    check_whole(client)
    for name, node in shards(client):
        cursor = 0
        while True:
            try:
                cursor, keys = node.scan(cursor, match=match, count=count)
            except REDIS_ERRORS as exc:
                raise_no_reply(exc, "SCAN", f"Redis SCAN failed on {name}: {exc}")
            if keys:
                yield name, keys
            if cursor == 0:
                break


def by_shard(client, commands: list[tuple], trips: ShardTrips | None = None) -> list:
    """Run single-key ``commands`` (``(name, key, *args)``) on a cluster in ONE round trip per shard, the shards
    concurrently: grouped by the shard redis-py's slot map names for each key, packed into one write per shard
    connection, every write sent before any reply is read. Replies come back in the commands' order, raw (bytes,
    int, None), an error reply as its exception object (not raised). A reply that says the slot moved (MOVED, ASK,
    TRYAGAIN, CLUSTERDOWN: resharding or failover) is retried with redis-py's own ``execute_command``, which follows
    the redirection and refreshes its slot map. ``trips`` counts one round trip on each shard written to.

    Raises:
        redis.ConnectionError and other connection-level errors (the connections used are dropped, not reused).
    """
    groups: dict[str, tuple] = {}
    node_of = _slot_map(client)
    for i, command in enumerate(commands):
        key = command[1]
        node = node_of(key_slot(key.encode() if isinstance(key, str) else key))
        group = groups.get(node.name)
        if group is None:
            group = groups[node.name] = (node, [])
        group[1].append(i)
    replies: list = [None] * len(commands)
    sent = []
    try:
        for node, indices in groups.values():
            server = client.get_redis_connection(node)
            conn = server.connection_pool.get_connection()
            sent.append((server, conn))
            conn.send_packed_command(conn.pack_commands([commands[i] for i in indices]), check_health=False)
        for (_, conn), (_, indices) in zip(sent, groups.values()):
            for i in indices:
                try:
                    replies[i] = conn.read_response()
                except redis.ResponseError as exc:
                    replies[i] = exc
    except BaseException:
        for _, conn in sent:  # a reply may be unread: never hand the connection to the next caller
            conn.disconnect()
        raise
    finally:
        for server, conn in sent:
            server.connection_pool.release(conn)
    if trips is not None:
        trips.counts.update(groups.keys())
    for i, reply in enumerate(replies):
        if isinstance(reply, _MOVED):
            try:
                replies[i] = client.execute_command(*commands[i])
            except redis.ResponseError as exc:
                replies[i] = exc
    return replies


def send_packed(client: redis.Redis, commands: list[bytes]) -> list:
    """Run commands already packed (RESP bytes, :mod:`kvcli.store.resp`) on a single server in one round trip: one
    write of them all on a connection of the client's pool, then every reply read, raw (bytes, int, None), an error
    reply as its exception object (not raised), as :func:`by_shard` gives them. A connection that fails is retried
    with the client's own retry policy (send and replies again: only for commands that may run twice, as UNLINK).

    Raises:
        redis.ConnectionError, redis.TimeoutError: after the client's retries (the connection is dropped).
    """
    pool = client.connection_pool
    conn = pool.get_connection()

    def attempt() -> list:
        conn.send_packed_command(commands, check_health=False)
        replies: list = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    try:
        return conn.retry.call_with_retry(attempt, lambda _error: conn.disconnect())
    except BaseException:
        conn.disconnect()  # a reply may be unread: never hand the connection to the next caller
        raise
    finally:
        pool.release(conn)


def _slot_map(client):
    """slot -> primary, from redis-py's slot map: its cache read directly where it has one (``get_node_from_slot``
    costs ~6 us a call, most of a lookup's client time at hundreds of chunks), else through the method."""
    manager = client.nodes_manager
    cache = getattr(manager, "slots_cache", None)
    if not isinstance(cache, dict):
        return manager.get_node_from_slot

    def primary(slot: int):
        nodes = cache.get(slot)
        return nodes[0] if nodes else manager.get_node_from_slot(slot)  # not covered: redis-py raises its error

    return primary


_MOVED = (redis.exceptions.AskError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


def mget(client, keys: list, trips: ShardTrips | None = None) -> list:
    """Values of ``keys`` in order (None where missing): one MGET on a single server; on a cluster the GETs of each
    shard in one write per shard, all shards' sent before any reply is read (:func:`by_shard`: one round trip per
    shard touched, concurrently), a key of another type answering None as MGET does. ``trips`` counts round trips
    per shard. Raises redis errors."""
    if not is_cluster(client):
        if trips is not None:
            trips.add()
        return client.mget(keys)
    replies = by_shard(client, [("GET", key) for key in keys], trips)
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    return [None if isinstance(r, Exception) else r for r in replies]


def unlink(client, keys: list) -> int:
    """UNLINK ``keys`` (on a cluster one per key, one round trip per shard). Returns the number removed."""
    if not keys:
        return 0
    if not is_cluster(client):
        return int(client.unlink(*keys))
    return sum(int(r) for r in _raised(by_shard(client, [("UNLINK", key) for key in keys])))


def _set(key, value, nx: bool, ex: int | None) -> tuple:
    return ("SET", key, value) + (("NX",) if nx else ()) + (("EX", ex) if ex else ())


def _raised(replies: list) -> list:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def set_in_order(client, deletes: list, first: list[tuple], then: list[tuple], nx: bool = False,
                 ex: int | None = None, trips: ShardTrips | None = None) -> tuple[list, list]:
    """Cluster writes with an order between them: DEL of ``deletes`` and ``first``'s ``(key, value)`` SETs, and only
    once all of them were acknowledged, ``then``'s (:func:`by_shard`, one round trip per shard each). One round
    when ``first`` is empty (nothing to wait for: ``then`` goes with the deletes, other keys). Returns the replies
    to ``first`` and to ``then`` (truthy when set). Raises the first error reply; ``then`` is not sent when the
    first round had one.
    """
    dels = [("DEL", key) for key in deletes]
    if not first:
        return [], _raised(by_shard(client, dels + [_set(k, v, nx, ex) for k, v in then], trips))[len(dels):]
    replies = _raised(by_shard(client, dels + [_set(k, v, nx, ex) for k, v in first], trips))[len(dels):]
    if not then:
        return replies, []
    return replies, _raised(by_shard(client, [_set(k, v, nx, ex) for k, v in then], trips))


class PrefixWrite(NamedTuple):
    """What :func:`write_prefix` stored: ``stored`` chunks (a prefix of those asked), ``error`` (the first refusal
    or None), and ``left``: keys this write created beyond that prefix that stay because an UNLINK was refused
    (payloads without metadata, or whole chunks past a gap; never metadata without its payload), sorted."""

    stored: int
    error: Exception | None
    left: tuple[str, ...] = ()


def each(client, commands: list[tuple]) -> list:
    """Run single-key ``commands`` (``(name, key, *args)``) in one round trip (a cluster: one per shard,
    :func:`by_shard`), not as a transaction: each runs or is refused on its own. Replies in the commands' order, an
    error reply as its exception object (not raised).

    Raises:
        redis.ConnectionError, redis.TimeoutError and other connection-level errors.
    """
    if is_cluster(client):
        return by_shard(client, commands)
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


def transactions(client) -> bool:
    """Whether ``client`` may run a MULTI/EXEC transaction: a single server whose user may run MULTI and EXEC
    (probed with a PING inside one, which changes nothing). A Redis Cluster: False (a batch's keys span slots).

    Raises:
        redis.ConnectionError, redis.TimeoutError: the probe got no answer.
    """
    if is_cluster(client):
        return False
    pipe = client.pipeline(transaction=True)
    pipe.ping()
    try:
        pipe.execute()
    except redis.ResponseError:  # MULTI or EXEC refused (an ACL): the PING ran on its own
        return False
    return True


def write_prefix(client, chunks: list[tuple[tuple, tuple]], ex: int | None = None, heads: list[str] | tuple = (),
                 atomic: bool = False) -> PrefixWrite:
    """Write ``chunks`` (``((payload key, value), (metadata key, value))`` in chain order), after giving ``heads``
    (keys already there) ``ex`` too, so that what is stored is a PREFIX of them with no chunk half-written, and say
    exactly what the server ran. ``ex``: seconds to live for every key (None: none).

    ``atomic`` (a single server that runs transactions, :func:`transactions`): one MULTI/EXEC of the EXPIREs, the
    payloads, then the metadata, all of it or none (a refused command aborts it whole; a reply that never comes
    leaves it whole or absent). Otherwise (a cluster, or a user without MULTI) no transaction: the EXPIREs (one
    round trip, :func:`each`), every payload (one more), then the metadata of the chunks before the first refused
    payload (one more); when any SET is refused, both halves of every chunk from the first refused one on are
    deleted again, one UNLINK per key (which an out-of-memory server still runs), the metadata first, and a payload
    only once its metadata is gone (a metadata key the user may not delete, and that is there, keeps its payload
    beside it).

    Returns:
        A :class:`PrefixWrite`: chunks stored, the first refusal, and the keys this write created past the stored
        prefix that stay because an UNLINK was refused (two or three more round trips, only after a refusal).

    Raises:
        redis.ConnectionError, redis.TimeoutError: a round trip failed (atomic: the batch is stored whole or not
            at all; else a prefix of the payloads, and of the metadata of the chunks whose payload was sent before
            it, may be stored).
    """
    if atomic:
        pipe = client.pipeline(transaction=True)
        for key in heads:
            pipe.expire(key, ex)
        for (key, value), _ in chunks:
            pipe.set(key, value, ex=ex)
        for _, (key, value) in chunks:
            pipe.set(key, value, ex=ex)
        try:
            pipe.execute()
        except redis.ResponseError as exc:  # the transaction was aborted whole (EXECABORT)
            return PrefixWrite(0, exc)
        return PrefixWrite(len(chunks), None)
    if heads:
        expired = each(client, [("EXPIRE", key, ex) for key in heads])
        failed = next((r for r in expired if isinstance(r, Exception)), None)
        if failed is not None:
            return PrefixWrite(0, failed)
    replies = each(client, [_set(key, value, False, ex) for (key, value), _ in chunks])
    created = {key for ((key, _), _), reply in zip(chunks, replies) if not isinstance(reply, Exception)}
    good = next((i for i, r in enumerate(replies) if isinstance(r, Exception)), len(chunks))
    error = replies[good] if good < len(chunks) else None
    if good:
        metas = each(client, [_set(key, value, False, ex) for _, (key, value) in chunks[:good]])
        created.update(key for (_, (key, _)), reply in zip(chunks, metas) if not isinstance(reply, Exception))
        bad = next((i for i, r in enumerate(metas) if isinstance(r, Exception)), good)
        if bad < good:
            good, error = bad, metas[bad]
    if error is None:
        return PrefixWrite(good, None)
    tail = chunks[good:]  # metadata first: a payload goes only once its metadata is gone
    metas = [key for _, (key, _) in tail]
    refused = {key for key, reply in zip(metas, each(client, [("UNLINK", key) for key in metas]))
               if isinstance(reply, Exception)}
    if refused:  # a metadata key the user may not delete: is it there at all?
        asked = sorted(refused)
        stays = {key for key, n in zip(asked, each(client, [("EXISTS", key) for key in asked]))
                 if isinstance(n, Exception) or int(n)}
    else:
        stays = set()
    payloads = [key for ((key, _), (meta, _)) in tail if meta not in stays]
    refused.update(key for key, reply in zip(payloads, each(client, [("UNLINK", key) for key in payloads]))
                   if isinstance(reply, Exception))
    kept = {key for (key, _), _ in tail} - set(payloads)  # a payload whose metadata stays, kept beside it
    return PrefixWrite(good, error, tuple(sorted((refused | kept) & created)))


class ShardTrips:
    """Round trips per shard of one store: a lookup that touches three shards counts one round trip on each (they
    run concurrently, so it costs one round trip of wall time). ``counts``: ``{shard name: round trips}``."""

    def __init__(self, client) -> None:
        self.counts: Counter[str] = Counter()
        self._single = None if is_cluster(client) else shards(client)[0][0]

    def add(self) -> None:
        """A single server's round trip; on a cluster :func:`by_shard` counts its own."""
        if self._single is not None:
            self.counts[self._single] += 1


@contextlib.contextmanager
def uninterrupted():
    """Hold SIGINT and SIGTERM while a write is sent and acknowledged, then act on them. A write stopped half way
    would leave half a command on a connection that the server may still complete AFTER the cleanup's purge has
    scanned (a large pipelined write is read over several event-loop turns), leaving keys behind. No-op outside the
    main thread (where signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in caught[:1]:  # the first one, as it would have come
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL and signum == signal.SIGINT:
                raise KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def drop_connections(client) -> None:
    """Close every pooled connection of ``client`` (new ones open on the next command). After an interrupted call
    (Ctrl-C, SIGTERM) a connection may hold half a command or an unread reply; the next command must not use it."""
    if is_cluster(client):
        client.disconnect_connection_pools()
    else:
        client.connection_pool.disconnect()


def wait_closed(client, name: str, seconds: float, poll: float = 0.05) -> bool:
    """Wait until no primary (one server: itself) holds a connection named ``name`` (``CLIENT LIST``; a client
    names its connections with ``CLIENT SETNAME``). A server runs what a connection sent before it reads the end of
    its stream, so once a dead writer's connections are gone nothing it sent can still be applied. Returns whether
    that happened within ``seconds``; False also where ``CLIENT LIST`` is refused (an ACL) or fails."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            held = any(c.get("name") == name for _, node in shards(client) for c in node.client_list())
        except REDIS_ERRORS:
            return False
        if not held:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


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
