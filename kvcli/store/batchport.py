"""The seam between a chunk store and its batcher: :class:`BatchPort`, everything :mod:`kvcli.store.batch` may
call on a :class:`~kvcli.store.chunkstore.ChunkStore`, and nothing else.

A batcher answers many requests' lookups and stores at once with the answers the store gives one at a time, so it
needs more of the store than a library user does: its key heads, its metadata writer, its Redis calls, the
judgement of chunks it read itself, and the plan and the accounting of a write it sends itself. Those live here,
behind :meth:`ChunkStore.batch_port <kvcli.store.chunkstore.ChunkStore.batch_port>`, rather than on the store's
public surface; tests/store/test_batchport.py checks that batch.py touches the store through this port only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from kvcli.store.calls import Calls
    from kvcli.store.cluster import ShardTrips
    from kvcli.store.hashing import ChunkedPrompt
    from kvcli.store.layout import MetadataWriter
    from kvcli.store.records import LookupResult, StoreConfig, StoreResult, StoreStats, WritePlan
    from kvcli.store.written import WrittenChunks


class BatchPort(Protocol):
    """What a batcher may call on its store (one store: one namespace, chunk size and model).

    Read-only on the server: :meth:`read_chunks`. Pure (no Redis call): :meth:`judged`, :meth:`evaluate`.
    :meth:`plan_write` changes the store's client-side state (its LRU, its ``written`` record) and the plan must
    then be sent; :meth:`account_write` and :meth:`account_written` change :attr:`stats` only.
    """

    @property
    def config(self) -> StoreConfig:
        """What the store writes and where."""

    @property
    def stats(self) -> StoreStats:
        """The store's running totals, changed through their ``count_*`` methods."""

    @property
    def calls(self) -> Calls:
        """The store's Redis calls: round trips, fault counting, the tolerant-store rule."""

    @property
    def written(self) -> WrittenChunks:
        """The chunks whose keys the store may have written: a batch records its own before they are sent."""

    @property
    def metadata(self) -> MetadataWriter:
        """The one writer of the store's metadata values (a batch script builds accounted values from its parts)."""

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The store's redis-py client (pipelines; a cluster's per-shard writes)."""

    @property
    def cluster(self) -> bool:
        """Whether the store is on a Redis Cluster."""

    @property
    def shard_trips(self) -> ShardTrips:
        """Round trips per shard."""

    @property
    def meta_head(self) -> str:
        """A chunk's metadata key is this head + its hash in hex (32 characters)."""

    @property
    def payload_head(self) -> str:
        """A chunk's payload key is this head + its hash in hex (32 characters)."""

    @property
    def scripted(self) -> bool:
        """Whether a batch may be one server-side script: a single server, no client-side capacity (the client's
        LRU decides what a request deletes) and a server that has not refused the lookup script."""

    def new_connection(self) -> Any:
        """A connection of the batcher's own to the store's single server (redis-py's ``Connection``, made by the
        client's pool but not connected yet and never returned to it): replies come back on it in the order sent.
        Only on a single server."""

    def read_chunks(self, prompt: ChunkedPrompt, record: bool = True) -> tuple[list, list[str]]:
        """The metadata values and states of every chunk of ``prompt`` in every namespace, in one round trip (per
        shard), as a lookup reads them; ``record``: counted as a round trip.

        Raises:
            RedisUnavailable, RedisFailure: as :meth:`kvcli.store.calls.Calls.call`.
        """

    def judged(self, prompt: ChunkedPrompt, metas: list, lengths: list[int]) -> list[str]:
        """The states of chunks read as metadata values and payload STRLENs (a length counts only where the
        metadata records a real payload; :data:`kvcli.store.judge.NOT_READ` where none was read)."""

    def evaluate(self, prompt: ChunkedPrompt, metas: list, states: list[str] | None = None,
                 seconds: float = 0.0) -> LookupResult:
        """The lookup's answer from the metadata values of every chunk in every namespace (None: missing) and
        their states (None: judged without their payloads), priced at ``seconds``."""

    def plan_write(self, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> WritePlan:
        """What a store of chunks ``[start, n)`` after ``lookup`` writes, not sent yet (the LRU's bookkeeping is
        done and the chunks recorded in :attr:`written`: the plan must be sent). ``kv``: ``[layers, 2, kv_heads,
        >= n*chunk_size, head_dim]``, or None for accounted chunks."""

    def account_write(self, plan: WritePlan, seconds: float) -> StoreResult:
        """Count a :meth:`plan_write` write the server acknowledged (all its SETs created keys); ``seconds``: its
        share of wall time."""

    def account_written(self, chunks: int, meta_bytes: int, seconds: float, present: int = 0) -> StoreResult:
        """Count ``chunks`` accounted chunks (metadata only) a batch script wrote and the server acknowledged,
        ``meta_bytes`` of metadata, ``present`` chunks found there already."""
