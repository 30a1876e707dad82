"""One store's side of a replay: its counts, ledger, hit curve, verified checksums and pipelined batches.

A replay runs one store per (layout, chunk size) and nothing one store does changes another's hits, so everything
it accounts for a store lives in that store's :class:`Lane`: the :class:`~kvcli.replay.results.ChunkSizeResult`
(counts, bytes, seconds), the :class:`~kvcli.replay.savings.Ledger` (per request records for the savings), the
chunks an unlimited cache would hold (capacity-limited stores only), the :class:`~kvcli.sim.curve.HitCurve`, the
chunks whose checksum was verified and the :class:`~kvcli.store.batch.Batcher` of its pipelined batches. The unit
that drives a trace through its lanes (:mod:`kvcli.replay.unit`) hands each lane every request in trace order.

Estimated requests (:meth:`Lane.submit`, then :meth:`Lane.account`): the lookup and metadata writes are real, the
payload bytes are accounted, and transfer and store seconds are priced with the server's chunk rates
(:class:`~kvcli.replay.network.ServerRates`). Where a real payload is hit, the checksums of up to ``verify_sample``
distinct chunks per chunk size are verified (their payloads read, outside the timings); a chunk that fails is a
miss from then on.

Measured requests (:meth:`Lane.measure`): lookup, retrieve, suffix prefill and store are timed for real, against
the full prefill the unit timed once for all lanes. Hit chunks whose payload was only accounted are materialized
first from the request's own full prefill (written untimed), so the timed retrieve reads real bytes.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.errors import KvcliError
from kvcli.model.costcurve import PrefillSample
from kvcli.prefixkv import resumable_tokens
from kvcli.replay.measure import SuffixTimings
from kvcli.replay.network import ServerRates
from kvcli.replay.results import ChunkSizeResult, ReplayConfig
from kvcli.replay.savings import Ledger
from kvcli.sim.curve import CurveResult, HitCurve
from kvcli.sim.stream import ChunkStream
from kvcli.store.batch import SAMPLE_EVERY, Batcher
from kvcli.store.calls import RedisUnavailable, resend
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.hashing import ChunkedPrompt, reusable_tokens
from kvcli.store.kvstore import KVStore
from kvcli.store.layout import is_real
from kvcli.store.namespace import redis_memory
from kvcli.store.serde import stored_as
from kvcli.traces.request import Request

Estimated = tuple[ChunkedPrompt, int, float | None]
"""One estimated request as a lane sees it: ``(its chunked prompt, prompt tokens, timestamp in seconds or None)``."""


class Measured(NamedTuple):
    """What one lane gives back for a measured request.

    Attributes:
        reusable: tokens the request would reuse here with unlimited capacity (for the upper bound).
        row: the measured log's entry for this chunk size (``chunk_size``, ``hit_tokens``, ``reused_tokens``,
            ``suffix_prefill_seconds``, ``saved_seconds``).
        sample: the suffix prefill's timing, or None when nothing was reused (no suffix prefill ran).
    """

    reusable: int
    row: dict
    sample: PrefillSample | None


class Lane:
    """One store's replay accounting, fed one request at a time in trace order.

    Args:
        store: the store (:class:`~kvcli.store.kvstore.KVStore`) of one (layout, chunk size).
        rate: the server's transfer rates for this store (seconds per chunk), calibrated once per trace.
        config: the replay's options (payload, ``verify_sample``, ``memory_sample``, upper bound, hit curve).
        client: the redis-py client the store runs on (its Redis memory is sampled at :meth:`finish`).
        batched: estimated requests go to the server in pipelined batches (:class:`~kvcli.store.batch.Batcher`;
            only for a store that :func:`~kvcli.store.batch.batchable` accepts).
        quiet: a context manager factory each of the batcher's latency samples runs inside, or None.
        curve_elsewhere: another process feeds this store's hit curve (:mod:`kvcli.replay.prefetch`) and hands it
            over finished (:meth:`curve_from`) before :meth:`finish`; the lane feeds none.

    Attributes:
        store: the store.
        result: this store's counts, filled as requests come and completed by :meth:`finish`.
        ledger: this store's per request records (tokens; seconds) for the savings.
    """

    def __init__(self, store: KVStore, rate: ServerRates, config: ReplayConfig, client: redis.Redis | RedisCluster,
                 batched: bool = False, quiet=None, curve_elsewhere: bool = False) -> None:
        cs = store.config.chunk_size
        self.store = store
        self.result = ChunkSizeResult(cs, store.config.namespace, layout=store.layout,
                                      upper_bound_tokens=0 if config.upper_bound else None)
        self.ledger = Ledger()
        self._rate, self._client = rate, client
        self._real = config.payload == "real"
        self._priced = config.priced  # a profile or a roofline prices every prefill, measured requests' too
        self._verify_sample, self._memory_sample = config.verify_sample, config.memory_sample
        self._allow_evictions = config.allow_evictions
        # chunks an unlimited cache would hold: only where the store's own capacity can evict
        self._seen: set[bytes] | None = set() if store.resident_chunks is not None else None
        self._hit_curve = None if curve_elsewhere else hit_curve(store, config)
        self._curve_done: tuple[CurveResult, ChunkStream | None] | None = None  # curve_from's
        self._plan = config.plan
        self._checked: dict[bytes, bool] = {}  # chunk hash -> checksum verified good
        self._real_chunks: set[bytes] = set()  # chunks this lane may have written with a real payload (measured)
        self._batcher: Batcher | None = None
        if batched:
            assert isinstance(store, ChunkStore), "batched only where batchable(), which takes only a ChunkStore"
            # a priced replay prices every lookup (lookups x the link's round trip): no latency samples to take
            self._batcher = Batcher(store, 0 if config.priced else SAMPLE_EVERY, quiet=quiet)

    # -- estimated requests ---------------------------------------------------------------------------------------
    def submit(self, requests: list[Estimated]):
        """Start a batch of estimated requests (trace order): the hit curve gets them, and a batcher sends them
        (its :class:`~kvcli.store.batch.Batch`, answered by :meth:`account`); None without a batcher.

        Raises:
            RedisFailure, RedisUnavailable: as :meth:`kvcli.store.batch.Batcher.submit`.
        """
        if self._hit_curve:
            self._hit_curve.defer([(prompt.hash_bytes, stamp, n) for prompt, n, stamp in requests])
        return self._batcher.submit([prompt for prompt, _, _ in requests]) if self._batcher is not None else None

    def account(self, requests: list[Estimated], sent) -> list[int]:
        """Count the batch :meth:`submit` returned ``sent`` for: its batcher's answers, or one lookup and one
        (accounted) store per request without a batcher. Returns, per request, the tokens it would reuse here with
        unlimited capacity.

        Raises:
            RedisFailure, RedisUnavailable: as :meth:`kvcli.store.batch.Batcher.answers`.
        """
        store, res, rate = self.store, self.result, self._rate
        cs = store.config.chunk_size
        done = self._batcher.answers(sent) if self._batcher is not None else None
        reusable = []
        for i, (prompt, n, _) in enumerate(requests):
            crit, back = _critical(res), _background(res)
            if done is None:
                look = store.lookup(prompt)
                hit_chunks = self._checksums(prompt, look)
                written = store.store(prompt, None, start_chunk=hit_chunks, lookup=look)
            else:  # the batch's answer; a real chunk it hit is verified as one by one
                look, written = done[i]
                hit_chunks = self._verified(prompt, look) if self._real_chunks else look.hit_chunks
            reusable.append(self._count(prompt, look, n, hit_chunks))
            res.store_seconds += written.seconds
            res.transfer_seconds_estimated += rate.get(hit_chunks)
            res.deserialize_seconds_estimated += hit_chunks * rate.deserialize_seconds
            res.store_seconds_estimated += rate.put(prompt.chunks - hit_chunks)
            res.hit_requests += hit_chunks > 0
            res.store_requests += written.chunks_written > 0
            self.ledger.add(n, reusable_tokens(hit_chunks * cs, n), critical=_critical(res) - crit,
                            background=_background(res) - back)
        return reusable

    def _verified(self, prompt: ChunkedPrompt, look) -> int:
        """The hit run of a batched answer (whose lookup read no metadata) after :meth:`_checksums` verified the
        real chunks in it, as the one-by-one path verifies them: a read-only lookup gives their metadata, only for a
        request that hit a real chunk not verified yet (or a chunk that failed: a miss whenever it is hit)."""
        checked, hashes, k = self._checked, prompt.hashes, look.hit_chunks
        failed = next((i for i in range(k) if checked.get(hashes[i]) is False), None)
        if failed is not None:
            return failed
        if len(checked) >= self._verify_sample or all(
                h not in self._real_chunks or h in checked for h in hashes[:k]):
            return k
        fresh = self.store.lookup(prompt, record=False)
        good = self._checksums(prompt, fresh)
        return good if good < fresh.hit_chunks else k

    def _checksums(self, prompt: ChunkedPrompt, look) -> int:
        """The hit run after verifying the checksums of real-payload hit chunks not verified yet, up to
        ``verify_sample`` chunks per chunk size (one MGET of their payloads, outside the timings); a chunk that
        fails is a miss now and whenever it is hit again."""
        checked = self._checked
        k = look.hit_chunks
        if len(look.metadata) < k:  # a layout whose lookup reads no metadata (lmcache: EXISTS): nothing to check
            return k
        todo: list[int] = []
        for i in range(k):
            good = checked.get(prompt.hashes[i])
            if good is False:
                return i
            if good is None and is_real(look.metadata[i]) \
                    and len(checked) + len(todo) < self._verify_sample:
                todo.append(i)
        if not todo:
            return k
        store = self.store
        assert isinstance(store, ChunkStore), "only kvcli's layout reads metadata, so only it has real hit chunks"
        for i, good in zip(todo, store.verify(prompt, todo, look)):
            checked[prompt.hashes[i]] = good
        return next((i for i in range(k) if checked.get(prompt.hashes[i]) is False), k)

    # -- measured requests ----------------------------------------------------------------------------------------
    def measure(self, index: int, request: Request, head: np.ndarray, t_full: float, logits_full, kv_full,
                suffixes: SuffixTimings) -> Measured:
        """Replay one measured request here, timed: lookup, retrieve, suffix prefill and store, against its full
        prefill of ``head`` (its first ``len(head)`` tokens: ``t_full`` seconds, ``logits_full``
        ``[tokens, vocab]``, ``kv_full`` ``[layers, 2, kv_heads, tokens, head_dim]``); the rest of a truncated
        prompt is estimated. ``suffixes`` times the suffix prefill (the request's own, shared by its lanes: a lane
        that reuses the same prefix KV as one before it takes that timing, and adds no new sample).

        Raises:
            RedisFailure: the server failed. ModelFailure: the model failed.
        """
        store, res, rate = self.store, self.result, self._rate
        cs = store.config.chunk_size
        n, length = request.prompt_tokens, len(head)
        crit, back = _critical(res), _background(res)
        prompt = store.chunk(request.prompt, request.hash_salt)
        if self._hit_curve:
            self._hit_curve.observe(prompt.hashes, request.timestamp, n)
        if self._real:
            self._real_chunks.update(prompt.hashes[:length // cs])  # written real below, or materialized in _fetch
        look = store.lookup(prompt)
        past, got = self._fetch(prompt, look, kv_full, length)
        inside = min(look.hit_chunks, length // cs)
        hit_chunks = look.hit_chunks if got >= inside else got  # hits = what could be retrieved
        reusable = self._count(prompt, look, n, hit_chunks)
        reuse = 0 if past is None else past.shape[3]
        sample = None
        if reuse == 0:  # no hit: the cached path is the full prefill itself, saving exactly 0
            kv, t_suffix = kv_full, t_full
        else:
            t_suffix, (logits, kv), fresh = suffixes.timed(past)
            sample = PrefillSample(length - reuse, reuse, t_suffix) if fresh else None
            res.max_logit_diff = max(res.max_logit_diff, float((logits[-1] - logits_full[-1]).abs().max()))
        if self._real and length < n:  # real KV for the measured tokens' chunks, the rest accounted
            written = store.store(prompt, kv, start_chunk=hit_chunks, end_chunk=length // cs, lookup=look)
            rest = store.store(prompt, None, start_chunk=max(hit_chunks, length // cs), lookup=look)
            res.store_seconds += rest.seconds
            res.store_seconds_estimated += rest.chunks_written * (rate.set_seconds + rate.serialize_seconds)
            stored = written.chunks_written + rest.chunks_written
        else:
            written = store.store(prompt, kv if self._real else None, start_chunk=hit_chunks, lookup=look)
            stored = written.chunks_written
            if not self._real:
                res.store_seconds_estimated += rate.put(written.chunks_written)
        res.store_seconds += written.seconds
        res.hit_requests += hit_chunks > 0
        res.store_requests += stored > 0
        res.measured_requests += 1
        res.full_prefill_seconds_measured += t_full
        res.suffix_prefill_seconds_measured += t_suffix
        res.saved_prefill_seconds_measured += t_full - t_suffix
        if self._priced:  # the cost prices it whole, as any request: its timings here checked the KV path only
            self.ledger.add(n, reusable_tokens(hit_chunks * cs, n), critical=_critical(res) - crit,
                            background=_background(res) - back)
        else:
            self.ledger.add(n, reusable_tokens(hit_chunks * cs, n), length, reuse,
                            (index, t_full, t_suffix if reuse else None), _critical(res) - crit,
                            _background(res) - back)
        row = {"chunk_size": cs, "hit_tokens": hit_chunks * cs, "reused_tokens": reuse,
               "suffix_prefill_seconds": t_suffix, "saved_seconds": t_full - t_suffix}
        return Measured(reusable, row, sample)

    def _fetch(self, prompt: ChunkedPrompt, look, kv_full, length: int):
        """KV of the reusable part of the measured tokens ``[layers, 2, kv_heads, reuse, head_dim]``
        (:func:`reusable_tokens` of the first ``length``; a hybrid model's down to the last chunk boundary with its
        linear layers' state, :func:`~kvcli.prefixkv.resumable_tokens`) and the hit chunks retrieved among them.
        Hit chunks beyond them (a truncated measurement) are priced, not moved."""
        store, res, rate = self.store, self.result, self._rate
        cs = store.config.chunk_size
        inside = min(look.hit_chunks, length // cs)
        outside = look.hit_chunks - inside
        res.transfer_seconds_estimated += outside * rate.get_seconds
        res.deserialize_seconds_estimated += outside * rate.deserialize_seconds
        if inside == 0:
            return None, 0
        if not self._real:
            res.transfer_seconds_estimated += rate.get(inside)
            res.deserialize_seconds_estimated += inside * rate.deserialize_seconds
            past = kv_full[:, :, :, :resumable_tokens(kv_full, reusable_tokens(inside * cs, length))]
            return stored_as(past, store.config.kv_dtype), inside  # what a retrieve would hand back
        got = store.retrieve(prompt, lookup=look.first(inside))
        start = end = got.hit_tokens // cs
        while got.break_reason == "no-payload" and end < inside and store.accounted(prompt, look, end):
            end += 1  # payloads this run only accounted for (a chunk stored "real" that lost it is a real miss)
        if end > start:
            done = store.store(prompt, kv_full, start_chunk=start, end_chunk=end, overwrite=True)
            res.materialized_chunks += done.chunks_present
            got = store.retrieve(prompt, lookup=store.lookup(prompt, record=False).first(inside))
        res.transfer_seconds_measured += got.transfer_seconds
        res.deserialize_seconds += got.deserialize_seconds
        res.serialized_bytes_read += got.payload_bytes + got.header_bytes
        if got.kv is None:
            return None, 0
        reuse = resumable_tokens(got.kv, reusable_tokens(got.hit_tokens, length))
        return got.kv[:, :, :, :reuse], got.hit_tokens // cs

    # -- every request --------------------------------------------------------------------------------------------
    def _count(self, prompt: ChunkedPrompt, look, n: int, hit_chunks: int) -> int:
        """Account one request's hits (tokens it reuses: :func:`reusable_tokens`); returns what it would reuse
        with unlimited capacity (every chunk this run stored, and every chunk the read namespace supplies)."""
        res, seen = self.result, self._seen
        cs = self.store.config.chunk_size
        res.requests += 1
        res.prompt_tokens += n
        res.short_requests += n < cs
        res.short_prompt_tokens += n if n < cs else 0
        res.hit_tokens += reusable_tokens(hit_chunks * cs, n)
        res.hit_tokens_metadata_only += reusable_tokens(look.metadata_hit_chunks * cs, n)
        res.chunks_hit += hit_chunks
        res.namespace_hit_chunks += sum(look.from_read[:hit_chunks])
        res.lookup_seconds += look.seconds
        if seen is None:
            unlimited = reusable_tokens(hit_chunks * cs, n)
        else:
            k = 0
            for i, h in enumerate(prompt.hashes):
                if h not in seen and i not in look.read_usable:
                    break
                k += 1
            unlimited = reusable_tokens(k * cs, n)
            seen.update(prompt.hashes[k:])
        res.hit_tokens_unlimited += unlimited
        return unlimited

    # -- the end --------------------------------------------------------------------------------------------------
    def curve_from(self, result: CurveResult, stream: ChunkStream | None) -> None:
        """The store's hit curve as another process finished it (:meth:`kvcli.sim.curve.HitCurve.result` of every
        request this lane counts, and its :meth:`~kvcli.sim.curve.HitCurve.stream`), for :meth:`finish`."""
        self._curve_done = (result, stream)

    def close(self) -> None:
        """Read every batch reply still due and close the batcher's connection (nothing this process sent may run
        after it); call it however the replay ends, before :meth:`finish`."""
        if self._batcher is not None:
            self._batcher.close()

    def finish(self) -> list[str]:
        """Complete :attr:`result` with the store's totals, its Redis memory (sampled) and the hit curve; returns
        what could not be read, for the report's notes (e.g. a user without SCAN or MEMORY: the rest stands)."""
        store, res = self.store, self.result
        st = store.stats
        for name in ("objects_created", "metadata_entries", "chunks_written", "payload_bytes_written",
                     "payload_bytes_accounted", "header_bytes_written", "metadata_bytes_written", "round_trips",
                     "lookups", "lookup_round_trips", "evicted_chunks", "checksum_failures", "checksum_verified_chunks",
                     "redis_retries", "redis_errors", "redis_timeouts", "redis_busy_retries", "lookups_pipelined",
                     "lookups_sampled"):
            setattr(res, name, getattr(st, name))
        res.vanished_chunks = store.vanished_chunks()
        if st.lookup_seconds:
            res.lookup_p50_seconds, res.lookup_p99_seconds = (
                float(x) for x in np.percentile(np.asarray(st.lookup_seconds), [50, 99]))
        else:  # no prompt had a full chunk: nothing was looked up
            res.lookup_p50_seconds = res.lookup_p99_seconds = None
        res.key_bytes_per_chunk = store.key_bytes_per_chunk
        trips = getattr(store, "shard_trips", None)
        res.round_trips_by_shard = dict(sorted(trips.counts.items())) if trips is not None else {}
        degraded = []
        # the store's key count, where the run knows it: every key it created is still there without a capacity
        # (nothing deleted; a server that evicts was refused by the preflight unless allowed), so the SCAN stops at
        # the sample instead of counting every key
        known = st.objects_created if store.resident_chunks is None and not self._allow_evictions else None
        try:  # read again after an attempt that got no reply, by the rule on failed calls
            res.redis_memory_bytes, res.redis_memory_sampled_keys = resend(self._client, lambda: redis_memory(
                self._client, store.key_pattern, self._memory_sample, known))
        except RedisUnavailable:  # the last straw of the rule: the server is taken as gone, the run stops
            raise
        except KvcliError as exc:  # refused (a user without SCAN or MEMORY): the rest of the report stands
            degraded.append(f"Redis memory of chunk size {store.config.chunk_size} not read: {exc}")
        if self._curve_done is not None:
            res.hit_curve, stream = self._curve_done
        elif self._hit_curve is not None:
            res.hit_curve, stream = (self._hit_curve.result(res.prompt_tokens, store.config.payload_bytes),
                                     self._hit_curve.stream())
        else:
            res.hit_curve, stream = None, None
        if stream is not None and res.hit_curve is not None:  # the planner: only where it was asked for
            from kvcli.replay.planner import plan

            res.plan = plan(stream, res.hit_curve, self._plan, getattr(store, "capacity_chunks", None))
        return degraded


def hit_curve(store: KVStore, config: ReplayConfig) -> HitCurve | None:
    """The hit curve a store's lane keeps (:class:`~kvcli.sim.curve.HitCurve`, empty), or None: one per chunk size,
    on the first layout's store (it depends on the hashes, not the layout), unless ``--no-curve`` or a read
    namespace (the curve assumes the run's own cold cache)."""
    if not config.hit_curve or config.namespace is not None or store.layout != config.layouts[0]:
        return None
    return HitCurve(store.config.chunk_size, config.ttl_refresh, record=config.plan.wanted,
                    keep_hits=bool(config.sizing))


def _critical(res: ChunkSizeResult) -> float:
    """Critical-path seconds accounted so far on the given server: lookup, transfer, deserialize."""
    return (res.lookup_seconds + res.transfer_seconds_measured + res.transfer_seconds_estimated
            + res.deserialize_seconds + res.deserialize_seconds_estimated)


def _background(res: ChunkSizeResult) -> float:
    """Background seconds accounted so far: serialize and store."""
    return res.store_seconds + res.store_seconds_estimated



