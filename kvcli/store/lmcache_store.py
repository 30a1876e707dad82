"""The chunk stores in LMCache's Redis layouts and lookup protocols, for replaying a trace the way LMCache would.

Three layouts (:mod:`kvcli.store.lmcache`, :mod:`kvcli.store.lmcache_mp`; LMCache 0.5.6 and its main agree):

* ``lmcache`` (:class:`LMCacheStore`, the ``redis://`` connector): two keys per chunk, ``<key>kv_bytes`` (the KV
  bytes, ``KV_2LTD``, no header) and ``<key>metadata`` (the 28-byte record), written kv_bytes first;
* ``lmcache-resp`` (:class:`LMCacheRespStore`, the ``resp://`` connector): one key per chunk, the bare key string,
  holding the KV bytes;
* ``lmcache-mp`` (:class:`LMCacheMPStore`, multiprocess mode's RESP L2 adapter): one key per chunk,
  ``{model}@{kv_rank:08x}@0@{hash hex}``, holding the KV bytes.

Protocol of ``lmcache``, mirroring LMCache's calls on the wire:

* **lookup** -- one ``EXISTS <key>metadata`` per chunk, in chunk order, each awaited before the next, stopping at
  the first miss (``RedisConnector._batched_async_contains``; the synchronous ``lookup`` path reaches the same
  per-key ``exists`` through ``AbstractBackend.batched_contains``). A prompt of ``n`` full chunks with ``h`` hits
  costs ``min(h + 1, n)`` round trips. No token check on a hit (LMCache trusts the hash).
* **retrieve** -- LMCache gathers one coroutine per chunk, each ``GET <key>metadata`` then ``GET <key>kv_bytes``:
  two round trips deep. Here: a pipeline of the metadata GETs, then one of the kv_bytes GETs (two round trips).
* **store** -- LMCache gathers one coroutine per chunk, each ``SET <key>kv_bytes`` then ``SET <key>metadata``
  (plain SETs: a present chunk is rewritten). Here: a pipeline of the kv_bytes SETs, then one of the metadata SETs
  (two round trips; one when the payload is only accounted: metadata only). Every chunk from ``start_chunk`` on is
  written, as LMCache stores everything after the hit run; kvcli's store skips chunks its lookup saw present.

Protocol of the one-key layouts (``RESPConnector``'s ``batched_async_contains`` / ``batched_get`` /
``batched_put`` and ``NativeConnectorL2Adapter``'s ``submit_batch_exists`` / ``get`` / ``set``, each one batch
through LMCache's native client, which sends one command per key; golden vectors count 3 EXISTS for a lookup of 3
chunks of which the first 2 are stored):

* **lookup** -- one EXISTS per chunk of the prompt, all in one round trip; the hit run is the leading chunks that
  exist.
* **retrieve** -- one GET per hit chunk, one round trip; a value that is not exactly one chunk's KV bytes ends the
  run (empty: "no-payload"; another length: "bad-record").
* **store** -- one SET per chunk from ``start_chunk`` on, one round trip. A chunk whose payload is only accounted
  (``kv`` None) is its key with an empty value: present to a lookup, as the metadata key alone is in ``lmcache``;
  LMCache itself never writes an empty value.

Chunk hashes are kvcli's prefix hashes (:mod:`kvcli.store.hashing`, same root and chain), folded to LMCache's int
(first 8 bytes; ``lmcache-mp`` takes the 16 bytes whole, as LMCache keeps its ``TokenHasher``'s bytes) so hits
are the same chunks in every layout. A request's cache salt is in kvcli's chunk hash (the chain's root), so
``lmcache-mp`` keys written by kvcli have no ``@{cache_salt}`` field (LMCache's keep the hash unsalted and add
it). The key's ``model_name`` is ``{namespace}/{chunk_size}/{model id}`` (``@`` replaced: LMCache splits keys on
it), so a replay's keys are its own and :func:`purge_namespace` can delete exactly them; in a real deployment it is
the served model's name.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import cast

import redis
import torch
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError, KvcliError, RedisFailure, redis_error_text
from kvcli.store import cluster
from kvcli.store.calls import execute_pipeline
from kvcli.store.chunkstore import check_value_size
from kvcli.store.hashing import ChunkedPrompt, PromptChunker
from kvcli.store.lmcache import (
    KEY_DTYPES,
    KV_SUFFIX,
    METADATA_SUFFIX,
    MP,
    REDIS,
    RESP,
    LMCacheKey,
    classify_key,
    fold_hash,
    from_kv_2ltd,
    key_affixes,
    kv_record,
    pack_record,
    to_kv_2ltd,
)
from kvcli.store.lmcache_mp import MPKey, kv_rank
from kvcli.store.namespace import PurgeCount, glob_escape
from kvcli.store.records import LookupResult, RetrieveResult, StoreConfig, StoreResult, StoreStats
from kvcli.store.serde import flat_bytes, tensor_bytes
from kvcli.store.written import HASH_BYTES, METADATA, PAYLOAD, WrittenChunks
from kvcli.units import torch_dtype

_DELETE_BATCH = 1000


def run_model_name(namespace: str, chunk_size: int, model_id: str) -> str:
    """The ``model_name`` field of a replay's LMCache keys: ``{namespace}/{chunk_size}/{model id}``."""
    return f"{namespace}/{chunk_size}/{model_id.replace('@', '-').replace('%', '-')}"


