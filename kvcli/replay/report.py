"""Replay reports: a rich table per trace for the terminal, one JSON document for scripts."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvcli.replay.results import ChunkSizeResult, TraceResult
from kvcli.units import fmt_bytes, json_document


def stdout_console() -> Console:
    """The console for results: the terminal's width, or 160 columns when stdout is a pipe or a file (rich would
    otherwise cut tables to 80 columns)."""
    out = Console()
    return out if out.is_terminal else Console(width=160)


def _secs(s: float) -> str:
    text = f"{s:,.3f} s" if abs(s) < 100 else f"{s:,.0f} s"
    return text.replace("-0.000 s", "0.000 s")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _per_shard(counts: dict[str, int]) -> str:
    """Round trips per shard: "min / max (N shards)", or "1 shard" for a single server."""
    if len(counts) <= 1:
        return "1 shard"
    return f"{min(counts.values()):,} / {max(counts.values()):,} ({len(counts)} shards)"


# (label, function of a ChunkSizeResult) — the rows of the table, in reading order.
ROWS: list[tuple[str, callable]] = [
    ("requests", lambda r: f"{r.requests:,}"),
    ("prompt tokens", lambda r: f"{r.prompt_tokens:,}"),
    ("hit tokens", lambda r: f"{r.hit_tokens:,}"),
    ("hit token ratio", lambda r: _pct(r.hit_token_ratio)),
    ("  without capacity limit", lambda r: _pct(r.to_dict()["hit_token_ratio_unlimited"])),
    ("  token-granular upper bound", lambda r: _pct(r.to_dict()["upper_bound_ratio"])),
    ("  loss to chunking (tokens)", lambda r: f"{r.to_dict()['loss_to_chunking_tokens']:,}"),
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
    ("lookup p50 / p99", lambda r: f"{r.lookup_p50_seconds * 1e3:.2f} / {r.lookup_p99_seconds * 1e3:.2f} ms"
                                   + (f" ({r.lookups_sampled:,} sampled)" if r.lookups_pipelined else "")),
    ("lookup time", lambda r: _secs(r.lookup_seconds)),
    ("transfer time measured", lambda r: _secs(r.transfer_seconds_measured)),
    ("transfer time estimated", lambda r: _secs(r.transfer_seconds_estimated)),
    ("deserialize time", lambda r: _secs(r.deserialize_seconds)),
    ("store time (serialize + write)", lambda r: _secs(r.store_seconds)),
    ("store payload writes estimated", lambda r: _secs(r.store_seconds_estimated)),
    ("measured requests", lambda r: f"{r.measured_requests:,}"),
    ("prefill saved, measured", lambda r: _secs(r.saved_prefill_seconds_measured)),
    ("prefill saved, estimated", lambda r: _secs(r.saved_prefill_seconds_estimated)),
    ("overhead", lambda r: _secs(r.overhead_seconds)),
    ("net benefit", lambda r: _secs(r.net_benefit_seconds)),
    ("max logit diff", lambda r: f"{r.max_logit_diff:.2e}" if r.measured_requests else "-"),
]


def trace_table(result: TraceResult, curve_source: str = "measured in this run") -> Table:
    """A table for one trace: one column per chunk size, the recommended one marked."""
    best = result.recommended_chunk_size
    table = Table(title=f"{result.trace}: {result.requests:,} requests, {result.skipped_empty} empty skipped; "
                        f"payload {result.payload}", title_justify="left")
    table.add_column("chunk size", style="bold", no_wrap=True)
    for r in result.per_chunk_size:
        table.add_column(f"{r.chunk_size}{' *' if r.chunk_size == best else ''}", justify="right",
                         style="green" if r.chunk_size == best else None)
    for label, fn in ROWS:
        table.add_row(label, *[fn(r) for r in result.per_chunk_size])
    verdict = (f"* recommended chunk size by net benefit: {best}." if best is not None
               else "No chunk size pays off here: every net benefit is <= 0.")
    table.caption = (f"{verdict} Measured: timed with the model and Redis in this run; estimated: prefill from the "
                     f"cost curve ({curve_source}), transfers from chunk SET/GET timings on this server.")
    table.caption_justify = "left"
    return table


def print_report(results: list[TraceResult], console: Console, context: dict) -> None:
    """Print every trace's table, then the run context (model, server, cost curve)."""
    for result in results:
        console.print(trace_table(result, context.get("cost_curve_source", "")))
        for note in result.notes:
            console.print(f"  note: {note}")
    curve = context.get("cost_curve", {})
    check = context.get("cost_curve_vs_measured", {})
    console.print(f"model {context.get('model_id')} on {context.get('device')}, KV {context.get('kv_bytes_per_token'):,} "
                  f"bytes/token; Redis {context.get('redis')} {context.get('redis_version')}; metadata "
                  f"{context.get('metadata_placement')}", highlight=False)
    if "jobs" in context:
        console.print(f"{context['jobs']} job(s) (processes replaying chunk sizes at once); "
                      f"{context.get('torch_threads_text')}; lookup latency: {context.get('lookup_latency')}",
                      highlight=False)
    if curve:
        line = (f"cost curve ({context.get('cost_curve_source')}): t = {curve['a_seconds']:.3g} s + "
                f"{curve['b_seconds_per_token']:.3g} s/token x n + "
                f"{curve['d_seconds_per_pair']:.3g} s x n(c + (n+1)/2)")
        if check.get("samples"):
            line += (f"; measured/predicted on {check['samples']} measured prefills: median "
                     f"{check['median_measured_over_predicted']:.2f}, max {check['max_measured_over_predicted']:.2f}")
        console.print(line, highlight=False)


def to_json(results: list[TraceResult], context: dict) -> str:
    """One JSON document: ``{"context": {...}, "traces": [{..., "per_chunk_size": [...]}]}``."""
    traces = []
    for t in results:
        traces.append({
            "trace": t.trace, "requests": t.requests, "skipped_empty": t.skipped_empty,
            "measured_requests": t.measured_requests, "payload": t.payload, "seconds": t.seconds,
            "used_memory_delta_bytes": t.used_memory_delta_bytes, "notes": t.notes,
            "recommended_chunk_size": t.recommended_chunk_size,
            "per_chunk_size": [r.to_dict() for r in t.per_chunk_size]})
    return json_document("replay", {"context": context, "traces": traces})


def summary_line(result: TraceResult) -> str:
    """One line per trace for stderr: best chunk size and its hit ratio and net benefit."""
    best = next((r for r in result.per_chunk_size if r.chunk_size == result.recommended_chunk_size), None)
    if best is None:
        top = max(result.per_chunk_size, key=lambda r: r.hit_tokens)
        return (f"{result.trace}: no chunk size pays off (best hit ratio {_pct(top.hit_token_ratio)} at chunk size "
                f"{top.chunk_size}, net benefit {_secs(top.net_benefit_seconds)})")
    return (f"{result.trace}: best chunk size {best.chunk_size} (hit {_pct(best.hit_token_ratio)}, net benefit "
            f"{_secs(best.net_benefit_seconds)})")


__all__ = ["print_report", "to_json", "trace_table", "summary_line", "ChunkSizeResult"]
