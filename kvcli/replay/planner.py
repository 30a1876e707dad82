"""The capacity planner of one chunk size: tiers, the optimal bound and the gap, admission, policies and the bill,
run after the replay on the chunk ids the curve kept (:mod:`kvcli.sim.stream`; no Redis, nothing in the
replay's loops). Off unless ``--tier``, ``--optimal``, ``--admit-after`` or ``--policy`` asks for it.

The chosen capacity (where the gap is split, and where admission and the policies run without tiers): the first
tier's size, else ``--capacity-tokens`` / ``--capacity-bytes``, else the smallest capacity whose LRU reaches 90% of
the unlimited cache's hit tokens.

Pricing (:func:`price_plan`, after the replay's savings): a tier's hits cost a load and save their recompute.
Recompute: the tier's hit tokens times the replay's saved prefill per hit token at this chunk size (its 95%
interval carried): an average over the trace's hits, not the marginal cost of each. Load, by the tier's kind
(:data:`kvcli.sim.tiers.KINDS`): ``gpu`` 0 (the prefix cache is in device memory); ``host`` its bytes at the
device's load rate (``--hardware``'s host link or ``--prefill-profile``'s measured rate; else this machine's
measured deserialize time per chunk); any other tier a store across the network, priced as the replay's Redis
(the network model's round trip per request and bytes at link speed, or the server's measured rates), plus the
host part.
"""
from __future__ import annotations

import time

from kvcli.replay.bill import Prices, bill
from kvcli.replay.network import DeviceRates, Link, ServerRates
from kvcli.replay.results import PlanOptions, PlanResult
from kvcli.replay.savings import Interval
from kvcli.sim.curve import CurveResult
from kvcli.sim.eviction import simulate_policy
from kvcli.sim.optimal import optimal_by_capacity
from kvcli.sim.stream import ChunkStream
from kvcli.sim.tiers import simulate_tiers


def chosen_capacity(options: PlanOptions, curve: CurveResult, capacity_chunks: int | None) -> tuple[int, str]:
    """The chosen capacity in chunks and what chose it (module docstring)."""
    if options.tiers:
        t = options.tiers[0]
        return t.chunks(curve.chunk_size, curve.payload_bytes_per_chunk), f"the first tier ({t.name})"
    if capacity_chunks is not None:
        return capacity_chunks, "the replay's capacity"
    c = curve.capacity_for(0.9)
    return (c or 0), "the LRU's capacity for 90% of unlimited hits"


def plan(stream: ChunkStream, curve: CurveResult, options: PlanOptions, capacity_chunks: int | None) -> PlanResult:
    """Run what ``options`` asks for over ``stream`` (one chunk size's requests), next to its LRU ``curve``;
    ``capacity_chunks``: the replay's own capacity at this chunk size (None: unlimited)."""
    t0 = time.perf_counter()
    cs, pb = curve.chunk_size, curve.payload_bytes_per_chunk
    cap, source = chosen_capacity(options, curve, capacity_chunks)
    out = PlanResult(cs, pb, cap, source, memory_bytes=stream.nbytes)
    caps = [t.chunks(cs, pb) for t in options.tiers] or [cap]
    if options.tiers:
        counts = simulate_tiers(stream, caps, options.admit_after)
        out.tiers = [{**t.to_dict(), "capacity_chunks": c, "capacity_payload_bytes": c * pb, "hit_tokens": tok,
                      "hit_chunks": hit, "hit_requests": req, "bytes_read": hit * pb, "bytes_written": w * pb}
                     for t, c, tok, hit, req, w in zip(options.tiers, caps, counts.hit_tokens, counts.hit_chunks,
                                                       counts.hit_requests, counts.written_chunks)]
        out.tier_hit_tokens = counts.total_hit_tokens
    if options.admit_after > 1:
        always, admit = simulate_tiers(stream, caps), simulate_tiers(stream, caps, options.admit_after)
        out.admission = {"admit_after": options.admit_after, "capacity_chunks": caps,
                         "hit_tokens_always": always.total_hit_tokens, "hit_tokens_admitted": admit.total_hit_tokens,
                         "bytes_written_always": sum(always.written_chunks) * pb,
                         "bytes_written_admitted": sum(admit.written_chunks) * pb,
                         "new_chunks": admit.new_chunks, "new_chunks_admitted": admit.admitted_new_chunks}
    if options.optimal:
        out.optimal = optimal_by_capacity(stream)
        lru, opt, unl = curve.hit_tokens(cap), out.optimal_hit_tokens(cap), curve.unlimited_hit_tokens
        out.gap = {"capacity_chunks": cap, "lru_hit_tokens": lru, "optimal_hit_tokens": opt,
                   "unlimited_hit_tokens": unl, "policy_gap_tokens": opt - lru, "capacity_gap_tokens": unl - opt}
    if options.policies:
        for name in options.policies:
            p = simulate_policy(stream, name, cap)
            out.policies.append({"policy": name, "capacity_chunks": cap, "hit_tokens": p.hit_tokens(cs),
                                 "bytes_written": p.written_chunks * pb, "skipped": p.skipped})
        if options.optimal:
            out.policies.append({"policy": "optimal (offline)", "capacity_chunks": cap,
                                 "hit_tokens": out.optimal_hit_tokens(cap), "bytes_written": None, "skipped": ""})
    out.seconds = time.perf_counter() - t0
    return out


