"""Replay a trace through the chunk-hash KV-cache store, one namespace per chunk size, and account what it saves.

Per request, in trace order, for every chunk size: lookup (one round trip), retrieve the hit run's KV (one more),
prefill only the missed suffix with the real model, store the new full chunks (one pipelined round trip).

Measured vs estimated: ``measure`` requests (spread evenly over the trace, prompts up to ``measure_max_tokens``)
run the model: their full prefill is timed once, and per chunk size the cached path (lookup + transfer +
deserialize + suffix prefill, plus the store) is timed for real, with the largest logit difference against the
full prefill recorded. The other requests do the real lookup and write real metadata, but their payload bytes are
accounted, not written, and their prefill times come from a cost curve fitted to every prefill timed in the same
run (calibration + measured requests), their transfer times from chunk SET/GET timings calibrated on the same
server. When a measured request hits chunks whose payload was only accounted, their KV is taken from its own full
prefill and written first, untimed ("materialized"), so the timed retrieve reads real bytes.

``payload="accounted"`` writes no payload at all (index and metadata only): traces whose KV would never fit the
server replay in seconds; measured requests then use their own prefix KV and an estimated transfer time.

Hit tokens never exceed the prompt: only full chunks hit. A request needs at least one token of compute for its
logits, so a prompt that hits entirely reuses ``len - 1`` tokens in the timing (vLLM recomputes the last token).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import redis

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve, PrefillSample
from kvcli.model.presets import ModelSpec
from kvcli.replay.measure import calibrate_transfer, curve_check, pick_measured, timed_prefill
from kvcli.replay.results import ChunkSizeResult, ReplayConfig, TraceResult
from kvcli.replay.upper_bound import RadixUpperBound
from kvcli.store import cluster
from kvcli.store.batch import drain, lookup_and_store
from kvcli.store.chunkstore import ChunkStore, StoreConfig
from kvcli.store.namespace import purge, redis_memory
from kvcli.traces.request import Request


@dataclass(frozen=True)
class ReplayPlan:
    """What every part of one trace's replay shares (``--jobs`` sends it to each worker process).

    Attributes:
        name: the trace (file name).
        namespace: the run's own fresh namespace (one per trace; every chunk size under its own key prefix).
        measured: indices of the requests that run the model.
        lengths: prompt lengths (tokens) when the trace was read ahead (the model runs on some requests), else None.
    """

    name: str
    namespace: str
    measured: frozenset[int]
    lengths: np.ndarray | None


@dataclass
class _Pending:
    """Unmeasured requests' (new tokens, cached tokens, hit chunks, new chunks), estimated at the end."""

    prompt: list[int] = field(default_factory=list)
    reuse: list[int] = field(default_factory=list)
    hit_chunks: list[int] = field(default_factory=list)
    new_chunks: list[int] = field(default_factory=list)


