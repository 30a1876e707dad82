"""LRU stack distances of chunks, a batch of requests at a time: the one-pass form of :class:`kvcli.sim.lru.ChunkLru`.

Mattson et al. (1970), "Evaluation techniques for storage hierarchies": an LRU cache of capacity ``C`` holds exactly
the ``C`` most recent distinct items of the access sequence (the *stack*), whatever ``C`` is, so one pass that
records each access's stack distance (1 = the most recent item, 2 = the one before, ...) gives the hit ratio at
every capacity. Here the access sequence is :class:`~kvcli.sim.lru.ChunkLru`'s: a request touches its chunks
last-to-first, so chunk 0 ends most recent, and ``ChunkLru`` with capacity ``C`` holds, after every request, exactly
the top ``C`` of this stack. A request's lookup sees the state *before* it: its chunk ``k`` is held at capacity
``C`` iff its distance ``d_k <= C``, and it hits iff chunks ``0..k`` are all held: ``max(d_0..d_k) <= C`` (the
running maximum along the chain, :func:`chain_max`).

Counting: a distance is 1 + the number of distinct chunks touched since the chunk's last touch, i.e. the number of
chunks whose last-touch time is at or after its own. Last-touch times live in a Fenwick tree (Fenwick 1994, "A new
data structure for cumulative frequency tables") with a 1 at every chunk's latest time: a distance is ``live -
prefix(t) + 1``, O(log n). The tree holds the state before a batch of requests (the replay's ``--pipeline``
batch, or one request); inside the batch, what earlier requests of the batch touched is counted offline
(:meth:`StackDistances.access_many`: a dominance count over the batch's re-touches), so the queries and updates of a
whole batch run as numpy arrays over its chunks, with no Python loop per request or chunk: ~10x fewer numpy calls
per request than one request at a time at 256 per batch. Since requests mostly re-touch runs of consecutive times
(the chunks an earlier request touched together), the tree is queried once per run and updated ``n + log n`` nodes
per run instead of ``n log n``. Times are renumbered 1..live when the tree fills, so its size stays within 2x the
chunks seen plus one batch (amortized O(log n) per access).

Memory: per distinct chunk, 4 bytes of last-touch time and <= 8 bytes of tree (int32, at most half full), doubling
as it grows; plus :class:`~kvcli.sim.chunkids.ChunkIds`' 24 bytes where the caller maps hashes to ids.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcli.sim.chunkids import enlarged, grown

NEVER = np.int64(1) << np.int64(62)
"""The distance of a chunk never seen before: larger than any capacity (a miss at every capacity)."""
_FEW = 8  # runs or positions that plain loops handle faster than ~log(size) rounds of numpy calls


class Fenwick:
    """A binary indexed tree of int32 counts over positions ``1..size``; vectorized range updates and prefix sums.

    Source: P. M. Fenwick, "A new data structure for cumulative frequency tables", Software: Practice and
    Experience 24(3), 1994. Position 0 is unused and stays 0.
    """

    __slots__ = ("tree",)

    def __init__(self, size: int, ones: int = 0) -> None:
        """A tree of ``size`` positions, positions ``1..ones`` set to 1 and the rest 0 (built in O(size))."""
        # tree[i] = sum of a over (i - low(i), i]; int32: counts stay below 2**31 chunks. Nodes up to ``ones`` hold
        # low(i) ones, nodes past it none, except the ones covering ``ones`` itself (its update path).
        self.tree = np.zeros(size + 1, np.int32)
        i = np.arange(1, ones + 1, dtype=np.int32)
        self.tree[1:ones + 1] = i & -i
        j = ones + (ones & -ones) if ones else size + 1
        while j <= size:
            self.tree[j] = ones - (j - (j & -j))
            j += j & -j

    @property
    def size(self) -> int:
        """Positions (the last valid position)."""
        return len(self.tree) - 1

    def add_runs(self, starts: np.ndarray, ends: np.ndarray, deltas: np.ndarray) -> None:
        """``a[p] += deltas[r]`` for every ``p`` in each run ``[starts[r], ends[r]]`` (int64; runs disjoint, in
        ``1..size``).

        Touches each node once per run that overlaps it: the run's own positions, then the update path above its end
        (a node past the end covers part of the run only if it covers the end). So a run of ``n`` positions costs
        ``n + log(size)`` element updates instead of ``n * log(size)``.
        """
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        deltas = np.broadcast_to(np.asarray(deltas, np.int64), starts.shape)
        lengths = ends - starts + 1
        first = np.repeat(starts, lengths)
        inside = first + np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        # the runs' own positions are distinct nodes: one fancy-indexed add (np.add.at is ~5x slower per element)
        self.tree[inside] += ((inside - np.maximum(inside - (inside & -inside), first - 1))
                              * np.repeat(deltas, lengths)).astype(np.int32)
        nodes, amounts, size = [], [], len(self.tree) - 1
        if len(starts) <= _FEW:  # a plain loop up the few paths beats ~log(size) rounds of numpy calls
            up, up_amounts = [], []
            for a, b, d in zip(starts.tolist(), ends.tolist(), deltas.tolist()):
                j = b + (b & -b)
                while j <= size:
                    up.append(j)
                    up_amounts.append((b - max(j - (j & -j), a - 1)) * d)
                    j += j & -j
            nodes.append(np.array(up, np.int64))
            amounts.append(np.array(up_amounts, np.int64))
        else:
            j, lo, hi, d = ends + (ends & -ends), starts - 1, ends, deltas
            while True:
                keep = j <= size
                j, lo, hi, d = j[keep], lo[keep], hi[keep], d[keep]
                if not j.size:
                    break
                nodes.append(j)
                amounts.append((hi - np.maximum(j - (j & -j), lo)) * d)
                j = j + (j & -j)
        if nodes:  # paths of several runs may meet: add.at sums repeats
            np.add.at(self.tree, np.concatenate(nodes), np.concatenate(amounts).astype(np.int32))

    def prefix(self, positions: np.ndarray) -> np.ndarray:
        """``sum(a[1..p])`` for each of ``positions`` (int64 in ``0..size``), int64 ``[len(positions)]``."""
        tree = self.tree
        if len(positions) <= _FEW:
            sums: list[int] = []
            for i in np.asarray(positions, np.int64).tolist():
                total = 0
                while i:
                    total += int(tree[i])
                    i &= i - 1
                sums.append(total)
            return np.array(sums, np.int64)
        i = np.array(positions, np.int64)
        out = np.zeros(i.size, np.int64)
        while i.any():  # tree[0] == 0, so finished positions add nothing
            out += tree[i]
            i &= i - 1
        return out


class StackDistances:
    """LRU stack distances of chunks (dense int ids, e.g. from :class:`~kvcli.sim.chunkids.ChunkIds`) under
    :class:`~kvcli.sim.lru.ChunkLru`'s order. Not thread-safe.

    Every chunk ever touched stays on the stack (an unlimited LRU never drops one), so ``live`` is the number of
    distinct chunks seen, and the distance of a seen chunk is at most ``live``.
    """

    __slots__ = ("_last", "_tree", "_clock", "live")

    def __init__(self) -> None:
        self._last = np.zeros(1024, np.int32)  # last-touch time per id (1-based tree position)
        self._tree = Fenwick(1024)
        self._clock = 0  # the latest time handed out
        self.live = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the numpy state (last-touch times and the tree)."""
        return self._last.nbytes + self._tree.tree.nbytes

    def access(self, ids: np.ndarray, first_new: int) -> np.ndarray:
        """One request: the distances of its chunks before it, then touch them last-to-first (as ChunkLru.store).

        Args:
            ids: ``[chunks]`` int ids of the request's chunks in prompt order, distinct (prefix-chained hashes are).
            first_new: ids ``>= first_new`` were never touched (seen for the first time in this request), and every
                id below it was; ids are dense (``first_new == live`` on every call).

        Returns:
            int64 ``[chunks]``: stack distance of each chunk before the request, 1 = most recent, :data:`NEVER` for a
            chunk never touched. The chunk is held by a ``ChunkLru`` of capacity ``C`` iff its distance ``<= C``.
        """
        ids = np.asarray(ids, np.int64)
        return self.access_many(ids, np.array([0, len(ids)], np.int64), first_new)

    def access_many(self, ids: np.ndarray, bounds: np.ndarray, first_new: int,
                    links: BatchLinks | None = None) -> np.ndarray:
        """Several requests in order, each as :meth:`access` (its distances before it, then its touches), in one
        pass of numpy calls over all their chunks: the same distances as one call per request.

        Args:
            ids: int64 ``[chunks]``: the requests' chunk ids, concatenated in order (distinct within a request).
            bounds: int64 ``[requests + 1]``: request ``r``'s chunks are ``ids[bounds[r]:bounds[r + 1]]``.
            first_new: ids ``>= first_new`` were never touched before these requests (``== live``).
            links: :func:`batch_links` of ``ids`` (computed here when None).

        Returns:
            int64 ``[chunks]``: each chunk's distance before its own request (:data:`NEVER`: never touched).

        How: every touch gets a time (request ``r``'s chunk ``k`` is ``clock + bounds[r + 1] + bounds[r] - i`` at
        position ``i``, chunk 0 latest); a chunk of request ``r`` last touched at ``p`` is at distance ``#{chunks
        whose latest touch before r's start S_r is >= p}`` = A + B - D: A = live chunks at or after ``p`` before
        the batch (Fenwick, when ``p`` is before the batch), B = touches of the batch in ``[p, S_r)``, D = touches of
        the batch before ``S_r`` whose own previous touch is ``>= p`` (each such pair counted a chunk twice): a
        2D dominance count over the batch's re-touches (:func:`_smaller_before`), no loop per request.
        """
        t_all = len(ids)
        dist = np.full(t_all, NEVER, np.int64)
        if t_all == 0:
            return dist
        if first_new != self.live:
            raise ValueError(f"ids must be dense: first_new {first_new} != {self.live} chunks seen")
        if self._clock + t_all > self._tree.size:
            self._renumber(t_all)
        links = links if links is not None else batch_links(ids, bounds)
        req, prev, last = links.req, links.prev, links.last
        c0 = self._clock
        # touch times: chunk n-1 of the first request first (c0 + 1), chunk 0 of the last request last (c0 + t_all)
        times = c0 + (bounds[1:] + bounds[:-1])[req] - np.arange(t_all, dtype=np.int64)
        pre = np.flatnonzero((ids < first_new) & (prev < 0))  # first touch in the batch of a chunk seen before
        old = self._last[ids[pre]].astype(np.int64)
        if old.size:
            # Pre-batch times re-touched come in runs of consecutive times (an earlier request's chunks). Every old
            # time is live, so inside a run [a, b]: prefix(t) = prefix(a - 1) + (t - a + 1): one query per run.
            order = np.argsort(old)
            t = old[order]
            starts_at = np.flatnonzero(np.diff(t, prepend=t[0] - 2) != 1)
            run_start = t[starts_at]
            run_end = t[np.append(starts_at[1:], len(t)) - 1]
            run_of = np.repeat(np.arange(len(starts_at)), np.diff(np.append(starts_at, len(t))))
            below = self._tree.prefix(run_start - 1)[run_of]
            d = np.empty(len(t), np.int64)
            d[order] = self.live - below - (t - run_start[run_of])  # A = live - prefix(t) + 1
            dist[pre] = d + bounds[req[pre]]  # B: every touch of the batch before the request
        else:
            run_start = run_end = np.empty(0, np.int64)
        again = np.flatnonzero(prev >= 0)  # touched earlier in the batch: A = 0, B = S_r - p
        if again.size:
            dist[again] = c0 + 1 + bounds[req[again]] - times[prev[again]]
        if len(bounds) > 2 and len(pre) + len(again) > 1:
            retouch = np.concatenate([pre, again])
            p = np.concatenate([old, times[prev[again]]])  # distinct: one previous touch per touch
            by_p = np.argsort(-p)
            dist[retouch[by_p]] -= _smaller_before(req[retouch[by_p]], len(bounds) - 2)
        # untouch the old times, touch the batch's last touch of each chunk
        live_t = np.zeros(t_all + 2, np.int8)
        live_t[times[last] - c0] = 1
        edges = np.diff(live_t)
        new_start, new_end = np.flatnonzero(edges == 1) + c0 + 1, np.flatnonzero(edges == -1) + c0
        self._tree.add_runs(np.concatenate([run_start, new_start]), np.concatenate([run_end, new_end]),
                            np.concatenate([np.full(len(run_start), -1, np.int64), np.ones(len(new_start), np.int64)]))
        top = int(ids.max()) + 1
        if top > len(self._last):
            self._last = enlarged(self._last, grown(len(self._last), top))
        self._last[ids[last]] = times[last]
        self._clock += t_all
        self.live = max(self.live, top)
        return dist

    def _renumber(self, incoming: int) -> None:
        """Renumber the live chunks' times 1..live (order kept) into a tree with room for ``incoming`` more."""
        live = self.live
        order = np.argsort(self._last[:live], kind="stable")
        self._last[order] = np.arange(1, live + 1, dtype=np.int32)
        self._tree = Fenwick(max(2 * (live + incoming), 1024), ones=live)
        self._clock = live


