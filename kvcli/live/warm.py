"""Warm a live cache ahead of traffic: compute prompts' KV with the local model and store their full chunks.

Same key layout, namespaces and values as replay's store (store.py), so a warmed chunk is a replay hit.

* **Idempotent, and repairs what is damaged.** Each prompt's chunks are checked first (GET of the metadata, STRLEN
  of the payload, or GET of it with ``verify``, and PTTL of the metadata: one pipelined round trip). A chunk is
  *present*, neither recomputed nor rewritten, when its metadata parses, says ``"stored":"real"``, carries the
  prompt's token digest, this model, dtype, shape and chunk size, names the previous chunk as its parent, and its
  payload is a string of exactly header + tensor bytes (and, with ``verify``, matches its checksum). Any other
  chunk (a half missing, "accounted" metadata that replay writes, truncated, swapped, of another type, or, with
  ``verify``, corrupted) is written whole: payload and metadata both with a plain ``SET`` (``EX ttl``), so the
  metadata always describes the payload beside it and both halves carry the same TTL. A chunk present but not
  intact is counted in :attr:`SizeTotals.chunks_repaired`. Without ``verify``, a checksum failure found while
  reading a stored prefix back for the model is repaired too.
* **Prefill only what is missing.** The longest stored prefix (under any chunk size being warmed) is retrieved,
  checksum-verified, and passed as ``past_kv``; only the tokens after it, up to the end of the last full chunk that
  needs writing, run through the model. Prompts that share a prefix (a fleet's system prompt) compute it once.
* **No self-made gaps, no half chunk.** A prompt's chunks are written in order in batches, each sent after the one
  before it was stored (:func:`kvcli.store.cluster.write_prefix`): on a single server whose user may run MULTI, a
  batch is one ``MULTI``/``EXEC`` (all of it or none, also when its reply never comes); on a cluster, or for a
  user without MULTI, its payloads first, then their metadata, and on a refused SET both halves of every chunk
  from the first refused one on are deleted again. Either way what is stored is a prefix of the chain, no metadata
  is without its payload, and the counts are what the server ran. An out-of-memory reply (or any Redis error)
  stops the run there; :attr:`WarmResult.stopped` says why and the totals say what was written.
* **Dry run**: the same plan, read-only; chunks, objects, payload, header and metadata bytes a real run would
  write now (a chunk planned for an earlier prompt counts as present for later ones). A real run computes this
  plan first too, for the preflight: its Redis-memory estimate against ``maxmemory - used_memory``.

``ttl`` expires each chunk's metadata and payload together (``SET ... EX`` on both). A chain's head never expires
before its tail: when a prompt's later chunks are written, the present chunks before them whose TTL is shorter than
``ttl`` get ``EXPIRE ttl`` (both keys, in the first batch's transaction, or acknowledged before it is sent);
chunks with no TTL, or a longer one, keep it (:attr:`SizeTotals.ttl_refreshed`). The server's ``evicted_keys``
counter is read before and after a real run: :attr:`WarmResult.evicted_keys` is the difference (evictions by the
server during the run, whoever caused them).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
import torch
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError, RedisFailure, redis_error_text
from kvcli.model.presets import ModelSpec
from kvcli.model.threads import torch_threads
from kvcli.prefixkv import StatefulKV, resumable_tokens
from kvcli.store import cluster
from kvcli.store.chunkstore import ChunkStore, chunk_metadata, chunk_payload
from kvcli.store.hashing import ChunkedPrompt
from kvcli.store.judge import ACCOUNTED, MISSING, USABLE, WRONG_TYPE, judge
from kvcli.store.preflight import CHUNK_KEY_TAIL, Preflight, evicted_since, keys_bytes, preflight, server_memory
from kvcli.store.records import StoreConfig
from kvcli.store.serde import check_kv_dtype
from kvcli.traces.request import Request


# -- config and results ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WarmConfig:
    """Options of one warm run (frozen; built at the CLI edge). ``ttl`` in seconds; ``batch_bytes`` and
    ``batch_chunks``: the most value bytes and chunks one write batch holds; ``verify``: read present payloads and
    check their checksums (else their presence and length only).

    ``chunk_sizes`` is deduplicated (first occurrence kept): ``(16, 16)`` is one store, counted once.
    ``tokenizer`` is the tokenizer's identity (``Tokenizer.name``) that goes into the chunk hashes.
    ``kv_dtype``: the payloads' dtype when not the model's (``--kv-dtype fp8``: :mod:`kvcli.store.serde`).
    """

    namespace: str = "default"
    chunk_sizes: tuple[int, ...] = (16, 64, 256, 1024)
    tokenizer: str = "cl100k_base"
    ttl: int | None = None
    dry_run: bool = False
    strict: bool = False
    batch_bytes: int = 8 << 20
    batch_chunks: int = 64
    verify: bool = False
    kv_dtype: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_sizes", tuple(dict.fromkeys(self.chunk_sizes)))
        object.__setattr__(self, "kv_dtype", check_kv_dtype(self.kv_dtype))


@dataclass
class SizeTotals:
    """One chunk size's totals (counts; bytes). A chunk is "written" when this run wrote it (both its objects)."""

    chunk_size: int
    prompts: int = 0
    short_prompts: int = 0
    full_chunks: int = 0
    chunks_written: int = 0
    chunks_present: int = 0
    chunks_repaired: int = 0
    ttl_refreshed: int = 0
    objects_written: int = 0
    payload_objects: int = 0
    payload_bytes: int = 0
    header_bytes: int = 0
    metadata_bytes: int = 0

    @property
    def bytes(self) -> int:
        """Value bytes written: payload data + payload headers + metadata."""
        return self.payload_bytes + self.header_bytes + self.metadata_bytes

    def add(self, store: ChunkStore, meta_len: int) -> None:
        """Count one written chunk: its payload and its metadata (``meta_len`` bytes)."""
        self.chunks_written += 1
        self.objects_written += 2
        self.payload_objects += 1
        self.payload_bytes += store.config.payload_bytes
        self.header_bytes += store.config.header_bytes
        self.metadata_bytes += meta_len