class Replayer:
    """Replays traces through one :class:`ChunkStore` per chunk size on one Redis server.

    Args:
        client: a redis-py client.
        model: the local model (``prefill``, ``spec``), or None when nothing is measured (then ``spec`` names
            the model id, per-token KV shape and dtype the store accounts for).
        curve: the prefill cost curve (fitted to calibration points, min of repeats, in the same run); the
            measured requests' single timings are kept in ``measured_samples`` to check it, not fitted (one noisy
            timing per point would drag the fit around: see MEASURED.md on this machine's stalls).
        tokenizer: tokenizer name (part of the hash root).
    """

    def __init__(self, client: redis.Redis, model, curve: CostCurve, tokenizer: str, config: ReplayConfig,
                 spec: ModelSpec | None = None) -> None:
        self.client, self.model, self.curve, self.tokenizer, self.config = client, model, curve, tokenizer, config
        spec = model.spec if model is not None else spec
        self.model_id, self.kv_shape, self.dtype = spec.model_id, spec.kv_shape, spec.dtype
        self.measured_samples: list[PrefillSample] = []  # timings of real requests: for checking the curve
        self._samples_seen = 0

    # -- public ---------------------------------------------------------------------------------------------------
    def replay(self, name: str, requests: list[Request] | Callable[[], Iterable[Request]],
               progress: Callable[[int, int | None], None] | None = None) -> TraceResult:
        """Replay one trace. ``requests`` is a list or a zero-argument callable returning a fresh iterator. When
        the model runs on some requests, the trace is read twice: once to validate it (vocabulary) and choose the
        measured requests, before anything is written, then to replay it; otherwise once. ``progress(done, total)``
        is called after each request (``total`` None when the trace was not read ahead).

        Raises:
            BadInputError: a token id is outside the model's vocabulary (before any write); no requests.
            ChunkTooLargeError: a chunk's value exceeds the server's proto-max-bulk-len (before any write).
            RedisFailure, ModelFailure: the server or the model failed.
        """
        reader = (lambda: iter(requests)) if isinstance(requests, list) else requests
        plan = self.plan(name, reader)
        try:
            return self.run(plan, reader, progress)
        except BaseException:  # Ctrl-C or SIGTERM can stop a write half sent: purge over fresh connections
            cluster.drop_connections(self.client)
            raise
        finally:  # also on Ctrl-C or an error: the run's namespace is its own, never left behind
            if not self.config.keep:
                purge(self.client, plan.namespace)

    def plan(self, name: str, reader: Callable[[], Iterable[Request]]) -> ReplayPlan:
        """What every part of one trace's replay shares: its fresh namespace and, when the model runs on some
        requests, the prompt lengths and the measured requests (one validating pass over the trace, before any
        write). Raises BadInputError (repeated chunk sizes, a token id outside the vocabulary, no requests)."""
        cfg = self.config
        if len(set(cfg.chunk_sizes)) != len(cfg.chunk_sizes):
            raise BadInputError(f"chunk sizes repeat: {','.join(map(str, cfg.chunk_sizes))}")
        namespace = f"replay-{int(time.time())}-{os.getpid()}-{os.urandom(3).hex()}"
        if self.model is None or cfg.measure == 0:
            return ReplayPlan(name, namespace, frozenset(), None)
        lengths = self._validate(reader, name)
        measured = pick_measured(lengths, cfg.measure, cfg.measure_max_tokens, cfg.seed)
        return ReplayPlan(name, namespace, frozenset(measured), lengths)

    def run(self, plan: ReplayPlan, reader: Callable[[], Iterable[Request]],
            progress: Callable[[int, int | None], None] | None = None, chunk_sizes: tuple[int, ...] | None = None,
            upper_bound: bool | None = None, stats: dict | None = None) -> TraceResult:
        """Replay the trace under ``plan`` for ``chunk_sizes`` (default: the config's) into ``plan.namespace``,
        computing the token-granular upper bound when ``upper_bound`` (default: the config's). Deletes nothing:
        :meth:`replay` purges the namespace afterwards (``--jobs``: the parent, once every part is done).
        ``stats``, when given, receives ``count`` (requests read) and ``longest`` (tokens)."""
        cfg = self.config
        stores = [self._make_store(plan.namespace, cs) for cs in (chunk_sizes or cfg.chunk_sizes)]
        for store in stores:
            if cfg.payload == "real":
                store.check_value_size()
        return self._run(plan, reader, stores, progress, cfg.upper_bound if upper_bound is None else upper_bound,
                         stats if stats is not None else {})

    def _run(self, plan: ReplayPlan, reader, stores, progress, upper_bound: bool, stats: dict) -> TraceResult:
        cfg = self.config
        unlimited = [set() if store.resident_chunks is not None else None for store in stores]
        rates = [calibrate_transfer(self.client, store) for store in stores]
        used_before = cluster.used_memory(self.client)
        results = [ChunkSizeResult(store.config.chunk_size, store.config.namespace) for store in stores]
        pending = [_Pending() for _ in stores]
        radix = RadixUpperBound() if upper_bound else None
        t0 = time.perf_counter()
        skipped = count = longest = 0
        total = len(plan.lengths) if plan.lengths is not None else None
        limit = total if total is not None else cfg.limit
        batch: list[tuple[Request, int]] = []  # estimated requests waiting for one pipelined round trip
        width = max(1, cfg.pipeline)
        try:
            for index, request in enumerate(reader()):
                if limit is not None and index >= limit:
                    break
                n = len(request.token_ids)
                count, longest = count + 1, max(longest, n)
                if n == 0:
                    skipped += 1
                else:
                    upper = radix.match_and_insert(request.token_ids, request.cache_salt) if radix else 0
                    if index in plan.measured:
                        self._estimated(batch, stores, results, pending, unlimited, drained=True)
                        self._measured(request, stores, results, rates, unlimited, upper)
                    else:
                        batch.append((request, upper))
                        if len(batch) >= width:
                            self._estimated(batch, stores, results, pending, unlimited)
                if progress:
                    progress(index + 1, total)
            self._estimated(batch, stores, results, pending, unlimited, drained=True)
        except BaseException:  # writes still in flight are acknowledged first, so a purge after this sees them
            with cluster.uninterrupted():
                for store in stores:
                    with contextlib.suppress(Exception):
                        drain(store)
            raise
        if count == 0:
            raise BadInputError("the trace holds no requests", path=plan.name)
        for store, res, pend, rate in zip(stores, results, pending, rates):
            self._finish(store, res, pend, rate)
        used_after = cluster.used_memory(self.client)
        requests = count - skipped
        stats.update(count=count, longest=longest)
        return TraceResult(plan.name, requests, skipped, len(plan.measured),
                           _payload_label(cfg.payload, len(plan.measured), requests), results,
                           used_after - used_before, time.perf_counter() - t0,
                           notes=self._notes(longest, count, len(plan.measured)))

    def _notes(self, longest: int, count: int, measured: int) -> list[str]:
        """:func:`notes_for` this trace's measured prefills."""
        samples = self.measured_samples[self._samples_seen:]
        self._samples_seen = len(self.measured_samples)
        return notes_for(self.curve, samples, longest, count, measured)

    # -- passes ---------------------------------------------------------------------------------------------------
    def _validate(self, reader, name: str) -> np.ndarray:
        lengths = []
        vocab = self.model.config.vocab if self.model is not None else None
        for request in reader():
            if self.config.limit is not None and len(lengths) >= self.config.limit:
                break
            tokens = request.token_ids
            if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
                raise BadInputError(f"token id {int(tokens.max())} is outside the model's vocabulary of {vocab}",
                                    *_where(request))
            lengths.append(len(tokens))
        if not lengths:
            raise BadInputError("the trace holds no requests", path=name)
        return np.asarray(lengths, dtype=np.int64)

    def _make_store(self, namespace: str, chunk_size: int) -> ChunkStore:
        cfg = self.config
        return ChunkStore(self.client, StoreConfig(
            namespace=namespace, chunk_size=chunk_size, model_id=self.model_id, tokenizer=self.tokenizer,
            kv_shape=self.kv_shape, dtype=self.dtype, payload=cfg.payload, capacity_tokens=cfg.capacity_tokens,
            capacity_bytes=cfg.capacity_bytes, read_namespace=cfg.namespace))

    def _estimated(self, batch: list[tuple[Request, int]], stores, results, pending, unlimited,
                   drained: bool = False) -> None:
        """The batch's requests (``(request, upper bound tokens)``, in trace order): lookup, then store the missing
        chunks' metadata, per chunk size; ``config.pipeline`` requests per round trip (store/batch.py), or one by
        one (``pipeline`` 1). Empties ``batch``. ``drained``: wait until the server acknowledged every write
        (before anything else talks to it)."""
        if not batch:
            if drained:
                for store in stores:
                    drain(store)
            return
        for store, res, pend, seen in zip(stores, results, pending, unlimited):
            prompts = [store.chunk(r.token_ids, r.cache_salt) for r, _ in batch]
            if self.config.pipeline > 1:
                done = lookup_and_store(store, prompts)
            else:
                done = []
                for prompt in prompts:
                    look = store.lookup(prompt)
                    done.append((look, store.store(prompt, None, start_chunk=look.hit_chunks, lookup=look)))
            for (request, upper), prompt, (look, written) in zip(batch, prompts, done):
                n = len(request.token_ids)
                self._count(res, store, prompt, look, seen, n, upper)
                res.store_seconds += written.seconds
                pend.prompt.append(n)
                pend.reuse.append(min(look.hit_tokens, n - 1))
                pend.hit_chunks.append(look.hit_chunks)
                pend.new_chunks.append(len(prompt.hashes) - look.hit_chunks)
            if drained:
                drain(store)
        batch.clear()

    def _measured(self, request, stores, results, rates, unlimited, upper) -> None:
        tokens, n = request.token_ids, len(request.token_ids)
        t_full, (logits_full, kv_full) = timed_prefill(self.model, tokens, None)
        self.measured_samples.append(PrefillSample(n, 0, t_full))
        for store, res, rate, seen in zip(stores, results, rates, unlimited):
            prompt = store.chunk(tokens, request.cache_salt)
            look = store.lookup(prompt)
            past, hit_chunks = self._fetch(store, res, prompt, look, kv_full, rate)
            self._count(res, store, prompt, look, seen, n, upper, hit_chunks)  # hits = what was retrieved
            reuse = 0 if past is None else past.shape[3]
            if reuse == 0:  # no hit: the cached path is the full prefill itself, saving exactly 0
                kv, t_suffix = kv_full, t_full
            else:
                t_suffix, (logits, kv) = timed_prefill(self.model, tokens[reuse:], past)
                self.measured_samples.append(PrefillSample(n - reuse, reuse, t_suffix))
                res.max_logit_diff = max(res.max_logit_diff, float((logits[-1] - logits_full[-1]).abs().max()))
            real = self.config.payload == "real"
            written = store.store(prompt, kv if real else None, start_chunk=hit_chunks, lookup=look)
            res.store_seconds += written.seconds
            if not real:
                res.store_seconds_estimated += written.chunks_written * rate[0]
            res.measured_requests += 1
            res.full_prefill_seconds_measured += t_full
            res.suffix_prefill_seconds_measured += t_suffix
            res.saved_prefill_seconds_measured += t_full - t_suffix

    def _fetch(self, store, res, prompt, look, kv_full, rate):
        """KV of the reusable prefix ``[layers, 2, kv_heads, reuse, head_dim]`` and the hit chunk count."""
        n = len(prompt.tokens)
        if look.hit_chunks == 0:
            return None, 0
        if self.config.payload != "real":
            res.transfer_seconds_estimated += look.hit_chunks * rate[1]
            return kv_full[:, :, :, :min(look.hit_tokens, n - 1)], look.hit_chunks
        got = store.retrieve(prompt, lookup=look)
        start = end = got.hit_tokens // store.config.chunk_size
        while got.break_reason == "no-payload" and end < look.hit_chunks and _accounted(look.metadata[end]):
            end += 1  # payloads this run only accounted for (a chunk stored "real" that lost it is a real miss)
        if end > start:
            done = store.store(prompt, kv_full, start_chunk=start, end_chunk=end, overwrite=True)
            res.materialized_chunks += done.chunks_present
            got = store.retrieve(prompt, lookup=store.lookup(prompt, record=False))
        res.transfer_seconds_measured += got.transfer_seconds
        res.deserialize_seconds += got.deserialize_seconds
        res.serialized_bytes_read += got.payload_bytes + got.header_bytes
        if got.kv is None:
            return None, 0
        return got.kv[:, :, :, :min(got.hit_tokens, n - 1)], got.hit_tokens // store.config.chunk_size

    @staticmethod
    def _count(res, store, prompt, look, seen, n, upper, hit_chunks: int | None = None) -> None:
        hit_chunks = look.hit_chunks if hit_chunks is None else hit_chunks
        res.requests += 1
        res.prompt_tokens += n
        res.hit_tokens += hit_chunks * store.config.chunk_size
        res.chunks_hit += hit_chunks
        res.upper_bound_tokens += upper
        res.lookup_seconds += look.seconds
        if seen is None:
            res.hit_tokens_unlimited += hit_chunks * store.config.chunk_size
            return
        k = 0
        for h in prompt.hashes:
            if h not in seen:
                break
            k += 1
        res.hit_tokens_unlimited += k * store.config.chunk_size
        seen.update(prompt.hashes[k:])

    # -- calibration and totals -----------------------------------------------------------------------------------
    def _finish(self, store: ChunkStore, res: ChunkSizeResult, pend: _Pending, rate) -> None:
        st = store.stats
        if pend.prompt:
            n, reuse = np.asarray(pend.prompt), np.asarray(pend.reuse)
            saved = self.curve.predict(n, np.zeros_like(n)) - self.curve.predict(n - reuse, reuse)
            res.saved_prefill_seconds_estimated = float(np.sum(saved))
            set_s, get_s = rate
            res.transfer_seconds_estimated += float(np.sum(pend.hit_chunks) * get_s)
            res.store_seconds_estimated += float(np.sum(pend.new_chunks) * set_s)
        for name in ("objects_created", "metadata_entries", "chunks_written", "payload_bytes_written",
                     "payload_bytes_accounted", "header_bytes_written", "metadata_bytes_written", "round_trips",
                     "lookups", "evicted_chunks", "checksum_failures"):
            setattr(res, name, getattr(st, name))
        res.round_trips_by_shard = dict(sorted(store.shard_trips.counts.items()))
        if st.lookup_seconds:
            res.lookup_p50_seconds, res.lookup_p99_seconds = (
                float(x) for x in np.percentile(np.asarray(st.lookup_seconds), [50, 99]))
        res.lookups_pipelined, res.lookups_sampled = st.lookups_pipelined, st.lookups_sampled
        if st.lookups_pipelined and st.lookup_seconds:  # their latency one by one: the sampled lookups' mean
            res.lookup_seconds += st.lookups_pipelined * float(np.mean(st.lookup_seconds))
        known = res.metadata_entries - res.evicted_chunks if store.config.payload == "accounted" else None
        res.redis_memory_bytes, res.redis_memory_sampled_keys = redis_memory(
            self.client, store.config.namespace, store.config.chunk_size, self.config.memory_sample, known)


