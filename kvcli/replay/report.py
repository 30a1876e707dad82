"""Replay reports: per trace, its answer (:mod:`kvcli.replay.answer`) and a table for the terminal (the compact
one of the rows that decide the answer, chunk sizes side by side, or every row with ``full``); one JSON document for
scripts; one stderr line per trace.
"""
from __future__ import annotations

import textwrap

from rich import box
from rich.console import Console
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from kvcli.replay.answer import answer_line, answer_lines, answer_of
from kvcli.replay.curvereport import Row, curve_rows
from kvcli.replay.planreport import capacity_text, plan_notes, plan_rows, sizing_text
from kvcli.replay.results import Answer, ChunkSizeResult, TraceResult
from kvcli.replay.savings import Interval, fmt_interval, sig
from kvcli.tables import print_table, stdout_console
from kvcli.units import fmt_bytes, fmt_count, json_document


def _secs(s: float) -> str:
    text = f"{s:,.3f} s" if abs(s) < 100 else f"{s:,.0f} s"
    return text.replace("-0.000 s", "0.000 s")


NA = "–"  # a figure that was not computed or has no denominator (null in JSON)


def _pct(x: float | None) -> str:
    return NA if x is None else f"{100 * x:.1f}%"


def _count(x: int | None) -> str:
    return NA if x is None else f"{x:,}"


def _s3(x: float) -> str:
    """Seconds to 3 significant digits."""
    return f"{sig(x)} s"


def _iv(r: ChunkSizeResult, get) -> str:
    """An interval of the savings, 3 significant digits, or NA before savings are computed."""
    return f"{fmt_interval(get(r.savings))} s" if r.savings is not None else NA


def _share(iv: Interval | None) -> str:
    if iv is None:
        return NA
    return f"{sig(100 * iv.value)}% [{sig(100 * iv.low)}, {sig(100 * iv.high)}]"  # one precision: the point inside


def _flops(r: ChunkSizeResult) -> str:
    s = r.savings
    return f"{s.saved_flops:.3g} ({_pct(s.saved_flops / s.trace_flops)})" if s and s.trace_flops else NA


def _over(r: ChunkSizeResult, part: str) -> str:
    return _s3(getattr(r.overheads, part)) if r.overheads is not None else NA


def _lookup_ms(p50: float | None, p99: float | None) -> str:
    """Lookup latency percentiles "p50 / p99 ms"; – when nothing was looked up (both None together)."""
    return NA if p50 is None or p99 is None else f"{p50 * 1e3:.2f} / {p99 * 1e3:.2f} ms"


def _per_shard(counts: dict[str, int]) -> str:
    """Round trips per shard: "min / max (N shards)", "1 shard" for a single server, – when none was counted (no
    round trip, or a layout that does not count per shard)."""
    if not any(counts.values()):
        return NA
    if len(counts) <= 1:
        return "1 shard"
    return f"{min(counts.values()):,} / {max(counts.values()):,} ({len(counts)} shards)"


TIMED_LOOKUP, TIMED_TRANSFER = "lookup p50 / p99, timed here", "  of it timed on this server"
"""The rows of figures timed on this machine: a priced replay's table leaves them out (its JSON nulls them)."""

