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

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import redis

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve, PrefillSample
from kvcli.model.presets import ModelSpec
from kvcli.replay.upper_bound import RadixUpperBound
from kvcli.store.chunkstore import ChunkStore, StoreConfig
from kvcli.store.layout import key_prefix
from kvcli.store.namespace import purge
from kvcli.traces.request import Request


@dataclass(frozen=True)
class ReplayConfig:
    """Options of one replay (frozen; built at the CLI edge).

    Attributes:
        chunk_sizes: chunk sizes to compare (tokens), each in its own namespace.
        payload: "real" (measured requests write and read real KV) or "accounted" (no payload is ever written).
        measure: requests per trace that run the model (None: all of them).
        measure_max_tokens: longest prompt picked for measuring (tokens); longer ones are estimated.
        capacity_tokens / capacity_bytes: LRU capacity per chunk size (None: unlimited).
        namespace: an existing namespace (e.g. one ``kvcli warm`` filled) whose chunks count as hits; it is only
            read, never written. None: a cold cache. Either way the run writes into a fresh namespace of its own.
        keep: keep the run's own namespace (its keys) on the server after the report; deleted by default.
        limit: replay only the first N requests of each trace.
        memory_sample: keys per chunk size sampled with MEMORY USAGE.
        seed: seed for picking measured requests.
        upper_bound: compute the token-granular upper bound (a radix tree holding each distinct token run once,
            4 bytes per token: the one part of a replay whose memory grows with the trace).
    """

    chunk_sizes: tuple[int, ...] = (16, 64, 256, 1024)
    payload: str = "real"
    measure: int | None = 2
    measure_max_tokens: int = 512
    capacity_tokens: int | None = None
    capacity_bytes: int | None = None
    namespace: str | None = None
    keep: bool = False
    limit: int | None = None
    memory_sample: int = 200
    seed: int = 0
    upper_bound: bool = True


@dataclass
class ChunkSizeResult:
    """Everything measured for one chunk size (tokens, bytes, seconds, counts)."""

    chunk_size: int
    namespace: str
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_unlimited: int = 0
    upper_bound_tokens: int = 0
    chunks_hit: int = 0
    objects_created: int = 0
    metadata_entries: int = 0
    chunks_written: int = 0
    payload_bytes_written: int = 0
    payload_bytes_accounted: int = 0
    header_bytes_written: int = 0
    metadata_bytes_written: int = 0
    serialized_bytes_read: int = 0
    redis_memory_bytes: int = 0
    redis_memory_sampled_keys: int = 0
    round_trips: int = 0
    lookups: int = 0
    lookup_p50_ms: float = 0.0
    lookup_p99_ms: float = 0.0
    evicted_chunks: int = 0
    materialized_chunks: int = 0
    checksum_failures: int = 0
    measured_requests: int = 0
    full_prefill_seconds_measured: float = 0.0
    suffix_prefill_seconds_measured: float = 0.0
    saved_prefill_seconds_measured: float = 0.0
    saved_prefill_seconds_estimated: float = 0.0
    lookup_seconds: float = 0.0
    transfer_seconds_measured: float = 0.0
    transfer_seconds_estimated: float = 0.0
    deserialize_seconds: float = 0.0
    store_seconds: float = 0.0
    store_seconds_estimated: float = 0.0
    max_logit_diff: float = 0.0

    @property
    def hit_token_ratio(self) -> float:
        """hit tokens / prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def saved_prefill_seconds(self) -> float:
        """Prefill compute saved, measured + estimated (seconds)."""
        return self.saved_prefill_seconds_measured + self.saved_prefill_seconds_estimated

    @property
    def overhead_seconds(self) -> float:
        """Lookup + transfer + deserialize + store (management) seconds."""
        return (self.lookup_seconds + self.transfer_seconds_measured + self.transfer_seconds_estimated
                + self.deserialize_seconds + self.store_seconds + self.store_seconds_estimated)

    @property
    def net_benefit_seconds(self) -> float:
        """Saved prefill compute − lookup, transfer and management overhead (seconds): the design notes' goal."""
        return self.saved_prefill_seconds - self.overhead_seconds

    def to_dict(self) -> dict:
        """All fields plus the derived ratios and totals, JSON-ready."""
        out = dict(self.__dict__)
        out.update(hit_token_ratio=self.hit_token_ratio, saved_prefill_seconds=self.saved_prefill_seconds,
                   overhead_seconds=self.overhead_seconds, net_benefit_seconds=self.net_benefit_seconds,
                   loss_to_chunking_tokens=self.upper_bound_tokens - self.hit_tokens_unlimited,
                   upper_bound_ratio=self.upper_bound_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                   hit_token_ratio_unlimited=(self.hit_tokens_unlimited / self.prompt_tokens
                                              if self.prompt_tokens else 0.0))
        return out


