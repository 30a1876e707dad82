"""The chunk-store interface the replay drives, and the registry of key layouts that implement it.

Four layouts: ``kvcli`` (:class:`kvcli.store.chunkstore.ChunkStore`: one MGET per lookup, metadata with a token
digest and checksum), ``lmcache`` (:class:`kvcli.store.lmcache_store.LMCacheStore`: LMCache 0.5.6's ``redis://``
keys and its one-EXISTS-per-chunk lookup), ``lmcache-resp`` (:class:`kvcli.store.lmcache_store.LMCacheRespStore`:
its ``resp://`` connector, one key per chunk) and ``lmcache-mp``
(:class:`kvcli.store.lmcache_store.LMCacheMPStore`: its multiprocess mode's keys). All cut and hash prompts the same
way, so on the same trace they hit the same chunks; what differs is what goes over the wire and what sits in
Redis.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import redis
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.hashing import ChunkedPrompt, PromptChunker
from kvcli.store.lmcache import lmcache_layouts
from kvcli.store.namespace import PurgeCount, count, purge, purge_own
from kvcli.store.records import LookupResult, RetrieveResult, StoreConfig, StoreResult, StoreStats
from kvcli.store.runmark import RunMark
from kvcli.store.written import HashKeys, WrittenChunks, delete_keys

if TYPE_CHECKING:
    import torch


class KVStore(Protocol):
    """A chunk-hash KV-cache store for one namespace, chunk size and model (what replay needs of one).

    ``lookup`` and ``retrieve`` are read-only on the server; ``store`` writes. Shapes: KV ``[layers, 2, kv_heads,
    tokens, head_dim]``; sizes in bytes; times in seconds.
    Redis errors are raised as :class:`~kvcli.errors.RedisFailure`.
    """

    layout: str
    config: StoreConfig
    stats: StoreStats
    chunker: PromptChunker  # what ``chunk`` cuts and hashes with (another process can hash with it too)
    written: WrittenChunks  # the chunks whose keys it may have written, recorded before each write is sent

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """Cut and hash a prompt (the same chunks and hashes in every layout)."""

    def lookup(self, tokens, cache_salt: str = "", record: bool = True) -> LookupResult:
        """Consecutive hit chunks from chunk 0."""

    def retrieve(self, tokens, cache_salt: str = "", lookup: LookupResult | None = None) -> RetrieveResult:
        """The hit run's KV, verified; a chunk that fails ends the run."""

    def store(self, tokens, kv: torch.Tensor | None, cache_salt: str = "", start_chunk: int = 0,
              end_chunk: int | None = None, overwrite: bool = False,
              lookup: LookupResult | None = None) -> StoreResult:
        """Write full chunks ``[start_chunk, end_chunk)``; ``kv`` None: payload accounted, not written."""

    def accounted(self, prompt: ChunkedPrompt, lookup: LookupResult, k: int) -> bool:
        """Whether hit chunk ``k``'s payload was accounted, not written."""

    def check_value_size(self) -> int:
        """Refuse chunk values over the server's limit before any write; returns the limit (bytes)."""

    def payload_key(self, chunk_hash: bytes) -> str:
        """The key a chunk's payload is written under."""

    def written_keys(self) -> Iterator[list[str] | HashKeys]:
        """Every key the store may have written (its ``written`` record), in batches for UNLINK
        (:func:`~kvcli.store.written.delete_keys`)."""

    def vanished_chunks(self) -> int | None:
        """Chunks it wrote again because their keys had gone, not evicted by its capacity (None: not known)."""

    @property
    def resident_chunks(self) -> int | None:
        """Chunks held under a client-side capacity (None: no capacity)."""

    @property
    def key_pattern(self) -> str:
        """SCAN MATCH pattern covering this store's keys."""

    @property
    def value_bytes(self) -> int:
        """Bytes of one chunk's payload value as written."""

    @property
    def key_bytes_per_chunk(self) -> float:
        """Bytes of one chunk's key names."""


def _lmcache_store(client: redis.Redis | RedisCluster, config: StoreConfig) -> KVStore:
    from kvcli.store.lmcache_store import LMCacheStore  # torch: only a run with this layout loads it

    return LMCacheStore(client, config)


def _lmcache_resp_store(client: redis.Redis | RedisCluster, config: StoreConfig) -> KVStore:
    from kvcli.store.lmcache_store import LMCacheRespStore

    return LMCacheRespStore(client, config)


def _lmcache_mp_store(client: redis.Redis | RedisCluster, config: StoreConfig) -> KVStore:
    from kvcli.store.lmcache_store import LMCacheMPStore

    return LMCacheMPStore(client, config)


LAYOUTS: dict[str, Callable[[redis.Redis | RedisCluster, StoreConfig], KVStore]] = {
    "kvcli": ChunkStore,
    "lmcache": _lmcache_store,
    "lmcache-resp": _lmcache_resp_store,
    "lmcache-mp": _lmcache_mp_store,
}



