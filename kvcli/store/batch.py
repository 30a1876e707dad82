"""Pipelined lookups and index-only stores: many requests' lookup-then-store in two round trips, same answers.

A replay's estimated requests do, one after another, a lookup (one MGET) and a store of the chunks it found
missing (one MSET of metadata: their payload is only accounted). Each request's store depends on its own lookup,
and its lookup on every earlier store, so done one by one they cost two round trips per request, most of an
index-only replay's time (issue 11: Redis I/O 31-37% of it).

:func:`lookup_and_store` does a batch of such requests with the same result in two round trips:

1. one MGET of every request's lookup keys (on a Redis Cluster one round trip per shard,
   :func:`kvcli.store.cluster.by_shard`): the server's state before the batch;
2. the requests are then answered in order, each from that state overlaid with what the batch's earlier requests
   wrote or deleted (this process is the only writer of its run's namespace: chunks written earlier in the batch
   are known exactly, byte for byte, because this process wrote them; the read-only namespace is never written),
   with :meth:`ChunkStore.evaluate`, :meth:`ChunkStore.plan_known` and :meth:`ChunkStore.account_known`, the code
   the one-by-one path runs;
3. one pipeline sends every request's deletes (LRU) and MSET in order (a cluster: one round trip per shard, each
   shard's commands in order).

The server ends in the same state, and every request gets the same lookup, as when they run one by one (a test
replays traces both ways). What is lost is the per-request lookup latency: every ``sample_every``-th request also
does one unpipelined, timed lookup (read-only) before the batch is sent, and the store's ``lookup_seconds`` holds
those samples only (``lookups_sampled``); a report says so.
"""
from __future__ import annotations

import time

from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore, LookupResult, StoreResult
from kvcli.store.hashing import ChunkedPrompt


def lookup_and_store(store: ChunkStore, prompts: list[ChunkedPrompt], sample_every: int = 16
                     ) -> list[tuple[LookupResult, StoreResult]]:
    """Lookup, then store the missing chunks as accounted (index only), for each prompt in order, in two pipelined
    round trips; the same results as ``store.store(p, None, start_chunk=look.hit_chunks, lookup=look)`` after
    ``look = store.lookup(p)`` for each prompt in turn.

    Args:
        store: a store without TTL (the one-by-one path it mirrors is :meth:`ChunkStore.store` with a lookup).
        prompts: chunked prompts (``[tokens]`` cut by this store).
        sample_every: time one unpipelined lookup of every N-th request (counted over the store's life).

    Returns:
        ``[(lookup, store result)]`` per prompt; a lookup's ``seconds`` is 0 (not timed one by one), a store
        result's ``seconds`` its share of the batch's write round trip.

    Raises:
        RedisFailure: a read or a write failed (what the batch wrote before may stay; a replay purges its
            namespace).
    """
    if not prompts:
        return []
    st = store.stats
    for i, prompt in enumerate(prompts):  # latency samples, read-only, before anything of the batch is sent
        if (st.lookups_pipelined + i) % sample_every == 0 and prompt.hashes:
            t0 = time.perf_counter()
            store._read(store.lookup_keys(prompt))
            st.lookup_seconds.append(time.perf_counter() - t0)
            st.lookups_sampled += 1
    keys = [store.lookup_keys(p) for p in prompts]
    flat = [k for ks in keys for k in ks]
    values = store._read(flat) if flat else []
    st.lookups += len(prompts)
    st.lookups_pipelined += len(prompts)
    t0 = time.perf_counter()
    before = dict(zip(flat, values))
    overlay: dict[str, bytes | None] = {}
    pipe = store.client.pipeline(transaction=False)
    commands: list[tuple] = []  # a cluster: DEL and SET, every request's in order
    plans, looks = [], []
    for prompt, ks in zip(prompts, keys):
        metas = [overlay[k] if k in overlay else before[k] for k in ks]
        look = store.evaluate(prompt, metas)
        plan = store.plan_known(pipe, prompt, None, look.hit_chunks, len(prompt.hashes), look)
        deleted, store._deleting = store._deleting, []  # the LRU's victims (queued on pipe on a single server)
        if store.cluster:
            commands += [("DEL", k) for k in deleted]
            commands += [("SET", k, v) for k, v in plan.thens]
            written = plan.thens
        else:
            if plan.args:
                pipe.execute_command("MSET", *plan.args)
            written = list(zip(plan.args[::2], plan.args[1::2]))
        for k in deleted:
            overlay[k] = None
        overlay.update(written)
        plans.append(plan)
        looks.append(look)
    with cluster.uninterrupted():  # sent whole or not at all (Ctrl-C waits for the reply)
        if store.cluster and commands:
            store._call(_sent, store.client, commands, store.shard_trips)
        elif len(pipe):
            store.shard_trips.add()
            store._call(pipe.execute)
    seconds = (time.perf_counter() - t0) / len(prompts)
    return [(look, store.account_known(plan, seconds)) for look, plan in zip(looks, plans)]


def _sent(client, commands, trips) -> list:
    replies = cluster.by_shard(client, commands, trips)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
