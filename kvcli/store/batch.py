"""Pipelined index-only lookups and stores: many requests' lookup-then-store in two round trips, the same answers.

An index-only replay (``--payload accounted``) does, per request, a lookup (one round trip) and a store of the
chunks it found missing (one MSET of metadata: payloads are only accounted), one request after another. Each
request's store depends on its own lookup and its lookup on every earlier store, so done one by one they cost two
round trips per request: most of such a replay's time on a big trace (issue 11).

:func:`lookup_and_store` does a batch of such requests with the same results:

1. one read of every distinct metadata key the batch's prompts name (a single server: one MGET; a cluster: the
   GETs of each shard in one write, every shard's sent before any reply is read, :func:`kvcli.store.cluster.
   by_shard`): the server's state before the batch;
2. the requests are answered in order, each from that state overlaid with what the batch's earlier requests wrote
   or deleted (the run's namespace is its own: this process is its only writer and knows those values byte for
   byte), with the code the one-by-one path runs: :meth:`ChunkStore.evaluate` (``lengths`` None: metadata alone,
   which is exact when every chunk is accounted, see :func:`batchable`), :meth:`ChunkStore.plan_known` (the LRU's
   deletes and the MSET of the missing chunks) and, once the server acknowledged the writes,
   :meth:`ChunkStore.account_known`;
3. every request's deletes and writes in request order, in one round trip (a single server: one pipeline of DELs
   and MSETs, the MSETs of consecutive requests without a DEL between them merged into one; a cluster: one DEL or SET per key through :func:`~kvcli.store.cluster.by_shard`, whose
   per-shard order keeps the order of the commands on each key), held from Ctrl-C until acknowledged
   (:func:`~kvcli.store.cluster.uninterrupted`), so a cleanup after an interruption sees all of it or none.

The server ends in the same state, and every request gets the same lookup, as one by one (tests replay traces both
ways, on a single server and on a cluster, with and without a capacity), except where the server itself deletes
keys during a batch (maxmemory evictions): one by one sees such a loss at the next lookup, a batch at the next
batch. What batching loses is each lookup's own latency: one request in :data:`SAMPLE_EVERY` (the first with a full
chunk from every :data:`SAMPLE_EVERY`-th on) also gets one unpipelined, timed lookup (read-only, its answer not used), the store's ``lookup_seconds`` holds those samples
(``lookups_sampled``), and each pipelined lookup is priced at their mean so far (its ``seconds``).

Faults (a tolerant store, :mod:`kvcli.store.chunkstore`): a read that fails after retries makes every lookup of
the batch a failed one (a miss that stores nothing); a write that fails stores nothing for the batch's requests
(their lookups stand), each counted once in the store's stats.
"""
from __future__ import annotations

import time

from kvcli.store.chunkstore import ChunkStore, LookupResult, RedisUnavailable, StoreResult
from kvcli.store.cluster import by_shard, uninterrupted
from kvcli.store.hashing import ChunkedPrompt

SAMPLE_EVERY = 64  # 1 in 64 requests also gets an unpipelined, timed lookup: ~120 latency samples per 7,500
_NOTHING = StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)
_MSET_ARGS = 1 << 18  # arguments of one merged MSET at most, far below a server's multibulk limit (1M before 7)


def batchable(store) -> bool:
    """Whether ``store``'s lookup-then-store can go through :func:`lookup_and_store` with the same answers: kvcli's
    layout, accounted payloads (no chunk it can hit has a payload whose length the lookup would check), no
    read-only namespace (whose chunks may hold real payloads) and no TTL (the one-by-one path it mirrors writes
    with MSET)."""
    cfg = getattr(store, "config", None)
    return (isinstance(store, ChunkStore) and cfg.payload == "accounted" and cfg.read_namespace is None
            and cfg.ttl is None)


