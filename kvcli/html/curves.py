"""The replay's curves, drawn: the hit ratio against the cache's size (LRU at every capacity, the optimal eviction
where the document has it, the token-granular bound, the sizes for each share of the unlimited cache's hits, the
tiers' sizes) and against the TTL, from each chunk size's ``hit_curve`` (:mod:`kvcli.sim.curve`,
:mod:`kvcli.sim.ttlcurve`)."""
from __future__ import annotations

from kvcli.html.blocks import Figure, Table, Text
from kvcli.html.charts import WIDTH, chunk_sizes, level, marks_at, spec, text_tip, tip
from kvcli.html.numbers import NA, count, pct, seconds, sig, size

GIB = 2**30


def capacity_figure(rows: list[dict], config: dict) -> Figure:
    """Hit token ratio against the cache's size, one LRU line per chunk size (and the optimal eviction's, dashed,
    where the document has it), the token-granular bound, the sizes that reach each fraction of the unlimited
    cache's hits, each tier's size (the planner's, ``--tier``) and the replay's own capacity."""
    by_bytes = any(p["capacity_payload_bytes"] for r in rows for p in r["hit_curve"]["capacity_points"])
    key, unit = ("capacity_payload_bytes", GIB) if by_bytes else ("capacity_tokens", 1)
    title = "cache size (GiB of KV payload, log scale)" if by_bytes else "cache size (tokens, log scale)"
    curve, marks, prompt = [], [], {r["chunk_size"]: r["prompt_tokens"] for r in rows}
    for r in rows:
        cs, c = str(r["chunk_size"]), r["hit_curve"]
        for p in c["capacity_points"]:
            if p[key] <= 0:
                continue
            point = {"chunk_size": cs, "size": p[key] / unit, "tokens": p["capacity_tokens"],
                     "bytes": p["capacity_payload_bytes"]}
            curve.append({**point, "eviction": "LRU", "ratio": p["hit_token_ratio"], "hit_tokens": p["hit_tokens"]})
            if p.get("optimal_hit_tokens") is not None and prompt[r["chunk_size"]]:
                curve.append({**point, "eviction": "optimal (Belady's MIN)",
                              "ratio": p["optimal_hit_tokens"] / prompt[r["chunk_size"]],
                              "hit_tokens": p["optimal_hit_tokens"]})
        for fraction, p in sorted(c.get("capacity_for_fraction", {}).items(), key=lambda kv: float(kv[0])):
            if p is not None and float(fraction) < 1 and p[key] > 0:  # None: no cache reaches it (no hits)
                marks.append({"chunk_size": cs, "fraction": f"{100 * float(fraction):g}%", "size": p[key] / unit,
                              "tokens": p["capacity_tokens"], "bytes": p["capacity_payload_bytes"],
                              "ratio": p["hit_token_ratio"]})
    sizes = [float(d["size"]) for d in curve]
    lines = _size_lines(rows, config, key, unit, min(sizes, default=1.0), max(sizes, default=1.0))
    bound = next((r["upper_bound_ratio"] for r in rows if r.get("upper_bound_ratio") is not None), None)
    x = {"field": "size", "type": "quantitative", "scale": {"type": "log"}, "title": title}
    y = {"field": "ratio", "type": "quantitative", "title": "hit token ratio (% of prompt tokens)",
         "axis": {"format": ".0%"}}
    color = {"field": "chunk_size", "type": "nominal", "title": "chunk size", "sort": chunk_sizes(rows)}
    tips = [text_tip("chunk_size", "chunk size"), tip("tokens", "tokens", ",.0f"), tip("bytes", "bytes", ",.0f"),
            tip("ratio", "hit token ratio", ".2%")]
    optimal = any(d["eviction"] != "LRU" for d in curve)
    dash = ({"field": "eviction", "type": "nominal", "title": "eviction", "sort": ["LRU", "optimal (Belady's MIN)"],
             "legend": None} if optimal else {"value": [1, 0]})  # the title says which is dashed
    layers: list[dict] = [
        {"data": {"values": curve}, "mark": {"type": "line", "interpolate": "step-after", "point": "transparent"},
         "encoding": {"x": x, "y": y, "color": color, "strokeDash": dash,
                      "tooltip": [*tips[:1], text_tip("eviction", "eviction"), *tips[1:]]}}]
    if marks:
        layers.append({"data": {"values": marks}, "mark": {"type": "point", "filled": True, "size": 70},
                       "encoding": {"x": x, "y": y, "color": color,
                                    "shape": {"field": "fraction", "type": "nominal",
                                              "title": "share of unlimited hits"},
                                    "tooltip": [*tips[:1], text_tip("fraction", "share of the unlimited hits"),
                                                *tips[1:]]}})
    if bound is not None:
        layers.append(level(bound, f"token-granular bound {pct(bound)}"))
    if lines:
        layers.append(marks_at(lines, x, "#8c564b", [text_tip("label", "size"), tip("bytes", "bytes", ",.0f"),
                                                     tip("tokens", "tokens", ",.0f")]))
    chart = spec({"width": WIDTH, "height": 320, "layer": layers})
    fractions = sorted({m["fraction"] for m in marks}, key=lambda f: float(f[:-1]))
    table = Table(("chunk size", *[f"size for {f}" for f in fractions]),
                  tuple((str(r["chunk_size"]), *[_fraction_cell(r, f, by_bytes) for f in fractions]) for r in rows),
                  "cache that reaches this share of the unlimited cache's hit tokens")
    return Figure("Hit ratio against cache size (LRU at every capacity" + (
        "; optimal eviction dashed)" if optimal else ")"), chart, table,
                  "Each line is the hit ratio an LRU cache of that size would have had on this trace (exact: stack "
                  "distances); the points mark the sizes that reach a share of the unlimited cache's hits (the "
                  "table); dotted vertical lines: the tiers' sizes and the replay's own capacity, where given.",
                  "capacity")


