"""One unit of a replay: the whole trace, in arrival order, through a subset of its stores (one :class:`Lane` each).

:func:`replay_stores` is the one implementation a unit runs, in this process (every store) or in a worker process
or Ray task (some of them: :mod:`kvcli.replay.parallel`). Per request, in trace order: an empty prompt is skipped;
a measured one runs its full prefill once, then every lane replays it timed (:meth:`Lane.measure`); estimated ones
wait in a batch of up to ``pipeline`` requests and ``BATCH_CHUNKS`` chunks of the replay's smallest chunk size
(counted in prompt tokens, so every unit of a ``--jobs`` replay cuts the same batches; it bounds what a batch holds
in memory, ~200 bytes of hashes, digests and keys a chunk) that every lane sends together (:meth:`Lane.submit`).
A batch sent is accounted (:meth:`Lane.account`) once the batch after it was sent, so the server runs one batch
while this process reads and hashes the next; everything sent is accounted before a measured
request and at the end, so each lane sees its requests in trace order. The trace is read and hashed in this
process or, for an index-only unit on a machine with cores to spare, in a forked child
(:mod:`kvcli.replay.prefetch`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.model.costcurve import PrefillSample
from kvcli.replay.lane import Lane, hit_curve
from kvcli.replay.measure import SuffixTimings, timed_prefill
from kvcli.replay.prefetch import Item, Prefetch, can_prefetch, hashed_here
from kvcli.replay.results import ReplayConfig
from kvcli.replay.work import Part, Work
from kvcli.sim.upper_bound import UpperBound
from kvcli.store.batch import batchable
from kvcli.store.kvstore import KVStore
from kvcli.traces.request import Request

#: A batch of estimated requests is sent once its prompts hold this many chunks of the replay's smallest chunk size,
#: so its memory stays bounded whatever the prompts' lengths (256 requests of 12k tokens at chunk size 16 are 192k
#: chunks): at most ``BATCH_CHUNKS * smallest chunk size`` prompt tokens a batch, the same cut in every unit.
BATCH_CHUNKS = 1 << 16


def replay_stores(work: Work, indices: tuple[int, ...], stores: list[KVStore], upper_bound: bool,
                  client: redis.Redis | RedisCluster, model, config: ReplayConfig, prefetch: bool | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Part:
    """Replay the whole trace of ``work`` through ``stores`` (the stores ``indices`` of ``work.stores``, on
    ``client``) and return their picklable results; with ``upper_bound``, this unit also runs the token-granular
    upper bound's radix tree (exactly one unit does). ``model`` runs the measured requests (None: none measured);
    ``prefetch`` as :func:`~kvcli.replay.prefetch.can_prefetch`'s ``force``; ``progress(done, total)`` after each
    request.

    Raises:
        RedisFailure: the server failed. BadInputError: the trace changed since it was validated.
        ModelFailure: the model failed.
    """
    requests = len(work.lengths)
    # one request at a time where no store can batch (real payloads, a read namespace), and on a server that will
    # evict keys (--allow-evictions): it loses chunks at any moment, and each loss must be a miss at the very next
    # lookup (a batch would see it at the next batch)
    pipeline = 1 if work.evicts or not any(batchable(store) for store in stores) else config.pipeline
    batched = pipeline > 1 and all(batchable(store) for store in stores)
    bound = config.upper_bound and upper_bound
    ahead = batched and can_prefetch(requests, bool(work.measured), prefetch)
    ahead_items = Prefetch(work.reader, requests, [store.chunker for store in stores], bound,
                           functools.partial(_curves, stores, config),
                           [store.config.payload_bytes for store in stores]) if ahead else None
    items = (ahead_items if ahead_items is not None
             else hashed_here(work.reader, requests, stores, UpperBound() if bound else None, work.measured))
    quiet = ahead_items.paused if ahead_items is not None else None  # the child stopped while a lookup is timed
    lanes = [Lane(store, work.rates[i], config, client, batched=pipeline > 1 and batchable(store),
                  quiet=quiet, curve_elsewhere=ahead) for i, store in zip(indices, stores)]
    unit = UnitReplay(lanes, pipeline, requests, model, work.measure_tokens, radix=bound,
                      batch_tokens=BATCH_CHUNKS * min(config.chunk_sizes))
    try:
        unit.run(items, progress)
    finally:  # a batch still in flight runs before anything else this process sends (a cleanup)
        items.close()  # the child reading ahead, if any, is stopped
        for lane in lanes:
            lane.close()
    if ahead_items is not None:  # the curves the child fed, finished after its last batch
        for lane, curve in zip(lanes, ahead_items.curves):
            if curve is not None:
                lane.curve_from(*curve)
    degraded = [note for lane in lanes for note in lane.finish()]
    return unit.part(indices, degraded)


def _curves(stores: list[KVStore], config: ReplayConfig) -> list:
    """Each store's empty hit curve or None (:func:`kvcli.replay.lane.hit_curve`), made where they are fed."""
    return [hit_curve(store, config) for store in stores]


