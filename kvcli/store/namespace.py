"""Guarded delete of kvcli's keys of ONE namespace (and optionally one chunk size); nothing else on the server.

Keys are found with SCAN ``MATCH kvcli:v1:{namespace}:{chunk_size or *}:*`` (glob characters in the namespace
escaped; never KEYS), and each one is parsed back (layout.parse_key's rules) and kept only when its namespace (and chunk
size) is exactly the one asked for, so namespace ``a`` never matches ``a:b``'s keys, and a key outside kvcli's
layout is never deleted. Deletion is UNLINK (Redis >= 4) in pipelined batches; never FLUSHDB or
FLUSHALL. :func:`count` first (read-only), then :func:`purge` (the CLI requires ``--yes`` between the two).

On a Redis Cluster both SCAN every primary (:func:`kvcli.store.cluster.scan`: refused unless the cluster serves
every slot, and a shard that fails fails the command, so a count is never one shard's), count keys per shard
(``by_shard``), and UNLINK each SCAN batch one slot at a time (redis-py splits it; pipelined per shard).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import redis

from kvcli.errors import BadInputError, RedisFailure
from kvcli.store import cluster
from kvcli.store.layout import KEY_ROOT, KEY_VERSION, key_prefix

BATCH = 1000


@dataclass
class PurgeCount:
    """kvcli keys of one namespace (and chunk size): metadata entries and payloads, per chunk size and per shard
    (``{"host:port": keys}``: the one server, or every primary of a cluster)."""

    namespace: str
    chunk_size: int | None
    metadata: int = 0
    payloads: int = 0
    by_chunk_size: dict[int, int] = field(default_factory=dict)
    by_shard: dict[str, int] = field(default_factory=dict)
    deleted: int = 0

    @property
    def keys(self) -> int:
        """All matching keys (metadata + payloads)."""
        return self.metadata + self.payloads

    def to_dict(self) -> dict:
        """JSON-ready, with ``keys``."""
        return {**self.__dict__, "keys": self.keys}


def _pattern(namespace: str, chunk_size: int | None) -> str:
    escaped = re.sub(r"([*?\[\]\\])", r"\\\1", namespace)
    return f"{KEY_ROOT}:{KEY_VERSION}:{escaped}:{chunk_size if chunk_size else '*'}:*"


def _check(namespace: str, chunk_size: int | None) -> None:
    if not namespace:
        raise BadInputError("purge needs a namespace name (--namespace NAME)")
    if chunk_size is not None and chunk_size < 1:
        raise BadInputError(f"chunk size must be >= 1, got {chunk_size}")


def _matching(client: redis.Redis, namespace: str, chunk_size: int | None):
    """Batches ``(shard, [(key, chunk size, kind)])`` of exactly this namespace's chunk keys, every shard."""
    _check(namespace, chunk_size)
    pattern, start = _pattern(namespace, chunk_size), len(_prefix(namespace))
    for shard, keys in cluster.scan(client, pattern, BATCH):
        mine = [(key, *tail) for key in keys
                if (tail := _tail(key, start)) is not None and chunk_size in (None, tail[0])]
        if mine:
            yield shard, mine


_HEX32 = re.compile(rb"[0-9a-f]{32}")


def _tail(key: bytes, start: int) -> tuple[int, bytes] | None:
    """``(chunk size, kind)`` when ``key[start:]`` is exactly ``{chunk_size}:{m|p}:{32 hex}``, else None.

    The same rules as ``layout.parse_key`` for a key whose namespace prefix is already known to match (the SCAN
    pattern), without a regex over the whole key: a run's cleanup checks hundreds of thousands of keys.
    """
    rest = key[start:].split(b":")
    if len(rest) != 3 or not rest[0].isdigit() or rest[1] not in (b"m", b"p") or not _HEX32.fullmatch(rest[2]):
        return None
    return int(rest[0]), rest[1]


def _tally(result: PurgeCount, shard: str, batch) -> None:
    result.by_shard[shard] = result.by_shard.get(shard, 0) + len(batch)
    for _, size, kind in batch:
        result.by_chunk_size[size] = result.by_chunk_size.get(size, 0) + 1
        result.metadata += kind == b"m"
        result.payloads += kind == b"p"


def _prefix(namespace: str) -> bytes:
    return f"{KEY_ROOT}:{KEY_VERSION}:{namespace}:".encode()


def count(client: redis.Redis, namespace: str, chunk_size: int | None = None) -> PurgeCount:
    """How many keys :func:`purge` would delete now, by kind and chunk size. Read-only."""
    result = PurgeCount(namespace, chunk_size, by_shard={name: 0 for name, _ in cluster.shards(client)})
    for shard, batch in _matching(client, namespace, chunk_size):
        _tally(result, shard, batch)
    result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
    return result


def purge(client: redis.Redis, namespace: str, chunk_size: int | None = None, pipeline_batches: int = 16
          ) -> PurgeCount:
    """Delete kvcli's keys of ``namespace`` (and ``chunk_size``): UNLINK of each SCAN batch, pipelined.

    Returns what was found, with ``deleted`` = keys the server removed (a key that expired or was evicted between
    SCAN and UNLINK is found but not deleted).

    Raises:
        BadInputError: empty namespace or bad chunk size.
        RedisFailure: the server refused a command; keys of earlier batches are deleted.
    """
    result = PurgeCount(namespace, chunk_size, by_shard={name: 0 for name, _ in cluster.shards(client)})
    if cluster.is_cluster(client):  # one UNLINK per slot, pipelined per shard, for each SCAN batch
        for shard, batch in _matching(client, namespace, chunk_size):
            _tally(result, shard, batch)
            try:
                result.deleted += cluster.unlink(client, [key for key, _, _ in batch])
            except cluster.REDIS_ERRORS as exc:
                raise RedisFailure(f"Redis UNLINK failed: {exc}") from None
        result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
        return result
    pipe, queued = client.pipeline(transaction=False), 0
    for shard, batch in _matching(client, namespace, chunk_size):
        _tally(result, shard, batch)
        pipe.unlink(*[key for key, _, _ in batch])
        queued += 1
        if queued == pipeline_batches:
            result.deleted += _flush(pipe)
            queued = 0
    if queued:
        result.deleted += _flush(pipe)
    result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
    return result


def _flush(pipe) -> int:
    try:
        return sum(int(n) for n in pipe.execute())
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis UNLINK failed: {exc}") from None


def redis_memory(client: redis.Redis, namespace: str, chunk_size: int, sample: int) -> tuple[int, int]:
    """Redis's own memory for one namespace and chunk size: ``MEMORY USAGE`` of up to ``sample`` keys, scaled to
    all of them. Returns ``(bytes, sampled keys)``; exact when every key was sampled.
    """
    total = sampled = seen = 0
    pipe = client.pipeline(transaction=False)
    for _, keys in cluster.scan(client, key_prefix(namespace, chunk_size) + "*", 2000):  # no glob characters
        for key in keys:
            seen += 1
            if sampled < sample:
                pipe.memory_usage(key, samples=0)
                sampled += 1
    if sampled:
        total = sum(int(x or 0) for x in pipe.execute())
    return (int(total * seen / sampled) if sampled else 0), sampled
