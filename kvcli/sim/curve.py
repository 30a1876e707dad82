"""The hit-token curve of one chunk size over every cache capacity and a grid of TTLs, from one replay pass.

Capacity: Mattson's stack distances under the replay's own LRU order (:mod:`kvcli.sim.stackdist`, the one-pass
form of :class:`kvcli.sim.lru.ChunkLru`): a request's chunk ``k`` hits at capacity ``C`` chunks iff the running
maximum of its chain's distances up to ``k`` is ``<= C``. So the curve at ``C`` equals, chunk for chunk, a replay
with ``--capacity-tokens C*chunk_size`` (or ``--capacity-bytes C*payload_bytes``):
tests/replay/test_curve_replay.py checks it on random traces and on the Mooncake sample. TTL:
:mod:`kvcli.sim.ttlcurve` (unlimited capacity).

Both assume the run's own cold cache (no ``--namespace`` to read from) and count index hits (a measured request's
payload lost to a checksum failure is a hit here, a miss in the replay's count).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvcli.sim.chunkids import ChunkIds, Hashes, count, enlarged, grown
from kvcli.sim.stackdist import NEVER, StackDistances, batch_links, chain_max
from kvcli.sim.stream import ChunkStream, StreamRecorder
from kvcli.sim.ttlcurve import TtlCurve

BATCH = 256
"""Deferred requests (:meth:`HitCurve.defer`) observed at once: the replay's default ``--pipeline``; at chunk 512 the
cost per request falls ~6x from one request at a time and little more past this."""

FRACTIONS = (0.5, 0.9, 0.99, 1.0)
"""Shares of the unlimited hit tokens whose smallest capacity (and TTL) the result reports."""


class HitCurve:
    """Feeds one chunk size's requests, in replay order, to the stack distances and the TTL curve.

    Args:
        chunk_size: tokens per chunk.
        ttl_refresh: TTL counted from a chunk's last access (True) or its last write (False).
        record: also keep the requests' chunk ids (:meth:`stream`) for the capacity planner's offline
            simulations (:mod:`kvcli.replay.planner`): 4 bytes per chunk of every request, 16 per request.
        keep_hits: also keep every request's chain distances, so the result gives each request's reused tokens
            at any capacity (:meth:`CurveResult.reused_tokens`, for pricing a size's saving request by request):
            4 bytes per chunk of every request, 12 per request.
    """

    def __init__(self, chunk_size: int, ttl_refresh: bool = False, record: bool = False,
                 keep_hits: bool = False) -> None:
        self.chunk_size = chunk_size
        self._ids = ChunkIds()
        self._stack = StackDistances()
        self._by_distance = np.zeros(1024, np.int64)  # hit chunks whose chain distance is exactly d
        self._full = np.zeros(1024, np.int64)  # requests wholly hit from distance d on (they recompute a token)
        self._ttl: TtlCurve | None = TtlCurve(ttl_refresh)
        self.ttl_refresh = ttl_refresh
        self.untimed_requests = 0
        self._first: float | None = None
        self._last: float | None = None
        self.seconds = 0.0
        self._pending: list[tuple[Hashes, float | None, int | None]] = []  # deferred requests, in order
        self._recorder = StreamRecorder(chunk_size) if record else None
        # per batch: chain distances (int32, a miss at every capacity as HIT_NEVER), chunks and tokens per request
        self._hits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = [] if keep_hits else None

    def observe(self, hashes: Hashes, timestamp: float | None, prompt_tokens: int | None = None
                ) -> np.ndarray:
        """One request's full chunks (16-byte prefix hashes, prompt order: a sequence, or one ``bytes`` of them
        concatenated) at ``timestamp`` (seconds or None).
        ``prompt_tokens``: its length; a prompt made only of full chunks that hits them all still computes its last
        token (:func:`kvcli.store.hashing.reusable_tokens`), so it reuses one token less at those capacities.

        Returns int64 ``[chunks]``: each chunk's chain distance (chunk ``k`` hits at capacity ``C`` chunks iff it is
        ``<= C``; :data:`~kvcli.sim.stackdist.NEVER` for a miss at every capacity).
        """
        return self.observe_many([(hashes, timestamp, prompt_tokens)])[0]

    def defer(self, requests: Sequence[tuple[Hashes, float | None, int | None]]) -> None:
        """Requests ``(hashes, timestamp, prompt_tokens)`` to :meth:`observe_many` later, in order, :data:`BATCH` at
        a time (whatever batches the caller has: one request at a time with ``--pipeline 1``): the same curve, for
        a caller that does not need the chain distances. :meth:`observe`, :attr:`nbytes` and :meth:`result` take
        the deferred requests first."""
        self._pending.extend(requests)
        if len(self._pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Observe the deferred requests now."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._observe(pending)

    def observe_many(self, requests: Sequence[tuple[Hashes, float | None, int | None]]
                     ) -> list[np.ndarray]:
        """Several requests ``(hashes, timestamp, prompt_tokens)`` in trace order, each as :meth:`observe`, in one
        pass of numpy calls over all their chunks (:meth:`StackDistances.access_many
        <kvcli.sim.stackdist.StackDistances.access_many>`, :meth:`TtlCurve.access_many
        <kvcli.sim.ttlcurve.TtlCurve.access_many>`): the same chain distances and the same curve as one call per
        request, at a fraction of the per-call cost (the replay passes its ``--pipeline`` batches).

        Returns one int64 ``[chunks]`` array of chain distances per request.
        """
        self.flush()
        return self._observe(requests)

    def _observe(self, requests: Sequence[tuple[Hashes, float | None, int | None]]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        lengths = np.fromiter((count(h) for h, _, _ in requests), np.int64, len(requests))
        bounds = np.zeros(len(requests) + 1, np.int64)
        np.cumsum(lengths, out=bounds[1:])
        ids, first_new = self._ids.ids_many([h for h, _, _ in requests])
        links = batch_links(ids, bounds)
        if self._recorder is not None:
            self._recorder.add(ids, lengths, np.fromiter((-1 if n is None else n for _, _, n in requests), np.int64,
                                                         len(requests)))
        chain = chain_max(self._stack.access_many(ids, bounds, first_new, links), links.req)
        if self._hits is not None:
            tokens_of = np.fromiter((-1 if n is None else n for _, _, n in requests), np.int64, len(requests))
            self._hits.append((np.minimum(chain, HIT_NEVER).astype(np.int32), lengths.astype(np.int32),
                               np.where(tokens_of < 0, lengths * self.chunk_size, tokens_of)))
        hit = chain < NEVER
        if hit.any():
            top = int(chain[hit].max())
            if top >= len(self._by_distance):
                self._by_distance = enlarged(self._by_distance, grown(len(self._by_distance), top + 1))
            counts = np.bincount(chain[hit])
            self._by_distance[:len(counts)] += counts
            # requests made only of full chunks, all hit from some capacity on: they recompute a token
            ends = chain[np.maximum(bounds[1:] - 1, 0)]
            tokens = np.fromiter((-1 if n is None else n for _, _, n in requests), np.int64, len(requests))
            whole = ends[(lengths > 0) & (ends < NEVER) & (tokens == lengths * self.chunk_size)]
            if whole.size:
                if top >= len(self._full):
                    self._full = enlarged(self._full, len(self._by_distance))
                np.add.at(self._full, whole, 1)
        stamps = [t for _, t, _ in requests if t is not None]
        untimed = len(requests) - len(stamps)
        if untimed:
            self.untimed_requests += untimed
            self._ttl = None  # one request without a time: no TTL curve for this trace
        elif self._ttl is not None:
            self._ttl.access_many(ids, bounds, first_new, np.array([float(t) for t in stamps], np.float64), links)
            lo, hi = min(stamps), max(stamps)
            self._first = lo if self._first is None else min(self._first, lo)
            self._last = hi if self._last is None else max(self._last, hi)
        self.seconds += time.perf_counter() - t0
        cuts = bounds.tolist()
        return [chain[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def stream(self) -> ChunkStream | None:
        """The requests so far as chunk ids (None unless made with ``record``)."""
        self.flush()
        return None if self._recorder is None else self._recorder.stream()

    @property
    def nbytes(self) -> int:
        """Bytes held for the curve (numpy state): ~55-95 per distinct chunk on the Mooncake traces (arrays
        double as they grow; TTLs after write add 84 per chunk seen twice)."""
        self.flush()
        ttl = self._ttl.nbytes if self._ttl is not None else 0
        kept = sum(a.nbytes + b.nbytes + c.nbytes for a, b, c in self._hits or ())
        return self._ids.nbytes + self._stack.nbytes + self._by_distance.nbytes + ttl + kept

    def result(self, prompt_tokens: int, payload_bytes_per_chunk: int) -> CurveResult:
        """The curve so far, for a replay of ``prompt_tokens`` prompt tokens (hit token ratios' denominator)."""
        self.flush()
        distinct = len(self._ids)
        by_distance = np.zeros(distinct + 1, np.int64)  # distances never exceed the distinct chunks seen
        kept = min(len(self._by_distance), distinct + 1)
        by_distance[:kept] = self._by_distance[:kept]
        hits = np.cumsum(by_distance)
        full = np.zeros(distinct + 1, np.int64)
        kept_full = min(len(self._full), distinct + 1)
        full[:kept_full] = self._full[:kept_full]
        ttl, first, last = self._ttl, self._first, self._last  # first and last are set together
        per_request = None
        if self._hits is not None:
            parts = self._hits or [(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64))]
            per_request = RequestHits(*(np.concatenate(column) for column in zip(*parts)))
        return CurveResult(
            chunk_size=self.chunk_size, payload_bytes_per_chunk=payload_bytes_per_chunk, prompt_tokens=prompt_tokens,
            hit_chunks_by_capacity=hits, whole_hits_by_capacity=np.cumsum(full), distinct_chunks=distinct,
            ttl_seconds=None if ttl is None else ttl.grid, ttl_hit_chunks=None if ttl is None else ttl.hits(),
            ttl_rule="after access" if self.ttl_refresh else "after write", untimed_requests=self.untimed_requests,
            span_seconds=None if ttl is None or first is None or last is None else last - first,
            memory_bytes=self.nbytes, seconds=self.seconds, request_hits=per_request)