# (label, function of a ChunkSizeResult) — the rows of the table, in reading order.
ROWS: list[Row] = [
    ("requests", lambda r: f"{r.requests:,}"),
    ("prompt tokens", lambda r: f"{r.prompt_tokens:,}"),
    ("hit tokens", lambda r: f"{r.hit_tokens:,}"),
    ("  by metadata alone (payloads unchecked)", lambda r: f"{r.hit_tokens_metadata_only:,}"),
    ("hit token ratio", lambda r: _pct(r.hit_token_ratio)),
    ("  without capacity limit", lambda r: _pct(r.to_dict()["hit_token_ratio_unlimited"])),
    ("  token-granular upper bound", lambda r: _pct(r.to_dict()["upper_bound_ratio"])),
    ("  loss to chunking (tokens)", lambda r: _count(r.to_dict()["loss_to_chunking_tokens"])),
    ("objects created", lambda r: f"{r.objects_created:,}"),
    ("metadata entries", lambda r: f"{r.metadata_entries:,}"),
    ("evicted chunks", lambda r: f"{r.evicted_chunks:,}"),
    ("payload bytes written", lambda r: fmt_bytes(r.payload_bytes_written)),
    ("payload bytes accounted", lambda r: fmt_bytes(r.payload_bytes_accounted)),
    ("serialization header bytes", lambda r: fmt_bytes(r.header_bytes_written)),
    ("metadata bytes", lambda r: fmt_bytes(r.metadata_bytes_written)),
    ("serialized bytes read", lambda r: fmt_bytes(r.serialized_bytes_read)),
    ("Redis memory (MEMORY USAGE)", lambda r: fmt_bytes(r.redis_memory_bytes)),
    ("Redis round trips", lambda r: f"{r.round_trips:,}"),
    ("  per shard, min / max", lambda r: _per_shard(r.round_trips_by_shard)),
    ("Redis retries / BUSY retries / errors / timeouts",
     lambda r: f"{r.redis_retries:,} / {r.redis_busy_retries:,} / {r.redis_errors:,} / {r.redis_timeouts:,}"),
    (TIMED_LOOKUP, lambda r: _lookup_ms(r.lookup_p50_seconds, r.lookup_p99_seconds)),
    ("lookup time", lambda r: _over(r, "lookup")),
    ("transfer time", lambda r: _over(r, "transfer")),
    (TIMED_TRANSFER, lambda r: _secs(r.transfer_seconds_measured)),
    ("deserialize time", lambda r: _over(r, "deserialize")),
    ("critical path (lookup+transfer+deser.)", lambda r: _over(r, "critical")),
    ("background (serialize + store)", lambda r: _over(r, "background")),
    ("measured requests", lambda r: f"{r.measured_requests:,}"),
    ("prefill saved, measured", lambda r: _s3(r.saved_prefill_seconds_measured)),
    ("prefill saved, estimated", lambda r: _s3(r.savings.saved_estimated) if r.savings else NA),
    ("prefill saved [95% interval]", lambda r: _iv(r, lambda s: s.saved)),
    ("  share of the trace's prefill", lambda r: _share(r.savings.share) if r.savings else NA),
    ("  from prompts beyond calibration", lambda r: _pct(r.savings.beyond_share) if r.savings else NA),
    ("prefill FLOPs saved", lambda r: _flops(r)),
    ("net benefit, async stores", lambda r: _iv(r, lambda s: s.net_async)),
    ("net benefit, sync stores", lambda r: _iv(r, lambda s: s.net_sync)),
    ("checksums verified / failed", lambda r: f"{r.checksum_verified_chunks:,} / {r.checksum_failures:,}"),
    ("max logit diff", lambda r: f"{r.max_logit_diff:.2e}" if r.measured_requests else NA),
]


def _blend_pct(r: ChunkSizeResult, tokens) -> str:
    """A share of the prompt tokens from ``r``'s blend record (``tokens(blend)``), or NA without one."""
    return NA if r.blend is None else _pct(r.blend.ratio(tokens(r.blend)))


def _blend_rows(rs: list[ChunkSizeResult]) -> list[Row]:
    """``--reuse blend``'s rows (none without it): the tokens reusable at any position beyond the unbounded prefix
    figure, and what both save with the blended share recomputed (:mod:`kvcli.sim.blend`)."""
    if all(r.blend is None for r in rs):
        return []
    share = next(r.blend.recompute_fraction for r in rs if r.blend is not None)
    return [("+ blend (any position, unbounded)", lambda r: _blend_pct(r, lambda b: b.blend_tokens)),
            (f"  prefix + blend, {100 * share:g}% recomputed", lambda r: _blend_pct(r, lambda b: b.saved_tokens))]


