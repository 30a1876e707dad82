"""Pipelined lookups and index-only stores: many requests' lookup-then-store in one round trip, same answers.

A replay's estimated requests do, one after another, a lookup (one MGET) and a store of the chunks it found
missing (one MSET of metadata: their payload is only accounted). Each request's store depends on its own lookup,
and its lookup on every earlier store, so done one by one they cost two round trips per request, most of an
index-only replay's time (issue 11: Redis I/O 31-37% of it).

:func:`lookup_and_store` does a batch of such requests with the same result:

1. one MGET of every request's lookup keys: the server's state before the batch;
2. the requests are then answered in order, each from that state overlaid with what the batch's earlier requests
   wrote or deleted (this process is the only writer of its run's namespace, so it knows those chunks byte for
   byte; the read-only namespace is never written), with :meth:`ChunkStore.evaluate`,
   :meth:`ChunkStore.plan_known` and :meth:`ChunkStore.account_known`, the code the one-by-one path runs;
3. every request's deletes (LRU) and MSET are sent in order on the same connection.

On a single server the batch's writes are sent without waiting: their replies are read with the next batch's MGET,
which the server runs after them (one connection, in order), so the server stores one batch while this process
reads and hashes the next, and a batch costs one round trip. :func:`drain` reads what is still pending; the
replay calls it before anything else talks to the server (a measured request, the totals, the cleanup). On a Redis
Cluster the MGET and the writes each take one round trip per shard (:func:`kvcli.store.cluster.by_shard`).

The server ends in the same state, and every request gets the same lookup, as when they run one by one (a test
replays traces both ways). What is lost is the per-request lookup latency: every ``sample_every``-th request also
gets one unpipelined, timed lookup (read-only; its answer is not used) while nothing of the batch is pending, and
the store's ``lookup_seconds`` holds those samples (``lookups_sampled``); a report says so.
"""
from __future__ import annotations

import time

import redis

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore, LookupResult, StoreResult
from kvcli.store.hashing import ChunkedPrompt

SAMPLE_EVERY = 64  # 1 in 64 requests: ~190 latency samples per 12,000 requests


def lookup_and_store(store: ChunkStore, prompts: list[ChunkedPrompt], sample_every: int = SAMPLE_EVERY
                     ) -> list[tuple[LookupResult, StoreResult]]:
    """Lookup, then store the missing chunks as accounted (index only), for each prompt in order; the same results
    as ``store.store(p, None, start_chunk=look.hit_chunks, lookup=look)`` after ``look = store.lookup(p)`` for
    each prompt in turn. On a single server the writes may still be in flight on return (:func:`drain`).

    Args:
        store: a store without TTL (the one-by-one path it mirrors is :meth:`ChunkStore.store` with a lookup).
        prompts: chunked prompts (``[tokens]`` cut by this store).
        sample_every: time one unpipelined lookup of every N-th request (counted over the store's life).

    Returns:
        ``[(lookup, store result)]`` per prompt; a lookup's ``seconds`` is 0 (not timed one by one), a store
        result's ``seconds`` its share of the time spent planning and sending the batch's writes.

    Raises:
        RedisFailure: a read or a write failed (of this batch, or the previous batch's writes).
    """
    if not prompts:
        return []
    st = store.stats
    keys = [store.lookup_keys(p) for p in prompts]
    flat = [k for ks in keys for k in ks]
    values = _read(store, flat)
    for i, (prompt, ks) in enumerate(zip(prompts, keys)):  # latency samples, with nothing of ours pending
        if (st.lookups_pipelined + i) % sample_every == 0 and ks:
            t0 = time.perf_counter()
            store._read(ks)
            st.lookup_seconds.append(time.perf_counter() - t0)
            st.lookups_sampled += 1
    st.lookups += len(prompts)
    st.lookups_pipelined += len(prompts)
    t0 = time.perf_counter()
    before = dict(zip(flat, values))
    overlay: dict[str, bytes | None] = {}
    commands: list[tuple] = []  # DEL and MSET (a cluster: DEL and SET), every request's in order
    plans, looks = [], []
    pipe = _Collect()
    for prompt, ks in zip(prompts, keys):
        look = store.evaluate(prompt, [overlay[k] if k in overlay else before[k] for k in ks])
        plan = store.plan_known(pipe, prompt, None, look.hit_chunks, len(prompt.hashes), look)
        deleted, store._deleting = store._deleting, []  # the LRU's victims
        if store.cluster:
            commands += [("DEL", k) for k in deleted]
            commands += [("SET", k, v) for k, v in plan.thens]
            written = plan.thens
        else:
            if deleted:
                commands.append(("DEL", *deleted))
            if plan.args:
                commands.append(("MSET", *plan.args))
            written = list(zip(plan.args[::2], plan.args[1::2]))
        for k in deleted:
            overlay[k] = None
        overlay.update(written)
        plans.append(plan)
        looks.append(look)
    if commands:
        _write(store, commands)
    seconds = (time.perf_counter() - t0) / len(prompts)
    return [(look, store.account_known(plan, seconds)) for look, plan in zip(looks, plans)]