class UnitReplay:
    """The per-request loop of one unit over its lanes, and what it gathers across them.

    Args:
        lanes: one per store of the unit, in :attr:`Work.stores` order.
        pipeline: estimated requests per batch (1: one at a time).
        requests: the trace's requests (the length of each row of :attr:`reach`).
        model: the local model for measured requests' full prefills (None: nothing measured).
        measure_tokens: tokens of each measured prompt that run the model (0: whole).
        radix: whether the items carry the radix tree's match (:attr:`match` kept).
        batch_tokens: prompt tokens at which a batch is sent before it has ``pipeline`` requests (None: no limit).

    Attributes:
        lanes: the lanes.
        reach: per lane and request, the tokens the lane would reuse with unlimited capacity ``[lanes, requests]``.
        match: per request, the radix tree's reusable tokens ``[requests]``, or None without it.
        skipped: empty prompts seen. stamps: the timestamps seen (seconds).
        measured_log: one entry per measured request (``per_chunk_size`` in lane order).
        samples: the prefills timed (each measured request's full prefill, then its suffixes).
    """

    def __init__(self, lanes: list[Lane], pipeline: int, requests: int, model=None, measure_tokens: int = 0,
                 radix: bool = False, batch_tokens: int | None = None) -> None:
        self.lanes = lanes
        self.reach = np.zeros((len(lanes), requests), np.int64)
        self.match = np.zeros(requests, np.int64) if radix else None
        self.skipped = 0
        self.stamps: list[float] = []
        self.measured_log: list[dict] = []
        self.samples: list[PrefillSample] = []
        self._pipeline, self._requests, self._model, self._measure_tokens = pipeline, requests, model, measure_tokens
        self._batch: list[tuple] = []  # (index, prompt tokens, timestamp, [chunked prompt per lane]) waiting
        self._batch_tokens, self._batch_limit = 0, batch_tokens  # prompt tokens of the waiting batch; its limit
        self._inflight: tuple | None = None  # (indices, per lane requests, per lane batch) sent, not accounted

    def run(self, items: Iterable[Item], progress: Callable[[int, int], None] | None = None) -> None:
        """Replay every item (:mod:`kvcli.replay.prefetch`'s ``(index, timestamp, tokens, prompts, match,
        request)``, in trace order), then account everything still waiting or in flight."""
        for index, stamp, n, prompts, matched, request in items:
            if stamp is not None:
                self.stamps.append(stamp)
            if n == 0:
                self.skipped += 1
            else:
                if self.match is not None:
                    self.match[index] = matched
                if prompts is None:  # measured
                    self._flush()  # the estimated requests before it first: in trace order
                    self._measure(index, request)
                else:
                    self._batch.append((index, n, stamp, prompts))
                    self._batch_tokens += n
                    if len(self._batch) >= self._pipeline or (self._batch_limit is not None
                                                               and self._batch_tokens >= self._batch_limit):
                        self._flush(drain=False)
            if progress:
                progress(index + 1, self._requests)
        self._flush()

    def part(self, indices: tuple[int, ...], degraded: list[str]) -> Part:
        """The unit's results for the stores ``indices``, with ``degraded`` (what could not be read)."""
        stamps = self.stamps
        return Part(indices, [lane.result for lane in self.lanes], [lane.ledger for lane in self.lanes],
                    self.reach, self.match, self.skipped, max(stamps) - min(stamps) if len(stamps) > 1 else None,
                    self.measured_log, degraded, self.samples, [lane.store.written for lane in self.lanes])

    def _flush(self, drain: bool = True) -> None:
        """Send the waiting batch through every lane and account the batch sent before it; with ``drain``, also
        account the one just sent (before a measured request, at the end)."""
        if self._batch:
            entries, self._batch, self._batch_tokens = self._batch, [], 0
            shares = [[(prompts[s], n, stamp) for _, n, stamp, prompts in entries] for s in range(len(self.lanes))]
            sent = [lane.submit(share) for lane, share in zip(self.lanes, shares)]
            previous, self._inflight = self._inflight, ([entry[0] for entry in entries], shares, sent)
            if previous is not None:
                self._account(*previous)
        if drain and self._inflight is not None:
            inflight, self._inflight = self._inflight, None
            self._account(*inflight)

    def _account(self, indices: list[int], shares: list[list], sent: list) -> None:
        """Count one sent batch in every lane and set :attr:`reach` of its requests."""
        for row, lane, share, batch in zip(self.reach, self.lanes, shares, sent):
            row[indices] = lane.account(share, batch)

    def _measure(self, index: int, request: Request) -> None:
        """Run one request with the model on its first ``measure_tokens`` tokens (all of them when shorter): its
        full prefill once, then every lane's timed replay of it."""
        n = len(request.token_ids)
        length = min(n, self._measure_tokens) if self._measure_tokens else n
        head = request.token_ids[:length]
        t_full, (logits_full, kv_full) = timed_prefill(self._model, head, None)
        self.samples.append(PrefillSample(length, 0, t_full))
        rows, reusable = [], []
        suffixes = SuffixTimings(self._model, head)
        for lane in self.lanes:
            got = lane.measure(index, request, head, t_full, logits_full, kv_full, suffixes)
            rows.append(got.row)
            reusable.append(got.reusable)
            if got.sample is not None:
                self.samples.append(got.sample)
        self.measured_log.append({"index": index, "id": request.id, "prompt_tokens": n, "measured_tokens": length,
                                  "full_prefill_seconds": t_full, "per_chunk_size": rows})
        self.reach[:, index] = reusable
