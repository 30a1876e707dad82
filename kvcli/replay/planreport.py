"""The capacity planner in the replay report: its table rows (per chunk size), the lines under the table (the
model, the bill's inputs and formulas), and the one-line answers to "how big": the cache the figures assume
(:func:`capacity_text`) and the sizes that reach shares of the unbounded hits (:func:`sizing_text`). See
docs/planner.md for how to read them."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from kvcli.replay.bill import FORMULAS
from kvcli.replay.curvereport import Row
from kvcli.replay.results import ChunkSizeResult, PlanResult, TraceResult
from kvcli.replay.savings import Interval, fmt_interval, sig
from kvcli.units import fmt_bytes

NA = "–"


def _iv(d: dict | None, unit: str = "") -> str:
    return NA if d is None else f"{fmt_interval(Interval(d['value'], d['low'], d['high']))}{unit}"


def _with_plan(fn: Callable[[ChunkSizeResult, Any], str]) -> Callable[[ChunkSizeResult], str]:
    """The cell ``fn`` gives a result and its plan (typed Any: a row exists only where every chunk size's plan has
    that part, all being made from one set of options); – for a result without a plan."""
    def cell(r: ChunkSizeResult) -> str:
        return NA if r.plan is None else fn(r, r.plan)
    return cell


def _pct(part: int, r: ChunkSizeResult) -> str:
    return f"{part:,} ({100 * part / r.prompt_tokens:.1f}%)" if r.prompt_tokens else f"{part:,}"


def _tier(i: int, fn: Callable[[ChunkSizeResult, dict], str]) -> Callable[[ChunkSizeResult], str]:
    return _with_plan(lambda r, p: fn(r, p.tiers[i]) if i < len(p.tiers) else NA)


def _load(t: dict) -> str:
    rec = t.get("recompute_seconds")
    if "load_seconds" not in t:
        return NA
    return f"{sig(t['load_seconds'])} s vs {_iv(rec, ' s')}"


def plan_rows(results: list[ChunkSizeResult]) -> list[Row]:
    """Rows for the replay table: per tier hit tokens, bytes read / written, load vs recompute; the hierarchy's
    total; the optimal bound and the gap; admission; the policies; the bill. Empty without a plan."""
    first = next((r.plan for r in results if r.plan is not None), None)
    if first is None:
        return []
    rows: list[Row] = []
    for i, t in enumerate(first.tiers):
        size = fmt_bytes(t["size_bytes"]) if t["size_bytes"] is not None else f"{t['size_tokens']:,} tok"
        rows += [(f"tier {t['name']} ({size}): hit tokens", _tier(i, lambda r, x: _pct(x["hit_tokens"], r))),
                 (f"  {t['name']}: bytes read / written",
                  _tier(i, lambda r, x: f"{fmt_bytes(x['bytes_read'])} / {fmt_bytes(x['bytes_written'])}")),
                 (f"  {t['name']}: load vs recompute", _tier(i, lambda r, x: _load(x)))]
    if first.tiers:
        rows.append(("tiers together: hit tokens", _with_plan(lambda r, p: _pct(p.tier_hit_tokens or 0, r))))
    if first.gap is not None:
        rows += [("LRU / optimal / unlimited at the chosen size", _with_plan(lambda r, p: " / ".join(
                     f"{p.gap[k]:,}" for k in ("lru_hit_tokens", "optimal_hit_tokens", "unlimited_hit_tokens")))),
                 ("  gap: policy / capacity (tokens)", _with_plan(
                     lambda r, p: f"{p.gap['policy_gap_tokens']:,} / {p.gap['capacity_gap_tokens']:,}"))]
    if first.admission is not None:
        n = first.admission["admit_after"]
        rows += [(f"admit after {n}: hit tokens (always)", _with_plan(lambda r, p: (
                     f"{p.admission['hit_tokens_admitted']:,} ({p.admission['hit_tokens_always']:,})"))),
                 (f"admit after {n}: bytes written (always)", _with_plan(lambda r, p: (
                     f"{fmt_bytes(p.admission['bytes_written_admitted'])} "
                     f"({fmt_bytes(p.admission['bytes_written_always'])})")))]
    for i, pol in enumerate(first.policies):
        rows.append((f"policy {pol['policy']}: hit tokens / written", _with_plan(partial(_policy_cell, i=i))))
    if first.bill is not None:
        rows += [("bill: saved $/day [95%]", _with_plan(lambda r, p: _iv(p.bill["saved_usd_per_day"]))),
                 ("bill: memory $/day", _with_plan(lambda r, p: f"{sig(sum(p.bill['memory_usd_per_day'].values()))}")),
                 ("bill: net $/day [95%]", _with_plan(lambda r, p: _iv(p.bill["net_usd_per_day"]))),
                 ("bill: accelerators freed [95%]", _with_plan(lambda r, p: _iv(p.bill["accelerators_freed"])))]
    rows.append(("planner memory / time", _with_plan(lambda r, p: f"{fmt_bytes(p.memory_bytes)} / {p.seconds:.2f} s")))
    return rows


def _policy_cell(r: ChunkSizeResult, p: PlanResult, i: int) -> str:
    return _policy(p.policies[i]) if i < len(p.policies) else NA


def _policy(p: dict) -> str:
    if p["skipped"]:
        return p["skipped"]
    written = NA if p["bytes_written"] is None else fmt_bytes(p["bytes_written"])
    return f"{p['hit_tokens']:,} / {written}"


def plan_notes(results: list[ChunkSizeResult]) -> list[str]:
    """Lines under the table: the chosen capacity, tiers whose loads cost more than recomputing, policies that were
    not run (and why), the bill's inputs and formulas."""
    plans = [(r, r.plan) for r in results if r.plan is not None]
    if not plans:
        return []
    out = []
    r0, p0 = plans[0]
    out.append(f"planner: chosen capacity = {p0.capacity_source} ({p0.capacity_chunks:,} chunks at chunk size "
               f"{p0.chunk_size}); tiers looked up fastest first, promotion into faster tiers, write-through, one LRU "
               f"each (docs/planner.md); recompute = tier hit tokens x this chunk size's saved prefill per hit token")
    for r, p in plans:
        empty = [t["name"] for t in p.tiers if not t["capacity_chunks"]]
        if empty:
            out.append(f"chunk size {r.chunk_size}: {', '.join(empty)} smaller than one chunk: holds nothing")
        if p.slow_tiers:
            out.append(f"chunk size {r.chunk_size}: loading from {', '.join(p.slow_tiers)} costs more than "
                       f"recomputing its hits")
        out += [f"chunk size {r.chunk_size}: policy {pol['policy']} at {pol['capacity_chunks']:,} chunks "
                f"{pol['skipped']}" for pol in p.policies if pol["skipped"]]
    if p0.bill is not None:
        inputs = p0.bill["inputs"]
        prices = ", ".join(f"{k} ${v:g}/GB-month" for k, v in inputs["usd_per_gb_month"].items()) or "no tier prices"
        gpu = "not given" if inputs["gpu_hour_usd"] is None else f"${inputs['gpu_hour_usd']:g}"
        span = inputs["trace_span_seconds"]
        spanned = ("none (no timestamps: no rate)" if span is None else "0 s (all at one instant: no rate)"
                   if not span else f"{span:,.1f} s")
        out.append(f"bill inputs (yours, no defaults): gpu-hour {gpu}; {prices}; trace span {spanned}; tier bytes: "
                   + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in inputs["tier_bytes"].items()))
        out += [f"bill: {f}" for f in FORMULAS]
    return out