def lookup_and_store(store: ChunkStore, prompts: list[ChunkedPrompt], sample_every: int = SAMPLE_EVERY
                     ) -> list[tuple[LookupResult, StoreResult]]:
    """Lookup, then store the missing chunks as accounted (index only), for each prompt in order, in two round trips:
    the same results as ``look = store.lookup(p)`` then ``store.store(p, None, start_chunk=look.hit_chunks,
    lookup=look)`` for each prompt in turn (module docstring).

    Args:
        store: a store for which :func:`batchable` holds.
        prompts: prompts cut and hashed by ``store`` (:meth:`ChunkStore.chunk`), in request order.
        sample_every: time one unpipelined lookup per N requests (the first one with a full chunk from each N-th
            on, counted over the store's life).

    Returns:
        ``[(lookup, store result)]`` per prompt, acknowledged by the server. A lookup's ``seconds`` is the mean of
        the sampled unpipelined lookups so far; a store result's ``seconds`` its share of the wall time spent
        planning and sending the batch's writes.

    Raises:
        RedisFailure: the server refused a read or a write (e.g. OOM, permissions).
        RedisUnavailable: a call failed after retries and the store does not absorb it (module docstring).
    """
    if not prompts:
        return []
    st = store.stats
    for i, prompt in enumerate(prompts):  # latency samples: read-only, answers not used; one per sample_every
        if prompt.hexes and st.lookups_sampled * sample_every <= st.lookups_pipelined + i:  # lookups with a chunk
            t0 = time.perf_counter()
            try:
                store._read_chunks(prompt.hexes, record=False)
            except RedisUnavailable as exc:
                store._absorb(exc)
                continue
            st.lookup_seconds.append(time.perf_counter() - t0)
            st.lookups_sampled += 1
    st.lookups += len(prompts)
    st.lookups_pipelined += len(prompts)
    price = sum(st.lookup_seconds) / len(st.lookup_seconds) if st.lookup_seconds else 0.0
    meta = store.prefix + "m:"
    keys = list(dict.fromkeys(meta + x for p in prompts for x in p.hexes))  # distinct: prompts share prefixes
    try:
        values = store._read(keys) if keys else []
    except RedisUnavailable as exc:
        store._absorb(exc)
        return [(LookupResult(0, 0, len(p.hashes), "redis-error", price, failed=True), _NOTHING) for p in prompts]
    st.lookup_round_trips += bool(keys)
    state = dict(zip(keys, values))  # the server's before the batch, then overlaid with the batch's own writes
    t0 = time.perf_counter()
    pipe = None if store.cluster else store.client.pipeline(transaction=False)
    commands: list[tuple] = []  # a cluster: every DEL and SET in request order
    mset: list = []  # a single server: the MSET arguments since the last DEL (one MSET for consecutive requests)
    looks, plans = [], []
    for prompt in prompts:
        look = store.evaluate(prompt, [state[meta + x] for x in prompt.hexes], None, price)
        plan = store.plan_known(_DELETES, prompt, None, look.hit_chunks, len(prompt.hashes), look)
        deleted, store._deleting = store._deleting, []  # the LRU's victims, deleted before this request's writes
        for key in deleted:
            state[key] = None
        if store.cluster:
            commands += [("DEL", key) for key in deleted]
            commands += [("SET", key, value) for key, value in plan.thens]
            state.update(plan.thens)
        else:
            if deleted or len(mset) > _MSET_ARGS:
                if mset:
                    pipe.execute_command("MSET", *mset)
                    mset = []
                if deleted:
                    pipe.delete(*deleted)
            mset += plan.args
            state.update(zip(plan.args[::2], plan.args[1::2]))
        looks.append(look)
        plans.append(plan)
    if mset:
        pipe.execute_command("MSET", *mset)
    try:
        with uninterrupted():  # sent whole and acknowledged, or not at all
            if store.cluster and commands:
                store._call(_write, store.client, commands, store.shard_trips)
            elif not store.cluster and len(pipe):
                store.shard_trips.add()
                store._call(pipe.execute)
    except RedisUnavailable as exc:
        store._absorb(exc)
        return [(look, _NOTHING) for look in looks]
    seconds = (time.perf_counter() - t0) / len(prompts)
    return [(look, store.account_known(plan, seconds)) for look, plan in zip(looks, plans)]


class _Deletes:
    """What :meth:`ChunkStore.plan_known` queues the LRU's deletes on: nothing (a batch takes them from
    ``store._deleting`` and sends them in request order itself)."""

    def delete(self, *keys) -> None:
        pass


_DELETES = _Deletes()


def _write(client, commands: list[tuple], trips) -> list:
    """:func:`~kvcli.store.cluster.by_shard`, raising the first error reply."""
    replies = by_shard(client, commands, trips)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
