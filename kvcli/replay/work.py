"""The independent units of a replay and how their results merge.

A trace's replay runs one store per (layout, chunk size), each in its own key prefix with its own LRU and counts:
nothing one store does changes another's hits. A unit replays the whole trace (in arrival order: one cache's LRU
order stays sequential) through a subset of the stores and returns a :class:`Part`; the parent merges the parts
(:func:`merge_parts`, :func:`merge_logs`, :func:`merged_samples`) into exactly what one unit holding every store
returns, then computes savings, the verdict and the notes once (kvcli.replay.replayer). The only figure that spans
stores, the upper bound, is merged per request and store: ``max(radix match, what the store reuses)``, summed
(more than the match only where a read ``--namespace`` supplies it, at the chunk sizes it holds).

Everything here is plain picklable data: units run in this process, in worker processes or as Ray tasks
(kvcli.replay.parallel).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from kvcli.model.costcurve import PrefillSample
from kvcli.replay.network import ServerRates
from kvcli.replay.results import ChunkSizeResult
from kvcli.replay.savings import Ledger
from kvcli.store.runmark import RunMark
from kvcli.store.written import WrittenChunks
from kvcli.traces.request import Request

UPPER_BOUND_WEIGHT = 4.0  # the radix tree's cost in units of a 1,024-token store (bench/bench_jobs.py, roughly)


@dataclass(frozen=True)
class Work:
    """What every unit of one trace's replay shares, prepared once by the parent.

    Attributes:
        name: the trace's display name.
        reader: zero-argument callable returning a fresh iterator over the trace's requests in arrival order
            (picklable for worker processes: a list's ``functools.partial(iter, list)`` or a file reader).
        lengths: prompt lengths ``[requests]`` (tokens) in arrival order; units replay ``len(lengths)`` requests
            (with ``streamed``: empty, not known yet).
        measured: indices of the requests that run the model.
        measure_tokens: tokens of each measured prompt that run it (0: whole).
        namespace: the run's own namespace.
        stores: ``(layout, chunk_size)`` of every store, in the report's order.
        rates: the server's transfer rates per store, calibrated once by the parent (estimates identical in every
            unit).
        evicts: the preflight says the server will evict keys (``--allow-evictions``): requests one at a time, no
            pipelined batches (kvcli.store.batch), so every eviction is a miss at the very next lookup.
        mark: the run's server (:mod:`kvcli.store.runmark`), which every unit's stores check after a dropped
            connection; None: not checked.
        streamed: the trace is checked as it is read (kvcli.replay.replayer): its lengths are not known before the
            replay; one unit reads it to its end or ``limit`` (None: every request) and returns them
            (:attr:`Part.lengths`).
        limit: with ``streamed``, the most requests read.
    """

    name: str
    reader: Callable[[], Iterable[Request]]
    lengths: np.ndarray
    measured: set[int]
    measure_tokens: int
    namespace: str
    stores: tuple[tuple[str, int], ...]
    rates: list[ServerRates]
    evicts: bool = False
    mark: RunMark | None = None
    streamed: bool = False
    limit: int | None = None


@dataclass
class Part:
    """One unit's results, for the stores ``indices`` of :attr:`Work.stores` (in that order).

    ``reach[j, i]``: the tokens request ``i`` would reuse at store ``indices[j]`` with unlimited capacity (0 for
    an empty prompt); ``match[i]``: the radix tree's reusable tokens for it, in the one unit that ran it, else None.
    ``measured_log``: one entry per measured request, its ``per_chunk_size`` in ``indices`` order. ``samples``:
    the prefills this unit timed (each measured request's full prefill, then its suffixes). ``written``: each
    store's record of the chunks whose keys it may have written (:mod:`kvcli.store.written`), for the cleanup.
    ``lengths``: the prompt lengths ``[requests]`` it read, where :attr:`Work.streamed` (else None).
    """

    indices: tuple[int, ...]
    results: list[ChunkSizeResult]
    ledgers: list[Ledger]
    reach: np.ndarray
    match: np.ndarray | None
    skipped: int
    span_seconds: float | None
    measured_log: list[dict]
    degraded: list[str]
    samples: list[PrefillSample]
    written: list[WrittenChunks] = field(default_factory=list)
    lengths: np.ndarray | None = None


def plan_units(stores: tuple[tuple[str, int], ...], jobs: int, upper_bound: bool) -> list[tuple[tuple[int, ...], bool]]:
    """Split the stores into at most ``jobs`` units of about equal work: ``(store indices, runs the upper bound)``.

    A store's work is taken as ``1 + 256 / chunk_size`` (reading and hashing the trace, plus writes and keys that
    grow as chunks shrink); the radix tree weighs :data:`UPPER_BOUND_WEIGHT`. Greedy: heaviest first into the
    lightest unit, the radix tree last into the lightest. Indices within a unit keep the report's order; exactly
    one unit runs the upper bound.
    """
    count = max(1, min(jobs, len(stores)))
    loads = [0.0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(stores)), key=lambda i: (stores[i][1], i)):  # smallest chunk (heaviest) first
        k = min(range(count), key=lambda j: (loads[j], j))
        loads[k] += 1 + 256 / stores[i][1]
        members[k].append(i)
    radix = min(range(count), key=lambda j: (loads[j], j)) if upper_bound else -1
    return [(tuple(sorted(m)), k == radix) for k, m in enumerate(members)]


def merge_parts(parts: list[Part], stores: int, upper_bound: bool
                ) -> tuple[list[ChunkSizeResult], list[Ledger], int, float | None]:
    """The per-store results and ledgers in the report's order, the skipped (empty) requests and the trace's span
    (seconds), with the upper bound merged per request (module docstring).

    Raises:
        AssertionError: the parts do not cover every store exactly once.
    """
    results: list[ChunkSizeResult | None] = [None] * stores
    ledgers: list[Ledger | None] = [None] * stores
    for part in parts:
        for i, res, ledger in zip(part.indices, part.results, part.ledgers):
            assert results[i] is None, f"store {i} replayed twice"
            results[i], ledgers[i] = res, ledger
    assert all(r is not None for r in results), "a store was not replayed"
    # every slot is filled (asserted above; a ledger comes with each result): the filters only narrow the types
    done = [r for r in results if r is not None]
    books = [ledger for ledger in ledgers if ledger is not None]
    if upper_bound:  # per store: the radix tree's match, or what the store reused where that is more (--namespace)
        match = next(p.match for p in parts if p.match is not None)
        for part in parts:
            for i, reach in zip(part.indices, part.reach):
                done[i].upper_bound_tokens = int(np.maximum(match, reach).sum())
    return done, books, parts[0].skipped, parts[0].span_seconds


def merge_logs(parts: list[Part]) -> list[dict]:
    """The measured requests' log as one unit holding every store writes it: per request, ``per_chunk_size`` in
    the report's order; the full prefill's seconds from the unit holding the first store."""
    first = next(p for p in parts if 0 in p.indices)
    merged = []
    for k, entry in enumerate(first.measured_log):
        rows: dict[int, dict] = {}
        for part in parts:
            rows.update(zip(part.indices, part.measured_log[k]["per_chunk_size"]))
        merged.append({**entry, "per_chunk_size": [rows[i] for i in sorted(rows)]})
    return merged


def merged_samples(parts: list[Part]) -> list[PrefillSample]:
    """The prefill timings of all units with each measured request's full prefill once (the unit holding the first
    store's; every unit runs it for its own stores)."""
    first = next(p for p in parts if 0 in p.indices)
    return first.samples + [s for p in parts if p is not first for s in p.samples if s.cached_tokens > 0]