def _fraction_cell(r: dict, fraction: str, by_bytes: bool) -> str:
    for key, p in r["hit_curve"].get("capacity_for_fraction", {}).items():
        if p is not None and f"{100 * float(key):g}%" == fraction:
            tokens = f"{count(p['capacity_tokens'])} tokens"
            return f"{size(p['capacity_payload_bytes'])} ({tokens})" if by_bytes else tokens
    return NA


def _size_lines(rows: list[dict], config: dict, key: str, unit: float, low: float, high: float) -> list[dict]:
    """Vertical lines: each tier of the planner's first plan (``--tier``) and the replay's capacity, within the
    curve's x range (a log axis has no room for 0)."""
    out = []
    plan: dict = next((r["plan"] for r in rows if r.get("plan")), {})
    for tier in plan.get("tiers") or ():
        tokens = tier["capacity_chunks"] * plan["chunk_size"]
        n = tier["capacity_payload_bytes"] if key == "capacity_payload_bytes" else tokens
        out.append({"size": n / unit, "label": f"tier {tier['name']}: {size(tier['capacity_payload_bytes'])}",
                    "bytes": tier["capacity_payload_bytes"], "tokens": tokens})
    if config.get("capacity_bytes") and key == "capacity_payload_bytes":
        out.append({"size": config["capacity_bytes"] / unit, "label": f"capacity {size(config['capacity_bytes'])}",
                     "bytes": config["capacity_bytes"], "tokens": None})
    elif config.get("capacity_tokens") and key == "capacity_tokens":
        out.append({"size": config["capacity_tokens"], "label": f"capacity {count(config['capacity_tokens'])} tokens",
                    "bytes": None, "tokens": config["capacity_tokens"]})
    return [line for line in out if low <= line["size"] <= high * 1.5]


def ttl_figure(rows: list[dict], span: float | None) -> Figure | Text:
    """Hit token ratio against the TTL (unlimited capacity), one line per chunk size, the TTLs that reach each
    fraction of the unlimited cache's hits, and the trace's span (from which on a TTL is as good as none); a text
    where the trace has no timestamps."""
    curve, marks = [], []
    rule = rows[0]["hit_curve"].get("ttl_rule", "after write")
    for r in rows:
        c, cs = r["hit_curve"], str(r["chunk_size"])
        ratio = {p["ttl_seconds"]: p["hit_token_ratio"] for p in c.get("ttl_points") or ()}
        curve += [{"chunk_size": cs, "ttl": p["ttl_seconds"], "ratio": p["hit_token_ratio"],
                   "hit_tokens": p["hit_tokens"]} for p in c.get("ttl_points") or ()]
        for fraction, ttl in sorted((c.get("ttl_for_fraction_seconds") or {}).items(), key=lambda kv: float(kv[0])):
            if float(fraction) < 1 and ttl in ratio:
                marks.append({"chunk_size": cs, "fraction": f"{100 * float(fraction):g}%", "ttl": ttl,
                              "ratio": ratio[ttl]})
    if not curve:
        return Text("No TTL curve: the trace has no timestamps.")
    x = {"field": "ttl", "type": "quantitative", "scale": {"type": "log"}, "title": "TTL (s, log scale)"}
    y = {"field": "ratio", "type": "quantitative", "title": "hit token ratio (% of prompt tokens)",
         "axis": {"format": ".0%"}}
    color = {"field": "chunk_size", "type": "nominal", "title": "chunk size", "sort": chunk_sizes(rows)}
    layers: list[dict] = [
        {"data": {"values": curve}, "mark": {"type": "line", "point": {"size": 25}},
         "encoding": {"x": x, "y": y, "color": color,
                      "tooltip": [text_tip("chunk_size", "chunk size"), tip("ttl", "TTL (s)", ",.3~g"),
                                  tip("ratio", "hit token ratio", ".2%"), tip("hit_tokens", "hit tokens", ",.0f")]}}]
    if marks:
        layers.append({"data": {"values": marks}, "mark": {"type": "point", "filled": True, "size": 90},
                       "encoding": {"x": x, "y": y, "color": color,
                                    "shape": {"field": "fraction", "type": "nominal",
                                              "title": "share of unlimited hits"},
                                    "tooltip": [text_tip("chunk_size", "chunk size"),
                                                text_tip("fraction", "share of the unlimited hits"),
                                                tip("ttl", "TTL (s)", ",.3~g"), tip("ratio", "hit token ratio",
                                                                                    ".2%")]}})
    if span:
        layers.append(marks_at([{"ttl": span, "label": f"trace span {sig(span)} s"}], x, "#555"))
    chart = spec({"width": WIDTH, "height": 300, "layer": layers})
    fractions = sorted({m["fraction"] for m in marks}, key=lambda f: float(f[:-1]))
    table = Table(("chunk size", *[f"TTL for {f}" for f in fractions]),
                  tuple((str(r["chunk_size"]), *[_ttl_cell(r, f) for f in fractions]) for r in rows),
                  "shortest grid TTL that reaches this share of the unlimited cache's hit tokens")
    return Figure(f"Hit ratio against TTL (entries expire {rule}; unlimited capacity)", chart, table,
                  "Past the trace's span a TTL is the same as none: replay a longer cut of the trace for longer TTLs.",
                  "ttl")


def _ttl_cell(r: dict, fraction: str) -> str:
    for key, ttl in (r["hit_curve"].get("ttl_for_fraction_seconds") or {}).items():
        if f"{100 * float(key):g}%" == fraction:
            return seconds(ttl)
    return NA
