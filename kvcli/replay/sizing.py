"""How big a cache the figures assume, and how big one must be: the capacity record of a trace (what the replay's
cache held per chunk size, what set it, what an unlimited cache would hold) and the sizing of each chunk size (the
smallest LRU cache that reaches each share of the unlimited cache's hit tokens, and its bill), both from the
hit-ratio curve's exact hits at every capacity (:class:`kvcli.sim.curve.CurveResult`); no Redis, no model.

A size's saved prefill is priced request by request: each request's reused tokens at that size (the curve's chain
distances, :meth:`kvcli.sim.curve.CurveResult.reused_tokens`) through the replay's prefill cost, with its 95%
interval over the cost's draws (:func:`kvcli.replay.savings.priced_saving`); every request estimated, measured ones
too. Its bill (:func:`kvcli.replay.bill.bill`) is the saving at ``--price gpu-hour``
against the memory at each tier's ``--price TIER=$/GB-month``, each priced tier alone holding the whole size.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcli.model.costcurve import PrefillCost
from kvcli.replay.bill import Prices, bill
from kvcli.replay.results import CapacityBasis, ChunkSizeResult
from kvcli.replay.savings import Interval, priced_saving
from kvcli.sim.curve import CurveResult


def capacity_record(basis: CapacityBasis, rows: Sequence[tuple[ChunkSizeResult, int, int | None]]) -> dict:
    """The cache a trace's figures assume (JSON-ready): ``kind``, ``why`` and ``gpu_tier`` of ``basis``, and per
    chunk size (``rows``: its result, payload bytes per chunk and the store's capacity in chunks, None without one)
    the capacity in chunks, tokens and payload bytes, and the chunks and payload bytes an unlimited cache would
    hold (every distinct chunk of the trace; None without the curve)."""
    per_size = []
    for res, payload_bytes, chunks in rows:
        curve = res.hit_curve
        distinct = curve.distinct_chunks if curve is not None else None
        per_size.append({
            "chunk_size": res.chunk_size, "payload_bytes_per_chunk": payload_bytes, "capacity_chunks": chunks,
            "capacity_tokens": None if chunks is None else chunks * res.chunk_size,
            "capacity_payload_bytes": None if chunks is None else chunks * payload_bytes,
            "unlimited_chunks": distinct,
            "unlimited_payload_bytes": None if distinct is None else distinct * payload_bytes})
    return {**basis.to_dict(), "per_chunk_size": per_size}


def size_cache(curve: CurveResult, fractions: Sequence[float], cost: PrefillCost, draws: np.ndarray,
               span_seconds: float | None, prices: Prices | None) -> list[dict]:
    """The smallest LRU cache reaching each of ``fractions`` of ``curve``'s unlimited hit tokens, with its hits,
    saved prefill and bill (module docstring), JSON-ready: one dict per fraction, its capacity fields None where
    the trace has no hit, its saving None where the curve kept no per-request hits.

    Args:
        curve: the chunk size's hit-ratio curve.
        fractions: shares of the unlimited hit tokens, in (0, 1].
        cost: the replay's prefill cost; ``draws``: its draws (``cost.draws(DRAWS, seed)``) for the interval.
        span_seconds: the trace's span (None: no timestamps: no money per day).
        prices: ``--price`` (None: no bill).
    """
    out = []
    for fraction in fractions:
        chunks = curve.capacity_for(fraction)
        entry: dict = {"fraction": fraction, "capacity_chunks": chunks, "capacity_tokens": None,
                       "capacity_payload_bytes": None, "hit_tokens": None, "hit_token_ratio": None,
                       "saved_prefill_seconds": None, "bill": None}
        if chunks is not None:
            hits = curve.hit_tokens(chunks)
            entry.update(capacity_tokens=chunks * curve.chunk_size,
                         capacity_payload_bytes=chunks * curve.payload_bytes_per_chunk, hit_tokens=hits,
                         hit_token_ratio=hits / curve.prompt_tokens if curve.prompt_tokens else None)
            if curve.request_hits is not None:
                at = priced_saving(cost, *curve.reused_tokens(chunks), draws)
                entry["saved_prefill_seconds"] = at.to_dict()
                if prices is not None:
                    entry["bill"] = _bill(at, span_seconds, entry["capacity_payload_bytes"], prices)
        out.append(entry)
    return out


def _bill(saved: Interval, span_seconds: float | None, size_bytes: int, prices: Prices) -> dict:
    """The saving at ``prices.gpu_hour`` (``saved_usd_per_day``, ``accelerators_freed``) and, per priced tier, the
    whole size held there: ``memory_usd_per_day`` and ``net_usd_per_day`` by tier name; ``inputs``: the prices and
    the trace's span."""
    alone = bill(saved, span_seconds, {}, Prices(prices.gpu_hour))
    out = {"saved_usd_per_day": alone["saved_usd_per_day"], "accelerators_freed": alone["accelerators_freed"],
           "memory_usd_per_day": {}, "net_usd_per_day": {},
           "inputs": {"gpu_hour_usd": prices.gpu_hour, "usd_per_gb_month": dict(prices.per_gb_month),
                      "trace_span_seconds": span_seconds}}
    for name, price in prices.per_gb_month.items():
        tier = bill(saved, span_seconds, {name: size_bytes}, Prices(prices.gpu_hour, {name: price}))
        out["memory_usd_per_day"][name] = tier["memory_usd_per_day"][name]
        out["net_usd_per_day"][name] = tier["net_usd_per_day"]
    return out
