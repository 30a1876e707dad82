"""Hit chunks at every TTL of a grid, in one pass over a trace's timestamps (unlimited capacity).

Two expiry rules, as a chunk store would apply them with Redis expiry (``SET ... EX ttl``):

* **after write** (default; what :class:`~kvcli.store.chunkstore.ChunkStore` and ``kvcli warm --ttl`` do): a chunk
  lives ``T`` seconds from the write that stored it. A request writes every chunk of its prompt that is absent
  (never stored, or expired) and leaves present ones as they are (``SET NX``: a hit does not extend the life).
  Whether a chunk is present depends on ``T``, so its write times do too; and since a hit leaves a chain's head with
  its older write time while its tail is written anew, the hit ratio need not rise with ``T`` (requests ``[a]`` at
  0 s, ``[a, b]`` at 2 s and at 3 s hit 2 chunks with ``T`` = 1 s, ``a`` rewritten at 2 s, but 1 with ``T`` = 2 s:
  ``a`` hit at 2 s, expired at 3 s). The curve is therefore exact at each TTL of the grid (one write time per chunk
  and grid TTL, kept only for chunks seen twice), not between them.
* **after access** (``--ttl-refresh``): every request renews the life of all its chunks (rewrites the absent
  ones, refreshes the present ones), so a chunk is present at time ``t`` iff ``t - (its last request) <= T``: one
  gap per chunk decides every ``T`` at once, exactly as a stack distance decides every capacity.

Either way a request's chunk ``k`` hits iff chunks ``0..k`` are all present (a missing chunk ends the hit run);
under "after write" a chain's head can expire before its tail (it was written earlier). A key is present up to and
including its expiry instant (Redis expires a key when now > its expiry time), so a gap equal to ``T`` hits: gaps
are compared with ``T`` plus :data:`RESOLUTION_SECONDS`, so that a gap of 0.2 s that floating point makes
0.20000005 (two epoch timestamps subtracted) still counts as 0.2.

Timestamps are taken in trace order; one earlier than the request before it counts a zero gap.
"""
from __future__ import annotations

import numpy as np

from kvcli.sim.chunkids import enlarged, grown
from kvcli.sim.stackdist import BatchLinks, batch_links, chain_max

# TTLs evaluated, seconds: 1, 2, 5 x 10^k from 0.1 s to 500,000 s (5.8 days); a TTL longer than the trace's span
# is the same as no expiry.
TTL_GRID_SECONDS = np.array([m * 10.0 ** e for e in range(-1, 6) for m in (1, 2, 5)])


_SCALAR_TAIL = 8  # a batch's trailing rounds of one touch each are taken on Python floats from this many on

RESOLUTION_SECONDS = 1e-6
"""Timestamps are compared to the microsecond: finer than any trace's clock (Mooncake's is in milliseconds, Redis
expires to the millisecond), coarser than floating point's error on a difference of two epoch times (~1e-7 s)."""