@dataclass
class WarmResult:
    """What a warm run wrote (dry run: would write). ``stopped`` is "" or why it stopped early; tokens; seconds.

    ``evicted_keys``: keys the server evicted while the run wrote (INFO ``evicted_keys`` after minus before; None
    for a dry run, or when the counter could not be read afterwards). Above 0, what was written may be gone.
    """

    namespace: str
    model_id: str
    prompts: int
    per_size: list[SizeTotals]
    dry_run: bool
    preflight: Preflight
    tokens_prefilled: int = 0
    tokens_reused: int = 0
    seconds: float = 0.0
    compute_seconds: float = 0.0  # retrieving stored prefixes + prefill
    write_seconds: float = 0.0  # serializing + writing chunks (a round trip per batch; two without MULTI)
    stopped: str = ""
    estimate: list[SizeTotals] = field(default_factory=list)
    evicted_keys: int | None = None
    verify: bool = False  # present payloads were read and their checksums checked
    layout: str = "kvcli"  # the key layout written (kvcli.live.warm_lmcache for LMCache's)

    def total(self, name: str) -> int:
        """Sum of one :class:`SizeTotals` field (or ``"bytes"``) over chunk sizes."""
        return sum(getattr(t, name) for t in self.per_size)

    def to_dict(self) -> dict:
        """JSON-ready, with per-size and total ``bytes``."""
        out = dataclasses.asdict(self)
        for key in ("per_size", "estimate"):
            for row, tot in zip(out[key], getattr(self, key)):
                row["bytes"] = tot.bytes
        out["totals"] = {name: self.total(name) for name in (
            "chunks_written", "chunks_present", "chunks_repaired", "ttl_refreshed", "objects_written",
            "payload_bytes", "header_bytes", "metadata_bytes", "bytes")}
        return out


# -- plan (read-only) -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """One prompt under one store: chunks to write (ascending; each written whole), intact prefix, chunks found
    damaged (to be rewritten), and each chunk's metadata PTTL in ms (-2: no key, -1: no TTL)."""

    prompt: ChunkedPrompt
    write: tuple[int, ...]
    intact: int  # leading chunks that are present (real metadata and a payload)
    damaged: frozenset[int] = frozenset()
    pttl: tuple[int, ...] = ()


