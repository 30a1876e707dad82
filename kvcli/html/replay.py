"""A ``kvcli replay --json`` document, drawn: per trace, the answer and the run's provenance, then per chunk size
the hit ratio against the token-granular bound, objects and bytes, prefill saved and net benefit with their 95%
intervals, the capacity and TTL curves, and, where the document carries explain's per-request breakdown (replay
``--html`` attaches it as each trace's ``explain``), the per-request cache timeline
(:mod:`kvcli.html.timeline`)."""
from __future__ import annotations

from kvcli.html.blocks import Answer, Figure, Notes, Part, Section, Table, Text
from kvcli.html.charts import WIDTH, chunk_sizes, ordinal, spec, text_tip, tip
from kvcli.html.curves import GIB, capacity_figure, ttl_figure
from kvcli.html.documents import Document
from kvcli.html.numbers import NA, count, interval, pct, seconds, sig, size
from kvcli.html.provenance import provenance_facts
from kvcli.html.timeline import explained_parts

BAR_COLORS = {"hit token ratio": "#2ca02c", "without the capacity limit": "#98df8a", "token-granular bound": "#7f7f7f"}


def replay_sections(doc: Document) -> list[Section]:
    """One section per trace of the document."""
    return [Section(f"replay: {t['trace']}", "replay", tuple(_trace_parts(doc.body, t))) for t in doc.body["traces"]]


def answer_lines(trace: dict) -> tuple[str, ...]:
    """The answer's lines: the document's ``answer`` where it has one (its ``lines``, its ``text``, a string, or
    its fields as ``name: value``), else the verdict's text."""
    answer = trace.get("answer")
    if isinstance(answer, str):
        return tuple(answer.splitlines())
    if isinstance(answer, list):
        return tuple(str(line) for line in answer)
    if isinstance(answer, dict):
        if isinstance(answer.get("lines"), list):
            return tuple(str(line) for line in answer["lines"])
        if isinstance(answer.get("text"), str):
            return tuple(answer["text"].splitlines())
        return tuple(f"{k.replace('_', ' ')}: {v}" for k, v in answer.items() if not isinstance(v, (dict, list)))
    verdict = trace.get("verdict")
    if verdict and verdict.get("text"):
        return (verdict["text"],)
    return ("no verdict: no chunk size was replayed (every prompt empty?)",)


def focus_chunk_size(trace: dict) -> int | None:
    """The chunk size the answer points at: the answer's own, else the verdict's focus (the recommended size, the
    tied one it names, or the best net benefit when none pays: :class:`kvcli.replay.savings.Verdict`), else the
    recommended one; None when the document names none."""
    answer = trace.get("answer")
    if isinstance(answer, dict) and isinstance(answer.get("chunk_size"), int):
        return answer["chunk_size"]
    focus = (trace.get("verdict") or {}).get("focus_chunk_size")
    return int(focus) if focus else trace.get("recommended_chunk_size")


def _trace_parts(body: dict, t: dict) -> list[Part]:
    rows = [r for r in t["per_chunk_size"] if r["requests"]]
    parts: list[Part] = [Answer(answer_lines(t)), provenance_facts(body, _trace_facts(body, t))]
    if not rows:
        return parts + [Text("No request with a prompt: nothing to draw."), Notes(tuple(t.get("notes") or ()))]
    focus = focus_chunk_size(t)
    parts += [hit_ratio_figure(rows, focus), objects_figure(rows, focus), savings_figure(rows, focus)]
    curves = [r for r in rows if r.get("hit_curve")]
    if curves:
        parts.append(capacity_figure(curves, body.get("context", {}).get("config", {})))
        parts.append(ttl_figure(curves, t.get("span_seconds")))
    else:
        parts.append(Text("No capacity or TTL curve in this document (replayed with --no-curve or --namespace)."))
    if t.get("explain"):
        parts += explained_parts(t["explain"], "replay")
    else:
        parts.append(Text("No per-request breakdown in this document: replay --html attaches it (so does --json "
                          "beside --html), or draw kvcli explain --json's document beside this one."))
    return parts + [Notes(tuple(t.get("notes") or ()))]


def _trace_facts(body: dict, t: dict) -> list[tuple[str, str]]:
    ctx = body.get("context", {})
    kv = ctx.get("kv_bytes_per_token")
    return [("trace", f"{t['trace']}: {count(t['requests'])} requests over {seconds(t.get('span_seconds'))}"),
            ("model", f"{ctx.get('model_id', NA)} ({size(kv)} of KV per token)" if kv else ctx.get("model_id", NA)),
            ("prefill priced by", str(ctx.get("cost_curve_source", NA))),
            ("stores", f"{t.get('store_mode', NA)}; payload {t.get('payload', NA)}"),
            ("Redis", f"{ctx.get('redis', NA)} (version {ctx.get('redis_version', NA)})")]


def _star(r: dict, focus: int | None) -> str:
    return f"{r['chunk_size']}{' *' if r['chunk_size'] == focus else ''}"