def blend_text(result: TraceResult) -> str | None:
    """One line on ``--reuse blend``'s figures at the answer's chunk size (else the first): the prefix figure
    (unbounded cache), the blend beside it and what they save, by kind; None without them."""
    rows = [r for r in result.per_chunk_size if r.blend is not None]
    if not rows:
        return None
    focus = answer(result).focus
    r = next((r for r in rows if r.chunk_size == focus), rows[0])
    assert r.blend is not None
    return (f"reuse at any position (CacheBlend; units: {r.blend.unit}; an unbounded cache) at chunk size "
            f"{r.chunk_size}: {r.blend.line('prefix')}")


_AFTER_BOUND = next(i for i, (label, _) in enumerate(ROWS) if label.startswith("  loss to chunking")) + 1


def _priced(result: TraceResult) -> bool:
    """Whether the trace's figures were priced (nothing timed here decides them)."""
    return result.pricing is not None and result.pricing["mode"] == "priced"


def trace_table(result: TraceResult, curve_source: str = "measured in this run") -> Table:
    """A table for one trace: one column per chunk size, the recommended one marked (tied ones marked "="); a
    priced replay's leaves out the rows timed on this machine (:data:`TIMED_LOOKUP`, :data:`TIMED_TRANSFER`)."""
    best, marks = result.recommended_chunk_size, _marks(result)
    layout = result.per_chunk_size[0].layout if result.per_chunk_size else "kvcli"
    table = Table(title=f"{result.trace}: {result.requests:,} requests, {result.skipped_empty} empty skipped; "
                        f"payload {result.payload}" + ("" if layout == "kvcli" else f"; layout {layout}"),
                  title_justify="left")
    table.add_column("chunk size", style="bold", no_wrap=True)
    for r in result.per_chunk_size:
        table.add_column(f"{r.chunk_size}{marks[r.chunk_size]}", justify="right",
                         style="green" if r.chunk_size == best else None)
    priced = _priced(result)
    rs = result.per_chunk_size
    for label, fn in ROWS[:_AFTER_BOUND] + _blend_rows(rs) + ROWS[_AFTER_BOUND:] + curve_rows(rs) + plan_rows(rs):
        if priced and label in (TIMED_LOOKUP, TIMED_TRANSFER):
            continue
        if label.startswith("  by metadata") and all(r.hit_tokens_metadata_only == r.hit_tokens
                                                      for r in result.per_chunk_size):
            continue  # every hit's payload checked out: the row would repeat the one above
        table.add_row(label, *[fn(r) for r in result.per_chunk_size])
    table.caption = f"{_verdict_line(result)} {_sources(result, curve_source)}"
    table.caption_justify = "left"
    return table


def _sources(result: TraceResult, curve_source: str) -> str:
    """Where the figures come from (priced, or measured and estimated) and what their intervals cover."""
    transfers = ("the network model" if result.network else "chunk SET/GET timings on this server")
    if _priced(result):
        spread = ("95%, from the utilization's published range" if curve_source.startswith("roofline")
                  else "95%, from the profile's spread" if curve_source.startswith("profile")
                  else "none (a flat rate has no spread)")
        return (f"Priced, not timed: prefill from the {curve_source} (every request), overheads from counts and "
                f"rates (transfers from the network model, KV to and from the device at its rates). Intervals: "
                f"{spread}.")
    return (f"Timed here: measured with the model and Redis in this run; estimated: prefill from the cost curve "
            f"({curve_source}), transfers from {transfers}. Intervals: 95%, from the calibration's spread and this "
            f"run's timing noise.")


def _compact_caption(result: TraceResult, curve_source: str) -> str:
    """The compact table's caption: its marks, where its figures come from, and where every row is."""
    legend = "* recommended, = tied. " if any(_marks(result).values()) else ""
    if _priced(result):
        sources = f"Priced, not timed: prefill from the {curve_source}, overheads from counts and rates."
    else:
        sources = ("Timed here: measured with the model and Redis in this run; estimated: the rest, from the "
                   "cost curve.")
    planned = any(r.plan is not None for r in result.per_chunk_size)
    more = "Every row, the capacity planner's too: --full." if planned else "Every row: --full."
    return f"{legend}{sources} {more}"


