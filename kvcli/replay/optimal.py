"""The optimal bound: the most hit chunks any eviction policy could get at a capacity, for prefix-chained chunks.

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
replay's lookup counts. So MIN's hit chunks are the most any policy gets, LRU included. tests/replay/test_optimal.py
checks it against exhaustive search over every keep/drop choice on random tiny traces.

In tokens, a prompt made only of full chunks that is wholly hit reuses one token less (the engine computes the
last token): the optimal bound in tokens is MIN's hit chunks times the chunk size less its whole-prompt hits, the
optimum in chunks (a token optimum could differ by at most one token per request).

Cost: O(chunks * log C) per capacity (a heap of next uses with stale entries skipped), a Python loop per chunk:
about 1-2 us per chunk per capacity. Capacities at or past :func:`peak_live` (the most chunks ever awaiting a
next use) evict nothing that returns: there MIN is the unlimited cache, known without a pass.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from kvcli.replay.stream import NEVER, ChunkStream


def peak_live(stream: ChunkStream, next_use: np.ndarray) -> int:
    """The most chunks awaiting a next request at once (after some request): at that capacity or more, MIN keeps
    every chunk until its next request, as an unlimited cache does."""
    if not len(next_use):
        return 0
    req = np.repeat(np.arange(stream.requests, dtype=np.int64), np.diff(stream.bounds))
    again = next_use < NEVER
    delta = np.zeros(stream.requests + 1, np.int64)
    np.add.at(delta, req[again], 1)  # held from the gap after its request ...
    np.add.at(delta, next_use[again], -1)  # ... to the gap before its next request
    return int(np.cumsum(delta).max(initial=0))


def optimal_hits(stream: ChunkStream, capacity: int, next_use: np.ndarray | None = None) -> tuple[int, int]:
    """MIN's ``(hit chunks, whole-prompt hits)`` at ``capacity`` chunks (module docstring); hit tokens are
    ``hit_chunks * chunk_size - whole``.

    Args:
        stream: one chunk size's requests.
        capacity: chunks, >= 0.
        next_use: :meth:`ChunkStream.next_use` (computed here when None).

    Raises:
        ValueError: a negative capacity.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 chunks, got {capacity}")
    nxt = (stream.next_use() if next_use is None else next_use).tolist()
    flat, cuts, tokens = stream.lists()
    whole_len = stream.whole().tolist()
    held: dict[int, int] = {}  # chunk id -> its next request
    heap: list[tuple[int, int, int]] = []  # (-next request, -depth, id): the top is the first to go
    push, pop = heapq.heappush, heapq.heappop
    hits = whole = 0
    for r in range(len(tokens)):
        a, b = cuts[r], cuts[r + 1]
        k = 0
        while a + k < b and flat[a + k] in held:
            k += 1
        hits += k
        whole += k == b - a and whole_len[r]
        if not capacity:
            continue
        for d in range(b - a):
            x, t = flat[a + d], nxt[a + d]
            if t == NEVER:
                held.pop(x, None)
            else:
                held[x] = t
                push(heap, (-t, -d, x))
        while len(held) > capacity:
            t, _, x = pop(heap)
            if held.get(x) == -t:
                del held[x]
        if len(heap) > 4 * capacity + 1024:  # stale entries: rebuild from what is held
            heap = [(-t, -d, x) for x, (t, d) in _depths(held, heap).items()]
            heapq.heapify(heap)
    return hits, int(whole)


def _depths(held: dict[int, int], heap: list[tuple[int, int, int]]) -> dict[int, tuple[int, int]]:
    """Each held chunk's (next request, depth), from the heap's live entries."""
    out = {}
    for t, d, x in heap:
        if held.get(x) == -t:
            out[x] = (-t, -d)
    return out


def optimal_curve(stream: ChunkStream, capacities: Sequence[int], unlimited: tuple[int, int]) -> list[tuple[int, int]]:
    """MIN's ``(hit chunks, whole hits)`` at each of ``capacities`` (chunks); ``unlimited``: the unlimited cache's
    ``(hit chunks, whole hits)``, given for capacities at or past :func:`peak_live` (no pass needed there)."""
    nxt = stream.next_use()
    peak = peak_live(stream, nxt)
    return [unlimited if c >= peak else optimal_hits(stream, int(c), nxt) for c in capacities]