@dataclass
class TraceResult:
    """One trace's replay: per chunk size results, the recommendation and run-level facts."""

    trace: str
    requests: int
    skipped_empty: int
    measured_requests: int
    payload: str
    per_chunk_size: list[ChunkSizeResult]
    used_memory_delta_bytes: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def recommended_chunk_size(self) -> int | None:
        """The chunk size with the largest net benefit; None when no chunk size has a positive net benefit."""
        rows = [r for r in self.per_chunk_size if r.requests and r.net_benefit_seconds > 0]
        return max(rows, key=lambda r: r.net_benefit_seconds).chunk_size if rows else None


@dataclass
class _Pending:
    """Unmeasured requests' (new tokens, cached tokens, hit chunks, new chunks), estimated at the end."""

    prompt: list[int] = field(default_factory=list)
    reuse: list[int] = field(default_factory=list)
    hit_chunks: list[int] = field(default_factory=list)
    new_chunks: list[int] = field(default_factory=list)


def pick_measured(lengths: np.ndarray, count: int | None, max_tokens: int, seed: int) -> set[int]:
    """Indices of the requests that run the model: ``count`` of those with 1..max_tokens tokens, evenly spread.

    ``count`` None picks every non-empty request. Deterministic for a seed (a seeded jitter inside each stride).
    """
    if count is None:
        return set(np.flatnonzero(lengths > 0).tolist())
    eligible = np.flatnonzero((lengths > 0) & (lengths <= max_tokens))
    if count <= 0 or eligible.size == 0:
        return set()
    if count >= eligible.size:
        return set(eligible.tolist())
    edges = np.linspace(0, eligible.size, count + 1)
    rng = np.random.default_rng(seed)
    picks = [int(eligible[int(lo + rng.random() * (hi - lo))]) for lo, hi in zip(edges[:-1], edges[1:])]
    return set(picks)


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
               progress: Callable[[int, int], None] | None = None) -> TraceResult:
        """Replay one trace. ``requests`` is a list or a zero-argument callable returning a fresh iterator (the
        trace is read twice: once to validate it and choose measured requests, before anything is written, then
        to replay it). ``progress(done, total)`` is called after each request.

        Raises:
            BadInputError: a token id is outside the model's vocabulary (before any write).
            ChunkTooLargeError: a chunk's value exceeds the server's proto-max-bulk-len (before any write).
            RedisFailure, ModelFailure: the server or the model failed.
        """
        cfg = self.config
        if len(set(cfg.chunk_sizes)) != len(cfg.chunk_sizes):
            raise BadInputError(f"chunk sizes repeat: {','.join(map(str, cfg.chunk_sizes))}")
        reader = (lambda: iter(requests)) if isinstance(requests, list) else requests
        lengths = self._validate(reader, name)
        measured = pick_measured(lengths, cfg.measure if self.model is not None else 0, cfg.measure_max_tokens,
                                 cfg.seed)
        namespace = f"replay-{int(time.time())}-{os.getpid()}-{os.urandom(3).hex()}"
        stores = [self._make_store(namespace, cs) for cs in cfg.chunk_sizes]
        for store in stores:
            if cfg.payload == "real":
                store.check_value_size()
        try:
            return self._run(name, reader, lengths, measured, stores, progress)
        finally:  # also on Ctrl-C or an error: the run's namespace is its own, never left behind
            if not cfg.keep:
                purge(self.client, namespace)

    def _run(self, name, reader, lengths, measured, stores, progress) -> TraceResult:
        cfg = self.config
        unlimited = [set() if store.resident_chunks is not None else None for store in stores]
        rates = [self._calibrate_transfer(store) for store in stores]
        used_before = int(self.client.info("memory").get("used_memory", 0))
        results = [ChunkSizeResult(store.config.chunk_size, store.config.namespace) for store in stores]
        pending = [_Pending() for _ in stores]
        radix = RadixUpperBound() if cfg.upper_bound else None
        t0 = time.perf_counter()
        skipped = 0
        for index, request in enumerate(reader()):
            if index >= len(lengths):
                break
            if len(request.token_ids) == 0:
                skipped += 1
            else:
                upper = radix.match_and_insert(request.token_ids, request.cache_salt) if radix else 0
                if index in measured:
                    self._measured(request, stores, results, rates, unlimited, upper)
                else:
                    self._estimated(request, stores, results, pending, unlimited, upper)
            if progress:
                progress(index + 1, len(lengths))
        for store, res, pend, rate in zip(stores, results, pending, rates):
            self._finish(store, res, pend, rate)
        used_after = int(self.client.info("memory").get("used_memory", 0))
        requests = len(lengths) - skipped
        return TraceResult(name, requests, skipped, len(measured),
                           _payload_label(cfg.payload, len(measured), requests), results,
                           used_after - used_before, time.perf_counter() - t0,
                           notes=self._notes(lengths, measured))

    def _notes(self, lengths: np.ndarray, measured: set[int]) -> list[str]:
        """Warnings a reader of the report needs: estimates far from what was measured, or far outside the
        range the cost curve was fitted on."""
        notes = []
        check = curve_check(self.curve, self.measured_samples[self._samples_seen:])
        self._samples_seen = len(self.measured_samples)
        ratio = check.get("median_measured_over_predicted")
        if ratio is not None and not 0.5 <= ratio <= 2.0:
            notes.append(f"measured prefills took {ratio:.2f}x what the cost curve predicts (median of "
                         f"{check['samples']}): the machine was busy or the curve is off; estimates are unreliable")
        fitted = self.curve.max_tokens
        longest = int(lengths.max()) if len(lengths) else 0
        if fitted and longest > 4 * fitted and len(measured) < len(lengths):
            notes.append(f"prompts reach {longest:,} tokens but the cost curve was fitted up to {fitted:,}: "
                         f"estimated savings of long prompts are extrapolated")
        return notes

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

    def _estimated(self, request, stores, results, pending, unlimited, upper) -> None:
        n = len(request.token_ids)
        for store, res, pend, seen in zip(stores, results, pending, unlimited):
            prompt = store.chunk(request.token_ids, request.cache_salt)
            look = store.lookup(prompt)
            store.touch(prompt, look.hit_chunks)
            written = store.store(prompt, None, start_chunk=look.hit_chunks, lookup=look)
            self._count(res, store, prompt, look, seen, n, upper)
            res.store_seconds += written.seconds
            pend.prompt.append(n)
            pend.reuse.append(min(look.hit_tokens, n - 1))
            pend.hit_chunks.append(look.hit_chunks)
            pend.new_chunks.append(len(prompt.hashes) - look.hit_chunks)

    def _measured(self, request, stores, results, rates, unlimited, upper) -> None:
        tokens, n = request.token_ids, len(request.token_ids)
        t_full, (logits_full, kv_full) = self._timed_prefill(tokens, None)
        self.measured_samples.append(PrefillSample(n, 0, t_full))
        for store, res, rate, seen in zip(stores, results, rates, unlimited):
            prompt = store.chunk(tokens, request.cache_salt)
            look = store.lookup(prompt)
            store.touch(prompt, look.hit_chunks)
            past, hit_chunks = self._fetch(store, res, prompt, look, kv_full, rate)
            self._count(res, store, prompt, look, seen, n, upper, hit_chunks)  # hits = what was retrieved
            reuse = 0 if past is None else past.shape[3]
            if reuse == 0:  # no hit: the cached path is the full prefill itself, saving exactly 0
                kv, t_suffix = kv_full, t_full
            else:
                t_suffix, (logits, kv) = self._timed_prefill(tokens[reuse:], past)
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

    def _timed_prefill(self, tokens, past, repeats: int = 2):
        """``(seconds, (logits, kv))``: the fastest of ``repeats`` identical prefills (this VM stalls for
        hundreds of ms at random; the least-disturbed run is the measurement, as for the cost curve)."""
        best, out = float("inf"), None
        for _ in range(repeats):
            self.model.synchronize()  # a GPU runs asynchronously: nothing queued earlier may land in this timing
            t0 = time.perf_counter()
            out = self.model.prefill(tokens, past)  # past_kv on the CPU: its copy to the device is timed too
            self.model.synchronize()  # ...and the work itself is timed, not its launch
            best = min(best, time.perf_counter() - t0)
        return best, out

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
    def _calibrate_transfer(self, store: ChunkStore, chunks: int = 4, cap: int = 8 << 20) -> tuple[float, float]:
        """Seconds per chunk to (SET, GET) one chunk-sized value on this server, measured now (min of 3).

        Values over ``cap`` bytes are timed at ``cap`` and scaled by size (loopback transfers are bandwidth
        bound at that size; MEASURED.md).
        """
        size = store.config.payload_bytes + store.config.header_bytes
        probe = min(size, cap)
        value = os.urandom(64) * (probe // 64) + os.urandom(probe % 64)
        # named like payload keys of the run's namespace, so an interrupted run's cleanup (purge) removes them too
        keys = [store.payload_key(b"\xff" * 15 + bytes([i])) for i in range(chunks)]
        best_set = best_get = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, value)
            pipe.execute()
            t1 = time.perf_counter()
            self.client.mget(keys)
            t2 = time.perf_counter()
            best_set, best_get = min(best_set, t1 - t0), min(best_get, t2 - t1)
        self.client.delete(*keys)
        scale = size / probe / chunks
        return best_set * scale, best_get * scale

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
        if st.lookup_seconds:
            ms = np.asarray(st.lookup_seconds) * 1e3
            res.lookup_p50_ms, res.lookup_p99_ms = (float(x) for x in np.percentile(ms, [50, 99]))
        res.redis_memory_bytes, res.redis_memory_sampled_keys = redis_memory(
            self.client, store.config.namespace, store.config.chunk_size, self.config.memory_sample)