HIT_NEVER = np.int32(np.iinfo(np.int32).max)
"""A chunk that misses at every capacity, in :class:`RequestHits` (distances never reach it: they count distinct
chunks, at most one per 16-byte hash seen)."""


@dataclass(frozen=True)
class RequestHits:
    """Every request's chain distances, in replay order: ``chains`` int32 ``[chunks of all requests]`` (chunk ``k``
    of a request hits at capacity ``C`` iff its entry is ``<= C``; non-decreasing within a request, being a running
    maximum; :data:`HIT_NEVER` for a miss at every capacity), ``chunks`` int32 ``[requests]`` (each request's
    entries, in order), ``prompt_tokens`` int64 ``[requests]``."""

    chains: np.ndarray
    chunks: np.ndarray
    prompt_tokens: np.ndarray


@dataclass(frozen=True)
class CurveResult:
    """One chunk size's curves. Capacities in chunks (``C * chunk_size`` tokens, ``C * payload_bytes_per_chunk``
    payload bytes); hits in chunks (``* chunk_size`` tokens).

    Attributes:
        hit_chunks_by_capacity: int64 ``[distinct_chunks + 1]``: hit chunks at capacity ``C`` = element ``C`` (the
            last one is the unlimited cache's).
        whole_hits_by_capacity: int64 ``[distinct_chunks + 1]``: requests made only of full chunks that hit all of
            them at capacity ``C``: each reuses one token less (the engine computes the last token), so hit tokens
            at ``C`` are ``hit_chunks * chunk_size - whole_hits``. The TTL curve counts whole chunks.
        ttl_seconds / ttl_hit_chunks: the TTL grid (seconds) and hit chunks at each; None without timestamps.
        ttl_rule: "after write" or "after access".
        untimed_requests: requests without a timestamp (any one turns the TTL curve off).
        span_seconds: last minus first timestamp (TTLs from about here on are the unlimited cache).
        memory_bytes: bytes the curve held; seconds: time spent computing it.
        request_hits: every request's chain distances (:class:`RequestHits`; None unless the curve kept them):
            :meth:`reused_tokens` at any capacity.
    """

    chunk_size: int
    payload_bytes_per_chunk: int
    prompt_tokens: int
    hit_chunks_by_capacity: np.ndarray
    whole_hits_by_capacity: np.ndarray
    distinct_chunks: int
    ttl_seconds: np.ndarray | None
    ttl_hit_chunks: np.ndarray | None
    ttl_rule: str
    untimed_requests: int
    span_seconds: float | None
    memory_bytes: int
    seconds: float
    request_hits: RequestHits | None = None

    @property
    def unlimited_hit_tokens(self) -> int:
        """Hit tokens with unlimited capacity and no expiry."""
        return self.hit_tokens(self.distinct_chunks)

    def hit_tokens(self, capacity_chunks: int) -> int:
        """Hit tokens at a capacity of ``capacity_chunks`` chunks (exact: equals the replay at that capacity)."""
        c = min(max(int(capacity_chunks), 0), self.distinct_chunks)
        return int(self.hit_chunks_by_capacity[c]) * self.chunk_size - int(self.whole_hits_by_capacity[c])

    def reused_tokens(self, capacity_chunks: int) -> tuple[np.ndarray, np.ndarray]:
        """Each request's prompt tokens and reused tokens at a capacity of ``capacity_chunks`` chunks, int64
        ``[requests]`` each, in replay order: its leading chunks whose chain distance is at most the capacity, less
        the last token of a prompt hit whole (the engine computes it); they sum to :meth:`hit_tokens`.

        Raises:
            ValueError: the curve kept no per-request distances (``HitCurve(keep_hits=False)``).
        """
        if self.request_hits is None:
            raise ValueError("the curve kept no per-request hits: build it with HitCurve(keep_hits=True)")
        h = self.request_hits
        below = np.zeros(len(h.chains) + 1, np.int64)
        np.cumsum(h.chains <= min(max(int(capacity_chunks), 0), int(HIT_NEVER) - 1), out=below[1:])
        ends = np.cumsum(h.chunks, dtype=np.int64)
        hit = below[ends] - below[ends - h.chunks]  # a request's hits are its leading chunks: the chain only rises
        reused = np.maximum(np.minimum(hit * self.chunk_size, h.prompt_tokens - 1), 0)
        return h.prompt_tokens.astype(np.int64), reused

    def capacity_for(self, fraction: float) -> int | None:
        """Smallest capacity (chunks) whose hit tokens reach ``fraction`` of the unlimited cache's; None when the
        trace has no hits at all."""
        total = self.hit_chunks_by_capacity[-1]
        if total == 0:
            return None
        return int(np.searchsorted(self.hit_chunks_by_capacity, fraction * total, side="left"))

    def ttl_for(self, fraction: float) -> float | None:
        """Smallest grid TTL (seconds) whose hit tokens reach ``fraction`` of the unlimited cache's; None when there
        is no TTL curve, no hit, or no grid TTL reaches it."""
        total = self.hit_chunks_by_capacity[-1]
        if self.ttl_seconds is None or self.ttl_hit_chunks is None or total == 0:  # both None together
            return None
        ok = np.flatnonzero(self.ttl_hit_chunks >= fraction * total)
        return float(self.ttl_seconds[ok[0]]) if ok.size else None

    def _point(self, c: int, optimal: Callable[[int], int] | None = None) -> dict:
        hit = self.hit_tokens(c)
        out = {"capacity_chunks": c, "capacity_tokens": c * self.chunk_size,
               "capacity_payload_bytes": c * self.payload_bytes_per_chunk, "hit_tokens": hit,
               "hit_token_ratio": hit / self.prompt_tokens if self.prompt_tokens else 0.0}
        if optimal is not None:
            out["optimal_hit_tokens"] = optimal(c)
        return out

    def capacities(self, points: int = 100) -> np.ndarray:
        """About ``points`` capacities (chunks), log-spaced from 1 to every distinct chunk, plus 0."""
        if self.distinct_chunks == 0:
            return np.zeros(1, np.int64)
        grid = np.geomspace(1, self.distinct_chunks, points)
        return np.unique(np.concatenate([[0], np.rint(grid).astype(np.int64), [self.distinct_chunks]]))

    def to_dict(self, optimal: Callable[[int], int] | None = None) -> dict:
        """JSON-ready: log-spaced capacity points (LRU ``hit_tokens``; with ``optimal``, a function of a capacity in
        chunks to the optimal eviction's hit tokens, also ``optimal_hit_tokens``), the capacity and TTL reaching each
        of :data:`FRACTIONS` of the unlimited hit tokens, the TTL points, memory and time."""
        out = {
            "chunk_size": self.chunk_size, "distinct_chunks": self.distinct_chunks,
            "unlimited_hit_tokens": self.unlimited_hit_tokens,
            "capacity_points": [self._point(int(c), optimal) for c in self.capacities()],
            "capacity_for_fraction": {str(f): (None if (c := self.capacity_for(f)) is None else self._point(c))
                                      for f in FRACTIONS},
            "ttl_rule": self.ttl_rule, "untimed_requests": self.untimed_requests,
            "trace_span_seconds": self.span_seconds, "ttl_points": None, "ttl_for_fraction_seconds": None,
            "memory_bytes": self.memory_bytes, "seconds": self.seconds}
        if self.ttl_seconds is not None and self.ttl_hit_chunks is not None:  # both None together
            out["ttl_points"] = [
                {"ttl_seconds": float(t), "hit_tokens": int(h) * self.chunk_size,
                 "hit_token_ratio": int(h) * self.chunk_size / self.prompt_tokens if self.prompt_tokens else 0.0}
                for t, h in zip(self.ttl_seconds, self.ttl_hit_chunks)]
            out["ttl_for_fraction_seconds"] = {str(f): self.ttl_for(f) for f in FRACTIONS}
        return out