def _marks(result: TraceResult) -> dict[int, str]:
    """Each chunk size's mark in a table's header: " *" recommended, " =" tied, "" else."""
    best = result.recommended_chunk_size
    tied = set(result.verdict.tied) if result.verdict and result.verdict.kind == "tie" else set()
    return {r.chunk_size: " *" if r.chunk_size == best else " =" if r.chunk_size in tied else ""
            for r in result.per_chunk_size}


SECOND_UNITS = ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (1e4, 1.0, "s"), (float("inf"), 1 / 3600, "h"))
"""A row of seconds is written in the first unit whose bound its largest magnitude is under: (bound in seconds,
factor, unit)."""


def _seconds_row(values: list[float | None]) -> tuple[float, str]:
    """The factor and unit of a row of seconds (:data:`SECOND_UNITS`)."""
    top = max((abs(v) for v in values if v is not None), default=0.0)
    return next((factor, unit) for bound, factor, unit in SECOND_UNITS if top < bound)


def _seconds_cells(values: list[float | None], also: list[float] | None = None) -> list[str]:
    """Seconds in the row's unit (:func:`_seconds_row` of ``values`` and ``also``: the interval row's ends)."""
    factor, unit = _seconds_row([*values, *(also or [])])
    return [NA if v is None else f"{sig(v * factor)} {unit}" for v in values]


def _ends(ivs: list[Interval | None]) -> list[float]:
    return [x for iv in ivs if iv is not None for x in (iv.low, iv.high)]


def _interval_cells(ivs: list[Interval | None]) -> list[str]:
    """Intervals as "low–high" (one figure where both ends read the same) in the unit of the row above them (its
    values' and theirs, the largest magnitude)."""
    factor, _ = _seconds_row([x for iv in ivs if iv is not None for x in (iv.value, iv.low, iv.high)])
    cells = [None if iv is None else (sig(iv.low * factor), sig(iv.high * factor)) for iv in ivs]
    return [NA if c is None else c[0] if c[0] == c[1] else f"{c[0]}–{c[1]}" for c in cells]


def _ratio(tokens: int | None, r: ChunkSizeResult) -> float | None:
    """``tokens`` over ``r``'s prompt tokens (None without either)."""
    return tokens / r.prompt_tokens if tokens is not None and r.prompt_tokens else None


def _saved(r: ChunkSizeResult) -> Interval | None:
    return r.savings.saved if r.savings is not None else None


def _net(r: ChunkSizeResult) -> Interval | None:
    return r.savings.net(r.store_mode) if r.savings is not None else None


def compact_rows(result: TraceResult) -> list[tuple[str, list[str]]]:
    """The rows that decide the answer, as (label, a cell per chunk size), in reading order: hit token ratio (and
    unbounded, where a capacity cut it; the token-granular upper bound), objects (and evictions, where any), payload
    and metadata bytes, the critical path (and the background, where a size's net benefit counts it), prefill
    saved with its interval and share, the net benefit the verdict compares with its interval."""
    rs = result.per_chunk_size
    saved, net = [_saved(r) for r in rs], [_net(r) for r in rs]
    modes = {r.store_mode for r in rs} or {result.store_mode}
    rows = [("hit token ratio", [_pct(r.hit_token_ratio) for r in rs])]
    if any(r.hit_tokens_unlimited != r.hit_tokens for r in rs):
        rows.append(("  unbounded cache", [_pct(_ratio(r.hit_tokens_unlimited, r)) for r in rs]))
    if any(r.upper_bound_tokens is not None for r in rs):
        rows.append(("  token-granular bound", [_pct(_ratio(r.upper_bound_tokens, r)) for r in rs]))
    rows += [(label, [fn(r) for r in rs]) for label, fn in _blend_rows(rs)]
    rows.append(("objects created", [fmt_count(r.objects_created) for r in rs]))
    if any(r.evicted_chunks for r in rs):
        rows.append(("  evicted chunks", [fmt_count(r.evicted_chunks) for r in rs]))
    rows += [("KV payload bytes", [fmt_bytes(r.payload_bytes_written + r.payload_bytes_accounted) for r in rs]),
             ("metadata bytes", [fmt_bytes(r.metadata_bytes_written) for r in rs]),
             ("critical path", _seconds_cells([_over_seconds(r, "critical") for r in rs]))]
    if any(r.store_mode == "sync" for r in rs):
        rows.append(("background (stores)", _seconds_cells([_over_seconds(r, "background") for r in rs])))
    rows += [("prefill saved", _seconds_cells([_value(iv) for iv in saved], _ends(saved))),
             ("  95% interval", _interval_cells(saved)),
             ("  share of prefill", [_pct(r.savings.share.value) if r.savings and r.savings.share else NA
                                     for r in rs]),
             (f"net benefit ({modes.pop() if len(modes) == 1 else 'mixed'})",
              _seconds_cells([_value(iv) for iv in net], _ends(net))),
             ("  95% interval", _interval_cells(net))]
    return rows