def hit_ratio_figure(rows: list[dict], focus: int | None) -> Figure:
    """Bars per chunk size: the hit token ratio, without the capacity limit where a capacity applied, and the
    token-granular upper bound (an unlimited radix tree)."""
    capped = any(r.get("hit_token_ratio_unlimited") not in (None, r["hit_token_ratio"]) for r in rows)
    measures = ["hit token ratio"] + (["without the capacity limit"] if capped else []) + ["token-granular bound"]
    data = []
    for r in rows:
        data.append({"chunk_size": str(r["chunk_size"]), "measure": measures[0], "ratio": r["hit_token_ratio"],
                     "tokens": r["hit_tokens"]})
        if capped:
            data.append({"chunk_size": str(r["chunk_size"]), "measure": measures[1],
                         "ratio": r["hit_token_ratio_unlimited"], "tokens": r["hit_tokens_unlimited"]})
        if r.get("upper_bound_ratio") is not None:
            data.append({"chunk_size": str(r["chunk_size"]), "measure": "token-granular bound",
                         "ratio": r["upper_bound_ratio"], "tokens": r["upper_bound_tokens"]})
    chart = spec({"width": WIDTH, "height": 260, "data": {"values": data}, "mark": {"type": "bar"},
                  "encoding": {"x": ordinal("chunk_size", "chunk size (tokens)", chunk_sizes(rows)),
                               "xOffset": {"field": "measure", "sort": measures},
                               "y": {"field": "ratio", "type": "quantitative",
                                     "title": "share of prompt tokens (%)", "axis": {"format": ".0%"}},
                               "color": {"field": "measure", "type": "nominal", "sort": measures, "title": None,
                                         "scale": {"domain": measures, "range": [BAR_COLORS[m] for m in measures]},
                                         "legend": {"orient": "top"}},
                               "tooltip": [text_tip("chunk_size", "chunk size"), text_tip("measure", "measure"),
                                           tip("ratio", "share of prompt tokens", ".2%"),
                                           tip("tokens", "tokens", ",.0f")]}})
    table = Table(("chunk size", "hit ratio", *(["unlimited"] if capped else []), "bound", "lost to chunking"),
                  tuple((_star(r, focus), pct(r["hit_token_ratio"]),
                         *([pct(r.get("hit_token_ratio_unlimited"))] if capped else []),
                         pct(r.get("upper_bound_ratio")), f"{count(r.get('loss_to_chunking_tokens'))} tokens")
                        for r in rows))
    return Figure("Hit token ratio per chunk size, against the token-granular bound", chart, table,
                  "The bound is what a token-granular radix cache of unlimited size would reuse; the gap to it is "
                  "the loss to chunking (and, with a capacity, to eviction). * the chunk size the answer names.",
                  "hit-ratio")


def objects_figure(rows: list[dict], focus: int | None) -> Figure:
    """Objects created (and evicted) and bytes (KV payload, metadata) per chunk size."""
    objects, stored = [], []
    for r in rows:
        cs = str(r["chunk_size"])
        objects.append({"chunk_size": cs, "what": "objects created", "n": r["objects_created"]})
        if r.get("evicted_chunks"):
            objects.append({"chunk_size": cs, "what": "chunks evicted", "n": r["evicted_chunks"]})
        payload = (r.get("payload_bytes_written") or 0) + (r.get("payload_bytes_accounted") or 0)
        for what, n in (("KV payload", payload), ("metadata", r.get("metadata_bytes_written") or 0),
                        ("Redis memory", r.get("redis_memory_bytes") or 0)):
            if n > 0:
                stored.append({"chunk_size": cs, "what": what, "gib": n / GIB, "bytes": n})
    x = ordinal("chunk_size", "chunk size (tokens)", chunk_sizes(rows))
    left = {"width": WIDTH // 2 - 20, "height": 240, "data": {"values": objects}, "mark": "bar",
            "encoding": {"x": x, "xOffset": {"field": "what"},
                         "y": {"field": "n", "type": "quantitative", "title": "objects (count)",
                               "axis": {"format": "~s"}},
                         "color": {"field": "what", "type": "nominal", "title": None,
                                   "scale": {"range": ["#1f77b4", "#d62728"]}, "legend": {"orient": "top"}},
                         "tooltip": [text_tip("chunk_size", "chunk size"), text_tip("what", "what"),
                                     tip("n", "count", ",.0f")]}}
    # every chunk size keeps its place on the bytes axis too: one that stored nothing has no bar (0 has no log)
    right = {"width": WIDTH // 2 - 20, "height": 240, "data": {"values": stored}, "mark": "bar",
             "encoding": {"x": {**x, "scale": {"domain": chunk_sizes(rows)}}, "xOffset": {"field": "what"},
                          "y": {"field": "gib", "type": "quantitative", "scale": {"type": "log"}, "stack": None,
                                "title": "bytes (GiB, log scale)"},
                          "color": {"field": "what", "type": "nominal", "title": None,
                                    "scale": {"range": ["#9467bd", "#ff7f0e", "#17becf"]},
                                    "legend": {"orient": "top"}},
                          "tooltip": [text_tip("chunk_size", "chunk size"), text_tip("what", "what"),
                                      tip("gib", "GiB", ",.3f"), tip("bytes", "bytes", ",.0f")]}}
    chart = spec({"hconcat": [left, right], "resolve": {"scale": {"color": "independent", "xOffset": "independent"}}})
    table = Table(("chunk size", "objects", "evicted", "KV payload", "metadata", "Redis memory", "round trips"),
                  tuple((_star(r, focus), count(r["objects_created"]), count(r.get("evicted_chunks")),
                         size((r.get("payload_bytes_written") or 0) + (r.get("payload_bytes_accounted") or 0)),
                         size(r.get("metadata_bytes_written")), size(r.get("redis_memory_bytes")),
                         count(r.get("round_trips"))) for r in rows))
    return Figure("Objects and bytes per chunk size", chart, table,
                  "KV payload: bytes written, or counted with --payload accounted; Redis memory: MEMORY USAGE "
                  "sampled over the run's keys.", "objects")