class LMCacheStore:
    """A chunk store for one namespace, chunk size and model in LMCache's Redis layout (module docstring).

    Implements :class:`kvcli.store.kvstore.KVStore` (layout "lmcache"). Not thread-safe. Read-only calls:
    :meth:`lookup`, :meth:`retrieve`.

    Raises:
        BadInputError: options the layout has no counterpart for (a read-only namespace, an LRU capacity, a TTL,
            an fp8 payload),
            a namespace with '@', or a KV dtype LMCache's metadata record cannot name.
    """

    layout = REDIS

    def __init__(self, client: redis.Redis | RedisCluster, config: StoreConfig, world_size: int = 1,
                 worker_id: int = 0) -> None:
        if config.read_namespace:
            raise BadInputError(f"--namespace reads kvcli's own layout; it cannot be read with --layout {self.layout}")
        if config.capacity_tokens or config.capacity_bytes or config.ttl:
            raise BadInputError(f"a capacity or TTL is not supported with --layout {self.layout} (LMCache's Redis "
                                f"backend leaves eviction to the server)")
        if config.kv_dtype is not None:
            raise BadInputError(f"--kv-dtype fp8 stores kvcli's payload format (K and V scales with the KV); "
                                f"--layout {self.layout} replays LMCache's own, which has no scales: use "
                                f"--layout kvcli")
        if config.state_shape:
            raise BadInputError(f"a hybrid model's chunks carry its linear layers' state beside the KV (kvcli's "
                                f"payload format); --layout {self.layout} replays LMCache's own, which has no place "
                                f"for it: use --layout kvcli")
        if "@" in config.namespace:
            raise BadInputError(f"namespace {config.namespace!r}: LMCache's keys are split on '@'; use another name")
        self._dtype = torch_dtype(config.dtype)  # a name ("bfloat16") or a torch dtype
        if self._dtype not in KEY_DTYPES:
            raise BadInputError(f"LMCache's keys have no name for KV dtype {self._dtype}")
        self._record = self._metadata_record(config)
        self.client, self.config = client, config
        self.world_size, self.worker_id = world_size, worker_id
        self.model_name = run_model_name(config.namespace, config.chunk_size, config.model_id)
        self._head, self._tail = key_affixes(self.model_name, world_size, worker_id, KEY_DTYPES[self._dtype])
        self.stats = StoreStats()
        self.chunker = PromptChunker(config.model_id, config.tokenizer, config.chunk_size)
        self._with_metadata: set[int] = set()
        self._with_kv: set[int] = set()
        self._accounted: set[int] = set()
        self._base_bytes = self._bases = 0
        self.written = WrittenChunks()  # the chunks whose keys this store may have written (kvcli.store.written)

    def _metadata_record(self, config: StoreConfig) -> bytes:
        """The metadata value of every chunk of this store (``RemoteMetadata`` of one full chunk).

        Raises:
            BadInputError: a KV dtype the record has no code for.
        """
        try:
            return pack_record(kv_record(config.kv_shape, config.chunk_size, self._dtype))
        except ValueError as exc:
            raise BadInputError(str(exc)) from None

    # -- keys ---------------------------------------------------------------------------------------------------
    def base_key(self, chunk_hash: bytes) -> str:
        """The chunk's LMCache key string (``CacheEngineKey.to_string()``), without the Redis suffix."""
        return f"{self._head}{fold_hash(chunk_hash):x}{self._tail}"

    def payload_key(self, chunk_hash: bytes) -> str:
        """The chunk's ``kv_bytes`` key."""
        return self.base_key(chunk_hash) + KV_SUFFIX

    def written_keys(self) -> Iterator[list[str]]:
        """Every key this store may have written (:attr:`written`: metadata, then kv_bytes), in lists of at most
        :data:`~kvcli.store.written.DELETE_BATCH` keys (two hashes that fold to one LMCache key give it twice)."""
        for kind, suffix in ((METADATA, METADATA_SUFFIX), (PAYLOAD, KV_SUFFIX)):
            for blob in self.written.slices(kind):
                yield [self.base_key(blob[i:i + HASH_BYTES]) + suffix for i in range(0, len(blob), HASH_BYTES)]

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """Cut and hash a prompt exactly as :meth:`kvcli.store.chunkstore.ChunkStore.chunk` does (same root and
        chain)."""
        return self.chunker.chunk(tokens, cache_salt)

    def _prompt(self, tokens, cache_salt: str) -> ChunkedPrompt:
        return self.chunker.prompt(tokens, cache_salt)

    def _store_end(self, prompt: ChunkedPrompt, kv: torch.Tensor | None, start_chunk: int,
                   end_chunk: int | None) -> int:
        """The end (exclusive) of the chunks a store of ``[start_chunk, end_chunk)`` writes: ``end_chunk`` capped at
        the prompt's full chunks. Raises KvcliError: ``kv`` holds fewer tokens than those chunks (when there are
        any to write)."""
        n = len(prompt.hashes) if end_chunk is None else min(end_chunk, len(prompt.hashes))
        cs = self.config.chunk_size
        if start_chunk < n and kv is not None and kv.shape[3] < n * cs:
            raise KvcliError(f"store needs KV for {n * cs} tokens, got {kv.shape[3]}")
        return n

    # -- read ---------------------------------------------------------------------------------------------------
    def lookup(self, tokens, cache_salt: str = "", record: bool = True) -> LookupResult:
        """Hit chunks from chunk 0: one ``EXISTS <key>metadata`` per chunk, sequential, stopping at the first miss.

        Args:
            tokens: token ids ``[tokens]`` or a :class:`ChunkedPrompt` from :meth:`chunk`.
            record: count this lookup in :attr:`stats`.

        Raises:
            RedisFailure: the server refused an EXISTS.
        """
        prompt = self._prompt(tokens, cache_salt)
        n, k = len(prompt.hashes), 0
        t0 = time.perf_counter()
        try:
            while k < n and self.client.exists(self.base_key(prompt.hashes[k]) + METADATA_SUFFIX):
                k += 1
        except cluster.REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis EXISTS failed: {exc}") from None
        seconds = time.perf_counter() - t0
        if record:
            trips = min(k + 1, n)
            self.stats.count_round_trips(trips)
            self.stats.count_lookup(seconds, trips)
        cs = self.config.chunk_size
        return LookupResult(k, k * cs, n, "missing" if k < n else "", seconds)

    def retrieve(self, tokens, cache_salt: str = "", lookup: LookupResult | None = None) -> RetrieveResult:
        """Lookup (skipped when ``lookup`` is given), then the hit chunks' metadata and KV bytes (two round trips).

        Returns the KV ``[layers, 2, kv_heads, hit_tokens, head_dim]`` of the hit run. A chunk without KV bytes
        ends the run ("no-payload"), so does one whose record does not describe this store's chunks or whose
        ``length`` differs from its KV bytes ("bad-record", counted in ``stats.checksum_failures``).
        """
        prompt = self._prompt(tokens, cache_salt)
        found = lookup or self.lookup(prompt)
        k = found.hit_chunks
        if k == 0:
            return RetrieveResult(0, None, found, 0, 0, 0.0, 0.0, found.break_reason)
        bases = [self.base_key(h) for h in prompt.hashes[:k]]
        t0 = time.perf_counter()
        records = self._pipelined("get", [b + METADATA_SUFFIX for b in bases])
        values = self._pipelined("get", [b + KV_SUFFIX for b in bases])
        t1 = time.perf_counter()
        tensors, data, reason = [], 0, found.break_reason
        for record, value in zip(records, values):
            if record is None or value is None:
                reason = "no-payload"
                break
            tensor = self._decode(record, value)
            if tensor is None:
                reason = "bad-record"
                self.stats.count_checksums(0, 1)
                break
            tensors.append(tensor)
            data += len(value)
        kv = torch.cat(tensors, dim=3) if tensors else None
        t2 = time.perf_counter()
        self.stats.count_read(data)
        return RetrieveResult(len(tensors) * self.config.chunk_size, kv, found, data, 0, t1 - t0, t2 - t1, reason)

    def _decode(self, record: bytes, value: bytes) -> torch.Tensor | None:
        if record != self._record or len(value) != self.config.payload_bytes:
            return None  # a record that does not describe this store's chunks, or KV bytes of another length
        return self._tensor(value)

    def _tensor(self, value: bytes) -> torch.Tensor:
        """One chunk's KV bytes (``KV_2LTD``) as kvcli's ``[layers, 2, kv_heads, chunk_size, head_dim]`` (a view)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only buffer: never written into
            flat = torch.frombuffer(value, dtype=self._dtype)
        layers, two, heads, dim = self.config.kv_shape
        return from_kv_2ltd(flat.view(two, layers, self.config.chunk_size, heads * dim), heads)

    # -- write --------------------------------------------------------------------------------------------------
    def store(self, tokens, kv: torch.Tensor | None, cache_salt: str = "", start_chunk: int = 0,
              end_chunk: int | None = None, overwrite: bool = False,
              lookup: LookupResult | None = None) -> StoreResult:
        """Write chunks ``[start_chunk, end_chunk)`` as LMCache does: every kv_bytes SET, then every metadata SET.

        Args:
            kv: ``[layers, 2, kv_heads, >= end_chunk*chunk_size, head_dim]`` KV of the prompt from token 0 (any
                device); None writes metadata only (the payload is accounted: counted, not written).
            overwrite, lookup: accepted for the common interface; LMCache's SETs always overwrite and it does not
                skip chunks present after the hit run.

        Raises:
            KvcliError: ``kv`` is too short.
            RedisFailure: the server refused a write.
        """
        prompt = self._prompt(tokens, cache_salt)
        cs = self.config.chunk_size
        n = self._store_end(prompt, kv, start_chunk, end_chunk)
        if start_chunk >= n:
            return StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)
        real = kv is not None
        t0 = time.perf_counter()
        self.written.add(METADATA, prompt.hashes[start_chunk:n])  # before the writes are sent
        if kv is not None:
            self.written.add(PAYLOAD, prompt.hashes[start_chunk:n])
        ids = [fold_hash(h) for h in prompt.hashes[start_chunk:n]]
        bases = [f"{self._head}{x:x}{self._tail}" for x in ids]
        if kv is not None:
            values = [tensor_bytes(to_kv_2ltd(kv[:, :, :, k * cs:(k + 1) * cs, :])) for k in range(start_chunk, n)]
            self._pipelined("set", [b + KV_SUFFIX for b in bases], values)
        self._pipelined("set", [b + METADATA_SUFFIX for b in bases], [self._record] * len(bases))
        seconds = time.perf_counter() - t0
        return self._account(ids, bases, real, seconds)

    def _account(self, ids: list[int], bases: list[str], real: bool, seconds: float) -> StoreResult:
        cfg, st = self.config, self.stats
        new_meta = sum(1 for x in ids if x not in self._with_metadata)
        new_kv = sum(1 for x in ids if x not in self._with_kv) if real else 0
        self._with_metadata.update(ids)
        payload = len(ids) * cfg.payload_bytes
        if real:
            self._with_kv.update(ids)
            st.count_rewrite(sum(1 for x in ids if x in self._accounted) * cfg.payload_bytes)
            self._accounted.difference_update(ids)
        else:
            self._accounted.update(x for x in ids if x not in self._with_kv)
        objects = new_meta + (new_kv if self._record else 0)  # a one-key layout: the key is the chunk's one object
        st.count_write(new_meta, objects, payload, 0, len(ids) * len(self._record), real)
        self._base_bytes += sum(len(b.encode()) for b in bases)
        self._bases += len(bases)
        return StoreResult(new_meta, len(ids) - new_meta, objects, new_meta, payload, 0,
                           len(ids) * len(self._record), 0, seconds)

    def _pipelined(self, command: str, keys: list[str], values: list | None = None, count: bool = True) -> list:
        """One round trip: ``command`` for every key (with its value), pipelined without a transaction; counted in
        ``stats`` unless ``count`` is False."""
        pipe = self.client.pipeline(transaction=False)
        for i, key in enumerate(keys):
            getattr(pipe, command)(key, *(() if values is None else (flat_bytes(values[i]),)))
        if count:
            self.stats.count_round_trips()
        try:
            return execute_pipeline(pipe)
        except cluster.REDIS_ERRORS as exc:
            raise RedisFailure(f"Redis {command.upper()} failed: {redis_error_text(exc)}") from None

    # -- the common interface (kvcli.store.kvstore.KVStore) -------------------------------------------------------
    def accounted(self, prompt: ChunkedPrompt, lookup: LookupResult, k: int) -> bool:
        """Whether hit chunk ``k`` was written with its payload only accounted (its metadata key alone)."""
        return fold_hash(prompt.hashes[k]) in self._accounted

    def check_value_size(self) -> int:
        """Refuse KV values over the server's ``proto-max-bulk-len`` before any write (ChunkTooLargeError; NoReply:
        CONFIG GET got no reply)."""
        return check_value_size(self.client, self.config, self.value_bytes)

    def vanished_chunks(self) -> int | None:
        """None: not known (LMCache's store writes every chunk after the hit run again, present or not, so a
        chunk written twice says nothing of a chunk gone)."""
        return None

    @property
    def resident_chunks(self) -> int | None:
        """None: no client-side capacity."""
        return None

    @property
    def key_pattern(self) -> str:
        """SCAN MATCH pattern of this store's keys."""
        return glob_escape(self.model_name) + "@*"

    @property
    def value_bytes(self) -> int:
        """Bytes of one chunk's kv_bytes value (no header)."""
        return self.config.payload_bytes

    @property
    def metadata_bytes_per_chunk(self) -> int:
        """Bytes of one chunk's metadata value (the 28-byte record; 0 in a one-key layout)."""
        return len(self._record)

    @property
    def objects_per_chunk(self) -> int:
        """Keys one chunk with its payload takes: 2 (``<key>metadata``, ``<key>kv_bytes``), 1 in a one-key layout."""
        return 2 if self._record else 1

    @property
    def key_bytes_per_chunk(self) -> float:
        """Bytes of one chunk's two key names, averaged over the chunks written (16 hex digits before any)."""
        base = self._base_bytes / self._bases if self._bases else len((self._head + "0" * 16 + self._tail).encode())
        return 2 * base + len(METADATA_SUFFIX) + len(KV_SUFFIX)