def chain_max(distances: np.ndarray, req: np.ndarray | None = None) -> np.ndarray:
    """Running maximum along a request's chain, ``[chunks]``: chunk ``k`` hits at capacity ``C`` iff it is ``<= C``
    (a missing chunk ends the hit run: later chunks never fill a gap).

    ``req``: int64 ``[chunks]``, non-decreasing: each chunk's request, for the chains of several requests
    concatenated (each restarts), as :attr:`BatchLinks.req`; None: one request.
    """
    if not len(distances) or req is None or req[-1] == req[0]:
        return np.maximum.accumulate(distances) if len(distances) else distances
    hit = distances < NEVER
    span = int(distances[hit].max()) + 2 if hit.any() else 2  # > every distance: offsets keep requests apart
    offset = (req - req[0]) * span
    chain = np.maximum.accumulate(np.where(hit, distances, span - 1) + offset) - offset
    chain[chain == span - 1] = NEVER
    return chain


class BatchLinks(NamedTuple):
    """How the chunks of several requests, concatenated (``[chunks]``), link up: see :func:`batch_links`."""

    req: np.ndarray
    """int64: the request (0-based in the batch) of each chunk."""
    prev: np.ndarray
    """int64: position of the same id's previous touch in the batch, -1 for its first."""
    last: np.ndarray
    """bool: no later touch of the same id in the batch."""
    rank: np.ndarray
    """int64: how many earlier touches of the same id the batch has."""


