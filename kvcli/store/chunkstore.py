"""The chunk-hash KV-cache store on Redis: ``lookup``, ``retrieve`` and ``store`` of per-chunk KV tensors.

Key layout and metadata format: :mod:`kvcli.layout` (README, "The store").

Round trips: ``lookup`` is one round trip whatever the number of chunks: one read-only script (``EVAL_RO``) that
returns every metadata value and, for each chunk whose metadata records a real payload, its payload's length
(``STRLEN``), or where scripts are refused an MGET of the metadata and a STRLEN per payload key pipelined together;
``retrieve`` adds one MGET of the hit chunks' payloads; ``store`` writes the missed full chunks in one pipelined
round trip, payload before metadata for each chunk.

On a Redis Cluster (:mod:`kvcli.store.cluster`) the keys of one lookup spread over the shards and a script cannot
span slots: the lookup sends each shard its GETs (metadata) and STRLENs (payloads) in one write, every shard's sent
before any reply is read (one round trip per shard, concurrently), and ``shard_trips`` counts round trips per
shard. A store writes payloads first and metadata once they are acknowledged (two round trips; one with accounted
payloads), so a metadata hit still means its payload was written.

A lookup hit is what a serving engine could load: the metadata is there with the prompt's token digest and, for a
chunk stored "real", its payload is there with the exact length (header + tensor bytes); a payload that is missing
(evicted, expired, deleted), truncated or of another type ends the hit run there. Checksums need the payload bytes:
:meth:`ChunkStore.retrieve` checks every chunk it returns, :meth:`ChunkStore.verify` checks chosen ones.

Faults: the client's connections retry a dropped connection themselves (redis-py's Retry, set up in
:mod:`kvcli.store.server`); a call that still fails (the connection kept dropping, or no reply within the client's
timeout) raises :class:`RedisUnavailable`, or, in a store made with ``tolerate_unavailable`` (replay's), is
absorbed by the documented rule: a failed lookup is a miss (``break_reason`` "redis-error") and that request
stores nothing, a failed retrieve returns no KV, a failed store writes nothing more; each is counted in
:class:`StoreStats` (``redis_errors``, ``redis_timeouts``, ``redis_retries``), and after
:data:`MAX_FAILURES_IN_ROW` such failures in a row (across every store on the client) the server is taken as gone
and :class:`RedisUnavailable` is raised anyway. Other errors (out of memory, permissions) always raise.
"""
from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis
import xxhash

from kvcli.errors import BadInputError, KvcliError, RedisFailure, redis_error_text
from kvcli.store.cluster import REDIS_ERRORS, ShardTrips, by_shard, is_cluster, mget, set_in_order, uninterrupted
from kvcli.store.hashing import ChunkedPrompt, PromptChunker
from kvcli.store.layout import _NAMESPACE_RE, key_prefix
from kvcli.store.lru import ChunkLru
from kvcli.store.serde import PayloadError, decode_kv, dtype_name, encode_kv, header_size
from kvcli.store.server import FaultCounts, fault_counts, script_refused
from kvcli.units import dtype_bytes

if TYPE_CHECKING:
    import torch

MAX_FAILURES_IN_ROW = 3  # calls failing after retries, in a row, before a tolerant store gives up