class LMCacheRespStore(LMCacheStore):
    """A chunk store in LMCache's ``resp://`` layout (module docstring): one key per chunk, the bare
    ``CacheEngineKey`` string, holding the chunk's KV bytes; lookup, retrieve and store one batch each.

    Implements :class:`kvcli.store.kvstore.KVStore` (layout "lmcache-resp"); refuses what :class:`LMCacheStore`
    refuses. Not thread-safe. Read-only calls: :meth:`lookup`, :meth:`retrieve`.
    """

    layout = RESP

    def _metadata_record(self, config: StoreConfig) -> bytes:
        """No metadata record: the one-key layouts keep none."""
        return b""

    def payload_key(self, chunk_hash: bytes) -> str:
        """The chunk's one key (:meth:`base_key`)."""
        return self.base_key(chunk_hash)

    def written_keys(self) -> Iterator[list[str]]:
        """Every key this store may have written (:attr:`written`), in lists of at most
        :data:`~kvcli.store.written.DELETE_BATCH` keys."""
        for blob in self.written.slices(PAYLOAD):
            yield [self.base_key(blob[i:i + HASH_BYTES]) for i in range(0, len(blob), HASH_BYTES)]

    def lookup(self, tokens, cache_salt: str = "", record: bool = True) -> LookupResult:
        """Hit chunks from chunk 0: one EXISTS per chunk of the prompt, all in one round trip (LMCache's batched
        exists); the hit run is the leading chunks that exist.

        Raises:
            RedisFailure: the server refused an EXISTS.
        """
        prompt = self._prompt(tokens, cache_salt)
        n = len(prompt.hashes)
        t0 = time.perf_counter()
        found = self._pipelined("exists", [self.base_key(h) for h in prompt.hashes], count=record) if n else []
        k = next((i for i, present in enumerate(found) if not present), n)
        seconds = time.perf_counter() - t0
        if record:
            self.stats.count_lookup(seconds, 1 if n else 0)
        cs = self.config.chunk_size
        return LookupResult(k, k * cs, n, "missing" if k < n else "", seconds)

    def retrieve(self, tokens, cache_salt: str = "", lookup: LookupResult | None = None) -> RetrieveResult:
        """Lookup (skipped when ``lookup`` is given), then one GET per hit chunk in one round trip.

        Returns the KV ``[layers, 2, kv_heads, hit_tokens, head_dim]`` of the hit run. An empty value (a chunk
        whose payload was accounted) ends the run ("no-payload"); a value of any other length than one chunk's KV
        bytes ends it too ("bad-record", counted in ``stats.checksum_failures``).
        """
        prompt = self._prompt(tokens, cache_salt)
        found = lookup or self.lookup(prompt)
        k = found.hit_chunks
        if k == 0:
            return RetrieveResult(0, None, found, 0, 0, 0.0, 0.0, found.break_reason)
        t0 = time.perf_counter()
        values = self._pipelined("get", [self.base_key(h) for h in prompt.hashes[:k]])
        t1 = time.perf_counter()
        tensors, data, reason = [], 0, found.break_reason
        for value in values:
            if not value:
                reason = "no-payload"
                break
            if len(value) != self.config.payload_bytes:
                reason = "bad-record"
                self.stats.count_checksums(0, 1)
                break
            tensors.append(self._tensor(value))
            data += len(value)
        kv = torch.cat(tensors, dim=3) if tensors else None
        t2 = time.perf_counter()
        self.stats.count_read(data)
        return RetrieveResult(len(tensors) * self.config.chunk_size, kv, found, data, 0, t1 - t0, t2 - t1, reason)

    def store(self, tokens, kv: torch.Tensor | None, cache_salt: str = "", start_chunk: int = 0,
              end_chunk: int | None = None, overwrite: bool = False,
              lookup: LookupResult | None = None) -> StoreResult:
        """Write chunks ``[start_chunk, end_chunk)``: one SET per chunk, one round trip.

        Args:
            kv: ``[layers, 2, kv_heads, >= end_chunk*chunk_size, head_dim]`` KV of the prompt from token 0 (any
                device); None writes each chunk's key with an empty value (the payload is accounted: counted, not
                written).
            overwrite, lookup: accepted for the common interface; the SETs always overwrite.

        Raises:
            KvcliError: ``kv`` is too short.
            RedisFailure: the server refused a write.
        """
        prompt = self._prompt(tokens, cache_salt)
        cs = self.config.chunk_size
        n = self._store_end(prompt, kv, start_chunk, end_chunk)
        if start_chunk >= n:
            return StoreResult(0, 0, 0, 0, 0, 0, 0, 0, 0.0)
        t0 = time.perf_counter()
        self.written.add(PAYLOAD, prompt.hashes[start_chunk:n])  # before the writes are sent
        ids = [fold_hash(h) for h in prompt.hashes[start_chunk:n]]
        keys = [self.base_key(h) for h in prompt.hashes[start_chunk:n]]
        values = [b""] * len(keys) if kv is None else [
            tensor_bytes(to_kv_2ltd(kv[:, :, :, k * cs:(k + 1) * cs, :])) for k in range(start_chunk, n)]
        self._pipelined("set", keys, values)
        return self._account(ids, keys, kv is not None, time.perf_counter() - t0)

    @property
    def key_bytes_per_chunk(self) -> float:
        """Bytes of one chunk's key name, averaged over the chunks written (a 16-byte hash before any)."""
        return self._base_bytes / self._bases if self._bases else len(self.base_key(bytes(HASH_BYTES)).encode())


