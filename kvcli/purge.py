"""Guarded delete of kvcli's keys of ONE namespace (and optionally one chunk size); nothing else on the server.

Keys are found with SCAN ``MATCH kvcli:v1:{namespace}:{chunk_size or *}:*`` (glob characters in the namespace
escaped; never KEYS), and each one is parsed back (store.parse_key) and kept only when its namespace (and chunk
size) is exactly the one asked for, so namespace ``a`` never matches ``a:b``'s keys, and a key outside kvcli's
layout is never deleted. Deletion is UNLINK (Redis >= 4) in pipelined batches; never FLUSHDB or
FLUSHALL. :func:`count` first (read-only), then :func:`purge` (the CLI requires ``--yes`` between the two).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from .errors import BadInputError, RedisFailure
from .layout import KEY_ROOT, KEY_VERSION, parse_key

BATCH = 1000


@dataclass
class PurgeCount:
    """kvcli keys of one namespace (and chunk size): metadata entries and payloads, per chunk size."""

    namespace: str
    chunk_size: int | None
    metadata: int = 0
    payloads: int = 0
    by_chunk_size: dict[int, int] = field(default_factory=dict)
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


def matching_keys(client: redis.Redis, namespace: str, chunk_size: int | None = None) -> Iterator[list[bytes]]:
    """Batches of the keys :func:`purge` would delete (SCAN with a cursor; read-only). Raises RedisFailure."""
    _check(namespace, chunk_size)
    cursor, pattern = 0, _pattern(namespace, chunk_size)
    while True:
        try:
            cursor, keys = client.scan(cursor, match=pattern, count=BATCH)
        except redis.RedisError as exc:
            raise RedisFailure(f"Redis SCAN failed: {exc}") from None
        mine = [k for k in keys if _ours(k, namespace, chunk_size)]
        if mine:
            yield mine
        if cursor == 0:
            return


def _ours(key: bytes, namespace: str, chunk_size: int | None) -> bool:
    parts = parse_key(key)
    return parts is not None and parts.namespace == namespace and chunk_size in (None, parts.chunk_size)


def _tally(result: PurgeCount, keys: list[bytes]) -> None:
    for key in keys:
        parts = parse_key(key)
        result.by_chunk_size[parts.chunk_size] = result.by_chunk_size.get(parts.chunk_size, 0) + 1
        result.metadata += parts.kind == "m"
        result.payloads += parts.kind == "p"


def count(client: redis.Redis, namespace: str, chunk_size: int | None = None) -> PurgeCount:
    """How many keys :func:`purge` would delete now, by kind and chunk size. Read-only."""
    result = PurgeCount(namespace, chunk_size)
    for keys in matching_keys(client, namespace, chunk_size):
        _tally(result, keys)
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
    result = PurgeCount(namespace, chunk_size)
    pipe, queued = client.pipeline(transaction=False), 0
    for keys in matching_keys(client, namespace, chunk_size):
        _tally(result, keys)
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
    except redis.RedisError as exc:
        raise RedisFailure(f"Redis UNLINK failed: {exc}") from None