def batch_links(ids: np.ndarray, bounds: np.ndarray) -> BatchLinks:
    """:class:`BatchLinks` of ``ids`` (int64 ``[chunks]``, distinct within each request), requests cut at
    ``bounds`` (int64 ``[requests + 1]``, from 0 to ``len(ids)``). One stable sort by id; none for one request."""
    n = len(ids)
    lengths = np.diff(bounds)
    req = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    prev = np.full(n, -1, np.int64)
    if len(lengths) <= 1 or n <= 1:
        return BatchLinks(req, prev, np.ones(n, bool), np.zeros(n, np.int64))
    order = np.argsort(ids, kind="stable")  # a chunk's touches in request order
    same = ids[order[1:]] == ids[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    last = np.ones(n, bool)
    last[order[:-1][same]] = False
    # rank: position in the sorted run of equal ids
    head = np.concatenate([[True], ~same])
    starts = np.flatnonzero(head)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    return BatchLinks(req, prev, last, rank)


def _smaller_before(values: np.ndarray, top: int) -> np.ndarray:
    """For each ``i``: ``#{j < i : values[j] < values[i]}``, int64 ``[len(values)]`` (``values`` int64 in
    ``0..top``).

    A wavelet matrix over the values' bits (Claude, Navarro & Ordóñez, "The wavelet matrix", SPIRE 2012): per bit,
    from the highest, a stable split of the sequence by that bit and a prefix count of its zeros; each query follows
    its prefix ``[0, i)`` down the levels, adding the zeros it passes where its own bit is 1. O(n log top) numpy
    work, ``log2(top + 1)`` rounds of about a dozen calls.
    """
    n = len(values)
    out = np.zeros(n, np.int64)
    if n < 2 or top < 1:
        return out
    seq = values
    lo = np.zeros(n, np.int64)
    hi = np.arange(n, dtype=np.int64)
    zeros = np.empty(n + 1, np.int64)
    zeros[0] = 0
    for bit in range(int(top).bit_length() - 1, -1, -1):
        ones = (seq >> bit) & 1
        np.cumsum(1 - ones, out=zeros[1:])
        nz = zeros[-1]
        mine = ((values >> bit) & 1).astype(bool)
        zl, zh = zeros[lo], zeros[hi]
        out += np.where(mine, zh - zl, 0)
        lo = np.where(mine, nz + lo - zl, zl)
        hi = np.where(mine, nz + hi - zh, zh)
        split = ones.astype(bool)
        seq = np.concatenate([seq[~split], seq[split]])
    return out