class LMCacheMPStore(LMCacheRespStore):
    """A chunk store in LMCache's multiprocess-mode layout (its RESP L2 adapter; :mod:`kvcli.store.lmcache_mp`):
    one key per chunk, ``{model}@{kv_rank:08x}@0@{hash hex}`` (object group 0, the KV rank of ``world_size`` and
    ``worker_id``, kvcli's 16-byte prefix hash whole), holding the chunk's KV bytes; the protocol of
    :class:`LMCacheRespStore`.

    Implements :class:`kvcli.store.kvstore.KVStore` (layout "lmcache-mp"). Not thread-safe.

    Raises:
        BadInputError: as :class:`LMCacheStore`, or a world size or worker id outside 0-255.
    """

    layout = MP

    def __init__(self, client: redis.Redis | RedisCluster, config: StoreConfig, world_size: int = 1,
                 worker_id: int = 0) -> None:
        super().__init__(client, config, world_size, worker_id)
        try:
            self._head = f"{self.model_name}@{kv_rank(world_size, worker_id):08x}@0@"
        except ValueError as exc:
            raise BadInputError(str(exc)) from None

    def base_key(self, chunk_hash: bytes) -> str:
        """The chunk's multiprocess-mode key (``_object_key_to_string`` of its ``ObjectKey``)."""
        return self._head + chunk_hash.hex()