def _over_seconds(r: ChunkSizeResult, part: str) -> float | None:
    return getattr(r.overheads, part) if r.overheads is not None else None


def _value(iv: Interval | None) -> float | None:
    return None if iv is None else iv.value


def compact_table(result: TraceResult) -> Table:
    """The rows that decide the answer (:func:`compact_rows`), chunk sizes side by side, the verdict's marks in
    the header (* recommended, = tied); every row is in :func:`trace_table` (``kvcli replay --full``)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)  # columns 2 apart
    table.add_column("chunk size", style="bold", no_wrap=True)
    marks, best = _marks(result), result.recommended_chunk_size
    for r in result.per_chunk_size:
        table.add_column(f"{r.chunk_size}{marks[r.chunk_size]}", justify="right", no_wrap=True,
                         style="green" if r.chunk_size == best else None)
    for label, cells in compact_rows(result):
        table.add_row(label, *cells)
    return table


def _verdict_line(result: TraceResult) -> str:
    v = result.verdict
    if v is None:
        best = result.recommended_chunk_size
        return (f"* recommended chunk size by net benefit: {best}." if best is not None
                else "No chunk size pays off here: every net benefit is <= 0.")
    if v.kind == "clear":
        return f"* recommended: {v.text}."
    return f"No recommendation: {v.text}{' (marked =)' if v.kind == 'tie' else ''}."


def _facts(result: TraceResult) -> str:
    """One line: how many requests were measured and on how many tokens, and what the calibration covered."""
    line = f"  measured {result.measured_requests} of {result.requests:,} requests"
    if result.measure_tokens and any(m["measured_tokens"] < m["prompt_tokens"] for m in result.measured):
        line += f" (prompts truncated to their first {result.measure_tokens:,} tokens)"
    cal = result.calibration
    if cal:
        line += (f"; calibration covers full prefills up to {result.cost_curve.get('longest_full_tokens', 0):,} "
                 f"tokens and cached contexts up to {cal['longest_tokens']:,} (trace p95 {cal['target_tokens']:,})")
        if cal["skipped_points"]:
            line += f", {len(cal['skipped_points'])} longer points left out by --calibrate-seconds"
    if result.server_evicted_keys is not None:
        line += f"; server evicted keys during the replay: {result.server_evicted_keys:,}"
    return line


# (label, function of a ChunkSizeResult) — the rows that compare key layouts side by side.
LAYOUT_ROWS: list[Row] = [
    ("hit tokens", lambda r: f"{r.hit_tokens:,}"),
    ("hit token ratio", lambda r: _pct(r.hit_token_ratio)),
    ("lookups", lambda r: f"{r.lookups:,}"),
    ("lookup round trips", lambda r: f"{r.lookup_round_trips:,}"),
    ("  per lookup", lambda r: NA if r.to_dict()['lookup_round_trips_per_lookup'] is None else
     f"{r.to_dict()['lookup_round_trips_per_lookup']:.2f}"),
    ("lookup p50 / p99", lambda r: _lookup_ms(r.lookup_p50_seconds, r.lookup_p99_seconds)),
    ("lookup time", lambda r: _secs(r.lookup_seconds)),
    ("Redis round trips (all)", lambda r: f"{r.round_trips:,}"),
    ("objects created", lambda r: f"{r.objects_created:,}"),
    ("key bytes per chunk", lambda r: f"{r.key_bytes_per_chunk:,.0f} B"),
    ("metadata bytes per chunk", lambda r: NA if r.to_dict()['metadata_bytes_per_chunk'] is None else
     f"{r.to_dict()['metadata_bytes_per_chunk']:,.0f} B"),
    ("metadata bytes", lambda r: fmt_bytes(r.metadata_bytes_written)),
    ("payload bytes written", lambda r: fmt_bytes(r.payload_bytes_written)),
    ("serialized bytes read", lambda r: fmt_bytes(r.serialized_bytes_read)),
    ("Redis memory (MEMORY USAGE)", lambda r: fmt_bytes(r.redis_memory_bytes)),
]


def layout_table(result: TraceResult) -> Table:
    """The key layouts side by side (``--layout kvcli,lmcache``): one column per chunk size and layout."""
    cols = sorted((r for rows in result.by_layout.values() for r in rows),
                  key=lambda r: (r.chunk_size, list(result.by_layout).index(r.layout)))
    table = Table(title=f"{result.trace}: key layouts side by side", title_justify="left")
    table.add_column("chunk size / layout", style="bold", no_wrap=True)
    for r in cols:
        table.add_column(f"{r.chunk_size} {r.layout}", justify="right")
    for label, fn in LAYOUT_ROWS:
        table.add_row(label, *[fn(r) for r in cols])
    same = all(len({r.hit_tokens for r in cols if r.chunk_size == c.chunk_size}) == 1 for c in cols)
    table.caption = ("Hit tokens " + ("are equal in every layout" if same else "DIFFER between layouts (a payload "
                     "could not be retrieved)") + ": same chunk hashes, same prefix rule. kvcli: one MGET per "
                     "lookup; lmcache: one EXISTS per chunk until the first miss (LMCache 0.5.6, redis://).")
    table.caption_justify = "left"
    return table


def answer(result: TraceResult) -> Answer:
    """``result``'s answer: the one the run made (:func:`kvcli.replay.runner.run_replay`), else made now from the
    result alone (:func:`kvcli.replay.answer.answer_of`)."""
    return result.answer if result.answer is not None else answer_of(result)


def print_report(results: list[TraceResult], console: Console, context: dict, full: bool = False) -> None:
    """Print every trace's answer (:func:`kvcli.replay.answer.answer_lines`), its table (the compact one, or every
    row with ``full``) and layout comparison, its facts and notes (under a rule naming the trace when there are
    several), then the run context (model, server, cost curve)."""
    for result in results:
        if len(results) > 1:
            console.print(Rule(Text(result.trace), align="left", characters="─"))  # a name, never markup
        for line in answer_lines(answer(result), console.width):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        source = context.get("cost_curve_source", "")
        if full:
            print_table(console, trace_table(result, source))
        else:
            skipped = f", {result.skipped_empty:,} empty skipped" if result.skipped_empty else ""
            say(console, f"{result.trace}: {result.requests:,} requests{skipped}")
            table = compact_table(result)
            table.caption = _compact_caption(result, source)
            table.caption_justify = "left"
            print_table(console, table)
        for extra in (blend_text(result), pricing_text(result), capacity_text(result), sizing_text(result)):
            if extra:
                say(console, f"  {extra}")
        say(console, _facts(result))
        if result.preflight:
            say(console, f"  preflight: {result.preflight['message']}")
        if len(result.by_layout) > 1:
            print_table(console, layout_table(result))
        for note in result.notes:
            say(console, f"  note: {note}")
        for line in plan_notes(result.per_chunk_size) if full else []:
            say(console, f"  {line}")
    curve = context.get("cost_curve", {})
    check = context.get("cost_curve_vs_measured", {})
    source = f" (checkpoint {context['checkpoint']})" if context.get("checkpoint") else ""
    tok_source = context.get("tokenizer_source")
    tok_source = f" from {tok_source}" if tok_source and tok_source != context.get("tokenizer") else ""
    threads = context.get("torch_threads")
    threads = (f" ({threads} torch thread{'s' if threads != 1 else ''}, --threads)"
               if threads and context.get("device") == "cpu" else "")
    scales = context.get("kv_scale_bytes_per_chunk")
    kv_dtype = f"{context['kv_dtype']} (+ {scales:,} scale bytes per chunk) " if scales else ""
    state = context.get("state_bytes_per_chunk")
    state = (f" (attention layers) + {state:,} bytes per chunk of linear layers' state at its end (full and "
             "suffix prefills timed as one forward per chunk-boundary segment)") if state else ""
    say(console, f"model {context.get('model_id')}{source} on {context.get('device')}{threads}, KV "
                 f"{kv_dtype}{context.get('kv_bytes_per_token'):,} bytes/token{state}; tokenizer "
                 f"{context.get('tokenizer')}{tok_source}; Redis {context.get('redis')} "
                 f"{context.get('redis_version')}; metadata {context.get('metadata_placement')}"
                 f"{'; units in ' + context['units'] if context.get('units') else ''}")
    if curve.get("kind") == "roofline":
        acc, rates = curve["accelerator"], context.get("device_rates") or {}
        say(console, f"prefill priced on {acc['label']}: a roofline of the model's FLOPs and bytes "
                     f"({acc['bf16_flops_per_second'] / 1e12:,.0f} TFLOP/s dense BF16, "
                     f"{acc['hbm_bytes_per_second'] / 1e12:.2f} TB/s HBM) at MFU {curve['mfu']:.2f} "
                     f"[{curve['mfu_interval'][0]:.2f}, {curve['mfu_interval'][1]:.2f}]; KV to and from the "
                     f"device at {rates.get('load_bytes_per_second', 0) / 1e9:.0f} GB/s ({acc['host_link']}); "
                     f"overheads priced from counts and rates, not timed")
    elif curve:
        line = (f"cost curve ({context.get('cost_curve_source')}): t = {curve['a_seconds']:.3g} s + "
                f"{curve['b_seconds_per_token']:.3g} s/token x n + "
                f"{curve['d_seconds_per_pair']:.3g} s x n(n+1)/2 + "
                f"{curve.get('e_seconds_per_cached_pair', 0.0):.3g} s x n c")
        rates = context.get("device_rates")
        if rates:
            line += (f"; KV to and from the device at {rates['load_bytes_per_second'] / 1e9:.2f} / "
                     f"{rates['save_bytes_per_second'] / 1e9:.2f} GB/s ({rates['source']}); overheads priced from "
                     f"counts and rates, not timed")
        elif check.get("samples"):
            line += (f"; measured/predicted on {check['samples']} measured prefills: median "
                     f"{check['median_measured_over_predicted']:.2f}, max {check['max_measured_over_predicted']:.2f}")
        say(console, line)


def say(console: Console, text: str) -> None:
    """Print a line of prose under a table, wrapped between words to the console's width (a word longer than a
    line, a path, is printed whole), its continuation lines indented 2 columns past its own indent."""
    indent = len(text) - len(text.lstrip(" "))
    for line in textwrap.wrap(text, console.width, subsequent_indent=" " * (indent + 2), break_long_words=False,
                              break_on_hyphens=False) or [""]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def to_json(results: list[TraceResult], context: dict) -> str:
    """One JSON document: ``{"context": {...}, "traces": [{..., "per_chunk_size": [...]}]}`` (and, with more than
    one layout, ``"by_layout": {"kvcli": [...], "lmcache": [...]}`` per trace)."""
    traces = []
    for t in results:
        traces.append({
            "trace": t.trace, "requests": t.requests, "skipped_empty": t.skipped_empty,
            "measured_requests": t.measured_requests, "payload": t.payload, "seconds": t.seconds,
            "used_memory_delta_bytes": t.used_memory_delta_bytes, "notes": t.notes,
            "recommended_chunk_size": t.recommended_chunk_size,
            "verdict": ({"kind": t.verdict.kind, "tied_chunk_sizes": list(t.verdict.tied), "text": t.verdict.text,
                         "focus_chunk_size": t.verdict.focus,
                         "lower_bound_chunk_sizes": list(t.verdict.lower_bound)} if t.verdict else None),
            "store_mode": t.store_mode, "measure_tokens": t.measure_tokens, "measured": t.measured,
            "calibration": t.calibration, "cost_curve": t.cost_curve, "preflight": t.preflight,
            "server_evicted_keys": t.server_evicted_keys, "span_seconds": t.span_seconds, "network": t.network,
            "server_rates_per_chunk": t.server_rates, "pricing": t.pricing, "capacity": t.capacity,
            "answer": {**answer(t).to_dict(), "lines": answer_lines(answer(t)), "line": summary_line(t)},
            "per_chunk_size": [r.to_dict() for r in t.per_chunk_size],
            **({"by_layout": {name: [r.to_dict() for r in rows] for name, rows in t.by_layout.items()}}
               if len(t.by_layout) > 1 else {})})
    return json_document("replay", {"context": context, "traces": traces})


def pricing_text(result: TraceResult) -> str | None:
    """One line: how the trace's figures were found. Priced: what priced the prefill, the rate it came to over
    the trace's prompts (the ``--prefill-tps`` of a flat-rate run with the same total), and the overheads' model;
    timed here: the same for this run's timings. None without a pricing record."""
    p = result.pricing
    if p is None:
        return None
    rate = p.get("prefill_tokens_per_second")
    if p["mode"] != "priced":
        return f"timed here: prefill from {p['prefill']}; overheads {p['overheads']}"
    said = ""
    if rate is not None and not p["prefill"].startswith("flat rate"):
        tier = (result.capacity or {}).get("gpu_tier")  # a flat-rate run has no accelerator to size it on
        size = "" if tier is None else f" --capacity {tier['kv_bytes']}B"
        said = (f" = {rate:,.0f} tokens/s over this trace's prompts (the same total at a flat rate: --prefill-tps "
                f"{rate:.0f}{size})")
    return f"priced: prefill from the {p['prefill']}{said}; overheads {p['overheads']}"


