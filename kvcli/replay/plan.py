"""What a replay will write, before it writes: the Redis memory its preflight (:func:`replay_preflight`, on
:mod:`kvcli.store.preflight`, warm's too) compares with the server's room.

Per chunk size: one metadata key per distinct chunk of the trace (counted exactly by hashing every prompt; capped
by the LRU capacity), a payload key per chunk the measured requests write for real, and the transfer calibration's
probe values. Sizes are :func:`kvcli.store.preflight.keys_bytes` estimates (allocator-rounded values, keys, server
bookkeeping). Only computed when the server has a ``maxmemory``: without one there is nothing to compare with.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.replay.measure import probe_plan
from kvcli.store.chunkstore import ChunkStore, chunk_metadata
from kvcli.store.kvstore import KVStore
from kvcli.store.preflight import Preflight, ServerMemory, keys_bytes, preflight, server_memory
from kvcli.traces.request import Request

#: Bytes of one chunk's metadata value in a layout other than kvcli's (LMCache's record: 7 int32, 28 bytes).
OTHER_METADATA_BYTES = 32


def distinct_chunks(stores: Sequence[KVStore], reader: Callable[[], Iterable[Request]], limit: int) -> list[int]:
    """Distinct full chunks per store over the first ``limit`` requests (exact: 64-bit prefixes of the chunk
    hashes, collected as arrays and counted with ``np.unique``)."""
    seen: list[list[np.ndarray]] = [[] for _ in stores]
    for index, request in enumerate(reader()):
        if index >= limit:
            break
        for store, acc in zip(stores, seen):
            hashes = store.chunk(request.prompt, request.hash_salt).hashes
            if hashes:
                acc.append(np.frombuffer(b"".join(h[:8] for h in hashes), dtype="<u8"))
    return [int(np.unique(np.concatenate(acc)).size) if acc else 0 for acc in seen]


def plan_bytes(stores: Sequence[KVStore], distinct: Sequence[int], payload_chunks: Sequence[int],
               probe: int = 0) -> int:
    """Estimated Redis memory of a replay (bytes): metadata of ``distinct`` chunks per store (capped by its LRU
    capacity), real payloads of ``payload_chunks`` per store, and ``probe`` bytes per store."""
    need = 0
    for store, chunks, payloads in zip(stores, distinct, payload_chunks):
        cfg = store.config
        capacity = cfg.capacity_chunks  # set whenever the store counts resident chunks
        resident = chunks if store.resident_chunks is None or capacity is None else min(chunks, capacity)
        key = int(store.key_bytes_per_chunk / 2)
        meta = (len(chunk_metadata(store, store.chunk(np.zeros(cfg.chunk_size, dtype="<u4")), 0))
                if isinstance(store, ChunkStore) else OTHER_METADATA_BYTES)
        need += keys_bytes(resident, key, meta)
        need += keys_bytes(min(payloads, resident), key, store.value_bytes)
        need += probe
    return need


def room(mem: ServerMemory) -> int | None:
    """Bytes left under maxmemory (None without one); on a cluster the least room of any primary with a maxmemory
    (a probe's few keys may all land there)."""
    # used_memory is None only where INFO was refused, and then so is maxmemory
    limited = [(sh.maxmemory, sh.used_memory) for sh in mem.shards if sh.maxmemory and sh.used_memory is not None]
    if limited:
        return min(max(0, maxmemory - used) for maxmemory, used in limited)
    maxmemory, used = mem.maxmemory, mem.used_memory
    return max(0, maxmemory - used) if maxmemory and used is not None else None


def probe_bytes(store: KVStore, mem: ServerMemory) -> int:
    """Estimated Redis memory of the transfer calibration's probe values for ``store`` (bytes)."""
    chunks, size = probe_plan(store.value_bytes, room(mem))
    return keys_bytes(chunks, int(store.key_bytes_per_chunk / 2), size)


def replay_preflight(client: redis.Redis | RedisCluster, stores: Sequence[KVStore],
                     reader: Callable[[], Iterable[Request]], limit: int, measured_heads: Sequence[int],
                     probes: bool = True, mem: ServerMemory | None = None) -> Preflight:
    """The server's memory against what replaying the first ``limit`` requests will write (module docstring).

    Args:
        measured_heads: tokens of each measured request that run the model and write real payloads (empty when
            payloads are accounted).
        probes: the transfer calibration writes its probe values (False: it times no SET or GET).
        mem: the server's memory, read by the caller just before; None: read here.

    Raises:
        RedisFailure: INFO failed.
    """
    mem = mem or server_memory(client)
    need = None  # nothing to compare with on a server without maxmemory: not estimated
    if mem.maxmemory or any(sh.maxmemory for sh in mem.shards):
        distinct = distinct_chunks(stores, reader, limit)
        payload = [sum(h // s.config.chunk_size for h in measured_heads) for s in stores]
        need = plan_bytes(stores, distinct, payload, 0) + sum(probe_bytes(s, mem) for s in stores if probes)
    return preflight(client, need, mem)