def _namespace_keys(client: redis.Redis | RedisCluster, namespace: str,
                    layouts: tuple[str, ...]) -> Iterator[tuple[bytes, bool]]:
    """``(key, is a metadata key)`` of each key in one of ``layouts`` (:func:`kvcli.store.lmcache.classify_key`)
    whose model name starts with ``{namespace}/`` (SCAN MATCH of every shard, never KEYS; a key in no LMCache
    layout, or in another, is left out)."""
    prefix = namespace + "/"
    for _, keys in cluster.scan(client, glob_escape(prefix) + "*@*", _DELETE_BATCH):  # every shard
        for key in keys:
            got = classify_key(key)
            if got is None or got[0] not in layouts:
                continue
            layout, parsed = got
            suffix = ""
            if layout == REDIS:
                parsed, suffix = cast("tuple[LMCacheKey, str]", parsed)
            if cast("LMCacheKey | MPKey", parsed).model_name.startswith(prefix):
                yield key, suffix == METADATA_SUFFIX


def count_namespace(client: redis.Redis | RedisCluster, namespace: str, delete: bool = False,
                    layouts: tuple[str, ...] = (REDIS,)) -> PurgeCount:
    """The keys of ``namespace`` in LMCache's ``layouts`` (:func:`_namespace_keys`) as ``kvcli purge`` counts
    them: metadata keys (``lmcache``'s) and KV keys (payloads: ``kv_bytes`` keys, and the one-key layouts' keys);
    with ``delete``, also deleted as they are found (UNLINK in batches), ``deleted`` the number the server removed.
    Read-only otherwise.

    Raises:
        RedisFailure: the server refused a command.
    """
    found, batch = PurgeCount(namespace, None), []
    try:
        for key, is_metadata in _namespace_keys(client, namespace, layouts):
            if is_metadata:
                found.metadata += 1
            else:
                found.payloads += 1
            if delete:
                batch.append(key)
                if len(batch) >= _DELETE_BATCH:
                    found.deleted += cluster.unlink(client, batch)
                    batch = []
        found.deleted += cluster.unlink(client, batch)
    except cluster.REDIS_ERRORS as exc:
        raise RedisFailure(f"Redis {'cleanup' if delete else 'SCAN'} failed: {exc}") from None
    return found


def purge_namespace(client: redis.Redis | RedisCluster, namespace: str, layouts: tuple[str, ...] = (REDIS,)) -> int:
    """Delete a replay's keys in LMCache's ``layouts`` (:func:`count_namespace` with ``delete``). Returns the
    number deleted.

    Raises:
        RedisFailure: the server refused a command.
    """
    return count_namespace(client, namespace, delete=True, layouts=layouts).deleted


#: the store of each LMCache layout (:data:`kvcli.store.lmcache.LMCACHE_LAYOUTS`)
LMCACHE_STORES: dict[str, type[LMCacheStore]] = {REDIS: LMCacheStore, RESP: LMCacheRespStore, MP: LMCacheMPStore}
