"""Guarded delete of kvcli's keys of ONE namespace (and optionally one chunk size); nothing else on the server.

Keys are found with SCAN ``MATCH kvcli:v1:{namespace}:{chunk_size or *}:*`` (glob characters in the namespace
escaped; never KEYS), and each one is parsed back (layout.parse_key's rules) and kept only when its namespace (and chunk
size) is exactly the one asked for, so namespace ``a`` never matches ``a:b``'s keys, and a key outside kvcli's
layout is never deleted. Deletion is UNLINK (Redis >= 4) in pipelined batches; never FLUSHDB or
FLUSHALL. :func:`count` first (read-only), then :func:`purge` (the CLI requires ``--yes`` between the two).

On a Redis Cluster both SCAN every primary (:func:`kvcli.store.cluster.scan`: refused unless the cluster serves
every slot, and a shard that fails fails the command, so a count is never one shard's), count keys per shard
(``by_shard``), and UNLINK each SCAN batch one key per command, one round trip per shard
(:func:`kvcli.store.cluster.unlink`).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import redis

from kvcli.errors import BadInputError, RedisFailure
from kvcli.store import cluster
from kvcli.store.layout import KEY_ROOT, KEY_VERSION, key_prefix

BATCH = 5000  # keys per SCAN step (a hint to the server): fewer round trips over a large namespace


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
    """Batches ``(shard, keys, {(chunk size, kind): count})`` of exactly this namespace's chunk keys, every shard:
    each key is ``{prefix}{chunk_size}:{m|p}:{32 hex}`` (layout.parse_key's rules, the namespace prefix being
    matched already by the SCAN pattern). A run's cleanup checks hundreds of thousands of keys, so a SCAN step's
    keys are matched by one regex over them joined by newlines (C speed), unless a key holds a newline itself
    (then one match per key)."""
    _check(namespace, chunk_size)
    pattern = _pattern(namespace, chunk_size)
    size = rb"[0-9]+" if chunk_size is None else str(chunk_size).encode()
    body = re.escape(_prefix(namespace)) + rb"(" + size + rb"):([mp]):[0-9a-f]{32}"
    joined = re.compile(rb"^(" + body + rb")$", re.MULTILINE).findall
    single = re.compile(body).fullmatch
    for shard, keys in cluster.scan(client, pattern, BATCH):
        blob = b"\n".join(keys)
        if blob.count(b"\n") == len(keys) - 1:  # no key holds a newline: every line is one key
            found = joined(blob)
        else:
            found = [(k, m[1], m[2]) for k in keys if (m := single(k)) is not None]
        if found:
            yield shard, [k for k, _, _ in found], Counter((int(cs), kind) for _, cs, kind in found)


def _tally(result: PurgeCount, shard: str, keys: list, kinds: Counter) -> None:
    result.by_shard[shard] = result.by_shard.get(shard, 0) + len(keys)
    for (size, kind), n in kinds.items():
        result.by_chunk_size[size] = result.by_chunk_size.get(size, 0) + n
        result.metadata += n if kind == b"m" else 0
        result.payloads += n if kind == b"p" else 0


def _prefix(namespace: str) -> bytes:
    return f"{KEY_ROOT}:{KEY_VERSION}:{namespace}:".encode()


def count(client: redis.Redis, namespace: str, chunk_size: int | None = None) -> PurgeCount:
    """How many keys :func:`purge` would delete now, by kind and chunk size. Read-only."""
    result = PurgeCount(namespace, chunk_size, by_shard={name: 0 for name, _ in cluster.shards(client)})
    for shard, keys, kinds in _matching(client, namespace, chunk_size):
        _tally(result, shard, keys, kinds)
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
    if cluster.is_cluster(client):  # one UNLINK per key, one round trip per shard, for each SCAN batch
        for shard, keys, kinds in _matching(client, namespace, chunk_size):
            _tally(result, shard, keys, kinds)
            try:
                result.deleted += cluster.unlink(client, keys)
            except cluster.REDIS_ERRORS as exc:
                raise RedisFailure(f"Redis UNLINK failed: {exc}") from None
        result.by_chunk_size = dict(sorted(result.by_chunk_size.items()))
        return result
    pipe, queued = client.pipeline(transaction=False), 0
    for shard, keys, kinds in _matching(client, namespace, chunk_size):
        _tally(result, shard, keys, kinds)
        pipe.unlink(*keys)
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


def redis_memory(client: redis.Redis, namespace: str, chunk_size: int, sample: int, keys: int | None = None
                 ) -> tuple[int, int]:
    """Redis's own memory for one namespace and chunk size: ``MEMORY USAGE`` of up to ``sample`` keys, scaled to
    all of them. Returns ``(bytes, sampled keys)``; exact when every key was sampled.

    ``keys``: the namespace's key count when the caller knows it exactly (an index-only replay: its metadata
    entries less its evictions); the SCAN then stops once ``sample`` keys are read, instead of counting them all.
    """
    total = sampled = seen = 0
    pipe = client.pipeline(transaction=False)
    for _, batch in cluster.scan(client, key_prefix(namespace, chunk_size) + "*", 2000):  # no glob characters
        for key in batch:
            seen += 1
            if sampled < sample:
                pipe.memory_usage(key, samples=0)
                sampled += 1
        if keys is not None and sampled >= sample:
            break
    if sampled:
        total = sum(int(x or 0) for x in pipe.execute())
    seen = keys if keys is not None and sampled >= sample else seen
    return (int(total * seen / sampled) if sampled else 0), sampled
