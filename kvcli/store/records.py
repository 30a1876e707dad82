"""The chunk store's records: what a store writes (:class:`StoreConfig`), what its calls return
(:class:`LookupResult`, :class:`RetrieveResult`, :class:`StoreResult`, :class:`WritePlan`) and its running totals
(:class:`StoreStats`). Plain data: no Redis calls."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvcli.errors import BadInputError
from kvcli.store.hashing import ChunkedPrompt
from kvcli.store.layout import check_namespace, payload_header_metadata
from kvcli.store.serde import check_kv_dtype, data_bytes, header_size

if TYPE_CHECKING:
    import torch

MAX_CHUNK_SIZE = 1 << 24  # tokens: far beyond any context window; larger is a typo (and overflows tensor shapes)


class ChunkTooLargeError(BadInputError):
    """One chunk's value would exceed the server's ``proto-max-bulk-len``; raised before any write (exit 2)."""


@dataclass(frozen=True)
class StoreConfig:
    """What a store writes and where.

    Attributes:
        namespace: the key namespace (e.g. "default", or one per replay run and chunk size).
        chunk_size: tokens per chunk.
        model_id: the model whose KV is stored (part of the hash root and of each chunk's metadata).
        tokenizer: tokenizer name (part of the hash root).
        kv_shape: per-token KV shape ``(layers, 2, kv_heads, head_dim)``.
        dtype: the model's KV dtype, what :meth:`store` takes and :meth:`retrieve` returns (a torch dtype or
            torch's name for it, "bfloat16": an index-only store never imports torch).
        kv_dtype: the payload's dtype when it is not ``dtype``: ``"float8_e4m3fn"`` (``--kv-dtype fp8``: quantized
            with per-layer K and V scales, :mod:`kvcli.store.serde`); None: ``dtype`` itself, bit-exact.
        payload: "real" writes the KV bytes; "accounted" writes metadata only and counts the payload bytes.
        capacity_tokens / capacity_bytes: client-side LRU capacity over chunks (None: unlimited). Bytes count
            payload data bytes (stored or accounted).
        ttl: seconds to expire each chunk's metadata and payload (together), or None.
        read_namespace: another namespace whose chunks are read as hits too but never written (a cache someone
            warmed, replayed without changing it). Lookups stay one round trip (both namespaces' keys).
        state_shape: a hybrid model's ``(linear_layers, state_elements)``: each chunk's payload also holds every
            linear layer's state at the chunk's end, in ``dtype`` (:mod:`kvcli.store.serde`); ``()``: none.

    Raises:
        BadInputError: a namespace kvcli cannot own (:func:`kvcli.store.layout.check_namespace`), a chunk size
            outside ``[1, MAX_CHUNK_SIZE]``, or a capacity or TTL that is not > 0.
    """

    namespace: str
    chunk_size: int
    model_id: str
    tokenizer: str
    kv_shape: tuple[int, int, int, int]
    dtype: object
    payload: str = "real"
    capacity_tokens: int | None = None
    capacity_bytes: int | None = None
    ttl: int | None = None
    read_namespace: str | None = None
    kv_dtype: str | None = None
    state_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtype", check_kv_dtype(self.kv_dtype))
        if not self.namespace:
            raise BadInputError("namespace must not be empty")
        for name in filter(None, (self.namespace, self.read_namespace)):
            check_namespace(name)
        if not 1 <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise BadInputError(f"chunk size must be in [1, {MAX_CHUNK_SIZE:,}] tokens, got {self.chunk_size}")
        for name in ("capacity_tokens", "capacity_bytes", "ttl"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise BadInputError(f"{name.replace('_', ' ')} must be > 0, got {value}")

    @property
    def chunk_shape(self) -> tuple[int, int, int, int, int]:
        """``[layers, 2, kv_heads, chunk_size, head_dim]``."""
        layers, two, heads, dim = self.kv_shape
        return (layers, two, heads, self.chunk_size, dim)

    @property
    def stored_dtype(self):
        """The payload's dtype: ``kv_dtype``, else ``dtype``."""
        return self.kv_dtype if self.kv_dtype is not None else self.dtype

    @functools.cached_property
    def payload_bytes(self) -> int:
        """Tensor bytes of one chunk (bytes): its KV in :attr:`stored_dtype`, plus an fp8 payload's scales (4 bytes
        per layer and K/V), plus a hybrid model's state at the chunk's end (``state_shape`` in ``dtype``):
        :func:`kvcli.store.serde.data_bytes`."""
        return data_bytes(self.chunk_shape, self.stored_dtype, self.state_shape, self.dtype)

    @functools.cached_property
    def header_bytes(self) -> int:
        """Serialization header bytes of one chunk's payload (bytes)."""
        return header_size(self.chunk_shape, self.stored_dtype, self.payload_metadata, self.state_shape, self.dtype)

    @property
    def value_bytes(self) -> int:
        """Bytes of one chunk's payload value as written: serialization header + tensor bytes."""
        return self.header_bytes + self.payload_bytes

    @property
    def payload_metadata(self) -> dict[str, str]:
        """The ``__metadata__`` of each payload's safetensors header (:func:`kvcli.store.layout.
        payload_header_metadata`)."""
        return payload_header_metadata(self.model_id, self.chunk_size)

    @property
    def capacity_chunks(self) -> int | None:
        """Chunks the client-side capacity holds: the smaller of ``capacity_tokens // chunk_size`` and
        ``capacity_bytes // payload_bytes`` when both are set; None without a capacity."""
        limits = []
        if self.capacity_tokens:
            limits.append(self.capacity_tokens // self.chunk_size)
        if self.capacity_bytes:
            limits.append(self.capacity_bytes // self.payload_bytes)
        return min(limits) if limits else None


@dataclass(frozen=True, slots=True)
class LookupResult:
    """Result of one lookup: ``hit_chunks`` consecutive chunks from chunk 0 are present and loadable.

    ``hit_tokens`` = hit_chunks × chunk_size (tokens; never more than the prompt's full-chunk tokens; what a request
    reuses of them is :func:`kvcli.store.hashing.reusable_tokens`). ``break_reason`` is the state
    (:mod:`kvcli.store.judge`) of the chunk that ended the run ("missing", "token-mismatch", "no-payload",
    "bad-payload", "bad-metadata"), "redis-error" for a failed lookup, or "" (every full chunk hit). ``seconds``
    is wall time.
    ``metadata``: the hit run's metadata values, in order.
    ``metadata_hit_chunks``: the run by metadata alone (payloads not checked), >= ``hit_chunks``.
    ``present_after``: chunks after the hit run that are there and usable anyway (a store skips them; one whose
    payload was lost is written again, as the request that computed it would).
    ``from_read``: per hit chunk, whether it came from the read-only namespace; ``read_only``: every chunk index
    only the read-only namespace supplies (never written to, nor counted in, the store's own namespace);
    ``read_usable``: every chunk index the read-only namespace could supply.
    ``failed``: the lookup itself failed (a tolerant store): a miss whose chunks are not stored.
    """

    hit_chunks: int
    hit_tokens: int
    full_chunks: int
    break_reason: str
    seconds: float
    metadata: tuple[bytes, ...] = ()
    present_after: frozenset[int] = frozenset()
    from_read: tuple[bool, ...] = ()
    read_only: frozenset[int] = frozenset()
    metadata_hit_chunks: int = 0
    read_usable: frozenset[int] = frozenset()
    failed: bool = False

    @classmethod
    def failure(cls, full_chunks: int, seconds: float) -> LookupResult:
        """A lookup that failed (``break_reason`` "redis-error"): no hit, and its request stores nothing."""
        return cls(0, 0, full_chunks, "redis-error", seconds, failed=True)

    def first(self, chunks: int) -> LookupResult:
        """This lookup cut to its first ``chunks`` hit chunks (what a truncated measurement retrieves)."""
        if chunks >= self.hit_chunks:
            return self
        return dataclasses.replace(self, hit_chunks=chunks, hit_tokens=chunks * (self.hit_tokens // self.hit_chunks),
                                   break_reason="", metadata=self.metadata[:chunks], from_read=self.from_read[:chunks])


@dataclass(frozen=True, slots=True)
class RetrieveResult:
    """Result of one retrieve: the KV of the hit run, ``[layers, 2, kv_heads, hit_tokens, head_dim]`` (or None).

    ``hit_tokens`` may be less than the lookup's when a payload is missing (``break_reason`` "no-payload") or its
    checksum fails ("checksum"); those chunks count as misses and are never returned. Bytes read:
    ``payload_bytes`` (tensor) and ``header_bytes`` (serialization headers); times in seconds.
    """

    hit_tokens: int
    kv: torch.Tensor | None
    lookup: LookupResult
    payload_bytes: int
    header_bytes: int
    transfer_seconds: float
    deserialize_seconds: float
    break_reason: str


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Result of one store: chunks written and already present, objects (keys) and metadata entries created,
    payload / header / metadata bytes, chunks the LRU evicted, wall seconds."""

    chunks_written: int
    chunks_present: int
    objects_created: int
    metadata_entries: int
    payload_bytes: int
    header_bytes: int
    metadata_bytes: int
    evicted_chunks: int
    seconds: float


NOTHING_STORED = StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)


@dataclass
class StoreStats:
    """Running totals of one store (counts; bytes; seconds), changed only through its ``count_*`` methods (the
    store, its Redis calls and its batcher each say what happened, never how a total adds up)."""

    round_trips: int = 0
    lookups: int = 0
    lookup_round_trips: int = 0
    chunks_written: int = 0
    objects_created: int = 0
    metadata_entries: int = 0
    payload_bytes_written: int = 0
    payload_bytes_accounted: int = 0
    header_bytes_written: int = 0
    metadata_bytes_written: int = 0
    payload_bytes_read: int = 0
    header_bytes_read: int = 0
    evicted_chunks: int = 0
    checksum_failures: int = 0
    redis_retries: int = 0  # commands redis-py re-sent on a fresh connection after a drop
    redis_errors: int = 0  # calls that failed after retries (a tolerant store absorbs them: kvcli.store.calls)
    redis_timeouts: int = 0  # replies that did not come within the client's timeout
    redis_busy_retries: int = 0  # calls sent again after a BUSY reply (another client's script: kvcli.store.calls)
    checksum_verified_chunks: int = 0
    lookup_seconds: list[float] = field(default_factory=list)  # each timed lookup (seconds)
    lookups_pipelined: int = 0  # lookups answered in batches (kvcli.store.batch): not timed one by one
    lookups_sampled: int = 0  # unpipelined lookups timed for latency, besides the batches

    def mean_lookup_seconds(self) -> float:
        """The mean timed lookup so far (seconds; 0 before any): the price of a pipelined lookup."""
        return sum(self.lookup_seconds) / len(self.lookup_seconds) if self.lookup_seconds else 0.0

    def count_round_trips(self, n: int = 1) -> None:
        """``n`` calls to the server (a negative ``n`` takes back calls counted that turned out not to be the
        measured path's: a batch script the server refused)."""
        self.round_trips += n

    def count_lookup(self, seconds: float, round_trips: int) -> None:
        """One lookup timed on its own (not in a batch): ``seconds`` of wall time, ``round_trips`` of them (0 for a
        prompt without a full chunk)."""
        self.lookups += 1
        self.lookup_round_trips += round_trips
        self.lookup_seconds.append(seconds)

    def count_pipelined_lookups(self, lookups: int) -> None:
        """``lookups`` lookups answered in a batch (:mod:`kvcli.store.batch`), not timed one by one; their round
        trips: :meth:`count_lookup_round_trips`."""
        self.lookups += lookups
        self.lookups_pipelined += lookups

    def count_lookup_round_trips(self, n: int) -> None:
        """``n`` round trips that answered a batch's lookups."""
        self.lookup_round_trips += n

    def count_sample(self, seconds: float) -> None:
        """One unpipelined lookup a batcher timed for latency (read-only, its answer not used), ``seconds`` long."""
        self.lookup_seconds.append(seconds)
        self.lookups_sampled += 1

    def count_write(self, chunks: int, objects: int, payload_bytes: int, header_bytes: int, metadata_bytes: int,
                    real: bool) -> None:
        """A write the server acknowledged: ``chunks`` new chunks (each a new metadata entry), ``objects`` keys
        created, ``payload_bytes`` of tensor bytes (written when ``real``, else accounted: metadata only),
        ``header_bytes`` of serialization headers and ``metadata_bytes`` of metadata values."""
        self.chunks_written += chunks
        self.metadata_entries += chunks
        self.objects_created += objects
        if real:
            self.payload_bytes_written += payload_bytes
            self.header_bytes_written += header_bytes
        else:
            self.payload_bytes_accounted += payload_bytes
        self.metadata_bytes_written += metadata_bytes

    def count_rewrite(self, payload_bytes: int) -> None:
        """Chunks stored accounted got their real payload: ``payload_bytes`` are no longer only accounted (their
        write is counted by :meth:`count_write`)."""
        self.payload_bytes_accounted -= payload_bytes

    def count_read(self, payload_bytes: int, header_bytes: int = 0) -> None:
        """Payload values read back: ``payload_bytes`` of tensor bytes, ``header_bytes`` of headers."""
        self.payload_bytes_read += payload_bytes
        self.header_bytes_read += header_bytes

    def count_checksums(self, verified: int, failed: int) -> None:
        """``verified`` chunks checked against the checksum in their metadata; ``failed`` chunks that failed a check
        (a checksum, or in LMCache's layout a record that does not describe the store's chunks)."""
        self.checksum_verified_chunks += verified
        self.checksum_failures += failed

    def count_evictions(self, chunks: int) -> None:
        """``chunks`` chunks the client-side LRU evicted."""
        self.evicted_chunks += chunks

    def count_faults(self, errors: int = 0, timeouts: int = 0, retries: int = 0, busy_retries: int = 0) -> None:
        """Calls that failed after retries (``errors``), replies that did not come in time (``timeouts``), commands
        redis-py sent again on a fresh connection (``retries``) and calls sent again after a BUSY reply
        (``busy_retries``)."""
        self.redis_errors += errors
        self.redis_timeouts += timeouts
        self.redis_retries += retries
        self.redis_busy_retries += busy_retries


@dataclass(frozen=True, slots=True)
class WritePlan:
    """One store planned from its lookup (:meth:`kvcli.store.batchport.BatchPort.plan_write`), not sent yet.

    Attributes:
        prompt: the prompt it writes chunks of.
        missing: the chunk indices it writes, in order.
        deletes: keys of the chunks the LRU evicted, to delete before the writes (metadata and payload keys).
        args: the MSET arguments ``key, value, key, value, ...`` on a single server (each chunk's payload, then
            its metadata); empty on a cluster.
        firsts / thens: on a cluster, the ``(key, value)`` payload SETs and the metadata SETs sent once the
            payloads are acknowledged; empty on a single server.
        meta_bytes: bytes of the metadata values it writes.
        evicted: chunks the LRU evicted (``len(deletes) // 2``).
        present: chunks after the hit run that were already there (not written).
        real: whether it writes payloads (else accounted: metadata only).
    """

    prompt: ChunkedPrompt
    missing: list[int]
    deletes: list[str]
    args: list
    firsts: list
    thens: list
    meta_bytes: int
    evicted: int
    present: int
    real: bool