def _focus_size(result: TraceResult) -> int | None:
    """The chunk size a trace's one-line answers speak of: the verdict's (:attr:`kvcli.replay.savings.Verdict.
    focus`), else the first chunk size replayed."""
    if result.verdict is not None and result.verdict.focus is not None:
        return result.verdict.focus
    return next((r.chunk_size for r in result.per_chunk_size if r.requests), None)


def _tokens(n: float) -> str:
    """A token count in a few digits: 442,715 -> "443k", 6,213,632 -> "6.21M"."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{sig(n / scale)}{unit}"
    return f"{n:,.0f}"


def capacity_text(result: TraceResult) -> str | None:
    """One line: the cache the trace's figures assume at its focus chunk size and what set it (the GPU tier and its
    formula, a size given, or unlimited and why), and what an unbounded cache would need; None without a capacity
    record. E.g. "cache: GPU tier 54.0 GiB per node (NVIDIA H100 SXM5 80GB: 80.0 GiB x 0.9 - 15.0 GiB weights -
    3.0 GiB runtime and activations) = 443k tokens; unbounded would need 1.6 TiB (chunk size 256)"."""
    cap, cs = result.capacity, _focus_size(result)
    if cap is None or cs is None:
        return None
    row = next((r for r in cap["per_chunk_size"] if r["chunk_size"] == cs), None)
    if row is None:
        return None
    need = row["unlimited_payload_bytes"]
    needs = "" if need is None else f"; unbounded would need {fmt_bytes(need)} (chunk size {cs})"
    tier = cap.get("gpu_tier")
    if cap["kind"] == "gpu tier" and tier is not None:
        return (f"cache: GPU tier {fmt_bytes(tier['kv_bytes'])} per node ({tier['formula']}) = "
                f"{_tokens(tier['tokens'])} tokens{needs}")
    if cap["kind"] == "given" and row["capacity_chunks"] is not None:
        return (f"cache: {fmt_bytes(row['capacity_payload_bytes'])} = {_tokens(row['capacity_tokens'])} tokens at "
                f"chunk size {cs} (given){needs}")
    held = "" if need is None else f": {fmt_bytes(need)} at chunk size {cs}"
    return f"cache: unlimited ({cap['why']}){held}"