def make_stores(client: redis.Redis | RedisCluster, spec: ModelSpec, config: WarmConfig) -> list[ChunkStore]:
    """One :class:`ChunkStore` per chunk size: real payloads, the run's namespace, tokenizer and TTL."""
    return [ChunkStore(client, StoreConfig(config.namespace, cs, spec.model_id, config.tokenizer, spec.kv_shape,
                                           spec.dtype, ttl=config.ttl, kv_dtype=config.kv_dtype,
                                           state_shape=spec.state_shape))
            for cs in config.chunk_sizes]


def plan(store: ChunkStore, request: Request, planned: set[bytes] | None = None, verify: bool = False) -> _Plan:
    """Which of the prompt's full chunks are not present and intact (module docstring): one pipelined round trip
    (GET of each metadata value, STRLEN of each payload or GET with ``verify``, PTTL of each metadata), read-only.

    ``planned`` (dry run) holds hashes an earlier prompt of the run would write; they count as present.
    """
    prompt = store.chunk(request.prompt, request.hash_salt)
    if not prompt.hashes:
        return _Plan(prompt, (), 0)
    pipe = store.client.pipeline(transaction=False)
    for h in prompt.hashes:
        pipe.get(store.meta_key(h))
        (pipe.get if verify else pipe.strlen)(store.payload_key(h))
        pipe.pttl(store.meta_key(h))
    try:
        found = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        raise RedisFailure(f"Redis read failed: {redis_error_text(exc)}") from None
    for r in found:
        if isinstance(r, Exception) and "WRONGTYPE" not in str(r):
            raise RedisFailure(f"Redis read failed: {redis_error_text(r)}")
    write, damaged = [], set()
    for k, h in enumerate(prompt.hashes):
        if planned and h in planned:
            continue
        meta, payload = (WRONG_TYPE if isinstance(x, Exception) else x for x in found[3 * k:3 * k + 2])
        state = judge(meta, payload, prompt.digests[k], store.value_bytes, store.expected,
                      prompt.hexes[k - 1] if k else "")
        if state != USABLE:  # not present as this store writes it (accounted metadata included): written whole
            write.append(k)
            if not (state == MISSING or (state == ACCOUNTED and payload in (None, 0))):
                damaged.add(k)  # something is there, other than nothing or replay's metadata-only entry
    pttl = tuple(int(x) if isinstance(x, int) else -2 for x in found[2::3])
    return _Plan(prompt, tuple(write), write[0] if write else len(prompt.hashes), frozenset(damaged), pttl)


def estimate(stores: Sequence[ChunkStore], requests: Sequence[Request], verify: bool = False) -> list[SizeTotals]:
    """The dry run: what a real run would write now, per chunk size (exact counts and bytes). Read-only."""
    totals = []
    for store in stores:
        tot, planned = SizeTotals(store.config.chunk_size), set[bytes]()
        for request in requests:
            p = plan(store, request, planned, verify)
            _count_prompt(tot, p)
            for k in p.write:
                tot.add(store, len(chunk_metadata(store, p.prompt, k)))
            planned.update(p.prompt.hashes[k] for k in p.write)
        totals.append(tot)
    return totals


def _count_prompt(tot: SizeTotals, p: _Plan) -> None:
    tot.prompts += 1
    tot.short_prompts += not p.prompt.hashes
    tot.full_chunks += len(p.prompt.hashes)
    tot.chunks_present += len(p.prompt.hashes) - len(p.write)
    tot.chunks_repaired += len(p.damaged)