def notes_for(curve: CostCurve, samples: list[PrefillSample], longest: int, count: int, measured: int) -> list[str]:
    """Warnings a reader of the report needs: estimates far from what was measured (``samples``), or prompts
    (``longest`` tokens, ``count`` requests, ``measured`` of them run) far outside the range the cost curve was
    fitted on."""
    notes = []
    check = curve_check(curve, samples)
    ratio = check.get("median_measured_over_predicted")
    if ratio is not None and not 0.5 <= ratio <= 2.0:
        notes.append(f"measured prefills took {ratio:.2f}x what the cost curve predicts (median of "
                     f"{check['samples']}): the machine was busy or the curve is off; estimates are unreliable")
    fitted = curve.max_tokens
    if fitted and longest > 4 * fitted and measured < count:
        notes.append(f"prompts reach {longest:,} tokens but the cost curve was fitted up to {fitted:,}: "
                     f"estimated savings of long prompts are extrapolated")
    return notes


def _accounted(metadata: bytes) -> bool:
    """Whether a chunk's metadata says its payload was accounted, not written (layout.py)."""
    return b'"stored":"accounted"' in metadata


def _payload_label(mode: str, measured: int, requests: int) -> str:
    if mode == "accounted":
        return "accounted: index and metadata only, payload bytes counted"
    if measured >= requests:
        return "real"
    return f"real for {measured} measured requests, accounted for {requests - measured} estimated"


def _where(request: Request) -> tuple[str | None, int | None]:
    path, _, line = request.source.rpartition(":")
    return (path, int(line)) if line.isdigit() else (request.source or None, None)


