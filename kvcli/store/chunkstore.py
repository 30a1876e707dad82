"""The chunk-hash KV-cache store on Redis: ``lookup``, ``retrieve`` and ``store`` of per-chunk KV tensors.

Key layout and metadata format: :mod:`kvcli.store.layout` (README, "The store"); the records a store takes and
returns: :mod:`kvcli.store.records`; its Redis calls and their faults: :mod:`kvcli.store.calls`; whether a chunk
can be used: :mod:`kvcli.store.judge`, the one chunk judge.

Round trips: ``lookup`` is one round trip whatever the number of chunks: one read-only script (``EVAL_RO`` of
:data:`kvcli.store.judge.LOOKUP_SCRIPT`) that returns every metadata value and every chunk's state, reading a
payload's length only where its metadata records a real payload; where scripts are refused, an MGET of the metadata
and a STRLEN per payload key pipelined together, judged here. ``retrieve`` adds one MGET of the hit chunks'
payloads; ``store`` writes the missed full chunks in one pipelined round trip, payload before metadata for each
chunk.

On a Redis Cluster (:mod:`kvcli.store.cluster`) the keys of one lookup spread over the shards and a script cannot
span slots: the lookup sends each shard its GETs (metadata) and STRLENs (payloads) in one write, every shard's sent
before any reply is read (one round trip per shard, concurrently), and ``shard_trips`` counts round trips per
shard. A store writes payloads first and metadata once they are acknowledged (two round trips; one with accounted
payloads), so a metadata hit still means its payload was written.

A lookup hit is what a serving engine could load: a chunk whose state is "usable" or "accounted"
(:data:`kvcli.store.judge.HITS`); any other state ends the hit run there. Checksums need the payload bytes:
:meth:`ChunkStore.retrieve` checks every chunk it returns, :meth:`ChunkStore.verify` checks chosen ones.

Faults (:mod:`kvcli.store.calls`): in a store made with ``tolerate_unavailable`` (replay's), a call that fails
after redis-py's retries is absorbed by the documented rule: a failed lookup is a miss (``break_reason``
"redis-error") and that request stores nothing, a failed retrieve returns no KV, a failed store writes nothing
more; each is counted in :class:`~kvcli.store.records.StoreStats`.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import redis
import xxhash
from redis.cluster import RedisCluster

from kvcli.errors import KvcliError
from kvcli.prefixkv import concat_kv
from kvcli.sim.lru import ChunkLru
from kvcli.store.batchport import BatchPort
from kvcli.store.busy import is_busy
from kvcli.store.calls import Calls, RedisUnavailable, execute_pipeline
from kvcli.store.cluster import ShardTrips, by_shard, is_cluster, set_in_order, uninterrupted
from kvcli.store.hashing import ChunkedPrompt, PromptChunker
from kvcli.store.judge import (
    HITS,
    LOOKUP_SCRIPT,
    METADATA_HITS,
    MISSING,
    NOT_READ,
    WRONG_TYPE,
    Expected,
    checked_tensor,
    codes_to_states,
    judge,
    payload_ok,
)
from kvcli.store.layout import NO_CHECKSUM, MetadataWriter, is_accounted, is_real, key_prefix
from kvcli.store.noreply import no_reply, raise_no_reply
from kvcli.store.records import (
    NOTHING_STORED,
    ChunkTooLargeError,
    LookupResult,
    RetrieveResult,
    StoreConfig,
    StoreResult,
    StoreStats,
    WritePlan,
)
from kvcli.store.runmark import RunMark
from kvcli.store.serde import dtype_name, encode_kv
from kvcli.store.server import script_refused
from kvcli.store.written import METADATA, PAYLOAD, HashKeys, WrittenChunks

if TYPE_CHECKING:
    import torch


class _ScriptRefused(Exception):
    """The server has no EVAL_RO for us (unknown command, ACL, scripting disabled)."""


class ChunkStore:
    """A chunk-hash KV-cache store for one namespace, chunk size and model on one Redis server (or cluster).

    Not thread-safe. Read-only calls: :meth:`lookup`, :meth:`retrieve`, :meth:`verify` (apart from the client-side
    LRU's recency). Errors from Redis are raised as :class:`~kvcli.errors.RedisFailure` (one line, no traceback at
    the CLI). Implements :class:`kvcli.store.kvstore.KVStore` (layout "kvcli"); its batcher (:mod:`kvcli.store.batch`)
    drives it through :meth:`batch_port` alone.

    Args:
        client: a redis-py client.
        config: what the store writes and where.
        tolerate_unavailable: absorb a call that fails after retries (module docstring; replay's stores).
        scripts: False: never send the lookup script (the pipelined reads of a server that refuses scripts).
        mark: the run's server, checked after a dropped connection (:mod:`kvcli.store.runmark`); None: never.
    """

    layout = "kvcli"

    def __init__(self, client: redis.Redis | RedisCluster, config: StoreConfig, tolerate_unavailable: bool = False,
                 scripts: bool = True, mark: RunMark | None = None) -> None:
        self.client = client
        self.config = config
        self.stats = StoreStats()
        self._calls = Calls(client, self.stats, tolerate_unavailable, mark)
        self.prefix = key_prefix(config.namespace, config.chunk_size)
        self._meta_head, self._payload_head = self.prefix + "m:", self.prefix + "p:"  # a key is head + hash hex
        self.written = WrittenChunks()  # the chunks whose keys this store may have written (kvcli.store.written)
        self._read_prefix = key_prefix(config.read_namespace, config.chunk_size) if config.read_namespace else None
        self.chunker = PromptChunker(config.model_id, config.tokenizer, config.chunk_size)
        self._cluster = is_cluster(client)
        self._metadata = MetadataWriter(config.chunk_size, dtype_name(config.stored_dtype), config.chunk_shape,
                                        config.model_id, config.payload_bytes, config.header_bytes)
        self.expected = Expected.of_store(config)
        self._spaces = [self.prefix] + ([self._read_prefix] if self._read_prefix else [])
        self._scripts = scripts  # False once the server refused the lookup script: pipelined lookups from then on
        capacity = config.capacity_chunks
        self._lru = ChunkLru(capacity) if capacity is not None else None

    # -- keys ---------------------------------------------------------------------------------------------------
    def meta_key(self, chunk_hash: bytes) -> str:
        """The metadata key of a chunk."""
        return self._meta_head + chunk_hash.hex()

    def payload_key(self, chunk_hash: bytes) -> str:
        """The payload key of a chunk."""
        return self._payload_head + chunk_hash.hex()

    def written_keys(self) -> Iterator[HashKeys]:
        """Every key this store may have written (:attr:`written`: metadata, then payloads), distinct, in batches of
        at most :data:`~kvcli.store.written.DELETE_BATCH` keys."""
        for kind, head in ((METADATA, self._meta_head), (PAYLOAD, self._payload_head)):
            for blob in self.written.slices(kind):
                yield HashKeys(head, blob)

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """Cut and hash a prompt under this store's namespace root (model, tokenizer, ``cache_salt``)."""
        return self.chunker.chunk(tokens, cache_salt)

    @property
    def shard_trips(self):
        """Round trips per shard (:class:`kvcli.store.cluster.ShardTrips`)."""
        return self._calls.shard_trips

    def batch_port(self) -> BatchPort:
        """This store as its batcher (:mod:`kvcli.store.batch`) drives it: the members a batch needs beyond this
        class's public ones (:class:`~kvcli.store.batchport.BatchPort`), each this store's own."""
        return _BatchSide(self)

    # -- checks -------------------------------------------------------------------------------------------------
    def check_value_size(self) -> int:
        """Refuse a chunk whose value would exceed the server's ``proto-max-bulk-len``, before any write
        (:func:`check_value_size`). Returns the limit in bytes (512 MiB assumed when CONFIG GET is not allowed, as on
        managed servers).

        Raises:
            ChunkTooLargeError: header + payload bytes of one chunk exceed the limit.
            NoReply: CONFIG GET got no reply.
        """
        return check_value_size(self.client, self.config, self.value_bytes)

    # -- read ---------------------------------------------------------------------------------------------------
    def lookup(self, tokens, cache_salt: str = "", record: bool = True) -> LookupResult:
        """The longest run of consecutive loadable chunks from chunk 0, in ONE round trip (module docstring).

        A chunk that is not a hit (:mod:`kvcli.store.judge`: missing, another token digest, a real payload missing
        or of the wrong length) stops the run: later chunks never fill a gap. "Accounted" chunks (metadata only,
        written by replay) have no payload by design and are hits. Only full chunks count, so ``hit_tokens`` never
        exceeds the prompt length. With a read-only namespace, a chunk is taken from the store's own namespace when
        it is a hit there, else from the read-only one.

        Args:
            tokens: token ids ``[tokens]`` or a :class:`ChunkedPrompt` from :meth:`chunk`.
            cache_salt: tenant salt (ignored when ``tokens`` is already chunked).
            record: count this lookup in :attr:`stats` (False for bookkeeping lookups outside the measured path).
        """
        prompt = self.chunker.prompt(tokens, cache_salt)
        n = len(prompt.hashes)
        t0 = time.perf_counter()
        try:
            metas, states = self._read_chunks(prompt, record) if n else ([], [])
        except RedisUnavailable as exc:
            self._calls.absorb(exc)
            return LookupResult.failure(n, time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        if record:
            self.stats.count_lookup(seconds, bool(n))
        return self._evaluate(prompt, metas, states, seconds)

    def _evaluate(self, prompt: ChunkedPrompt, metas: list, states: list[str] | None = None,
                  seconds: float = 0.0) -> LookupResult:
        """The lookup's answer from the metadata values of every chunk in every namespace (the store's, then the
        read-only one; None: missing) and their states (:meth:`_read_chunks`), as :meth:`lookup` gives it.
        ``states`` None: payloads not read (a pipelined index-only lookup, kvcli.store.batch): the chunks are
        judged here without them, so a chunk whose metadata records a real payload is "bad-payload", never a hit
        nobody checked."""
        n = len(prompt.hashes)
        if states is None:
            value_bytes, digests = self.value_bytes, prompt.digests
            states = [judge(m, NOT_READ, digests[i % n], value_bytes) for i, m in enumerate(metas)]
        own = states[:n]
        read = states[n:] if len(self._spaces) > 1 else None
        ok = [own[k] in HITS or (read is not None and read[k] in HITS) for k in range(n)]
        k = next((i for i in range(n) if not ok[i]), n)
        reason = "" if k == n else own[k] if own[k] != MISSING or read is None else read[k]
        from_read: tuple[bool, ...] = ()
        read_only: frozenset[int] = frozenset()
        usable: frozenset[int] = frozenset()
        chosen = tuple(metas[:k])
        if read is not None:
            from_read = tuple(own[i] not in HITS for i in range(k))
            chosen = tuple(metas[n + i] if from_read[i] else metas[i] for i in range(k))
            read_only = frozenset(i for i in range(n) if metas[i] is None and read[i] in HITS)
            usable = frozenset(i for i in range(n) if read[i] in HITS)
        by_meta = next((i for i in range(n) if own[i] not in METADATA_HITS
                        and (read is None or read[i] not in METADATA_HITS)), n)
        later = frozenset(i for i in range(k + 1, n) if ok[i])
        return LookupResult(k, k * self.config.chunk_size, n, reason, seconds, chosen, later, from_read, read_only,
                            by_meta, usable)

    def _read_chunks(self, prompt: ChunkedPrompt, record: bool = True) -> tuple[list, list[str]]:
        """The metadata values and states (:mod:`kvcli.store.judge`) of every chunk of ``prompt`` in every
        namespace prefix, in one round trip: the lookup script, or where scripts are refused an MGET and STRLENs
        pipelined (judged here); on a cluster one round trip per shard touched, all shards' sent before any reply
        is read (:func:`~kvcli.store.cluster.by_shard`; the script cannot run there, its keys spanning slots).
        ``record``: counted as a round trip (per shard).

        Returns ``(metas, states)``, each ``len(spaces) * len(prompt.hashes)`` long (namespace-major); a metadata
        value is None for no key (or a key of another type).

        Raises:
            RedisUnavailable, RedisFailure: as :meth:`kvcli.store.calls.Calls.call`.
        """
        hexes = prompt.hexes
        meta_keys = [p + "m:" + x for p in self._spaces for x in hexes]
        payload_keys = [p + "p:" + x for p in self._spaces for x in hexes]
        if self._cluster:
            metas, lengths = self._calls.call(self._shard_reads, meta_keys, payload_keys,
                                              self.shard_trips if record else None, record=record)
            return [m if isinstance(m, bytes) else None for m in metas], self._judged(prompt, metas, lengths)
        if record:
            self.shard_trips.add()
        if self._scripts:
            try:
                replies = self._calls.call(self._eval_ro, meta_keys + payload_keys, b"".join(prompt.digests),
                                           record=record)
            except _ScriptRefused:
                self._scripts = False  # no scripts here (Redis < 7, ACL, disabled): pipelined from now on
            else:
                m = len(meta_keys)
                return list(replies[:m]), codes_to_states(replies[m:])
        pipe = self.client.pipeline(transaction=False)
        pipe.mget(meta_keys)
        for key in payload_keys:
            pipe.strlen(key)
        replies = self._calls.call(_execute_reads, pipe, record=record, name="MGET")
        metas = list(replies[0])
        return metas, self._judged(prompt, metas, [WRONG_TYPE if isinstance(x, Exception) else int(x)
                                                   for x in replies[1:]])

    def _judged(self, prompt: ChunkedPrompt, metas: list, lengths: list[int]) -> list[str]:
        """The states of chunks read as metadata values and payload STRLENs (as the lookup script judges them: a
        payload's length counts only where the metadata records a real payload)."""
        n, value_bytes, digests = len(prompt.hashes), self.value_bytes, prompt.digests
        return [judge(m, (length if isinstance(m, bytes) and is_real(m) else NOT_READ), digests[i % n], value_bytes)
                for i, (m, length) in enumerate(zip(metas, lengths))]

    def _shard_reads(self, meta_keys: list[str], payload_keys: list[str], trips) -> tuple[list, list]:
        """A cluster's lookup read: GET of every metadata key and STRLEN of every payload key, one round trip per
        shard (:func:`~kvcli.store.cluster.by_shard`). A key of another type reads as
        :data:`~kvcli.store.judge.WRONG_TYPE`; any other error reply is raised."""
        replies = by_shard(self.client, [("GET", k) for k in meta_keys] + [("STRLEN", k) for k in payload_keys],
                           trips)
        for reply in replies:
            if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                raise reply
        m = len(meta_keys)
        return ([WRONG_TYPE if isinstance(r, Exception) else r for r in replies[:m]],
                [WRONG_TYPE if isinstance(r, Exception) else int(r) for r in replies[m:]])

    def _eval_ro(self, keys: list[str], digests: bytes):
        """EVAL_RO of :data:`~kvcli.store.judge.LOOKUP_SCRIPT`: always one round trip (the server caches the
        compiled script by its SHA-1; EVALSHA_RO would need a second round trip whenever the server does not hold
        it yet)."""
        try:
            return self.client.execute_command("EVAL_RO", LOOKUP_SCRIPT, len(keys), *keys, digests,
                                               self.value_bytes)
        except redis.ResponseError as exc:
            if script_refused(exc):
                raise _ScriptRefused() from None
            raise

    def retrieve(self, tokens, cache_salt: str = "", lookup: LookupResult | None = None) -> RetrieveResult:
        """Lookup (one round trip, skipped when ``lookup`` is given), then fetch the hit chunks' KV in one more.

        Returns the KV ``[layers, 2, kv_heads, hit_tokens, head_dim]`` of the hit run in the model's dtype (an fp8
        payload dequantized; a hybrid model's as a :class:`~kvcli.prefixkv.StatefulKV` holding the state at each
        hit chunk's end), verified chunk by chunk (:func:`~kvcli.store.judge.checked_tensor`): a missing
        payload or a failed checksum ends the run there, and those chunks are never returned.
        """
        prompt = self.chunker.prompt(tokens, cache_salt)
        found = lookup or self.lookup(prompt)
        k = found.hit_chunks
        if k == 0:
            return RetrieveResult(0, None, found, 0, 0, 0.0, 0.0, found.break_reason)
        t0 = time.perf_counter()
        try:
            payloads = self._calls.read(self._payload_keys(prompt, found, range(k)))
        except RedisUnavailable as exc:
            self._calls.absorb(exc)
            return RetrieveResult(0, None, found, 0, 0, time.perf_counter() - t0, 0.0, "redis-error")
        t1 = time.perf_counter()
        tensors, data_bytes, head_bytes, reason = [], 0, 0, found.break_reason
        for meta, payload in zip(found.metadata, payloads):
            if payload is None:
                reason = "no-payload"
                break
            tensor = checked_tensor(payload, meta[8:16], self.config.chunk_shape, self.expected.dtype,
                                    self.config.dtype, self.config.state_shape)
            self.stats.count_checksums(1, tensor is None)
            if tensor is None:
                reason = "checksum"
                break
            size = self.config.payload_bytes  # the stored bytes (checked above), not the dequantized tensor's
            tensors.append(tensor)
            data_bytes += size
            head_bytes += len(payload) - size
        kv = concat_kv(tensors) if tensors else None
        t2 = time.perf_counter()
        self.stats.count_read(data_bytes, head_bytes)
        hit = len(tensors) * self.config.chunk_size
        return RetrieveResult(hit, kv, found, data_bytes, head_bytes, t1 - t0, t2 - t1, reason)

    def verify(self, prompt: ChunkedPrompt, indices: list[int], lookup: LookupResult) -> list[bool]:
        """Whether each chunk ``indices`` (of the lookup's hit run) has a payload whose tensor bytes match the
        checksum in its metadata: one MGET of those payloads, not counted as a round trip of the measured path
        (bookkeeping: replay samples checksums of chunks it only looked up)."""
        payloads = self._calls.read(self._payload_keys(prompt, lookup, indices), record=False)
        out = []
        for i, payload in zip(indices, payloads):
            good = payload is not None and payload_ok(payload, lookup.metadata[i][8:16], self.config.chunk_shape,
                                                      self.expected.dtype, self.config.state_shape)
            self.stats.count_checksums(1, not good)
            out.append(good)
        return out

    def _payload_keys(self, prompt: ChunkedPrompt, lookup: LookupResult, indices) -> list[str]:
        """The payload keys of hit chunks ``indices``, each in the namespace the lookup took it from."""
        own, other = self.prefix + "p:", (self._read_prefix or "") + "p:"
        read = lookup.from_read or (False,) * lookup.hit_chunks
        return [(other if read[i] else own) + prompt.hexes[i] for i in indices]

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
            return NOTHING_STORED
        try:
            return self._store(tokens, kv, cache_salt, start_chunk, end_chunk, overwrite, lookup)
        except RedisUnavailable as exc:
            self._calls.absorb(exc)
            return NOTHING_STORED

    def _store(self, tokens, kv, cache_salt, start_chunk, end_chunk, overwrite, lookup) -> StoreResult:
        prompt = self.chunker.prompt(tokens, cache_salt)
        cfg, cs = self.config, self.config.chunk_size
        n = len(prompt.hashes) if end_chunk is None else min(end_chunk, len(prompt.hashes))
        real = kv is not None
        if real and start_chunk < n and kv.shape[3] < n * cs:
            raise KvcliError(f"store needs KV for {n * cs} tokens, got {kv.shape[3]}")
        if lookup is not None and not overwrite and cfg.ttl is None:
            return self._store_known(prompt, kv, start_chunk, n, lookup)
        t0 = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        evicted, dropped, deletes = (0, frozenset(), []) if overwrite else self._admit(prompt, n, lookup)
        if deletes and not self._cluster:  # a cluster sends them with the write (_ordered)
            pipe.delete(*deletes)
        todo = [k for k in range(start_chunk, n) if k not in dropped]
        if not todo:
            if evicted:
                self._ordered(pipe, deletes, [], [])
            return StoreResult(0, 0, 0, 0, 0, 0, 0, evicted, 0.0)
        now = int(time.time())
        meta_bytes, firsts, thens = 0, [], []
        self._record(prompt, todo, real)
        for k in todo:
            checksum = NO_CHECKSUM
            if real:
                value, checksum = self._payload(kv, k)
                firsts.append((self.payload_key(prompt.hashes[k]), value))
            meta = self._metadata_value(prompt, k, checksum, real, now)
            meta_bytes += len(meta)
            thens.append((self.meta_key(prompt.hashes[k]), meta))
        if self._cluster:  # payloads acknowledged before any metadata is sent (cluster.py)
            got = self._ordered(pipe, deletes, firsts, thens, nx=not overwrite, ex=cfg.ttl)
            replies = [r for pair in zip(*got) for r in pair] if real else got[1]
        else:
            for i, (key, meta) in enumerate(thens):
                if real:
                    pipe.set(*firsts[i], nx=not overwrite, ex=cfg.ttl)
                pipe.set(key, meta, nx=not overwrite, ex=cfg.ttl)
            replies = self._ordered(pipe, [], [], [])[0]
            replies = replies[-len(todo) * (2 if real else 1):]
        if overwrite:  # a rewrite adds payload objects to chunks whose metadata already existed
            replies = [r if i % 2 == 0 else None for i, r in enumerate(replies)]
            if real:  # their payload bytes move from "accounted" to "written"
                self.stats.count_rewrite(len(todo) * cfg.payload_bytes)
        per = 2 if real else 1
        return self._account(len(todo), sum(1 for r in replies if r), sum(1 for r in replies[per - 1::per] if r),
                             meta_bytes, real, evicted, time.perf_counter() - t0)

    def _store_known(self, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> StoreResult:
        """Write the chunks the lookup saw missing in one MSET (payload and metadata of each chunk together)."""
        t0 = time.perf_counter()
        plan = self._plan_write(prompt, kv, start, n, lookup)
        pipe = self.client.pipeline(transaction=False)
        if self._cluster:  # no MSET across slots: payloads first, then metadata (cluster.py)
            if plan.firsts or plan.thens or plan.evicted:
                self._ordered(pipe, plan.deletes, plan.firsts, plan.thens)
        else:
            if plan.deletes:
                pipe.delete(*plan.deletes)
            if plan.args:
                pipe.execute_command("MSET", *plan.args)
            if plan.args or plan.evicted:
                self._ordered(pipe, [], [], [])
        return self._account_write(plan, time.perf_counter() - t0)

    def _plan_write(self, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> WritePlan:
        """What :meth:`store` with a lookup writes, not sent yet: the LRU's deletes (its bookkeeping is done: the
        plan must be sent), then the chunks of ``[start, n)`` the lookup did not find, as MSET ``args`` (a single
        server) or ``(key, value)`` payloads ``firsts`` and metadata ``thens`` (a cluster).

        Args:
            kv: ``[layers, 2, kv_heads, >= n*chunk_size, head_dim]`` for real payloads, or None (accounted).
        """
        real = kv is not None
        evicted, dropped, deletes = self._admit(prompt, n, lookup)
        missing = [k for k in range(start, n) if k not in lookup.present_after and k not in dropped]
        self._record(prompt, missing, real)
        now, meta_bytes = int(time.time()), 0
        meta_pre, payload_pre = self._meta_head, self._payload_head
        args: list = []  # a single server: MSET args
        firsts: list[tuple[str, memoryview]] = []  # a cluster: (key, value) pairs
        thens: list[tuple[str, bytes]] = []
        for k in missing:
            checksum = NO_CHECKSUM
            if real:
                value, checksum = self._payload(kv, k)
                if self._cluster:
                    firsts.append((payload_pre + prompt.hexes[k], value))
                else:
                    args += (payload_pre + prompt.hexes[k], value)
            meta = self._metadata_value(prompt, k, checksum, real, now)
            meta_bytes += len(meta)
            if self._cluster:
                thens.append((meta_pre + prompt.hexes[k], meta))
            else:
                args += (meta_pre + prompt.hexes[k], meta)
        present = sum(1 for k in range(start, n) if k in lookup.present_after)
        return WritePlan(prompt, missing, deletes, args, firsts, thens, meta_bytes, evicted, present, real)

    def _record(self, prompt: ChunkedPrompt, chunks: list[int], real: bool) -> None:
        """Record ``chunks`` of ``prompt`` in :attr:`written` before their write is sent: metadata, and the payload
        when ``real``."""
        hashes = [prompt.hashes[k] for k in chunks]
        self.written.add(METADATA, hashes)
        if real:
            self.written.add(PAYLOAD, hashes)

    def _account_write(self, plan: WritePlan, seconds: float) -> StoreResult:
        """Count a :meth:`_plan_write` write that the server acknowledged (all its SETs created keys)."""
        written = len(plan.missing)
        return self._account(written, written * (2 if plan.real else 1), written, plan.meta_bytes, plan.real,
                             plan.evicted, seconds, plan.present)

    def _account_written(self, chunks: int, meta_bytes: int, seconds: float, present: int = 0) -> StoreResult:
        """Count ``chunks`` accounted chunks (metadata only) that another path wrote and the server acknowledged
        (kvcli.store.batch's script), ``meta_bytes`` of metadata, ``present`` chunks found there already."""
        return self._account(chunks, chunks, chunks, meta_bytes, False, 0, seconds, present)

    def _account(self, written: int, created: int, new_meta: int, meta_bytes: int, real: bool, evicted: int,
                 seconds: float, present: int = 0) -> StoreResult:
        """Count a write of ``written`` chunks that created ``created`` keys, ``new_meta`` of them metadata."""
        cfg = self.config
        head = cfg.header_bytes if real else 0
        self.stats.count_write(new_meta, created, written * cfg.payload_bytes, written * head, meta_bytes, real)
        return StoreResult(new_meta, written - new_meta + present, created, new_meta, written * cfg.payload_bytes,
                           written * head, meta_bytes, evicted, seconds)

    def _payload(self, kv, k: int) -> tuple[memoryview, bytes]:
        """Chunk ``k``'s payload value out of ``kv`` (``[layers, 2, kv_heads, tokens, head_dim]``) and its
        checksum."""
        cs = self.config.chunk_size
        return chunk_payload(self, kv[:, :, :, k * cs:(k + 1) * cs, :])

    def _metadata_value(self, prompt: ChunkedPrompt, k: int, checksum: bytes, real: bool, now: int) -> bytes:
        return self._metadata.value(prompt.digests[k], checksum, prompt.hexes[k - 1] if k else "", real, now)

    # -- capacity (client-side LRU over chunks) -------------------------------------------------------------------
    @property
    def capacity_chunks(self) -> int | None:
        """Chunks the client-side capacity holds (:attr:`StoreConfig.capacity_chunks`), or None without one."""
        return self._lru.capacity if self._lru is not None else None

    def _admit(self, prompt: ChunkedPrompt, n: int, lookup: LookupResult | None) -> tuple[int, frozenset, list]:
        """One request's LRU bookkeeping (:class:`~kvcli.sim.lru.ChunkLru`): its chunks ``[0, n)`` held in this
        namespace become the most recent, chunk 0 first, and the least recent chunks over the capacity are
        evicted. Chunks present only in the read-only namespace are not held here.

        Returns ``(evicted, dropped, deletes)``: chunks evicted from the store, the indices of this request's
        chunks the capacity leaves no room for (its tail, when the request alone exceeds the capacity: not
        written), and the keys to delete (metadata and payload of each evicted chunk).
        """
        if self._lru is None:
            return 0, frozenset(), []
        skip = lookup.read_only if lookup is not None else frozenset()
        held = [k for k in range(n) if k not in skip]
        new, evicted = self._lru.store([prompt.hashes[k] for k in held])
        if not evicted:
            return 0, frozenset(), []
        gone, fresh = set(evicted), set(new)
        victims = [h for h in evicted if h not in fresh]
        deletes = [key for h in victims for key in (self.meta_key(h), self.payload_key(h))]
        self.stats.count_evictions(len(victims))
        return len(victims), frozenset(k for k in held if prompt.hashes[k] in gone), deletes

    def vanished_chunks(self) -> int | None:
        """Chunks this store wrote again because their keys had gone although its own capacity had not evicted
        them (another client deleted them, or the server evicted or expired them): a lookup missed them, so the
        hits counted are short of what the run's own writes would have given. Counted from the run's record, no
        Redis call: new metadata entries (a chunk is written only where its lookup found it missing) less the
        distinct chunks recorded (:mod:`kvcli.store.written`) less the chunks the capacity evicted, at least 0; at
        a capacity a chunk evicted and never written again hides one vanished chunk (a lower bound). A chunk that
        vanished and was never asked for again is not counted: it cost no hit.

        Returns:
            The count, or None when the record keeps nothing (the command's own embedded server, which no other
            client reaches).
        """
        if not self.written.keep:
            return None
        st = self.stats
        return max(0, st.metadata_entries - self.written.distinct_chunks(METADATA) - st.evicted_chunks)

    # -- what the replay compares across layouts (kvcli.store.kvstore.KVStore) ---------------------------------------
    @property
    def key_pattern(self) -> str:
        """SCAN MATCH pattern of this store's keys (a validated namespace holds no glob character)."""
        return self.prefix + "*"

    @property
    def value_bytes(self) -> int:
        """Bytes of one chunk's payload value: serialization header + tensor bytes."""
        return self.config.value_bytes

    @property
    def key_bytes_per_chunk(self) -> float:
        """Bytes of one chunk's two key names (metadata and payload)."""
        return 2 * (len(self.prefix) + 2 + 32)

    def accounted(self, prompt: ChunkedPrompt, lookup: LookupResult, k: int) -> bool:
        """Whether hit chunk ``k``'s metadata says its payload was accounted, not written (layout.py)."""
        return is_accounted(lookup.metadata[k])

    @property
    def resident_chunks(self) -> int | None:
        """Chunks held under the client-side capacity, or None without a capacity."""
        return None if self._lru is None else len(self._lru)

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _ordered(self, pipe, deletes, firsts, thens, nx: bool = False, ex: int | None = None) -> tuple[list, list]:
        """Run ``pipe``. On a cluster, ``deletes`` and ``firsts``' SETs (payloads), then once acknowledged
        ``thens``' SETs (metadata) (cluster.py): one round trip per shard each, one round when there are no
        payloads; returns the replies to ``firsts`` and to ``thens``. On a single server ``deletes``, ``firsts``
        and ``thens`` are empty (callers queue everything on ``pipe`` in order) and the replies are all of
        ``pipe``'s."""
        with uninterrupted():  # a write is sent whole or not at all: Ctrl-C waits for its reply
            if not self._cluster:
                self.shard_trips.add()
                return self._calls.call(execute_pipeline, pipe, name="EXECUTE"), []
            self.stats.count_round_trips(bool(firsts and thens))
            return self._calls.call(set_in_order, self.client, deletes, firsts, thens, nx, ex, self.shard_trips)


class _BatchSide:
    """A :class:`ChunkStore` as its batcher sees it (:class:`~kvcli.store.batchport.BatchPort`): each member is
    the store's own, private there so that the store's public surface stays a library user's."""

    __slots__ = ("_store",)

    def __init__(self, store: ChunkStore) -> None:
        self._store = store

    @property
    def config(self) -> StoreConfig:
        return self._store.config

    @property
    def stats(self) -> StoreStats:
        return self._store.stats

    @property
    def calls(self) -> Calls:
        return self._store._calls

    @property
    def written(self) -> WrittenChunks:
        return self._store.written

    @property
    def metadata(self) -> MetadataWriter:
        return self._store._metadata

    @property
    def client(self) -> redis.Redis | RedisCluster:
        return self._store.client

    @property
    def cluster(self) -> bool:
        return self._store._cluster

    @property
    def shard_trips(self) -> ShardTrips:
        return self._store.shard_trips

    @property
    def meta_head(self) -> str:
        return self._store._meta_head

    @property
    def payload_head(self) -> str:
        return self._store._payload_head

    @property
    def scripted(self) -> bool:
        store = self._store
        return not store._cluster and store._lru is None and store._scripts

    def new_connection(self) -> Any:
        assert not self._store._cluster, "a batcher's own connection is to a single server"
        return cast(redis.Redis, self._store.client).connection_pool.make_connection()

    def read_chunks(self, prompt: ChunkedPrompt, record: bool = True) -> tuple[list, list[str]]:
        return self._store._read_chunks(prompt, record)

    def judged(self, prompt: ChunkedPrompt, metas: list, lengths: list[int]) -> list[str]:
        return self._store._judged(prompt, metas, lengths)

    def evaluate(self, prompt: ChunkedPrompt, metas: list, states: list[str] | None = None,
                 seconds: float = 0.0) -> LookupResult:
        return self._store._evaluate(prompt, metas, states, seconds)

    def plan_write(self, prompt: ChunkedPrompt, kv, start: int, n: int, lookup: LookupResult) -> WritePlan:
        return self._store._plan_write(prompt, kv, start, n, lookup)

    def account_write(self, plan: WritePlan, seconds: float) -> StoreResult:
        return self._store._account_write(plan, seconds)

    def account_written(self, chunks: int, meta_bytes: int, seconds: float, present: int = 0) -> StoreResult:
        return self._store._account_written(chunks, meta_bytes, seconds, present)


def _execute_reads(pipe) -> list:
    """A lookup's pipelined MGET and STRLENs: their replies, an error reply to a STRLEN among them (a key of another
    type); a BUSY reply to any, or any error reply to the MGET, is raised (the call is then sent again, or fails)."""
    replies = pipe.execute(raise_on_error=False)
    busy = next((r for r in replies if isinstance(r, Exception) and is_busy(r)), None)
    if busy is not None:
        raise busy
    if isinstance(replies[0], Exception):
        raise replies[0]
    return replies


def check_value_size(client: redis.Redis | RedisCluster, config: StoreConfig, value_bytes: int) -> int:
    """Refuse ``value_bytes``-byte chunk values over the server's ``proto-max-bulk-len``, real or accounted payloads
    alike (a store the server could not hold is no answer, and a replay's transfer calibration writes values of one
    chunk's size, up to 8 MiB, either way), so the message names the two ways out that work for both: a smaller
    chunk size, or a larger limit.

    Returns the limit in bytes (512 MiB assumed when CONFIG GET is not allowed, as on managed servers).

    Raises:
        ChunkTooLargeError: ``value_bytes`` exceeds the limit.
        NoReply: CONFIG GET got no reply (within the timeout, or the connection kept dropping).
    """
    try:
        limit = int(dict(client.config_get("proto-max-bulk-len")).get("proto-max-bulk-len") or 0)
    except redis.RedisError as exc:  # refused (CONFIG not allowed): the default; no reply: said
        if no_reply(exc):
            raise_no_reply(exc, "CONFIG GET", f"Redis CONFIG GET proto-max-bulk-len failed: {exc}")
        limit = 0
    limit = limit or 512 * 1024 * 1024
    if value_bytes > limit:
        raise ChunkTooLargeError(
            f"chunk size {config.chunk_size} makes {value_bytes:,}-byte values, over the server's "
            f"proto-max-bulk-len of {limit:,} bytes; use a smaller chunk size or raise proto-max-bulk-len")
    return limit


# -- chunk values, for warm (the same bytes ChunkStore.store writes) ------------------------------------------------
def chunk_payload(store: ChunkStore, chunk_kv: torch.Tensor) -> tuple[memoryview, bytes]:
    """One chunk's payload value as :meth:`ChunkStore.store` writes it, and the 8-byte checksum it records.

    Args:
        chunk_kv: ``[layers, 2, kv_heads, chunk_size, head_dim]`` in the store's dtype (any device; a view is fine);
            quantized to the store's ``kv_dtype`` when it has one.

    Returns:
        ``(value, checksum)``: ``header_bytes + payload_bytes`` bytes, and xxh3_64 of the tensor bytes (an fp8
        payload's scales included).
    """
    value = encode_kv(chunk_kv, store.config.payload_metadata, store.config.kv_dtype)
    return value, xxhash.xxh3_64_digest(value[store.config.header_bytes:])


def chunk_metadata(store: ChunkStore, prompt: ChunkedPrompt, k: int, checksum: bytes = NO_CHECKSUM,
                   created: int | None = None, real: bool = True) -> bytes:
    """Chunk ``k``'s metadata value as :meth:`ChunkStore.store` writes it (``created``: unix seconds, now if None).

    Its length does not depend on ``checksum`` (always 8 bytes), so a dry run counts metadata bytes exactly.
    """
    return store._metadata.value(prompt.digests[k], checksum, prompt.hexes[k - 1] if k else "", real,
                                int(time.time()) if created is None else created)
