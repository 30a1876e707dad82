"""Warm a live cache in one of LMCache's layouts: compute prompts' KV with the local model and store their full
chunks as LMCache's own connector would (``lmcache``: ``redis://``, ``lmcache-resp``: ``resp://``, ``lmcache-mp``:
multiprocess mode; the stores of :mod:`kvcli.store.lmcache_store`, the same keys, values and metadata records).

The same prompts, chunk sizes and model as :func:`kvcli.live.warm.warm`, with LMCache's rule for what is there:

* **Present** is the hit run of LMCache's lookup (``lmcache``: ``EXISTS <key>metadata`` per chunk up to the first
  miss; the one-key layouts: ``EXISTS`` of every chunk key in one batch, the leading run). Every chunk after it is
  written, present or not, as LMCache's store writes everything after the hit run; chunks in the run are neither
  recomputed nor rewritten. LMCache keeps no token digest or checksum, so nothing in the run is checked further.
* **Prefill only what is missing**: the longest hit run (over the chunk sizes) is retrieved and passed as
  ``past_kv``; a value that cannot be read back (an accounted chunk, a wrong length, a record for another shape)
  ends the reused prefix there.
* **Dry run**: the same plan, read-only (a chunk an earlier prompt would write counts as present for later ones).

Refused, as LMCache's Redis backends have no counterpart: ``--ttl`` (LMCache sets none), ``--verify`` (no
checksum to verify), ``--kv-dtype fp8`` (kvcli's scaled payload) and a hybrid model's state (:class:`~kvcli.store.
lmcache_store.LMCacheStore` says why). Keys are named ``{namespace}/{chunk_size}/{model id}@...`` (a replay's
naming), so ``kvcli purge --namespace NS --layout LAYOUT`` deletes exactly them. A write the server refuses stops
the run there; :attr:`~kvcli.live.warm.WarmResult.stopped` says why and the totals say what was written before.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import redis
import torch
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError, RedisFailure
from kvcli.live.warm import Progress, SizeTotals, WarmConfig, WarmResult
from kvcli.model.presets import ModelSpec
from kvcli.store.lmcache import LMCACHE_LAYOUTS
from kvcli.store.lmcache_store import LMCACHE_STORES, LMCacheStore
from kvcli.store.preflight import evicted_since, keys_bytes, preflight, server_memory
from kvcli.store.records import StoreConfig
from kvcli.traces.request import Request


def make_lmcache_stores(client: redis.Redis | RedisCluster, spec: ModelSpec, config: WarmConfig,
                        layout: str) -> list[LMCacheStore]:
    """One store of ``layout`` per chunk size: the run's namespace, model and tokenizer.

    Raises:
        BadInputError: a layout that is not LMCache's, or an option it refuses (module docstring).
    """
    if layout not in LMCACHE_LAYOUTS:
        raise BadInputError(f"--layout must be kvcli or one of {', '.join(LMCACHE_LAYOUTS)}, got {layout!r}")
    if config.verify:
        raise BadInputError(f"--verify checks kvcli's payload checksums; --layout {layout} keeps none")
    return [LMCACHE_STORES[layout](client, StoreConfig(config.namespace, cs, spec.model_id, config.tokenizer,
                                                       spec.kv_shape, spec.dtype, ttl=config.ttl,
                                                       kv_dtype=config.kv_dtype, state_shape=spec.state_shape))
            for cs in config.chunk_sizes]


def _present(store: LMCacheStore, request: Request, planned: set[bytes] | None) -> tuple[int, int]:
    """``(chunks in the hit run, full chunks)`` of one prompt in one store (read-only); ``planned`` (dry run):
    hashes an earlier prompt would write, which extend the run."""
    prompt = store.chunk(request.prompt, request.cache_salt)
    k = store.lookup(prompt, record=False).hit_chunks
    while planned is not None and k < len(prompt.hashes) and prompt.hashes[k] in planned:
        k += 1
    return k, len(prompt.hashes)


def _count(tot: SizeTotals, store: LMCacheStore, hit: int, n: int, written: int) -> None:
    """One prompt in one store: ``written`` chunks of ``n`` written after a hit run of ``hit``."""
    tot.prompts += 1
    tot.short_prompts += n == 0
    tot.full_chunks += n
    tot.chunks_present += hit
    tot.chunks_written += written
    tot.objects_written += written * store.objects_per_chunk
    tot.payload_objects += written
    tot.payload_bytes += written * store.config.payload_bytes
    tot.metadata_bytes += written * store.metadata_bytes_per_chunk


def estimate_lmcache(stores: Sequence[LMCacheStore], requests: Sequence[Request]) -> list[SizeTotals]:
    """The dry run: what a real run would write now, per chunk size (exact counts and bytes). Read-only."""
    totals = []
    for store in stores:
        tot, planned = SizeTotals(store.config.chunk_size), set[bytes]()
        for request in requests:
            hit, n = _present(store, request, planned)
            _count(tot, store, hit, n, n - hit)
            planned.update(store.chunk(request.prompt, request.cache_salt).hashes[hit:])
        totals.append(tot)
    return totals


def warm_lmcache(client: redis.Redis | RedisCluster, requests: Sequence[Request], model, config: WarmConfig,
                 layout: str, progress: Progress | None = None, spec: ModelSpec | None = None) -> WarmResult:
    """Warm ``requests`` into ``config.namespace`` in LMCache's ``layout`` for every chunk size (or only estimate
    it, ``dry_run``); see the module docstring.

    Args:
        model: a ``LocalModel`` (``prefill``, ``spec``); None for a dry run with ``spec``.
        progress: called once the plan is known, then after each prompt (:data:`kvcli.live.warm.Progress`).

    Raises:
        BadInputError: an option the layout refuses; a token id outside the model's vocabulary.
        RedisFailure: a read failed; or ``strict`` and the estimate does not fit the server's free memory.
        ChunkTooLargeError: a chunk's value exceeds the server's proto-max-bulk-len (before any write).
    """
    t0 = time.perf_counter()
    spec = spec or model.spec
    stores = make_lmcache_stores(client, spec, config, layout)
    for store in stores:
        store.check_value_size()
    planned = estimate_lmcache(stores, requests)
    need = sum(keys_bytes(t.payload_objects, int(s.key_bytes_per_chunk), s.config.payload_bytes)
               + keys_bytes(t.objects_written - t.payload_objects, int(s.key_bytes_per_chunk),
                            s.metadata_bytes_per_chunk) for s, t in zip(stores, planned))
    before = server_memory(client)
    check = preflight(client, need, before)
    per_size = planned if config.dry_run else [SizeTotals(s.config.chunk_size) for s in stores]
    result = WarmResult(config.namespace, spec.model_id, len(requests), per_size, config.dry_run, check,
                        estimate=planned, layout=layout)
    if config.strict and check.fits is False and not config.dry_run:
        raise RedisFailure(f"warm refused (--strict): {check.message}")
    if not config.dry_run:
        if model is not None:
            _check_vocab(requests, model.config.vocab)
        _run(stores, requests, model, result, progress)
        result.evicted_keys = evicted_since(client, before)
    result.seconds = time.perf_counter() - t0
    return result


def _check_vocab(requests: Sequence[Request], vocab: int) -> None:
    for r in requests:
        if len(r.token_ids) and int(r.token_ids.max()) >= vocab:
            raise BadInputError(f"token id {int(r.token_ids.max())} is outside the model's vocabulary of {vocab}",
                                r.source or None)


def _run(stores: Sequence[LMCacheStore], requests: Sequence[Request], model, result: WarmResult,
         progress: Progress | None) -> None:
    done = [0, 0, sum(t.chunks_written for t in result.estimate), sum(t.bytes for t in result.estimate)]
    if progress:
        progress(*done)
    for request in requests:
        plans = [_present(store, request, None) for store in stores]
        if all(hit == n for hit, n in plans):
            for tot, store, (hit, n) in zip(result.per_size, stores, plans):
                _count(tot, store, hit, n, 0)
            continue
        t0 = time.perf_counter()
        kv = _compute(stores, plans, request, model, result)
        t1 = time.perf_counter()
        result.compute_seconds += t1 - t0
        for tot, store, (hit, n) in zip(result.per_size, stores, plans):
            try:
                wrote = store.store(request.prompt, kv, request.cache_salt, start_chunk=hit, end_chunk=n)
            except RedisFailure as exc:
                _count(tot, store, hit, n, 0)
                result.stopped = (f"the server refused chunks {hit}-{n - 1} of {request.source or request.id} at "
                                  f"chunk size {store.config.chunk_size}: {exc}; stopped there, everything before "
                                  f"it is stored")
                break
            _count(tot, store, hit, n, n - hit)  # every chunk after the hit run, new or not (LMCache's rule)
            done[0] += n - hit
            done[1] += wrote.payload_bytes + wrote.metadata_bytes
        result.write_seconds += time.perf_counter() - t1
        if progress:
            progress(*done)
        if result.stopped:
            return


def _compute(stores: Sequence[LMCacheStore], plans: list[tuple[int, int]], request: Request, model,
             result: WarmResult) -> torch.Tensor:
    """KV ``[layers, 2, kv_heads, end, head_dim]`` (CPU) up to the last chunk to write: the longest hit run read
    back (as far as its values read back), then the prefill of the rest."""
    end = max(n * s.config.chunk_size for s, (hit, n) in zip(stores, plans) if hit < n)
    best = max(range(len(stores)), key=lambda i: plans[i][0] * stores[i].config.chunk_size)
    past = None
    if plans[best][0]:
        got = stores[best].retrieve(request.prompt, request.cache_salt)
        if got.kv is not None:
            past = got.kv[:, :, :, :min(got.hit_tokens, end)]
    reused = 0 if past is None else past.shape[3]
    result.tokens_reused += reused
    if past is not None and reused >= end:
        return past
    result.tokens_prefilled += end - reused
    _, kv = model.prefill(request.token_ids[reused:end], past_kv=past if reused else None)
    return kv.cpu()