def curve_check(curve: CostCurve, samples) -> dict:
    """How well the cost curve predicts measured prefills: median and max of measured / predicted seconds."""
    ratios = sorted(s.seconds / p for s in samples
                    if (p := float(curve.predict(s.new_tokens, s.cached_tokens))) > 0)
    if not ratios:
        return {"samples": 0}
    return {"samples": len(ratios), "median_measured_over_predicted": ratios[len(ratios) // 2],
            "max_measured_over_predicted": ratios[-1]}


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


def _scan(client: redis.Redis, pattern: str, count: int = 2000):
    cursor = 0
    while True:
        cursor, keys = client.scan(cursor, match=pattern, count=count)
        if keys:
            yield keys
        if cursor == 0:
            return


def redis_memory(client: redis.Redis, namespace: str, chunk_size: int, sample: int) -> tuple[int, int]:
    """Redis's own memory for one namespace and chunk size: ``MEMORY USAGE`` of up to ``sample`` keys, scaled to
    all of them. Returns ``(bytes, sampled keys)``; exact when every key was sampled.
    """
    total = sampled = seen = 0
    pipe = client.pipeline(transaction=False)
    for keys in _scan(client, key_prefix(namespace, chunk_size) + "*"):  # a validated name: no glob characters
        for key in keys:
            seen += 1
            if sampled < sample:
                pipe.memory_usage(key, samples=0)
                sampled += 1
    if sampled:
        total = sum(int(x or 0) for x in pipe.execute())
    return (int(total * seen / sampled) if sampled else 0), sampled
