"""The optimal bound: the most hit chunks any eviction policy could get, at every capacity in one pass, for
prefix-chained chunks.

Model (the replay's): a cache of ``C`` chunks; a request hits the longest run of its chunks held from chunk 0 (a
chunk is useful only if its whole prefix is held); after the request, any of its chunks may be kept (none has to
be: bypass is allowed) and any held chunk dropped, ending with at most ``C``.

The policy: Belady's MIN (Belady 1966, "A study of replacement algorithms for a virtual-storage computer") with
bypass, one request at a time: after each request keep the ``C`` chunks, among those held and the request's own,
whose next request comes soonest (chunks never requested again are dropped); on a tie, the deeper chunk goes first.

Why it is optimal (not only a bound). (1) Upper bound: a hit on chunk ``x`` at request ``r'`` needs ``x`` held in
every gap from its previous request ``r`` to ``r'``; so any policy's hits are a set of such reuse intervals with at
most ``C`` of them over any gap, ignoring the prefix rule. The most intervals with at most ``C`` over any point is
what the greedy by right end takes (Carlisle & Lloyd 1995, "On the k-coloring of intervals"; Jain & Lin 2016,
"Back to the Future", ISCA, show Belady's MIN takes exactly those: OPTgen). (2) The prefix rule costs MIN nothing:
every request holding a chunk holds its parent, so a parent's next request is never later than its child's, and
with deeper-first ties MIN never keeps a chunk without its parent; its kept chunks are the prefix-closed runs the
replay's lookup counts. So MIN's hit chunks are the most any policy gets, LRU included.

In tokens, a prompt made only of full chunks that is wholly hit reuses one token less (the engine computes the
last token): the optimal bound in tokens is MIN's hit chunks times the chunk size less its whole-prompt hits, the
optimum in chunks (a token optimum could differ by at most one token per request).

Every capacity at once (:func:`optimal_by_capacity`): MIN's priority (next request, then depth) does not depend on
the capacity, so MIN is a stack algorithm (Mattson, Gecsei, Slutz & Traiger 1970, "Evaluation techniques for
storage hierarchies"): one list of slots whose first ``C`` hold the cache of ``C`` chunks, for every ``C`` at
once. A chunk's slot (1-based) before a request is the smallest capacity holding it, so the request's chunk ``k``
hits at ``C`` iff the largest slot among its chunks ``0..k`` is ``<= C``. The update after a request: with the
request's own chunks taken out of their slots (left empty), the new first ``C`` slots are the ``C`` best of the old
first ``C`` and the request's chunks (kept at every capacity: the best ``C`` of a set of ``C`` plus one more
contain the best ``C - 1`` of the set without it). That is one walk down the slots with the request's chunks in a
heap: at each slot, the better of the slot's chunk and the heap's best stays. Only slots whose chunk is worse than
the heap's best change, found block by block (blocks of :data:`BLOCK` slots with their worst key), and the walk
stops once the heap holds only empty slots. Slots hold only chunks that are requested again, so there are at most
as many as the most chunks ever awaiting a next request (6,915 on the 7,500-request Mooncake cut at chunk 512);
tests/sim/test_optimal.py checks the pass against a per-capacity MIN simulation (a heap of next uses) at every
capacity on random traces and on the Mooncake sample, and against exhaustive search on tiny traces.

Cost: a Python loop per chunk plus one step per changed slot: ~1.3 s for the 179 k chunks of the 7,500-request
Mooncake cut at chunk 512 (about a million changed slots; one per-capacity pass was ~0.2 s). Memory: the slots and
8 bytes per distinct chunk.
"""
from __future__ import annotations

import heapq

import numpy as np

from kvcli.sim.stream import NEVER, ChunkStream

BLOCK = 64
"""Slots per block of the walk's search for the next slot to change."""

_EMPTY = np.iinfo(np.int64).max  # an empty slot: worse than every chunk
_PAST = -1  # past the last slot: better than every chunk, so the walk never stops there