def parse_layouts(text: str) -> tuple[str, ...]:
    """``"kvcli,lmcache"`` -> ``("kvcli", "lmcache")`` (duplicates dropped, order kept).

    Raises:
        BadInputError: an unknown layout name (the message lists the valid ones), or none.
    """
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in names if x not in LAYOUTS]
    if unknown or not names:
        raise BadInputError(f"--layout must be one or more of {', '.join(LAYOUTS)} (comma-separated), got {text!r}")
    return names


def make_store(layout: str, client: redis.Redis | RedisCluster, config: StoreConfig, tolerate_unavailable: bool = False,
               mark: RunMark | None = None) -> KVStore:
    """The store of ``layout`` for ``config``. ``tolerate_unavailable``: kvcli's store counts a call that still
    fails after redis-py's retries as a miss (:class:`~kvcli.store.chunkstore.ChunkStore`); the lmcache store
    stops the run instead. ``mark``: the run's server, which kvcli's store checks after a dropped connection
    (:mod:`kvcli.store.runmark`; the lmcache store does not).

    Raises:
        BadInputError: an unknown layout, or options the layout does not support.
    """
    if layout not in LAYOUTS:
        raise BadInputError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    if layout == "kvcli":
        return ChunkStore(client, config, tolerate_unavailable=tolerate_unavailable, mark=mark)
    return LAYOUTS[layout](client, config)


def purge_run(client: redis.Redis | RedisCluster, namespace: str, layouts: tuple[str, ...], own_server: bool = False,
              stores: list[KVStore] | None = None, keys: Iterable[str] = ()) -> int:
    """Delete what a run wrote under ``namespace`` (its own, fresh) in each of ``layouts``; its own keys only.
    Returns the keys deleted.

    ``stores``: the run's stores, whose ``written`` records are complete (every chunk whose keys the run may have
    written, this process's and its workers': :mod:`kvcli.store.written`), with ``keys``, the run's other keys
    (its sentinel, :mod:`kvcli.store.runmark`): those keys are deleted with batched UNLINKs
    (:func:`~kvcli.store.written.delete_keys`), no SCAN. None (a record may be incomplete: a worker's was lost with
    it): a SCAN of the server finds them, kvcli's layout through :func:`~kvcli.store.namespace.purge_own`
    (the sentinel is named in it), LMCache's through :func:`~kvcli.store.lmcache_store.purge_namespace`.

    ``own_server``: the server is kvcli's embedded one, started for this command, on a private socket, holding
    nothing but this command's keys: then its database is discarded whole (``FLUSHDB ASYNC``: the server frees it in
    a thread of its own while this process goes on, and a server stopped before it is done exits all the same).
    Never on a server that was given (``--redis-url``, ``REDIS_URL``): that one may hold other people's keys, and
    only the run's own are deleted.

    Raises:
        RedisFailure: a command failed (the message says how many keys were deleted before it).
    """
    if own_server:
        deleted = int(client.dbsize())
        client.flushdb(asynchronous=True)
        return deleted
    if stores is not None:
        return delete_keys(client, itertools.chain([list(keys)], *(store.written_keys() for store in stores)))
    deleted = purge_own(client, namespace)
    if lmcache_layouts(layouts):
        from kvcli.store.lmcache_store import purge_namespace

        deleted += purge_namespace(client, namespace, lmcache_layouts(layouts))
    return deleted


def check_purge_layout(layout: str, chunk_size: int | None) -> None:
    """Raise BadInputError unless ``kvcli purge`` can delete ``layout``'s keys at ``chunk_size``: kvcli's by
    namespace and chunk size, LMCache's (what a ``replay --layout lmcache... --keep`` or a ``warm --layout
    lmcache...`` left) by namespace only."""
    if layout not in LAYOUTS:
        raise BadInputError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout != "kvcli" and chunk_size is not None:
        raise BadInputError(f"--chunk-size: not with --layout {layout} (its keys are deleted by namespace)")


def count_layout(client: redis.Redis | RedisCluster, namespace: str, chunk_size: int | None, layout: str) -> PurgeCount:
    """What :func:`purge_layout` would delete now (:func:`kvcli.store.namespace.count`, or for LMCache's layout
    :func:`kvcli.store.lmcache_store.count_namespace`). Read-only. Raises BadInputError, RedisFailure."""
    check_purge_layout(layout, chunk_size)
    if layout == "kvcli":
        return count(client, namespace, chunk_size)
    from kvcli.store.lmcache_store import count_namespace

    return count_namespace(client, namespace, layouts=(layout,))


def purge_layout(client: redis.Redis | RedisCluster, namespace: str, chunk_size: int | None, layout: str) -> PurgeCount:
    """Delete ``namespace``'s keys of ``layout`` (and ``chunk_size``, kvcli's layout only): what was found, with
    ``deleted`` (:func:`kvcli.store.namespace.purge`; :func:`kvcli.store.lmcache_store.count_namespace`). Raises
    BadInputError, RedisFailure."""
    check_purge_layout(layout, chunk_size)
    if layout == "kvcli":
        return purge(client, namespace, chunk_size)
    from kvcli.store.lmcache_store import count_namespace

    return count_namespace(client, namespace, delete=True, layouts=(layout,))