class TtlCurve:
    """Hit chunks per grid TTL (unlimited capacity), fed one request or one batch of requests at a time (the same
    counts). Not thread-safe.

    Args:
        refresh: expire ``T`` after a chunk's last access (True) or after its last write (False).
        grid: TTLs to evaluate, seconds, ascending.

    Times are kept as request numbers (int32) into one array of the requests' timestamps (8 bytes per request).
    Memory: 8 bytes per distinct chunk (its last access or first write, and its row number), plus, "after write",
    ``4 * len(grid)`` bytes (84) per chunk seen at least twice (its last write at each grid TTL).
    """

    def __init__(self, refresh: bool, grid: np.ndarray = TTL_GRID_SECONDS) -> None:
        self.refresh, self.grid = refresh, np.asarray(grid, np.float64)
        self._limits = self.grid + RESOLUTION_SECONDS  # a gap hits at TTL T iff gap <= T (to the microsecond)
        g = len(self.grid)
        self._hits = np.zeros(g + 1, np.int64)  # "after write": per grid TTL; "after access": by first TTL that fits
        self._stamps = np.zeros(1024, np.float64)  # timestamp of request r (seconds)
        self._requests = 0
        self._when = np.zeros(1024, np.int32)  # per id: request of its last access ("after access") or first write
        self._row = np.full(1024, -1, np.int32)  # "after write": per id, its row in _writes, or -1
        self._writes = np.zeros((0, g), np.int32)  # "after write": [chunks seen twice, grid] request of last write
        self._rows = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the numpy state."""
        return sum(a.nbytes for a in (self._hits, self._stamps, self._when, self._row, self._writes))

    def hits(self) -> np.ndarray:
        """Hit chunks at each grid TTL, int64 ``[len(grid)]``."""
        return np.cumsum(self._hits)[:-1] if self.refresh else self._hits[:-1].copy()

    def access(self, ids: np.ndarray, first_new: int, now: float) -> None:
        """One request at time ``now`` (seconds): count its hits at every grid TTL, then apply its writes/renewals.

        Args:
            ids: ``[chunks]`` dense ids of its chunks in prompt order (distinct); ids ``>= first_new`` are new.
        """
        ids = np.asarray(ids, np.int64)
        self.access_many(ids, np.array([0, len(ids)], np.int64), first_new, np.array([now], np.float64))

    def access_many(self, ids: np.ndarray, bounds: np.ndarray, first_new: int, nows: np.ndarray,
                    links: BatchLinks | None = None) -> None:
        """Several requests in order, each as :meth:`access`, in one pass of numpy calls over all their chunks.

        Args:
            ids: int64 ``[chunks]``: the requests' chunk ids, concatenated (distinct within a request); ids
                ``>= first_new`` are new to these requests.
            bounds: int64 ``[requests + 1]``: request ``r``'s chunks are ``ids[bounds[r]:bounds[r + 1]]``.
            nows: float64 ``[requests]``: their timestamps, seconds.
            links: :func:`~kvcli.sim.stackdist.batch_links` of ``ids`` (computed here when None).

        "After access": a chunk's gap is its request's time minus its previous request's (earlier in the batch or
        before it), all at once. "After write": a chunk's write time at each grid TTL depends on its previous
        touches, so its touches are taken in rounds (its first touch in the batch, its second, ...), each round one
        vectorized step over the chunks touched that often.
        """
        lengths = np.diff(bounds)
        busy = np.flatnonzero(lengths)  # requests with chunks: the only ones stamped
        if not busy.size:
            return
        links = links if links is not None else batch_links(ids, bounds)
        req, prev, last = links.req, links.prev, links.last
        number = np.zeros(len(lengths), np.int64)  # each request's number (row of _stamps)
        number[busy] = self._stamp_many(np.asarray(nows, np.float64)[busy])
        self._grow(int(ids.max()) + 1)
        stamps, g = self._stamps, len(self.grid)
        at = number[req]  # [chunks] request number of each touch
        again = prev >= 0
        seen = again | (ids < first_new)  # touched before (in the batch or before it)
        if self.refresh:
            before = np.where(again, at[np.maximum(prev, 0)], self._when[ids])
            gap = np.maximum(stamps[at] - stamps[before], 0.0)
            # the bin of the first grid TTL that fits, g for none, g + 1 for a chunk never seen: monotone in the
            # gap, so the chain's running maximum of bins is the bin of its running maximum
            bins = np.where(seen, np.searchsorted(self._limits, gap, side="left"), g + 1)
            chain = chain_max(bins, req)
            self._hits += np.bincount(chain[chain <= g], minlength=g + 1)
            self._when[ids[last]] = at[last]
            return
        fresh = ~seen
        self._when[ids[fresh]] = at[fresh]  # first write of a new chunk
        retouch = np.flatnonzero(seen)  # [touches of chunks seen before], in order: the only ones that can hit
        if not retouch.size:
            return
        # a row of write times per chunk touched twice: those seen before the batch, and new ones touched again
        need = ids[np.flatnonzero(seen & ~again | fresh & ~last)]
        rows = self._row[need].astype(np.int64)
        lacking = rows < 0  # seen once so far: at every grid TTL its write is still the first one
        if lacking.any():
            rows[lacking] = self._add_rows(self._when[need[lacking]])
            self._row[need[lacking]] = rows[lacking]
        order = np.argsort(links.rank[retouch], kind="stable")  # rounds: first touches in the batch, second, ...
        ranks = links.rank[retouch[order]]
        cuts = np.searchsorted(ranks, np.arange(int(ranks[-1]) + 2), side="left").tolist()
        row_of = self._row[ids[retouch[order]]].astype(np.int64)
        at_of = at[retouch[order]]
        now = stamps[at_of][:, None]
        alive = np.empty((len(retouch), g), bool)  # [retouch by round, grid]
        writes, grid = self._writes, self._limits
        sizes = np.diff(cuts)
        wide = np.flatnonzero(sizes != 1)
        tail = int(wide[-1]) + 1 if wide.size else 0  # rounds from here on hold one touch each
        if len(sizes) - tail < _SCALAR_TAIL:
            tail = len(sizes)
        for a, b in zip(cuts[:tail], cuts[1:tail + 1]):  # each chunk at most once per round
            if b - a == 1:  # one chunk: plain views, no gathers
                written = writes[row_of[a]]
                ok = np.less_equal(now[a] - stamps[written], grid, out=alive[a])
                written[~ok] = at_of[a]  # absent: written now
                continue
            rows = row_of[a:b]
            written = writes[rows]
            ok = np.less_equal(now[a:b] - stamps[written], grid, out=alive[a:b])
            writes[rows] = np.where(ok, written, at_of[a:b, None])  # absent: written now
        if tail < len(sizes):
            first = cuts[tail]
            alive[first:] = self._one_by_one(row_of[first:], at_of[first:])
        # each request's hits per grid TTL: its leading present chunks, all among its touches up to its first unseen
        m, heads = len(retouch), bounds[:-1]
        unseen = np.flatnonzero(fresh)
        k = np.searchsorted(unseen, heads)
        stop = np.minimum(np.append(unseen, len(ids))[k], bounds[1:])
        start, stop = np.searchsorted(retouch, heads), np.searchsorted(retouch, stop)
        keep = stop > start
        start, stop = start[keep], stop[keep]
        if not start.size:
            return
        absent_at = np.empty((m + 1, g), np.int32)  # [retouch (+ a pad), grid]: its row if absent, else m
        absent_at[m] = m
        absent_at[order] = np.where(alive, np.int32(m), order.astype(np.int32)[:, None])
        first_absent = np.minimum.reduceat(absent_at, np.column_stack([start, stop]).ravel(), axis=0)[::2]
        self._hits[:-1] += (np.minimum(first_absent, stop[:, None]) - start[:, None]).sum(axis=0)

    def _one_by_one(self, rows: np.ndarray, ats: np.ndarray) -> np.ndarray:
        """The rounds of one touch each, in order (the tail of a batch's rounds: the touches of its most requested
        chunk after every other chunk's last), as the round loop takes them, on Python floats: per grid TTL, the
        same float64 gap and comparison per touch, a fraction of the cost of numpy calls on one row of
        ``len(grid)`` values; a TTL at which the row's first write outlives its last touch is present throughout
        (one comparison). Updates the rows' write times; returns bool ``[touches, grid]``: present."""
        writes, stamps = self._writes, self._stamps
        limits = self._limits.tolist()
        rows_of, ats_of = rows.tolist(), ats.tolist()
        nows = stamps[ats].tolist()
        present = np.ones((len(rows_of), len(limits)), bool)
        start = 0
        while start < len(rows_of):  # each run of touches of one row
            row, end = rows_of[start], start + 1
            while end < len(rows_of) and rows_of[end] == row:
                end += 1
            written = writes[row].tolist()
            when = stamps[written].tolist()
            latest = max(nows[start:end])
            for j, limit in enumerate(limits):
                if latest - when[j] <= limit:  # alive at every touch (a gap never exceeds the largest)
                    continue
                at_j, when_j = written[j], when[j]
                for k in range(start, end):
                    now = nows[k]
                    if now - when_j > limit:  # absent: written now
                        present[k, j] = False
                        at_j, when_j = ats_of[k], now
                written[j] = at_j
            writes[row] = written
            start = end
        return present

    def _stamp_many(self, nows: np.ndarray) -> np.ndarray:
        r, k = self._requests, len(nows)
        if r + k > len(self._stamps):
            self._stamps = enlarged(self._stamps, grown(len(self._stamps), r + k))
        self._stamps[r:r + k] = nows
        self._requests += k
        return np.arange(r, r + k, dtype=np.int64)

    def _add_rows(self, first: np.ndarray) -> np.ndarray:
        k, have = len(first), len(self._writes)
        if self._rows + k > have:
            self._writes = enlarged(self._writes, max(self._rows + k, have + have // 2, 256), None)
        rows = np.arange(self._rows, self._rows + k)
        self._writes[rows] = first[:, None]
        self._rows += k
        return rows

    def _grow(self, top: int) -> None:
        if top > len(self._when):
            size = grown(len(self._when), top)
            self._when, self._row = enlarged(self._when, size), enlarged(self._row, size, -1)