def sizing_text(result: TraceResult) -> str | None:
    """One line: the smallest LRU cache reaching each ``--sizing`` share of the unbounded hits at the focus chunk
    size, and, with ``--price``, what it saves and costs per day; None without sizing (no curve). E.g. "sizes for
    90/95/99% of unbounded hits (chunk size 256): 759 GiB / 950 GiB / 1.2 TiB; saves $20.7 / $21.9 / $22.8 a day
    at $2.5/GPU-hour; memory in redis at $3/GB-month: $80.1 / $100 / $127 a day"."""
    cs = _focus_size(result)
    row = next((r for r in result.per_chunk_size if r.chunk_size == cs), None)
    if row is None or not row.sizing:
        return None
    shares = "/".join(f"{100 * s['fraction']:g}" for s in row.sizing)
    if all(s["capacity_chunks"] is None for s in row.sizing):
        return f"sizes for {shares}% of unbounded hits (chunk size {cs}): no hit to size a cache for"
    line = (f"sizes for {shares}% of unbounded hits (chunk size {cs}): "
            + " / ".join(fmt_bytes(s["capacity_payload_bytes"]) for s in row.sizing))
    bills = [s["bill"] for s in row.sizing]
    if any(b is None for b in bills):
        return line
    inputs = bills[0]["inputs"]
    if all(b["saved_usd_per_day"] is not None for b in bills):
        line += ("; saves " + " / ".join(f"${sig(b['saved_usd_per_day']['value'])}" for b in bills)
                 + f" a day at ${inputs['gpu_hour_usd']:g}/GPU-hour")
    for name in bills[0]["memory_usd_per_day"]:
        price = f" at ${inputs['usd_per_gb_month'][name]:g}/GB-month"
        line += (f"; memory in {name}{price}: "
                 + " / ".join(f"${sig(b['memory_usd_per_day'][name])}" for b in bills) + " a day")
    return line
