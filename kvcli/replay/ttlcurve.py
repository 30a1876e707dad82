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
including its expiry instant (Redis expires a key when now > its expiry time), so a gap equal to ``T`` hits.

Timestamps are taken in trace order; one earlier than the request before it counts a zero gap.
"""
from __future__ import annotations

import numpy as np

# TTLs evaluated, seconds: 1, 2, 5 x 10^k from 0.1 s to 500,000 s (5.8 days); a TTL longer than the trace's span
# is the same as no expiry.
TTL_GRID_SECONDS = np.array([m * 10.0 ** e for e in range(-1, 6) for m in (1, 2, 5)])


class TtlCurve:
    """Hit chunks per grid TTL (unlimited capacity), fed one request at a time. Not thread-safe.

    Args:
        refresh: expire ``T`` after a chunk's last access (True) or after its last write (False).
        grid: TTLs to evaluate, seconds, ascending.

    Times are kept as request numbers (int32) into one array of the requests' timestamps (8 bytes per request).
    Memory: 8 bytes per distinct chunk (its last access or first write, and its row number), plus, "after write",
    ``4 * len(grid)`` bytes (84) per chunk seen at least twice (its last write at each grid TTL).
    """

    def __init__(self, refresh: bool, grid: np.ndarray = TTL_GRID_SECONDS) -> None:
        self.refresh, self.grid = refresh, np.asarray(grid, np.float64)
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
        n = len(ids)
        if n == 0:
            return
        r = self._stamp(now)
        self._grow(int(ids.max()) + 1)
        seen = ids < first_new
        stamps = self._stamps
        if self.refresh:
            gap = np.full(n, np.inf)
            gap[seen] = np.maximum(now - stamps[self._when[ids[seen]]], 0.0)
            chain = np.maximum.accumulate(gap)
            np.add.at(self._hits, np.searchsorted(self.grid, chain[chain < np.inf], side="left"), 1)
            self._when[ids] = r
            return
        present = np.zeros((n, len(self.grid)), bool)
        old = ids[seen]
        if old.size:
            rows = self._row[old].astype(np.int64)
            fresh = rows < 0  # seen once so far: at every grid TTL its write is still the first one
            if fresh.any():
                rows[fresh] = self._add_rows(self._when[old[fresh]])
                self._row[old[fresh]] = rows[fresh]
            written = self._writes[rows]
            alive = now - stamps[written] <= self.grid
            present[seen] = alive
            self._writes[rows] = np.where(alive, written, r)  # absent chunks are written now (SET NX)
        self._hits[:-1] += np.logical_and.accumulate(present, axis=0).sum(axis=0)
        self._when[ids[~seen]] = r

    def _stamp(self, now: float) -> int:
        r = self._requests
        if r == len(self._stamps):
            self._stamps = np.concatenate([self._stamps, np.zeros(r)])
        self._stamps[r] = now
        self._requests += 1
        return r

    def _add_rows(self, first: np.ndarray) -> np.ndarray:
        k, have = len(first), len(self._writes)
        if self._rows + k > have:
            grown = np.empty((max(self._rows + k, have + have // 2, 256), len(self.grid)), np.int32)
            grown[:self._rows] = self._writes[:self._rows]
            self._writes = grown
        rows = np.arange(self._rows, self._rows + k)
        self._writes[rows] = first[:, None]
        self._rows += k
        return rows

    def _grow(self, top: int) -> None:
        if top > len(self._when):
            size = max(top, 2 * len(self._when))
            self._when = np.concatenate([self._when, np.zeros(size - len(self._when), np.int32)])
            self._row = np.concatenate([self._row, np.full(size - len(self._row), -1, np.int32)])