SAVINGS = (("prefill saved", "saved_prefill_seconds"), ("net benefit, async stores", "net_benefit_async_seconds"),
           ("net benefit, sync stores", "net_benefit_sync_seconds"))


def savings_figure(rows: list[dict], focus: int | None) -> Figure:
    """Prefill saved and the net benefit (async and sync stores) per chunk size, each a point on its 95% interval."""
    data = []
    for r in rows:
        s = r.get("savings") or {}
        for label, key in SAVINGS:
            figure = s.get(key)
            if figure:
                data.append({"chunk_size": str(r["chunk_size"]), "measure": label, "value": figure["value_seconds"],
                             "low": figure["low_seconds"], "high": figure["high_seconds"]})
    if not data:  # a result without savings: the net benefit alone
        data = [{"chunk_size": str(r["chunk_size"]), "measure": "net benefit", "value": r["net_benefit_seconds"],
                 "low": r["net_benefit_seconds"], "high": r["net_benefit_seconds"]} for r in rows]
    order = [label for label, _ in SAVINGS] if data[0]["measure"] != "net benefit" else ["net benefit"]
    x = ordinal("chunk_size", "chunk size (tokens)", chunk_sizes(rows))
    enc = {"x": x, "xOffset": {"field": "measure", "sort": order},
           "color": {"field": "measure", "type": "nominal", "sort": order, "title": None,
                     "scale": {"range": ["#2ca02c", "#1f77b4", "#ff7f0e"]}, "legend": {"orient": "top"}},
           "tooltip": [text_tip("chunk_size", "chunk size"), text_tip("measure", "measure"),
                       tip("value", "seconds", ",.3~g"), tip("low", "95% interval from (s)", ",.3~g"),
                       tip("high", "to (s)", ",.3~g")]}
    chart = spec({"width": WIDTH, "height": 280, "data": {"values": data}, "layer": [
        {"mark": {"type": "rule", "strokeWidth": 2},
         "encoding": {**enc, "y": {"field": "low", "type": "quantitative", "title": "seconds over the trace (s)"},
                      "y2": {"field": "high"}}},
        {"mark": {"type": "point", "filled": True, "size": 60},
         "encoding": {**enc, "y": {"field": "value", "type": "quantitative"}}},
        {"data": {"values": [{"zero": 0}]}, "mark": {"type": "rule", "color": "#555", "strokeDash": [3, 3]},
         "encoding": {"y": {"field": "zero", "type": "quantitative"}}}]})
    table = Table(("chunk size", "prefill saved [95%]", "share of prefill", "net, async [95%]", "net, sync [95%]",
                   "critical path", "background"),
                  tuple((_star(r, focus), interval((r.get("savings") or {}).get("saved_prefill_seconds")),
                         _share((r.get("savings") or {}).get("saved_prefill_share")),
                         interval((r.get("savings") or {}).get("net_benefit_async_seconds")),
                         interval((r.get("savings") or {}).get("net_benefit_sync_seconds")),
                         seconds((r.get("overheads") or {}).get("critical_path_seconds")),
                         seconds((r.get("overheads") or {}).get("background_seconds"))) for r in rows))
    return Figure("Prefill saved and net benefit per chunk size, with 95% intervals", chart, table,
                  "Net benefit: prefill saved minus the critical path (lookup, transfer, deserialize), and minus the "
                  "stores too when they run on the request's path (sync). A point is the estimate, its bar the 95% "
                  "interval; below the dashed line caching costs more than it saves.", "savings")


def _share(figure: dict | None) -> str:
    if not figure:
        return NA
    return f"{pct(figure['value'])} [{sig(100 * figure['low'])}, {sig(100 * figure['high'])}]"