def plan_bytes(stores: Sequence[ChunkStore], planned: Sequence[SizeTotals]) -> int:
    """Redis memory the plan needs (:func:`kvcli.store.preflight.keys_bytes`: allocator-rounded values, keys,
    bookkeeping), bytes."""
    need = 0
    for store, tot in zip(stores, planned):
        key = len(store.prefix) + CHUNK_KEY_TAIL
        metas = tot.objects_written - tot.payload_objects
        need += keys_bytes(tot.payload_objects, key, store.config.payload_bytes + store.config.header_bytes)
        need += keys_bytes(metas, key, tot.metadata_bytes // max(metas, 1))
    return need


# -- run --------------------------------------------------------------------------------------------------------------
#: ``progress(chunks written, value bytes written, chunks planned, value bytes planned)``, after each batch.
Progress = Callable[[int, int, int, int], None]


def warm(client: redis.Redis | RedisCluster, requests: Sequence[Request], model, config: WarmConfig,
         progress: Progress | None = None, spec: ModelSpec | None = None,
         notify: Callable[[str], None] | None = None) -> WarmResult:
    """Warm ``requests`` into ``config.namespace`` for every chunk size (or only estimate it, ``dry_run``).

    Args:
        client: the server to fill.
        requests: prompts (``token_ids`` ``[tokens]`` uint32, ``cache_salt``), e.g. from :func:`read_prompts`.
        model: a ``LocalModel`` (``prefill``, ``model_id``, ``dtype``, ``config``); None for a dry run with ``spec``.
        progress: called once the plan is known, then after each stored batch (see :data:`Progress`).
        spec: the model's :class:`ModelSpec` (default: taken from ``model``).
        notify: called with one line before anything is written when the estimate does not fit.

    Returns:
        A :class:`WarmResult`; ``estimate`` is the dry-run plan checked before writing.

    Raises:
        RedisFailure: a read failed; or ``strict`` and the estimate does not fit the server's free memory.
        ChunkTooLargeError: a chunk's value exceeds the server's proto-max-bulk-len (before any write).
        BadInputError: a token id outside the model's vocabulary (before any write).
        ModelFailure: from the model.
    """
    t0 = time.perf_counter()
    spec = spec or model.spec
    stores = make_stores(client, spec, config)
    for store in stores:
        store.check_value_size()
    if model is not None and spec.state_shape:  # a hybrid model: its state at every boundary of every store
        model.state_chunk_sizes = tuple(config.chunk_sizes)
    if model is not None and not config.dry_run:
        _check_vocab(requests, model.config.vocab)
    planned = estimate(stores, requests, config.verify)
    before = server_memory(client)
    check = preflight(client, plan_bytes(stores, planned), before, writes_ttl=config.ttl is not None)
    per_size = planned if config.dry_run else [SizeTotals(s.config.chunk_size) for s in stores]
    result = WarmResult(config.namespace, spec.model_id, len(requests), per_size, config.dry_run, check,
                        estimate=planned, verify=config.verify)
    if check.fits is False and notify:
        notify(f"preflight: {check.message}")
    if config.strict and check.fits is False and not config.dry_run:
        raise RedisFailure(f"warm refused (--strict): {check.message}")
    if not config.dry_run:
        _run(stores, requests, model, config, result, progress, _transactions(client))
        result.evicted_keys = evicted_since(client, before)  # None when unreadable; the totals still say what
    result.seconds = time.perf_counter() - t0
    return result


def _check_vocab(requests: Sequence[Request], vocab: int) -> None:
    for r in requests:
        if len(r.token_ids) and int(r.token_ids.max()) >= vocab:
            path, _, line = r.source.rpartition(":")
            raise BadInputError(f"token id {int(r.token_ids.max())} is outside the model's vocabulary of {vocab}",
                                path or r.source, int(line) if line.isdigit() else None)


def _transactions(client) -> bool:
    """Whether warm's batches go as MULTI/EXEC transactions (:func:`kvcli.store.cluster.transactions`); False when
    the probe got no answer (the first batch then meets the same fault, and says so)."""
    try:
        return cluster.transactions(client)
    except cluster.REDIS_ERRORS:
        return False


def _run(stores, requests, model, config: WarmConfig, result: WarmResult, progress: Progress | None,
         atomic: bool) -> None:
    done = [0, 0, sum(t.chunks_written for t in result.estimate), sum(t.bytes for t in result.estimate)]
    if progress:
        progress(*done)
    for request in requests:
        plans = [plan(store, request, verify=config.verify) for store in stores]
        if not any(p.write for p in plans):
            for tot, p in zip(result.per_size, plans):
                _count_prompt(tot, p)
            continue
        t0 = time.perf_counter()
        kv, best, bad = _compute(stores, plans, request, model, result)
        if bad is not None and bad not in plans[best].write and (bad + 1) * stores[best].config.chunk_size \
                <= kv.shape[3]:  # its checksum failed when read back: rewritten from the KV just computed
            p = plans[best]
            plans[best] = dataclasses.replace(p, write=tuple(sorted(p.write + (bad,))), damaged=p.damaged | {bad},
                                              intact=min(p.intact, bad))
        for tot, p in zip(result.per_size, plans):
            _count_prompt(tot, p)
        t1 = time.perf_counter()
        result.compute_seconds += t1 - t0
        with torch_threads(1):  # chunk copies are small and memory-bound: other threads only add wake-ups
            for tot, store, p in zip(result.per_size, stores, plans):
                result.stopped = _write(store, p, kv, tot, config, done, progress, request, atomic)
                if result.stopped:
                    break
        result.write_seconds += time.perf_counter() - t1
        if result.stopped:
            return


def _compute(stores, plans, request: Request, model, result: WarmResult) -> tuple[torch.Tensor, int, int | None]:
    """KV ``[layers, 2, kv_heads, end, head_dim]`` (CPU) up to the last chunk to write: stored prefix + prefill;
    the store the prefix came from, and the chunk whose checksum failed when it was read back (or None)."""
    end = max((p.write[-1] + 1) * s.config.chunk_size for s, p in zip(stores, plans) if p.write)
    best = max(range(len(stores)), key=lambda i: plans[i].intact * stores[i].config.chunk_size)
    past, cs, bad = None, stores[best].config.chunk_size, None
    if plans[best].intact:  # fetch only the chunks that cover tokens [0, end)
        chunks = min(plans[best].intact, -(-end // cs))
        got = stores[best].retrieve(plans[best].prompt.head(chunks), request.hash_salt)
        past = None if got.kv is None else got.kv[:, :, :, :resumable_tokens(got.kv, _resume_limit(got.kv, stores,
                                                                                                     plans, end))]
        bad = got.hit_tokens // cs if got.break_reason == "checksum" else None
    reused = 0 if past is None else past.shape[3]
    result.tokens_reused += reused
    if past is not None and reused >= end:
        return past, best, bad
    result.tokens_prefilled += end - reused
    _, kv = model.prefill(request.token_ids[reused:end], past_kv=past if reused else None)
    return kv.cpu(), best, bad


def _resume_limit(kv, stores, plans, end: int) -> int:
    """The most tokens a stored prefix may cover: ``end``; for a hybrid model's (a StatefulKV), fewer than the first
    chunk end to write whose linear layers' state it lacks, so the prefill runs through that end and saves it."""
    if not isinstance(kv, StatefulKV):
        return end
    ends = [(k + 1) * s.config.chunk_size for s, p in zip(stores, plans) for k in p.write]
    return min([end] + [t - 1 for t in ends if t not in kv.states])


def _write(store: ChunkStore, p: _Plan, kv: torch.Tensor, tot: SizeTotals, config: WarmConfig,
           done: list[int], progress: Progress | None, request: Request, atomic: bool) -> str:
    """Write the plan's chunks in order, one batch at a time (:func:`_write_batch`); returns "" or why it stopped.

    Each chunk is written whole with plain SETs (payload, then metadata; ``EX ttl`` on both): a chunk that was
    half there, or had "accounted" metadata, gets metadata that matches the payload written and one TTL for both.
    """
    cfg, cs, created = store.config, store.config.chunk_size, int(time.time())
    per_batch = max(1, min(config.batch_chunks, config.batch_bytes // (cfg.payload_bytes + cfg.header_bytes)))
    refresh = _to_refresh(p, cfg.ttl)
    for start in range(0, len(p.write), per_batch):
        batch = p.write[start:start + per_batch]
        heads = [k for h in (refresh if start == 0 else ()) for k in (store.meta_key(p.prompt.hashes[h]),
                                                                      store.payload_key(p.prompt.hashes[h]))]
        chunks, metas = [], []
        for k in batch:
            value, checksum = chunk_payload(store, kv[:, :, :, k * cs:(k + 1) * cs])
            metas.append(chunk_metadata(store, p.prompt, k, checksum, created))
            chunks.append(((store.payload_key(p.prompt.hashes[k]), value),
                           (store.meta_key(p.prompt.hashes[k]), metas[-1])))
        stored, exc, left = _write_batch(store.client, heads, chunks, cfg.ttl, atomic)
        before = (tot.chunks_written, tot.bytes)
        tot.ttl_refreshed += len(refresh) if start == 0 and (stored or exc is None) else 0
        for meta in metas[:stored]:  # all of them, or a refused batch's stored prefix
            tot.add(store, len(meta))
        done[0] += tot.chunks_written - before[0]
        done[1] += tot.bytes - before[1]
        if exc is not None:
            first, last = batch[stored], batch[-1]
            chunks_text = f"chunk {first}" if first == last else f"chunks {first}-{last}"
            what = (f"the batch of {chunks_text} (tokens {first * cs}-{(last + 1) * cs}) of "
                    f"{request.source or request.id}")
            if isinstance(exc, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
                why = ("got no reply within the timeout" if isinstance(exc, redis.exceptions.TimeoutError)
                       else "lost its connection (after retries)")
                stored_as = ("that batch is stored whole or not at all (MULTI/EXEC)" if atomic else
                             "a prefix of that batch may be stored (payloads go before their metadata, so no chunk "
                             "has metadata without its payload)")
                return f"{what} at chunk size {cs} {why}: {_reason(exc)}; stopped there: {stored_as}, everything " \
                       f"before it is stored"
            kept = (f"; {len(left):,} keys it wrote after that could not be deleted again (UNLINK refused; "
                    f"no lookup reaches them): {', '.join(left[:2])}{', ...' if len(left) > 2 else ''}"
                    if left else "")
            return (f"the server refused {what} at chunk size {cs}: {_reason(exc)}; stopped there, everything "
                    f"before it is stored{kept}")
        if progress:
            progress(*done)
    return ""


def _write_batch(client, heads: list[str], chunks: list[tuple[tuple, tuple]], ttl: int | None, atomic: bool
                 ) -> cluster.PrefixWrite:
    """Store one batch ``[((payload key, value), (metadata key, value))]`` after giving ``heads`` (keys of the
    chain's present head) ``ttl`` seconds; returns what was stored (:class:`~kvcli.store.cluster.PrefixWrite`).

    :func:`kvcli.store.cluster.write_prefix`: one MULTI/EXEC where the server and user allow it (``atomic``), else
    the payloads, then the metadata, and on a refusal both halves of every chunk from the first refused one on
    deleted again: what is stored is a prefix of the chain (no gap), no metadata is without its payload, and the
    count is what the server ran (a user without MULTI, or allowed to write some keys only, is told the truth). The
    batch is sent and acknowledged whole before a Ctrl-C or SIGTERM acts (:func:`kvcli.store.cluster.uninterrupted`).
    """
    try:
        with cluster.uninterrupted():
            return cluster.write_prefix(client, chunks, ttl, heads, atomic)
    except cluster.REDIS_ERRORS as exc:  # a round trip failed: no reply, or the connection is gone
        return cluster.PrefixWrite(0, exc)


def _to_refresh(p: _Plan, ttl: int | None) -> list[int]:
    """Present chunks before the last one written whose TTL is shorter than ``ttl``: the new tail depends on them,
    so they get ``ttl`` too (a chain's head never expires before its tail). Chunks without a TTL keep none."""
    if ttl is None or not p.write or not p.pttl:
        return []
    todo = set(p.write)
    return [k for k in range(p.write[-1]) if k not in todo and 0 <= p.pttl[k] < ttl * 1000]


def _reason(exc: Exception) -> str:
    """The server's own words for a refused batch, without redis-py's echo of the command or any value bytes."""
    text = str(exc)
    text = text.split(" caused error: ", 1)[1] if " caused error: " in text else text
    text = redis_error_text(RuntimeError(text)).strip().rstrip(".")
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        text = f"OOM, {text}"
    return text or type(exc).__name__
