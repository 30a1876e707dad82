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
(:mod:`kvcli.replay.prefetch`). A trace not validated before (:attr:`Work.streamed`: checked as it is read) is
read to its end or ``--limit``, its lengths kept and its order checked as it goes: a request earlier than one
before it, all timed so far, raises :class:`Unordered` (the replay starts again, its order read first).
"""
from __future__ import annotations

import functools
import sys
from array import array
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


class Unordered(Exception):
    """A trace checked as it is read (:attr:`Work.streamed`) is not in arrival order: request ``index`` came
    before the one ahead of it in the file, every request so far having a time. Nothing about it is counted: the
    caller deletes what the run wrote and replays the trace again with its order read first."""

    def __init__(self, index: int) -> None:
        super().__init__(f"request {index} arrives before an earlier one")
        self.index = index


def replay_stores(work: Work, indices: tuple[int, ...], stores: list[KVStore], upper_bound: bool,
                  client: redis.Redis | RedisCluster, model, config: ReplayConfig, prefetch: bool | None = None,
                  progress: Callable[[int, int | None], None] | None = None) -> Part:
    """Replay the whole trace of ``work`` through ``stores`` (the stores ``indices`` of ``work.stores``, on
    ``client``) and return their picklable results; with ``upper_bound``, this unit also runs the token-granular
    upper bound's radix tree (exactly one unit does). ``model`` runs the measured requests (None: none measured);
    ``prefetch`` as :func:`~kvcli.replay.prefetch.can_prefetch`'s ``force``; ``progress(done, total)`` after each
    request (``total`` None where the trace's length is not known yet).

    Raises:
        RedisFailure: the server failed. BadInputError: the trace changed since it was validated, or (checked as it
        is read) a bad record. Unordered: (checked as it is read) the trace is not in arrival order.
        ModelFailure: the model failed.
    """
    requests = None if work.streamed else len(work.lengths)
    limit = requests if requests is not None else (work.limit if work.limit is not None else sys.maxsize)
    # one request at a time where no store can batch (real payloads, a read namespace), and on a server that will
    # evict keys (--allow-evictions): it loses chunks at any moment, and each loss must be a miss at the very next
    # lookup (a batch would see it at the next batch)
    pipeline = 1 if work.evicts or not any(batchable(store) for store in stores) else config.pipeline
    batched = pipeline > 1 and all(batchable(store) for store in stores)
    bound = config.upper_bound and upper_bound
    # a trace of unknown length is one of STREAM_BYTES or more (kvcli.replay.replayer): taken as long enough
    ahead = batched and can_prefetch(requests if requests is not None else sys.maxsize, bool(work.measured), prefetch)
    ahead_items = Prefetch(work.reader, limit, [store.chunker for store in stores], bound,
                           functools.partial(_curves, stores, config),
                           [store.config.payload_bytes for store in stores]) if ahead else None
    items = (ahead_items if ahead_items is not None
             else hashed_here(work.reader, limit, stores, UpperBound() if bound else None, work.measured))
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
        requests: the trace's requests (the length of each row of :attr:`reach`); None: not known (the rows grow
            as requests come, the lengths are kept and the order checked: module docstring).
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
        lengths: the prompt lengths read (tokens), where ``requests`` was None (else None).
    """

    def __init__(self, lanes: list[Lane], pipeline: int, requests: int | None, model=None, measure_tokens: int = 0,
                 radix: bool = False, batch_tokens: int | None = None) -> None:
        self.lanes = lanes
        size = requests if requests is not None else 1024
        self.reach = np.zeros((len(lanes), size), np.int64)
        self.match = np.zeros(size, np.int64) if radix else None
        self.lengths: array | None = array("q") if requests is None else None
        self._latest: float | None = None  # the latest time so far, while the order is checked
        self._checking = requests is None  # the order is checked (until a request without a time)
        self.skipped = 0
        self.stamps: list[float] = []
        self.measured_log: list[dict] = []
        self.samples: list[PrefillSample] = []
        self._pipeline, self._requests, self._model, self._measure_tokens = pipeline, requests, model, measure_tokens
        self._batch: list[tuple] = []  # (index, prompt tokens, timestamp, [chunked prompt per lane]) waiting
        self._batch_tokens, self._batch_limit = 0, batch_tokens  # prompt tokens of the waiting batch; its limit
        self._inflight: tuple | None = None  # (indices, per lane requests, per lane batch) sent, not accounted

    def run(self, items: Iterable[Item], progress: Callable[[int, int | None], None] | None = None) -> None:
        """Replay every item (:mod:`kvcli.replay.prefetch`'s ``(index, timestamp, tokens, prompts, match,
        request)``, in trace order), then account everything still waiting or in flight."""
        for index, stamp, n, prompts, matched, request in items:
            if self.lengths is not None:  # checked as it is read
                self._read(index, stamp, n)
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
                progress(index + 1, self._requests)  # None while the trace's length is not known
        self._flush()

    def _read(self, index: int, stamp: float | None, n: int) -> None:
        """A request of a trace checked as it is read: its length kept, room made for it, its time checked.

        Raises:
            Unordered: it comes before an earlier request, every one so far having a time.
        """
        assert self.lengths is not None
        self.lengths.append(n)
        if index >= self.reach.shape[1]:
            grow = self.reach.shape[1]
            self.reach = np.concatenate([self.reach, np.zeros((len(self.lanes), grow), np.int64)], axis=1)
            if self.match is not None:
                self.match = np.concatenate([self.match, np.zeros(grow, np.int64)])
        if not self._checking:
            return
        if stamp is None:  # a request without a time: file order is the arrival order (kvcli.traces.order)
            self._checking = False
        elif self._latest is not None and stamp < self._latest:
            raise Unordered(index)
        else:
            self._latest = stamp

    def part(self, indices: tuple[int, ...], degraded: list[str]) -> Part:
        """The unit's results for the stores ``indices``, with ``degraded`` (what could not be read)."""
        stamps = self.stamps
        reach, match, lengths = self.reach, self.match, None
        if self.lengths is not None:  # checked as it was read: rows cut to the requests read
            lengths = np.frombuffer(self.lengths, np.int64).copy()
            reach, match = reach[:, :len(lengths)], None if match is None else match[:len(lengths)]
        return Part(indices, [lane.result for lane in self.lanes], [lane.ledger for lane in self.lanes],
                    reach, match, self.skipped, max(stamps) - min(stamps) if len(stamps) > 1 else None,
                    self.measured_log, degraded, self.samples, [lane.store.written for lane in self.lanes], lengths)

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