def drain(store: ChunkStore) -> None:
    """Wait for a single server's pending batch writes (read their replies) and give the connection back.
    Raises RedisFailure when the server refused one of them."""
    pending = getattr(store, "_batch_pending", None)
    if pending is None:
        return
    store._batch_pending = None
    conn, count = pending
    pool = store.client.connection_pool
    store.stats.round_trips += 1  # the wait for the last writes' replies
    store.shard_trips.add()
    try:
        error = _replies(conn, count)
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    if error is not None:
        raise RedisFailure(f"Redis batch write failed: {error}")


class _Collect:
    """Stands in for a pipeline where :meth:`ChunkStore.plan_known` queues the LRU's deletes: they are taken from
    ``store._deleting`` instead, so each request's commands keep their order."""

    def delete(self, *keys) -> None:
        pass


def _read(store: ChunkStore, keys: list[str]) -> list:
    """The batch's MGET. A single server: on the batch connection, behind the previous batch's writes (whose
    replies come first); one round trip for both."""
    if not keys:
        drain(store)
        return []
    if store.cluster:
        return store._read(keys)
    pending = getattr(store, "_batch_pending", None)
    if pending is None:
        return store._read(keys)
    store._batch_pending = None
    conn, count = pending
    store.stats.round_trips += 1
    store.shard_trips.add()
    try:
        conn.send_packed_command(_pack(conn, [("MGET", *keys)]), check_health=False)
        error = _replies(conn, count)
        values = conn.read_response()
    except BaseException as exc:
        conn.disconnect()
        store.client.connection_pool.release(conn)
        if isinstance(exc, cluster.REDIS_ERRORS):
            raise RedisFailure(f"Redis MGET failed: {exc}") from None
        raise
    store.client.connection_pool.release(conn)
    if error is not None:
        raise RedisFailure(f"Redis batch write failed: {error}")
    return values


def _write(store: ChunkStore, commands: list[tuple]) -> None:
    """Send the batch's writes: a cluster, one round trip per shard, waited for; a single server, sent on a
    connection of the client's pool and left pending (:func:`drain`), held from Ctrl-C until sent whole."""
    with cluster.uninterrupted():
        if store.cluster:
            store._call(_sent, store.client, commands, store.shard_trips)
            return
        pool = store.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(_pack(conn, commands), check_health=False)
        except BaseException as exc:
            conn.disconnect()
            pool.release(conn)
            if isinstance(exc, cluster.REDIS_ERRORS):
                raise RedisFailure(f"Redis batch write failed: {exc}") from None
            raise
        store._batch_pending = (conn, len(commands))


def _pack(conn, commands: list[tuple]):
    """The commands in the Redis protocol: hiredis's packer straight (redis-py's adds a pass over every argument,
    ~1 us each: 0.3 s of a 7,500-request replay), else redis-py's. Arguments are str or bytes."""
    if _hiredis_pack is None:
        return conn.pack_commands(commands)
    return [b"".join(_hiredis_pack(command) for command in commands)]


try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py without its hiredis extra
    _hiredis_pack = None


def _replies(conn, count: int) -> Exception | None:
    """Read ``count`` replies; the first error reply (all are read, so the connection stays in step)."""
    error = None
    for _ in range(count):
        try:
            conn.read_response()
        except redis.ResponseError as exc:
            error = error or exc
    return error


def _sent(client, commands, trips) -> list:
    replies = cluster.by_shard(client, commands, trips)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