class _Slots:
    """MIN's stack: ``keys[j]`` is the priority key of slot ``j``'s chunk (smaller: kept first; :data:`_EMPTY`: no
    chunk), ``items[j]`` its id (-1: none); ``worst[b]`` the largest key in block ``b``."""

    def __init__(self) -> None:
        self.keys: list[int] = [_PAST] * BLOCK
        self.items: list[int] = [-1] * BLOCK
        self.worst: list[int] = [_PAST]
        self.size = 0  # slots in use; those past it are _PAST

    def append(self, key: int, item: int) -> int:
        """Put ``item`` with ``key`` in a new slot at the end; returns the slot."""
        j = self.size
        if j == len(self.keys):
            self.keys += [_PAST] * j
            self.items += [-1] * j
            self.worst += [_PAST] * (j // BLOCK)
        self.size += 1
        self.set(j, key, item)
        return j

    def set(self, j: int, key: int, item: int) -> None:
        """Put ``item`` with ``key`` in slot ``j`` (< size)."""
        old, self.keys[j], self.items[j] = self.keys[j], key, item
        b = j // BLOCK
        if key >= self.worst[b]:
            self.worst[b] = key
        elif old == self.worst[b]:
            self.worst[b] = max(self.keys[b * BLOCK:(b + 1) * BLOCK])

    def first_worse(self, start: int, key: int) -> int:
        """The first slot ``>= start`` whose key is larger than ``key`` (-1: none)."""
        if start >= self.size:
            return -1
        keys, worst = self.keys, self.worst
        first = start // BLOCK
        if worst[first] > key:
            for j in range(start, (first + 1) * BLOCK):
                if keys[j] > key:
                    return j
        for b in range(first + 1, (self.size - 1) // BLOCK + 1):
            if worst[b] > key:
                for j in range(b * BLOCK, (b + 1) * BLOCK):
                    if keys[j] > key:
                        return j
        return -1

    def trim(self) -> None:
        """Drop empty slots at the end."""
        while self.size and self.keys[self.size - 1] == _EMPTY:
            self.set(self.size - 1, _PAST, -1)
            self.size -= 1


def optimal_by_capacity(stream: ChunkStream, next_use: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MIN's hit chunks and whole-prompt hits at every capacity, in one pass (module docstring).

    Args:
        stream: one chunk size's requests (prefix-chained: a chunk id has one depth).
        next_use: :meth:`ChunkStream.next_use` (computed here when None).

    Returns:
        ``(hit_chunks, whole_hits)``, int64 ``[ids + 1]`` each (``ids``: the largest chunk id + 1, the curve's
        distinct chunks): element ``C`` is MIN's at a capacity of ``C`` chunks; hit tokens at ``C`` are
        ``hit_chunks[C] * chunk_size - whole_hits[C]``. The last elements are the unlimited cache's.
    """
    nxt = (stream.next_use() if next_use is None else next_use).tolist()
    flat, cuts, _ = stream.lists()
    whole_prompt = stream.whole().tolist()
    ids = int(stream.ids.max()) + 1 if len(stream.ids) else 0
    width = int(np.diff(stream.bounds).max(initial=0)) + 1  # key = next request * width + depth: unique per chunk
    hits = np.zeros(ids + 2, np.int64)  # chunks (whole prompts) whose smallest capacity to hit is exactly C
    whole = np.zeros(ids + 2, np.int64)
    slots, slot = _Slots(), [-1] * ids  # chunk id -> its slot (-1: none)
    for r in range(len(cuts) - 1):
        a, b = cuts[r], cuts[r + 1]
        k, level = a, 0
        while k < b and slot[flat[k]] >= 0:
            level = max(level, slot[flat[k]] + 1)
            hits[level] += 1
            k += 1
        if k == b > a and whole_prompt[r]:
            whole[level] += 1
        pool = []
        for k in range(a, b):
            x = flat[k]
            if slot[x] >= 0:
                slots.set(slot[x], _EMPTY, -1)
                slot[x] = -1
            if nxt[k] != NEVER:
                pool.append((nxt[k] * width + k - a, x))
        heapq.heapify(pool)
        _walk(slots, slot, pool)
        slots.trim()
    return np.cumsum(hits)[:ids + 1], np.cumsum(whole)[:ids + 1]


def _walk(slots: _Slots, slot: list[int], pool: list[tuple[int, int]]) -> None:
    """Merge the heap ``pool`` of (key, id) into ``slots`` from the top: each slot keeps the better of its chunk
    and the heap's best (the worse goes into the heap); what is left at the end goes into new slots, best first."""
    start = 0
    while pool and pool[0][0] != _EMPTY:
        key, x = pool[0]
        j = slots.first_worse(start, key)
        if j < 0:
            while pool and pool[0][0] != _EMPTY:
                key, x = heapq.heappop(pool)
                slot[x] = slots.append(key, x)
            return
        y = slots.items[j]
        heapq.heapreplace(pool, (slots.keys[j], y))
        if y >= 0:
            slot[y] = -1
        slots.set(j, key, x)
        slot[x] = j
        start = j + 1
