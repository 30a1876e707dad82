"""The independent units of a replay and how their results merge.

A trace's replay runs one store per (layout, chunk size), each in its own key prefix with its own LRU and counts:
nothing one store does changes another's hits. A unit replays the whole trace (in arrival order: one cache's LRU
order stays sequential) through a subset of the stores and returns a :class:`Part`; the parent merges the parts
(:func:`merge_parts`, :func:`merge_logs`, :func:`merged_samples`) into exactly what one unit holding every store
returns, then computes savings, the verdict and the notes once (kvcli.replay.replayer). The only figure that spans
stores, the upper bound, is merged per request and store: ``max(radix match, what the store reuses)``, summed
(more than the match only where a read ``--namespace`` supplies it, at the chunk sizes it holds).

One chunk size on several cores is split the other way, by requests (:mod:`kvcli.replay.split`): each unit then
replays a :class:`Share` of the trace's requests through the same store, and the parts of one store merge request
by request (:func:`merge_results`, :func:`merge_ledgers`: sums, and per request records in arrival order).

Everything here is plain picklable data: units run in this process, in worker processes or as Ray tasks
(kvcli.replay.parallel).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from kvcli.model.costcurve import PrefillSample
from kvcli.replay.network import ServerRates
from kvcli.replay.results import ChunkSizeResult
from kvcli.replay.savings import Ledger
from kvcli.store.hashing import is_block_prompt
from kvcli.store.runmark import RunMark
from kvcli.store.written import WrittenChunks
from kvcli.traces.request import BlockKeys, HashIdRequest, Request

UPPER_BOUND_WEIGHT = 4.0  # the radix tree's cost in units of a 1,024-token store (bench/bench_jobs.py, roughly)


@dataclass(frozen=True)
class Work:
    """What every unit of one trace's replay shares, prepared once by the parent.

    Attributes:
        name: the trace's display name.
        reader: zero-argument callable returning a fresh iterator over the trace's requests in arrival order
            (picklable for worker processes: a list's ``functools.partial(iter, list)`` or a file reader).
        lengths: prompt lengths ``[requests]`` (tokens) in arrival order; units replay ``len(lengths)`` requests.
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


@dataclass(frozen=True)
class Share:
    """The requests one unit of a split replay takes (:mod:`kvcli.replay.split`); the unit reads the trace and
    skips the others unhashed.

    Attributes:
        replay: bool ``[requests]``: the requests its lanes replay.
        radix: bool ``[requests]``: the requests its radix tree holds (their match is reported; None: none).
        stop: no request from this index on is read (None: the whole trace, as a part that reports the trace's
            span and empty prompts must).
        record: keep each replayed request's chunk hashes and timestamp (:attr:`Part.stream`) for the parent's
            capacity/TTL curve.
        heads: bool ``[requests]``: other requests whose first ``head_tokens`` tokens (:func:`head`) the radix tree
            also holds, in arrival order (None: none), so that its matches are those of one tree of the whole trace
            wherever two parts' requests share fewer tokens than that (:mod:`kvcli.replay.split`).
        head_tokens: the tokens of each of ``heads`` the tree holds.
    """

    replay: np.ndarray
    radix: np.ndarray | None = None
    stop: int | None = None
    record: bool = False
    heads: np.ndarray | None = None
    head_tokens: int = 0


def head(request: Request, tokens: int) -> Request:
    """``request`` cut to its first ``tokens`` tokens (a hash-id request to its first keys, no token synthesized):
    the same chunk hashes as the whole request's for the chunks inside, the same cache salt and model, and a radix tree
    matches it as the whole request up to ``tokens``."""
    prompt = request.prompt
    if is_block_prompt(prompt):
        length = min(prompt.length, tokens)
        keys = prompt.keys[:-(-length // prompt.block_tokens)]
        return HashIdRequest(request.id, None, blocks=BlockKeys(keys, prompt.block_tokens, length),
                             cache_salt=request.cache_salt, model=request.model)
    return Request(request.id, request.token_ids[:tokens], cache_salt=request.cache_salt, model=request.model)


@dataclass
class Part:
    """One unit's results, for the stores ``indices`` of :attr:`Work.stores` (in that order).

    ``reach[j, i]``: the tokens request ``i`` would reuse at store ``indices[j]`` with unlimited capacity (0 for
    an empty prompt); ``match[i]``: the radix tree's reusable tokens for it, in the one unit that ran it, else None.
    ``measured_log``: one entry per measured request, its ``per_chunk_size`` in ``indices`` order. ``samples``:
    the prefills this unit timed (each measured request's full prefill, then its suffixes). ``written``: each
    store's record of the chunks whose keys it may have written (:mod:`kvcli.store.written`), for the cleanup.
    ``replayed``: the indices of the requests its lanes accounted, in their order (the order of each ledger's
    entries). ``lookup_samples``: per store, the timed lookups' seconds (the latency percentiles of merged parts).
    ``stream``: with a :class:`Share` that records, per replayed request its chunk hashes (16 bytes each, joined)
    and timestamp, in :attr:`replayed` order.
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
    replayed: np.ndarray | None = None
    lookup_samples: list[list[float]] = field(default_factory=list)
    stream: list[tuple[bytes, float | None]] | None = None


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


def merge_parts(parts: list[Part], stores: int, upper_bound: bool, match: np.ndarray | None = None
                ) -> tuple[list[ChunkSizeResult], list[Ledger], int, float | None]:
    """The per-store results and ledgers in the report's order, the skipped (empty) requests and the trace's span
    (seconds), with the upper bound merged per request (module docstring). A store replayed by several parts (a
    split replay: each its own requests) merges them (:func:`merge_results`, :func:`merge_ledgers`). ``match``:
    the radix tree's reusable tokens per request where the caller merged it (a split replay), else the one part's
    that ran the tree.

    Raises:
        AssertionError: a store not replayed, or replayed twice by whole-trace units.
    """
    rows: list[list[tuple[Part, int]]] = [[] for _ in range(stores)]
    for part in parts:
        for j, i in enumerate(part.indices):
            rows[i].append((part, j))
    assert all(rows), "a store was not replayed"
    results: list[ChunkSizeResult] = []
    ledgers: list[Ledger] = []
    for got in rows:
        if len(got) == 1:
            part, j = got[0]
            results.append(part.results[j])
            ledgers.append(part.ledgers[j])
            continue
        assert all(part.replayed is not None for part, _ in got), "a store replayed twice"
        results.append(merge_results([part.results[j] for part, j in got],
                                     [s for part, j in got for s in part.lookup_samples[j]]))
        ledgers.append(merge_ledgers([part.ledgers[j] for part, j in got],
                                     [part.replayed for part, _ in got]))  # type: ignore[misc]  # asserted
    if upper_bound:  # per store: the radix tree's match, or what the store reused where that is more (--namespace)
        if match is None:
            match = next(p.match for p in parts if p.match is not None)
        for i, got in enumerate(rows):
            reach = sum(part.reach[j] for part, j in got)
            results[i].upper_bound_tokens = int(np.maximum(match, reach).sum())
    spans = [p.span_seconds for p in parts if p.span_seconds is not None]
    # a unit that stopped reading early saw fewer empty prompts and a shorter span than the trace's (every other
    # unit read it whole)
    return results, ledgers, max(p.skipped for p in parts), max(spans) if spans else None


#: ChunkSizeResult fields that are not summed over parts: the same in every part, set after the merge, or merged
#: their own way (:func:`merge_results`)
NOT_SUMMED = {"chunk_size", "namespace", "layout", "key_bytes_per_chunk", "upper_bound_tokens", "lookup_p50_seconds",
              "lookup_p99_seconds", "max_logit_diff", "round_trips_by_shard", "vanished_chunks", "overheads",
              "savings", "store_mode", "hit_curve", "plan", "sizing"}


def merge_results(rows: list[ChunkSizeResult], lookup_seconds: list[float]) -> ChunkSizeResult:
    """One store's result from the parts that each replayed some of its requests: counts, tokens, bytes and seconds
    summed; the lookup latency percentiles of all the parts' timed lookups (``lookup_seconds``); the largest logit
    difference; round trips per shard summed; vanished chunks summed (None where a part could not tell). The
    curve, plan, sizing, savings and overheads are the caller's (None here, as in each part)."""
    out = dataclasses.replace(rows[0])
    for f in dataclasses.fields(ChunkSizeResult):
        if f.name not in NOT_SUMMED:
            setattr(out, f.name, sum(getattr(r, f.name) for r in rows))
    if lookup_seconds:
        out.lookup_p50_seconds, out.lookup_p99_seconds = (
            float(x) for x in np.percentile(np.asarray(lookup_seconds), [50, 99]))
    else:
        out.lookup_p50_seconds = out.lookup_p99_seconds = None
    out.max_logit_diff = max(r.max_logit_diff for r in rows)
    shards: dict[str, int] = {}
    for r in rows:
        for shard, trips in r.round_trips_by_shard.items():
            shards[shard] = shards.get(shard, 0) + trips
    out.round_trips_by_shard = dict(sorted(shards.items()))
    vanished = [r.vanished_chunks for r in rows]
    out.vanished_chunks = None if None in vanished else sum(v for v in vanished if v is not None)
    return out


def merge_ledgers(ledgers: list[Ledger], orders: list[np.ndarray]) -> Ledger:
    """One ledger of the parts' ledgers (``orders[k]``: the request index of each of ``ledgers[k]``'s entries), its
    per request entries in request order: what one process accounting every request in turn writes."""
    order = np.argsort(np.concatenate(orders), kind="stable").tolist()
    out = Ledger()
    for f in dataclasses.fields(Ledger):
        if f.name == "timings":  # one per measured request: a split replay measures none
            out.timings = [t for ledger in ledgers for t in ledger.timings]
            continue
        joined = [x for ledger in ledgers for x in getattr(ledger, f.name)]
        setattr(out, f.name, [joined[k] for k in order])
    return out


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