def price_plan(plan_result: PlanResult, saved: Interval, hit_tokens: int, load_seconds, span_seconds: float | None,
               prices: Prices | None) -> None:
    """Fill each tier's ``load_seconds`` and ``recompute_seconds`` (``{value, low, high}``), the slow tiers, and the
    bill (module docstring; :func:`kvcli.replay.bill.bill`).

    Args:
        plan_result: the chunk size's plan (changed in place).
        saved: the replay's saved prefill seconds at this chunk size; ``hit_tokens``: its hit tokens.
        load_seconds: a function of (tier dict) -> seconds to load that tier's hits.
        span_seconds: the trace's span (None: no timestamps).
        prices: ``--price`` (None: no bill).
    """
    per_token = Interval(*(x / hit_tokens for x in (saved.value, saved.low, saved.high))) if hit_tokens else None
    for tier in plan_result.tiers:
        tier["load_seconds"] = load_seconds(tier)
        tier["recompute_seconds"] = (None if per_token is None else Interval(
            *(x * tier["hit_tokens"] for x in (per_token.value, per_token.low, per_token.high))).to_dict())
        rec = tier["recompute_seconds"]
        if rec is not None and tier["hit_tokens"] and tier["load_seconds"] > rec["value"]:
            plan_result.slow_tiers.append(tier["name"])
    if prices is None:
        return
    tokens = plan_result.tier_hit_tokens if plan_result.tiers else hit_tokens
    tier_saved = saved if per_token is None or not plan_result.tiers else Interval(
        *(x * (tokens or 0) for x in (per_token.value, per_token.low, per_token.high)))
    sizes = {t["name"]: t["capacity_payload_bytes"] for t in plan_result.tiers}
    plan_result.bill = bill(tier_saved, span_seconds, sizes, prices)


def tier_load_seconds(tier: dict, value_bytes: int, rate: ServerRates, link: Link | None,
                      device: DeviceRates | None) -> float:
    """Seconds to load one tier's hits (``tier``: a :attr:`PlanResult.tiers` entry) onto the device (module
    docstring): ``gpu`` 0; ``host`` its payload bytes at ``device``'s load rate (None: this machine's measured
    deserialize time per chunk, ``rate``); another tier also the wire: ``link`` (one round trip per request that
    reads from it, ``value_bytes`` per chunk at link speed) or, without one, the server's measured rates."""
    chunks, requests = tier["hit_chunks"], tier["hit_requests"]
    if tier["kind"] == "gpu" or not chunks:
        return 0.0
    pb = tier["capacity_payload_bytes"] // max(tier["capacity_chunks"], 1)
    host = chunks * pb / device.load_bytes_per_second if device is not None else chunks * rate.deserialize_seconds
    if tier["kind"] == "host":
        return host
    wire = (link.seconds(chunks * value_bytes, requests) if link is not None
            else requests * rate.get_round_trip_seconds + chunks * rate.get_seconds)
    return wire + host