class RedisUnavailable(RedisFailure):
    """A call failed after redis-py's retries: the connection kept dropping, or no reply came within the timeout
    (``timeout`` True). Exit code 3."""

    def __init__(self, message: str, timeout: bool = False, final: bool = False) -> None:
        super().__init__(message)
        self.timeout, self.final = timeout, final  # final: MAX_FAILURES_IN_ROW reached, never absorbed


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
        dtype: KV dtype.
        payload: "real" writes the KV bytes; "accounted" writes metadata only and counts the payload bytes.
        capacity_tokens / capacity_bytes: client-side LRU capacity over chunks (None: unlimited). Bytes count
            payload data bytes (stored or accounted).
        ttl: seconds to expire each chunk's metadata and payload (together), or None.
        read_namespace: another namespace whose chunks are read as hits too but never written (a cache someone
            warmed, replayed without changing it). Lookups stay one MGET (both namespaces' keys).
    """

    namespace: str
    chunk_size: int
    model_id: str
    tokenizer: str
    kv_shape: tuple[int, int, int, int]
    dtype: object  # a torch dtype or torch's name for it ("bfloat16"): an index-only store never imports torch
    payload: str = "real"
    capacity_tokens: int | None = None
    capacity_bytes: int | None = None
    ttl: int | None = None
    read_namespace: str | None = None

    def __post_init__(self) -> None:
        for name in filter(None, (self.namespace, self.read_namespace)):
            if not _NAMESPACE_RE.fullmatch(name):
                raise BadInputError(f"namespace {name!r}: use letters, digits and . _ - @ + = (no ':' or glob "
                                    f"characters, so one namespace's keys never match another's)")
        if not self.namespace:
            raise BadInputError("namespace must not be empty")
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

    @functools.cached_property
    def payload_bytes(self) -> int:
        """Tensor bytes of one chunk (bytes)."""
        n = 1
        for d in self.chunk_shape:
            n *= d
        return n * dtype_bytes(self.dtype)

    @functools.cached_property
    def header_bytes(self) -> int:
        """Serialization header bytes of one chunk's payload."""
        return header_size(self.chunk_shape, self.dtype, _payload_metadata(self))


def _payload_metadata(config: StoreConfig) -> dict[str, str]:
    return {"format": "kvcli-kv/1", "model": config.model_id, "tokens": str(config.chunk_size)}


@dataclass(frozen=True, slots=True)
class LookupResult:
    """Result of one lookup: ``hit_chunks`` consecutive chunks from chunk 0 are present and loadable.

    ``hit_tokens`` = hit_chunks × chunk_size (tokens; never more than the prompt's full-chunk tokens; what a request
    reuses of them is :func:`kvcli.store.hashing.reusable_tokens`). ``break_reason`` is "missing",
    "token-mismatch", "no-payload" (metadata says real, no payload key), "bad-payload" (a payload of the wrong
    length or type) or "" (every full chunk hit). ``seconds`` is wall time.
    ``metadata_hit_chunks``: the run by metadata alone (payloads not checked), >= ``hit_chunks``.
    ``present_after``: chunks after the hit run that are there and usable anyway (a store skips them; one whose
    payload was lost is written again, as the request that computed it would).
    ``from_read``: per hit chunk, whether it came from the read-only namespace; ``read_only``: every chunk index
    only the read-only namespace supplies (never written to, nor counted in, the store's own namespace);
    ``read_usable``: every chunk index the read-only namespace could supply (metadata, digest and payload length
    check out).
    """

    hit_chunks: int
    hit_tokens: int
    full_chunks: int
    break_reason: str  # "missing", "token-mismatch", "redis-error" (a failed lookup) or ""
    seconds: float
    metadata: tuple[bytes, ...] = ()
    present_after: frozenset[int] = frozenset()
    from_read: tuple[bool, ...] = ()
    read_only: frozenset[int] = frozenset()
    metadata_hit_chunks: int = 0
    read_usable: frozenset[int] = frozenset()
    failed: bool = False  # the lookup itself failed (tolerant store): a miss whose chunks are not stored


@dataclass(frozen=True, slots=True)
class RetrieveResult:
    """Result of one retrieve: the KV of the hit run, ``[layers, 2, kv_heads, hit_tokens, head_dim]`` (or None).

    ``hit_tokens`` may be less than the lookup's when a payload is missing (``break_reason`` "no-payload") or its
    checksum fails ("checksum"); those chunks count as misses and are never returned. Times in seconds.
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
    """Result of one store: objects (keys) and metadata entries created, bytes, evictions, wall seconds."""

    chunks_written: int
    chunks_present: int
    objects_created: int
    metadata_entries: int
    payload_bytes: int
    header_bytes: int
    metadata_bytes: int
    evicted_chunks: int
    seconds: float


@dataclass
class StoreStats:
    """Running totals of one store (counts; bytes; seconds)."""

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
    redis_errors: int = 0  # calls that failed after retries (tolerant store: absorbed, see the module docstring)
    redis_timeouts: int = 0  # replies that did not come within the client's timeout
    checksum_verified_chunks: int = 0
    lookup_seconds: list[float] = field(default_factory=list)  # each timed lookup (seconds)
    lookups_pipelined: int = 0  # lookups answered in batches (store/batch.py): not timed one by one
    lookups_sampled: int = 0  # unpipelined lookups timed for latency, besides the batches


@dataclass(frozen=True, slots=True)
class KnownWrite:
    """One store planned from its lookup (:meth:`ChunkStore.plan_known`), not yet sent: the missing chunk indices,
    the MSET ``args`` (a single server) or ``(key, value)`` payload and metadata SETs (a cluster), metadata bytes,
    chunks the LRU evicted, chunks present after the hit run, and whether payloads are real."""

    prompt: ChunkedPrompt
    missing: list[int]
    args: list
    firsts: list
    thens: list
    meta_bytes: int
    evicted: int
    present: int
    real: bool


class ChunkStore:
    """A chunk-hash KV-cache store for one namespace, chunk size and model on one Redis server.

    Not thread-safe. Read-only calls: :meth:`lookup`, :meth:`retrieve` (apart from the client-side LRU's recency).
    Errors from Redis are raised as :class:`~kvcli.errors.RedisFailure` (one line, no traceback at the CLI).
    Implements :class:`kvcli.store.kvstore.KVStore` (layout "kvcli").
    """

    layout = "kvcli"

    def __init__(self, client: redis.Redis, config: StoreConfig, tolerate_unavailable: bool = False) -> None:
        self.client = client
        self.config = config
        self.tolerate_unavailable = tolerate_unavailable
        self._faults = fault_counts(client) or FaultCounts()
        self.prefix = key_prefix(config.namespace, config.chunk_size)
        self.read_prefix = key_prefix(config.read_namespace, config.chunk_size) if config.read_namespace else None
        self.stats = StoreStats()
        self.chunker = PromptChunker(config.model_id, config.tokenizer, config.chunk_size)
        self._spaces = [self.prefix] + ([self.read_prefix] if self.read_prefix else [])
        self._scripts = True  # False once the server refused the lookup script: pipelined lookups from then on
        self.cluster = is_cluster(client)
        self.shard_trips = ShardTrips(client)  # round trips per shard: {"host:port": count}
        self._deleting: list[str] = []  # keys the last _admit evicted (a cluster deletes them with the write)
        self._lru = ChunkLru(self._capacity_chunks()) if config.capacity_tokens or config.capacity_bytes else None
        static = {"tokens": config.chunk_size, "dtype": dtype_name(config.dtype), "shape": list(config.chunk_shape),
                  "model": config.model_id, "payload": config.payload_bytes}
        self._meta_middle = json.dumps(static, separators=(",", ":")).encode()[:-1] + b',"parent":"'
        self._meta_tails: dict[tuple[bool, int], bytes] = {}

    # -- keys ---------------------------------------------------------------------------------------------------
    def meta_key(self, chunk_hash: bytes) -> str:
        """The metadata key of a chunk."""
        return f"{self.prefix}m:{chunk_hash.hex()}"

    def payload_key(self, chunk_hash: bytes) -> str:
        """The payload key of a chunk."""
        return f"{self.prefix}p:{chunk_hash.hex()}"

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """Cut and hash a prompt under this store's namespace root (model, tokenizer, ``cache_salt``)."""
        return self.chunker.chunk(tokens, cache_salt)

    def _prompt(self, tokens, cache_salt: str) -> ChunkedPrompt:
        return self.chunker.prompt(tokens, cache_salt)

    # -- checks -------------------------------------------------------------------------------------------------
    def check_value_size(self, alternative: str = "--payload accounted") -> int:
        """Refuse a chunk whose value would exceed the server's ``proto-max-bulk-len``, before any write.

        ``alternative``: one more way out the message suggests (the command's own option), or "" for none.
        Returns the limit in bytes (512 MiB assumed when CONFIG GET is not allowed, as on managed servers).

        Raises:
            ChunkTooLargeError: header + payload bytes of one chunk exceed the limit.
        """
        return check_value_size(self.client, self.config, self.value_bytes, alternative)

    # -- read ---------------------------------------------------------------------------------------------------
    def lookup(self, tokens, cache_salt: str = "", record: bool = True) -> LookupResult:
        """The longest run of consecutive loadable chunks from chunk 0, in ONE round trip (module docstring).

        A missing chunk stops the run: later chunks never fill a gap. So does a chunk whose stored token digest
        differs from the prompt's (a hash collision), and a chunk stored "real" whose payload is missing or not
        of the exact length this store writes (an engine could not load it). "Accounted" chunks (metadata only,
        written by replay) have no payload by design and are not checked. Only full chunks count, so
        ``hit_tokens`` never exceeds the prompt length. With a read-only namespace, a chunk is taken from the
        store's own namespace when it is usable there, else from the read-only one.

        Args:
            tokens: token ids ``[tokens]`` or a :class:`ChunkedPrompt` from :meth:`chunk`.
            cache_salt: tenant salt (ignored when ``tokens`` is already chunked).
            record: count this lookup in :attr:`stats` (False for bookkeeping lookups outside the measured path).
        """
        prompt = self._prompt(tokens, cache_salt)
        n = len(prompt.hashes)
        t0 = time.perf_counter()
        try:
            metas, lengths = self._read_chunks(prompt.hexes, record) if n else ([], [])
        except RedisUnavailable as exc:
            self._absorb(exc)
            return LookupResult(0, 0, n, "redis-error", time.perf_counter() - t0, failed=True)
        seconds = time.perf_counter() - t0
        if record:
            self.stats.lookups += 1
            self.stats.lookup_round_trips += bool(n)
            self.stats.lookup_seconds.append(seconds)
        return self.evaluate(prompt, metas, lengths, seconds)

    def lookup_keys(self, prompt: ChunkedPrompt) -> list[str]:
        """The metadata keys a lookup reads: the prompt's chunks in this namespace, then in the read-only one."""
        return [p + "m:" + x for p in self._spaces for x in prompt.hexes]

    def evaluate(self, prompt: ChunkedPrompt, metas: list, lengths: list[int] | None = None,
                 seconds: float = 0.0) -> LookupResult:
        """The lookup's answer from the values of :meth:`lookup_keys` (None: missing) and the payload lengths
        (:meth:`_read_chunks`), as :meth:`lookup` gives it. ``lengths`` None: payloads not read (a pipelined
        index-only lookup, store/batch.py): a chunk whose metadata records a real payload then counts as
        ``bad-payload``, never as a hit nobody checked."""
        n = len(prompt.hashes)
        if lengths is None:
            lengths = [-1] * len(metas)
        expected = self.config.header_bytes + self.config.payload_bytes
        states = [[_usable(metas[j * n + k], lengths[j * n + k], prompt.digests[k], expected) for k in range(n)]
                  for j in range(len(self._spaces))]
        own, read = states[0], (states[1] if len(self._spaces) > 1 else None)
        ok = [own[k] == "" or (read is not None and read[k] == "") for k in range(n)]
        by_meta = [own[k] in _META_OK or (read is not None and read[k] in _META_OK) for k in range(n)]
        k = next((i for i in range(n) if not ok[i]), n)
        reason = "" if k == n else own[k] if own[k] != "missing" or read is None else read[k]
        from_read, read_only, usable = (), frozenset(), frozenset()
        chosen = tuple(metas[:k])
        if read is not None:
            from_read = tuple(own[i] != "" for i in range(k))
            chosen = tuple(metas[n + i] if from_read[i] else metas[i] for i in range(k))
            read_only = frozenset(i for i in range(n) if metas[i] is None and read[i] == "")
            usable = frozenset(i for i in range(n) if read[i] == "")
        later = frozenset(i for i in range(k + 1, n) if ok[i])
        return LookupResult(k, k * self.config.chunk_size, n, reason, seconds, chosen, later, from_read, read_only,
                            next((i for i in range(n) if not by_meta[i]), n), usable)

    def _read_chunks(self, hexes: list[str], record: bool) -> tuple[list, list]:
        """Metadata values and payload lengths of every chunk in every namespace prefix, in one round trip (on a
        cluster one per shard touched, all shards' sent before any reply is read: :func:`~kvcli.store.cluster.
        by_shard`; the script cannot run there, its keys spanning slots).

        Returns ``(metas, lengths)``, each ``len(spaces) * len(hexes)`` long (namespace-major): a metadata value or
        None (no key, or not a string), and the payload's length where the metadata records a real payload (-1
        where it was not asked, -2 for a key of another type; the pipelined and cluster reads ask every payload).
        """
        meta_keys = [p + "m:" + x for p in self._spaces for x in hexes]
        payload_keys = [p + "p:" + x for p in self._spaces for x in hexes]
        if self.cluster:
            return self._call(self._shard_reads, meta_keys, payload_keys, self.shard_trips if record else None,
                              record=record)
        if record:
            self.shard_trips.add()
        if self._scripts:
            try:
                replies = self._call(self._eval_ro, meta_keys + payload_keys, record=record)
            except _ScriptRefused:
                self._scripts = False  # no scripts here (Redis < 7, ACL, disabled): pipelined from now on
            else:
                m = len(meta_keys)
                return list(replies[:m]), [int(x) for x in replies[m:]]
        pipe = self.client.pipeline(transaction=False)
        pipe.mget(meta_keys)
        for key in payload_keys:
            pipe.strlen(key)
        replies = self._call(functools.partial(pipe.execute, raise_on_error=False), record=record)
        if isinstance(replies[0], Exception):
            raise RedisFailure(f"Redis MGET failed: {replies[0]}")
        return list(replies[0]), [-2 if isinstance(x, Exception) else int(x) for x in replies[1:]]

    def _shard_reads(self, meta_keys: list[str], payload_keys: list[str], trips) -> tuple[list, list]:
        """A cluster's lookup read: GET of every metadata key and STRLEN of every payload key, one round trip per
        shard (:func:`~kvcli.store.cluster.by_shard`). A key of another type reads as missing (-2 for a payload);
        any other error reply is raised."""
        replies = by_shard(self.client, [("GET", k) for k in meta_keys] + [("STRLEN", k) for k in payload_keys],
                           trips)
        for reply in replies:
            if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                raise reply
        m = len(meta_keys)
        return ([None if isinstance(r, Exception) else r for r in replies[:m]],
                [-2 if isinstance(r, Exception) else int(r) for r in replies[m:]])

    def _eval_ro(self, keys: list[str]):
        """EVAL_RO of :data:`_LOOKUP_SCRIPT`: always one round trip (the server caches the compiled script by its
        SHA-1; EVALSHA_RO would need a second round trip whenever the server does not hold it yet)."""
        try:
            return self.client.execute_command("EVAL_RO", _LOOKUP_SCRIPT, len(keys), *keys)
        except redis.ResponseError as exc:
            if script_refused(exc):
                raise _ScriptRefused() from None
            raise

    def retrieve(self, tokens, cache_salt: str = "", lookup: LookupResult | None = None) -> RetrieveResult:
        """Lookup (one round trip, skipped when ``lookup`` is given), then fetch the hit chunks' KV in one more.

        Returns the KV ``[layers, 2, kv_heads, hit_tokens, head_dim]`` of the hit run, verified chunk by chunk:
        a missing payload or a failed checksum ends the run there, and those chunks are never returned.
        """
        prompt = self._prompt(tokens, cache_salt)
        found = lookup or self.lookup(prompt)
        k = found.hit_chunks
        if k == 0:
            return RetrieveResult(0, None, found, 0, 0, 0.0, 0.0, found.break_reason)
        t0 = time.perf_counter()
        own, other = self.prefix + "p:", (self.read_prefix or "") + "p:"
        read = found.from_read or (False,) * k
        try:
            payloads = self._read([(other if r else own) + x for x, r in zip(prompt.hexes[:k], read)])
        except RedisUnavailable as exc:
            self._absorb(exc)
            return RetrieveResult(0, None, found, 0, 0, time.perf_counter() - t0, 0.0, "redis-error")
        t1 = time.perf_counter()
        tensors, data_bytes, head_bytes, reason = [], 0, 0, found.break_reason
        for meta, payload in zip(found.metadata, payloads):
            if payload is None:
                reason = "no-payload"
                break
            tensor, size = self._verified(meta, payload)
            self.stats.checksum_verified_chunks += 1
            if tensor is None:
                reason = "checksum"
                self.stats.checksum_failures += 1
                break
            tensors.append(tensor)
            data_bytes += size
            head_bytes += len(payload) - size
        if tensors:
            import torch

            kv = torch.cat(tensors, dim=3)
        else:
            kv = None
        t2 = time.perf_counter()
        self.stats.payload_bytes_read += data_bytes
        self.stats.header_bytes_read += head_bytes
        hit = len(tensors) * self.config.chunk_size
        return RetrieveResult(hit, kv, found, data_bytes, head_bytes, t1 - t0, t2 - t1, reason)

    def verify(self, prompt: ChunkedPrompt, indices: list[int], lookup: LookupResult) -> list[bool]:
        """Whether each chunk ``indices`` (of the lookup's hit run) has a payload whose tensor bytes match the
        checksum in its metadata: one MGET of those payloads, not counted as a round trip of the measured path
        (bookkeeping: replay samples checksums of chunks it only looked up)."""
        own, other = self.prefix + "p:", (self.read_prefix or "") + "p:"
        read = lookup.from_read or (False,) * lookup.hit_chunks
        keys = [(other if read[i] else own) + prompt.hexes[i] for i in indices]
        payloads = self._read(keys, record=False)
        out = []
        for i, payload in zip(indices, payloads):
            good = payload is not None and self._verified(lookup.metadata[i], payload)[0] is not None
            self.stats.checksum_verified_chunks += 1
            self.stats.checksum_failures += not good
            out.append(good)
        return out

    def _verified(self, meta: bytes, payload: bytes) -> tuple[torch.Tensor | None, int]:
        try:
            tensor, _ = decode_kv(payload)
        except PayloadError:
            return None, 0
        size = tensor.numel() * tensor.element_size()
        data = memoryview(payload)[len(payload) - size:]
        if xxhash.xxh3_64_digest(data) != meta[8:16] or tuple(tensor.shape) != self.config.chunk_shape:
            return None, 0
        return tensor, size

    # -- write --------------------------------------------------------------------------------------------------
    def store(self, tokens, kv: torch.Tensor | None, cache_salt: str = "", start_chunk: int = 0,
              end_chunk: int | None = None, overwrite: bool = False,
              lookup: LookupResult | None = None) -> StoreResult:
        """Write the prompt's full chunks ``[start_chunk, end_chunk)`` in one pipelined round trip.

        Args:
            tokens: token ids ``[tokens]`` or a :class:`ChunkedPrompt`.
            kv: ``[layers, 2, kv_heads, >= end_chunk*chunk_size, head_dim]`` KV of the prompt from token 0 (any
                device); None writes "accounted" chunks (metadata only; payload bytes counted, not written).
            start_chunk: first chunk to write (chunks before it are known present, e.g. the lookup's hit run).
            end_chunk: one past the last chunk to write (default: every full chunk).
            overwrite: replace existing chunks (used to give accounted chunks a real payload).
            lookup: this prompt's lookup, just made. Its view of which chunks exist lets the write skip them and
                go out as one atomic MSET (no TTL) instead of a pipeline of ``SET NX``: ~5x less client time.

        Each chunk is written payload first, then metadata, both ``SET NX`` unless ``overwrite`` (an existing
        chunk is left as it is and counted present). With a capacity, least recently used chunks are deleted
        first (their keys only).

        Raises:
            KvcliError: ``kv`` is missing or too short for real payloads.
            RedisFailure: the server refused a write (e.g. OOM); earlier chunks of the pipeline stay written.
            RedisUnavailable: the write failed after retries (a tolerant store returns an empty result instead;
                its lookup ``failed``: nothing is written).
        """
        if lookup is not None and lookup.failed:
            return StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)
        try:
            return self._store(tokens, kv, cache_salt, start_chunk, end_chunk, overwrite, lookup)
        except RedisUnavailable as exc:
            self._absorb(exc)
            return StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)

    def _store(self, tokens, kv, cache_salt, start_chunk, end_chunk, overwrite, lookup) -> StoreResult:
        prompt = self._prompt(tokens, cache_salt)
        cfg, cs = self.config, self.config.chunk_size
        n = len(prompt.hashes) if end_chunk is None else min(end_chunk, len(prompt.hashes))
        real = kv is not None
        if real and start_chunk < n and kv.shape[3] < n * cs:
            raise KvcliError(f"store needs KV for {n * cs} tokens, got {kv.shape[3]}")
        if lookup is not None and not overwrite and cfg.ttl is None:
            return self._store_known(prompt, kv, start_chunk, n, lookup)
        t0 = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        evicted, dropped = (0, frozenset()) if overwrite else self._admit(pipe, prompt, n, lookup)
        todo = [k for k in range(start_chunk, n) if k not in dropped]
        if not todo:
            if evicted:
                self._ordered(pipe, [], [])
            return StoreResult(0, 0, 0, 0, 0, 0, 0, evicted, 0.0)
        now = int(time.time())
        head = cfg.header_bytes if real else 0
        meta_bytes, layout, firsts, thens = 0, [], [], []
        for k in todo:
            h = prompt.hashes[k]
            if real:
                value = encode_kv(kv[:, :, :, k * cs:(k + 1) * cs, :], _payload_metadata(cfg))
                checksum = xxhash.xxh3_64_digest(value[head:])
                firsts.append((self.payload_key(h), value))
            else:
                checksum = b"\0" * 8
            meta = self._meta_value(prompt, k, checksum, real, now)
            meta_bytes += len(meta)
            thens.append((self.meta_key(h), meta))
            layout.append(h)
        if self.cluster:  # payloads acknowledged before any metadata is sent (cluster.py)
            got = self._ordered(pipe, firsts, thens, nx=not overwrite, ex=cfg.ttl)
            replies = [r for pair in zip(*got) for r in pair] if real else got[1]
        else:
            for i, (key, meta) in enumerate(thens):
                if real:
                    pipe.set(*firsts[i], nx=not overwrite, ex=cfg.ttl)
                pipe.set(key, meta, nx=not overwrite, ex=cfg.ttl)
            replies = self._ordered(pipe, [], [])[0]
            replies = replies[-len(layout) * (2 if real else 1):]
        if overwrite:  # a rewrite adds payload objects to chunks whose metadata already existed
            replies = [r if i % 2 == 0 else None for i, r in enumerate(replies)]
            if real:  # their payload bytes move from "accounted" to "written"
                self.stats.payload_bytes_accounted -= len(layout) * cfg.payload_bytes
        return self._account(layout, replies, evicted, meta_bytes, real, time.perf_counter() - t0)

    def _store_known(self, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> StoreResult:
        """Write the chunks the lookup saw missing in one MSET (payload and metadata of each chunk together)."""
        t0 = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        plan = self.plan_known(pipe, prompt, kv, start, n, lookup)
        if self.cluster:  # no MSET across slots: payloads first, then metadata (cluster.py)
            if plan.firsts or plan.thens or plan.evicted:
                self._ordered(pipe, plan.firsts, plan.thens)
        else:
            if plan.args:
                pipe.execute_command("MSET", *plan.args)
            if plan.args or plan.evicted:
                self._ordered(pipe, [], [])
        return self.account_known(plan, time.perf_counter() - t0)

    def plan_known(self, pipe, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> KnownWrite:
        """What :meth:`store` with a lookup writes, not yet sent: the LRU's deletes (queued on ``pipe``, or kept in
        ``_deleting`` on a cluster), then the missing chunks of ``[start, n)`` as MSET ``args`` (a single server)
        or ``(key, value)`` payloads ``firsts`` and metadata ``thens`` (a cluster)."""
        cfg, cs, real = self.config, self.config.chunk_size, kv is not None
        evicted, dropped = self._admit(pipe, prompt, n, lookup)
        missing = [k for k in range(start, n) if k not in lookup.present_after and k not in dropped]
        now, head, meta_bytes = int(time.time()), cfg.header_bytes if real else 0, 0
        meta_pre, payload_pre = self.prefix + "m:", self.prefix + "p:"
        args, firsts, thens = [], [], []  # a single server: MSET args; a cluster: (key, value) pairs
        for k in missing:
            checksum = b"\0" * 8
            if real:
                value = encode_kv(kv[:, :, :, k * cs:(k + 1) * cs, :], _payload_metadata(cfg))
                checksum = xxhash.xxh3_64_digest(value[head:])
                if self.cluster:
                    firsts.append((payload_pre + prompt.hexes[k], value))
                else:
                    args += (payload_pre + prompt.hexes[k], value)
            meta = self._meta_value(prompt, k, checksum, real, now)
            meta_bytes += len(meta)
            if self.cluster:
                thens.append((meta_pre + prompt.hexes[k], meta))
            else:
                args += (meta_pre + prompt.hexes[k], meta)
        present = sum(1 for k in range(start, n) if k in lookup.present_after)
        return KnownWrite(prompt, missing, args, firsts, thens, meta_bytes, evicted, present, real)

    def account_known(self, plan: KnownWrite, seconds: float) -> StoreResult:
        """Count a :meth:`plan_known` write that the server acknowledged (all its SETs created keys)."""
        replies = [True] * len(plan.missing) * (2 if plan.real else 1)
        return self._account([plan.prompt.hashes[k] for k in plan.missing], replies, plan.evicted, plan.meta_bytes,
                             plan.real, seconds, present=plan.present)

    def _meta_value(self, prompt: ChunkedPrompt, k: int, checksum: bytes, real: bool, now: int) -> bytes:
        """token digest (8) || payload checksum (8) || JSON (fields in the module docstring)."""
        middle, tail = self.meta_parts(real, now)
        return b"".join((prompt.digests[k], checksum, middle, prompt.hexes[k - 1].encode() if k else b"", tail))

    def meta_parts(self, real: bool, now: int) -> tuple[bytes, bytes]:
        """The two constant parts of a chunk's metadata value written at unix second ``now``: what comes between
        the 16 bytes of digest and checksum and the parent's hex (the JSON up to ``"parent":"``), and what comes
        after it. A value is ``digest || checksum || middle || parent hex (32, none for chunk 0) || tail``."""
        tail = self._meta_tails.get((real, now))
        if tail is None:  # one per second and kind: the fields after the parent
            head, stored = (self.config.header_bytes, "real") if real else (0, "accounted")
            tail = self._meta_tails[(real, now)] = f'","header":{head},"stored":"{stored}","created":{now}}}'.encode()
            if len(self._meta_tails) > 64:
                self._meta_tails = {(real, now): tail}
        return self._meta_middle, tail

    def _account(self, hashes, replies, evicted, meta_bytes, real, seconds, present: int = 0) -> StoreResult:
        cfg = self.config
        per = 2 if real else 1
        head = cfg.header_bytes if real else 0
        created = sum(1 for r in replies if r)
        new_meta = sum(1 for r in replies[per - 1::per] if r)
        written = len(hashes)
        st = self.stats
        st.chunks_written += new_meta
        st.objects_created += created
        st.metadata_entries += new_meta
        if real:
            st.payload_bytes_written += written * cfg.payload_bytes
            st.header_bytes_written += written * head
        else:
            st.payload_bytes_accounted += written * cfg.payload_bytes
        st.metadata_bytes_written += meta_bytes
        return StoreResult(new_meta, written - new_meta + present, created, new_meta, written * cfg.payload_bytes,
                           written * head, meta_bytes, evicted, seconds)

    # -- capacity (client-side LRU over chunks) -------------------------------------------------------------------
    @property
    def capacity_chunks(self) -> int | None:
        """Chunks the client-side capacity holds (the smaller of ``capacity_tokens // chunk_size`` and
        ``capacity_bytes // payload_bytes`` when both are set), or None without a capacity."""
        return self._lru.capacity if self._lru is not None else None

    def _capacity_chunks(self) -> int:
        cfg = self.config
        limits = []
        if cfg.capacity_tokens:
            limits.append(cfg.capacity_tokens // cfg.chunk_size)
        if cfg.capacity_bytes:
            limits.append(cfg.capacity_bytes // cfg.payload_bytes)
        return min(limits)

    def _admit(self, pipe, prompt: ChunkedPrompt, n: int, lookup: LookupResult | None) -> tuple[int, frozenset]:
        """One request's LRU bookkeeping (:class:`~kvcli.store.lru.ChunkLru`): its chunks ``[0, n)`` held in this
        namespace become the most recent, chunk 0 first, and the least recent chunks over the capacity are deleted
        (their keys only, queued on ``pipe``). Chunks present only in the read-only namespace are not held here.

        Returns ``(evicted, dropped)``: chunks deleted from the store, and the indices of this request's chunks
        the capacity leaves no room for (its tail, when the request alone exceeds the capacity): not written.
        """
        self._deleting = []
        if self._lru is None:
            return 0, frozenset()
        skip = lookup.read_only if lookup is not None else frozenset()
        held = [k for k in range(n) if k not in skip]
        new, evicted = self._lru.store([prompt.hashes[k] for k in held])
        if not evicted:
            return 0, frozenset()
        gone, fresh = set(evicted), set(new)
        victims = [h for h in evicted if h not in fresh]
        if victims:
            self._deleting = [k for h in victims for k in (self.meta_key(h), self.payload_key(h))]
            if not self.cluster:  # a cluster sends them with the write (_ordered): no multi-key DEL across slots
                pipe.delete(*self._deleting)
        self.stats.evicted_chunks += len(victims)
        return len(victims), frozenset(k for k in held if prompt.hashes[k] in gone)

    # -- what the replay compares across layouts (kvcli.store.kvstore.KVStore) ---------------------------------------
    @property
    def key_pattern(self) -> str:
        """SCAN MATCH pattern of this store's keys (a validated namespace holds no glob character)."""
        return self.prefix + "*"

    @property
    def value_bytes(self) -> int:
        """Bytes of one chunk's payload value: serialization header + tensor bytes."""
        return self.config.header_bytes + self.config.payload_bytes

    @property
    def key_bytes_per_chunk(self) -> float:
        """Bytes of one chunk's two key names (metadata and payload)."""
        return 2 * (len(self.prefix) + 2 + 32)

    def accounted(self, prompt: ChunkedPrompt, lookup: LookupResult, k: int) -> bool:
        """Whether hit chunk ``k``'s metadata says its payload was accounted, not written (layout.py)."""
        return b'"stored":"accounted"' in lookup.metadata[k]

    @property
    def resident_chunks(self) -> int | None:
        """Chunks held under the client-side capacity, or None without a capacity."""
        return None if self._lru is None else len(self._lru)

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _read(self, keys: list[str], record: bool = True) -> list:
        """MGET (one round trip per shard on a cluster), counted per shard when ``record``."""
        return self._call(mget, self.client, keys, self.shard_trips if record else None, record=record)

    def _ordered(self, pipe, firsts, thens, nx: bool = False, ex: int | None = None) -> tuple[list, list]:
        """Run ``pipe``. On a cluster, the deletes :meth:`_admit` recorded and ``firsts``' SETs (payloads), then once
        acknowledged ``thens``' SETs (metadata) (cluster.py): one round trip per shard each, one round when there
        are no payloads; returns the replies to ``firsts`` and to ``thens``. On a single server ``firsts``/``thens``
        are empty (callers queue everything on ``pipe`` in order) and the replies are all of ``pipe``'s."""
        with uninterrupted():  # a write is sent whole or not at all: Ctrl-C waits for its reply
            if not self.cluster:
                self.shard_trips.add()
                return self._call(pipe.execute), []
            deleting, self._deleting = self._deleting, []
            self.stats.round_trips += bool(firsts and thens)
            return self._call(set_in_order, self.client, deleting, firsts, thens, nx, ex, self.shard_trips)

    def _absorb(self, exc: RedisUnavailable) -> None:
        """Re-raise ``exc`` unless this store absorbs it (module docstring: a tolerant store, not the last straw)."""
        if not self.tolerate_unavailable or exc.final:
            raise exc

    def _call(self, fn, *args, record: bool = True):
        """One round trip: redis-py retries a dropped connection itself; what still fails is counted and raised
        as :class:`RedisUnavailable` (connection, timeout) or :class:`RedisFailure` (any other error)."""
        self.stats.round_trips += record
        faults, st = self._faults, self.stats
        retries, timeouts = faults.retries, faults.timeouts
        name = (getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "command")
                ).strip("_").upper()
        try:
            result = fn(*args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            faults.failed_in_row += 1
            st.redis_errors += 1
            timeout = isinstance(exc, redis.exceptions.TimeoutError)
            why = "no reply within the timeout" if timeout else "the connection kept dropping"
            if faults.failed_in_row >= MAX_FAILURES_IN_ROW:
                raise RedisUnavailable(f"the Redis server stopped answering: {faults.failed_in_row} calls in a row "
                                       f"failed after retries (last: {name}, {why}: {exc})", timeout,
                                       final=True) from None
            raise RedisUnavailable(f"Redis {name} failed after retries ({why}): {exc}", timeout) from None
        except REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis {name} failed: {redis_error_text(exc)}") from None
        finally:
            st.redis_retries += faults.retries - retries
            st.redis_timeouts += faults.timeouts - timeouts
        faults.failed_in_row = 0
        return result


def check_value_size(client: redis.Redis, config: StoreConfig, value_bytes: int,
                     alternative: str = "--payload accounted") -> int:
    """Refuse ``value_bytes``-byte chunk values (real payloads only) over the server's ``proto-max-bulk-len``;
    ``alternative`` is one more way out the message suggests (the command's own option), or "" for none.

    Returns the limit in bytes (512 MiB assumed when CONFIG GET is not allowed, as on managed servers).

    Raises:
        ChunkTooLargeError: ``value_bytes`` exceeds the limit and ``config.payload`` is "real".
    """
    try:
        limit = int(client.config_get("proto-max-bulk-len").get("proto-max-bulk-len", 0))
    except redis.RedisError:
        limit = 0
    limit = limit or 512 * 1024 * 1024
    if config.payload == "real" and value_bytes > limit:
        raise ChunkTooLargeError(
            f"chunk size {config.chunk_size} makes {value_bytes:,}-byte values, over the server's "
            f"proto-max-bulk-len of {limit:,} bytes; use a smaller chunk size"
            + (f", raise proto-max-bulk-len, or {alternative}" if alternative else " or raise proto-max-bulk-len"))
    return limit


# -- the lookup's one round trip ---------------------------------------------------------------------------------
# KEYS: every metadata key, then every payload key in the same order. Returns every metadata value (nil for no key
# or a key of another type), then per chunk the payload's STRLEN where the metadata records a real payload (-1 where
# not asked, -2 for a payload key of another type). Read-only: the server refuses any write inside EVAL_RO.
_LOOKUP_SCRIPT = """local n = #KEYS / 2
local out = {}
for i = 1, n do
  local m = redis.pcall('GET', KEYS[i])
  if type(m) ~= 'string' then m = false end
  out[i] = m
  local len = -1
  if m and string.find(m, '"stored":"real"', 17, true) then
    len = redis.pcall('STRLEN', KEYS[n + i])
    if type(len) ~= 'number' then len = -2 end
  end
  out[n + i] = len
end
return out"""
_META_OK = ("", "no-payload", "bad-payload")  # the metadata alone would count these as hits


class _ScriptRefused(Exception):
    """The server has no EVAL_RO/EVALSHA_RO for us (unknown command, ACL, scripting disabled)."""


def _usable(meta: bytes | None, length: int, digest: bytes, expected: int) -> str:
    """One chunk in one namespace: "" when a lookup may count it, else why not (:class:`LookupResult`)."""
    if meta is None:
        return "missing"
    if meta[:8] != digest:
        return "token-mismatch"
    if b'"stored":"real"' not in meta[16:]:
        return ""  # accounted: metadata only, no payload by design
    if length == 0:
        return "no-payload"
    return "" if length == expected else "bad-payload"


# -- chunk values, for warm (same bytes as ChunkStore.store writes) ------------------------------------------------
def chunk_payload(store: ChunkStore, chunk_kv: torch.Tensor) -> tuple[memoryview, bytes]:
    """One chunk's payload value as :meth:`ChunkStore.store` writes it, and the 8-byte checksum it records.

    Args:
        chunk_kv: ``[layers, 2, kv_heads, chunk_size, head_dim]`` in the store's dtype (any device; a view is fine).

    Returns:
        ``(value, checksum)``: ``header_bytes + payload_bytes`` bytes, and xxh3_64 of the tensor bytes.
    """
    value = encode_kv(chunk_kv, _payload_metadata(store.config))
    return value, xxhash.xxh3_64_digest(value[store.config.header_bytes:])


def chunk_metadata(store: ChunkStore, prompt: ChunkedPrompt, k: int, checksum: bytes = b"\0" * 8,
                   created: int | None = None, real: bool = True) -> bytes:
    """Chunk ``k``'s metadata value as :meth:`ChunkStore.store` writes it (``created``: unix seconds, now if None).

    Its length does not depend on ``checksum`` (always 8 bytes), so a dry run counts metadata bytes exactly.
    """
    return store._meta_value(prompt, k, checksum, real, int(time.time()) if created is None else created)