def summary_line(result: TraceResult) -> str:
    """One line per trace for stderr, never wrapped: the trace's answer whole (:func:`kvcli.replay.answer.
    answer_line`: the verdict, the figures at its chunk size, the cache it assumes, the assumption that moves it
    most) and how many requests were measured; then each chunk size whose hit figures are a lower bound, and why
    (:attr:`~kvcli.replay.results.ChunkSizeResult.understated`)."""
    line = answer_line(result.trace, answer(result), result.measured_requests)
    low = [r for r in result.per_chunk_size if r.requests and r.understated]
    return line + "".join(f"; hit figures at chunk size {r.chunk_size} are a lower bound ({_short_why(r)})"
                          for r in low)


def _short_why(r: ChunkSizeResult) -> str:
    """Why a chunk size's hits are a lower bound, in a few words: "2 of its chunks vanished, 12 Redis calls
    failed" (the notes give :attr:`~kvcli.replay.results.ChunkSizeResult.understated` in full)."""
    why = [f"{r.vanished_chunks:,} of its chunks vanished"] if r.vanished_chunks else []
    if r.redis_errors:
        why.append(f"{r.redis_errors:,} Redis call{'s' if r.redis_errors != 1 else ''} failed")
    return ", ".join(why)


__all__ = ["print_report", "to_json", "trace_table", "compact_table", "layout_table", "summary_line", "answer",
           "pricing_text", "blend_text", "stdout_console"]
