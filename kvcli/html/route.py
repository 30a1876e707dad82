"""A ``kvcli route --json`` document, drawn: per trace, each policy's hit ratio and TTFT against the load (the swept
parameter: nodes, rate, ...), TTFT p99 against hit ratio for every run, and the per-node balance of each run."""
from __future__ import annotations

from typing import Any

from kvcli.html.blocks import Facts, Figure, Notes, Part, Section, Table, Text
from kvcli.html.charts import WIDTH, level, spec, text_tip, tip
from kvcli.html.documents import Document
from kvcli.html.numbers import NA, count, pct, seconds, sig
from kvcli.html.provenance import provenance_facts

#: route's sweep parameters: the run's config field and the axis title, the load parameters first.
PARAMETERS = {
    "rate": ("rate", "offered rate (requests/s)"),
    "nodes": ("nodes", "serving nodes (count)"),
    "node-capacity": ("capacity_tokens", "KV cache per node (tokens)"),
    "max-batch": ("max_batch", "requests a node serves at once (count)"),
    "decode-tpot": ("decode_tpot", "seconds per output token (s)"),
    "w": ("cost_weight", "cost: weight w"),
    "temperature": ("temperature", "cost: temperature (tokens)"),
    "abs-threshold": ("abs_threshold", "cache-aware: abs-threshold (requests)"),
    "rel-threshold": ("rel_threshold", "cache-aware: rel-threshold (ratio)"),
    "cache-threshold": ("cache_threshold", "cache-aware: cache-threshold (share of the prompt)"),
    "lookup-delay": ("lookup_delay", "cache-manager: injected lookup delay"),
    "lookup-timeout": ("lookup_timeout", "cache-manager: lookup timeout (s)"),
    "seed": ("seed", "seed"),
}


def route_sections(doc: Document) -> list[Section]:
    """One section per trace of the document."""
    return [Section(f"route: {t['trace']}", "route", tuple(_trace_parts(doc.body, t))) for t in doc.body["traces"]]


def _trace_parts(body: dict, t: dict) -> list[Part]:
    runs = t["runs"]
    cost = t.get("cost_curve") or {}
    facts = [("trace", f"{t['trace']}: {len(runs)} runs"),
             ("prefill", str(cost.get("source") or cost.get("kind") or NA))]
    parts: list[Part] = [provenance_facts(body, facts), _winners(t)]
    if not runs:
        return parts + [Text("No run in this document.")]
    return parts + [load_figure(runs), frontier_figure(runs), balance_figure(runs), runs_table(runs),
                    Notes(tuple(t.get("notes") or ()))]


def run_label(run: dict) -> str:
    """``policy`` and its sweep point (``cache-manager nodes=4``)."""
    sweep = " ".join(f"{k}={v}" for k, v in (run.get("sweep") or {}).items())
    return f"{run['policy']} {sweep}".strip()


def load_parameter(runs: list[dict]) -> str | None:
    """The swept parameter the figures put on x: the first of :data:`PARAMETERS` that some run sweeps."""
    swept = {k for r in runs for k in r.get("sweep") or {}}
    return next((name for name in PARAMETERS if name in swept), None)


def _rows(runs: list[dict], name: str | None) -> list[dict]:
    out = []
    for r in runs:
        field = PARAMETERS[name][0] if name else None
        value = (r.get("config") or {}).get(field) if field else None
        others = " ".join(f"{k}={v}" for k, v in (r.get("sweep") or {}).items() if k != name)
        out.append({"policy": r["policy"], "run": run_label(r), "x": value, "series": others or "",
                    "hit": r["hit_token_ratio"], "bound": r.get("single_node_hit_token_ratio"),
                    "ttft_p50": r["ttft_seconds"]["p50"], "ttft_p99": r["ttft_seconds"]["p99"],
                    "e2e_p99": (r.get("e2e_seconds") or {}).get("p99")})
    return out


def load_figure(runs: list[dict]) -> Figure:
    """Each policy's hit ratio and TTFT (p99, p50 dashed) against the swept load parameter; bars per policy when
    nothing was swept."""
    name = load_parameter(runs)
    rows = _rows(runs, name)
    numeric = name is not None and all(isinstance(r["x"], (int, float)) for r in rows)
    policy = {"field": "policy", "type": "nominal", "title": "policy"}
    tips = [text_tip("run", "run"), tip("hit", "hit token ratio", ".2%"), tip("ttft_p50", "TTFT p50 (s)", ",.3~g"),
            tip("ttft_p99", "TTFT p99 (s)", ",.3~g"), tip("e2e_p99", "e2e p99 (s)", ",.3~g")]
    hit: dict[str, Any]
    ttft: dict[str, Any]
    if name is None:
        x = {"field": "policy", "type": "nominal", "title": "policy", "axis": {"labelAngle": -30}}
        hit = {"mark": "bar", "encoding": {"x": x, "y": {"field": "hit", "type": "quantitative",
                                                          "title": "hit token ratio (%)", "axis": {"format": ".0%"}},
                                           "color": policy, "tooltip": tips}}
        ttft = {"mark": {"type": "rule", "strokeWidth": 3},
                "encoding": {"x": x, "y": {"field": "ttft_p50", "type": "quantitative",
                                           "title": "TTFT p50 to p99 (s)"},
                             "y2": {"field": "ttft_p99"}, "color": policy, "tooltip": tips}}
        ttft = {"layer": [ttft, {"mark": {"type": "point", "filled": True, "size": 60},
                                 "encoding": {"x": x, "y": {"field": "ttft_p99", "type": "quantitative"},
                                              "color": policy, "tooltip": tips}}]}
    else:
        x = {"field": "x", "type": "quantitative" if numeric else "ordinal", "title": PARAMETERS[name][1]}
        if numeric:
            x["scale"] = {"zero": False}
            # whole values (nodes, max batch) are ticked at the swept values alone, never between two of them
            # (nodes=1,2 would draw a 1.5 tick labelled "2"); others get an explicit format, as Vega's default takes
            # its digits from the tick step, 0 when every run has one value, and labels 0.5 as "0"
            ints = sorted({r["x"] for r in rows}) if all(isinstance(r["x"], int) for r in rows) else None
            x["axis"] = {"values": ints, "format": ",d"} if ints else {"format": ",.3~g"}
        line = {"type": "line", "point": True}
        several = any(r["series"] for r in rows)
        detail = {"field": "series", "type": "nominal", "title": "other sweep values"} if several else {
            "value": [1, 0]}
        hit = {"mark": line, "encoding": {"x": x, "y": {"field": "hit", "type": "quantitative",
                                                         "title": "hit token ratio (%)", "axis": {"format": ".0%"}},
                                          "color": policy, "strokeDash": detail, "tooltip": tips}}
        ttft = {"layer": [
            {"mark": line, "encoding": {"x": x, "y": {"field": "ttft_p99", "type": "quantitative",
                                                       "title": "TTFT (s): p99 solid, p50 faint",
                                                       "scale": {"type": "log"}},
                                        "color": policy, "strokeDash": detail, "tooltip": tips}},
            {"mark": {"type": "line", "point": True, "opacity": 0.35},
             "encoding": {"x": x, "y": {"field": "ttft_p50", "type": "quantitative"}, "color": policy,
                          "strokeDash": detail, "tooltip": tips}}]}
    size = {"width": WIDTH // 2 + 40, "height": 260}
    chart = spec({"data": {"values": rows}, "hconcat": [{**size, **hit}, {**size, **ttft}]})
    what = f"against {PARAMETERS[name][1]}" if name else "per policy (nothing swept)"
    return Figure(f"Hit ratio and time to first token, {what}", chart, None,
                  "Hover a point for the run's figures; the table below lists every run.", "load")


def frontier_figure(runs: list[dict]) -> Figure:
    """TTFT p99 (x) against hit ratio (y), one point per run, the 1-node bound dashed: up and to the left is
    better."""
    rows = _rows(runs, load_parameter(runs))
    p99 = [r["ttft_p99"] for r in rows if r["ttft_p99"]]
    log = bool(p99) and max(p99) > 10 * min(p99)
    bound = next((r["bound"] for r in rows if r["bound"] is not None), None)
    tips = [text_tip("run", "run"), tip("hit", "hit token ratio", ".2%"), tip("ttft_p99", "TTFT p99 (s)", ",.3~g")]
    layers: list[dict] = [{
        "data": {"values": rows}, "mark": {"type": "point", "filled": True, "size": 80},
        "encoding": {"x": {"field": "ttft_p99", "type": "quantitative", "title": "TTFT p99 (s" + (
            ", log scale)" if log else ")"), **({"scale": {"type": "log"}} if log else {
                "scale": {"zero": False}, "axis": {"format": ",.3~g"}})},  # one run's value alone: not "0"
                     "y": {"field": "hit", "type": "quantitative", "title": "hit token ratio (%)",
                           "axis": {"format": ".0%"}},
                     "color": {"field": "policy", "type": "nominal", "title": "policy"},
                     "shape": {"field": "policy", "type": "nominal", "title": "policy"}, "tooltip": tips}}]
    if bound is not None:
        layers.append(level(bound, f"1-node bound {pct(bound)}"))
    chart = spec({"width": WIDTH, "height": 300, "layer": layers})
    return Figure("TTFT p99 against hit ratio, every run", chart, None,
                  "Up and to the left is better: a policy up and to the right bought hits with tail latency.",
                  "frontier")


def balance_figure(runs: list[dict]) -> Figure:
    """Per run, each node's prefill tokens against the mean node's (a heat map; 1.00 is perfect balance), with the
    requests and tokens of each node on hover."""
    data = []
    for r in runs:
        per = r.get("per_node") or {}
        tokens, requests = per.get("prefill_tokens") or [], per.get("requests") or []
        mean = sum(tokens) / len(tokens) if tokens else 0
        for node, n in enumerate(tokens):
            data.append({"run": run_label(r), "node": node, "tokens": n,
                         "requests": requests[node] if node < len(requests) else None,
                         "ratio": n / mean if mean else None})
    chart = spec({"width": WIDTH, "height": {"step": 18}, "data": {"values": data}, "mark": "rect",
                  "encoding": {"x": {"field": "node", "type": "ordinal", "title": "node",
                                     "axis": {"labelAngle": 0}},
                               "y": {"field": "run", "type": "nominal", "title": None, "sort": None},
                               "color": {"field": "ratio", "type": "quantitative",
                                         "title": "tokens ÷ mean",
                                         "scale": {"type": "symlog", "scheme": "blueorange", "domainMid": 1}},
                               "tooltip": [text_tip("run", "run"), tip("node", "node"),
                                           tip("requests", "requests", ",.0f"),
                                           tip("tokens", "prefill tokens computed", ",.0f"),
                                           tip("ratio", "of the mean node's", ".2f")]}})
    table = Table(("run", "requests max/mean", "prefill max/mean", "prefill CV", "peak imbalance"),
                  tuple((run_label(r), sig(_spread(r, "requests_spread")), sig(_spread(r, "prefill_tokens_spread")),
                         sig((r.get("per_node") or {}).get("prefill_tokens_spread", {}).get("cv")),
                         count((r.get("per_node") or {}).get("peak_request_imbalance"))) for r in runs),
                  "1.00 is perfect balance; N (the nodes) means one node did everything")
    return Figure("Per-node balance: each node's prefill tokens against the mean node's", chart, table,
                  anchor="balance")


def _spread(run: dict, key: str) -> float | None:
    return ((run.get("per_node") or {}).get(key) or {}).get("max_over_mean")


def runs_table(runs: list[dict]) -> Table:
    """Every run's figures, as the terminal's tables give them."""
    return Table(("run", "hit", "1-node bound", "prefill tokens", "evicted chunks", "req/s", "wait p99",
                  "TTFT p50", "TTFT p99", "e2e p99"),
                 tuple((run_label(r), pct(r["hit_token_ratio"]), pct(r.get("single_node_hit_token_ratio")),
                        count(r.get("prefill_tokens")), count(r.get("evictions")),
                        sig((r.get("throughput") or {}).get("requests_per_second")),
                        seconds((r.get("queue_wait_seconds") or {}).get("p99")),
                        seconds(r["ttft_seconds"]["p50"]), seconds(r["ttft_seconds"]["p99"]),
                        seconds((r.get("e2e_seconds") or {}).get("p99"))) for r in runs), "every run")


def _winners(t: dict) -> Facts:
    pairs = []
    for w in t.get("winners") or ():
        point = " ".join(f"{k}={v}" for k, v in (w.get("sweep") or {}).items()) or "the run"
        ttft, hit = w.get("ttft_p99_seconds") or {}, w.get("hit_token_ratio") or {}
        pairs.append((point, f"lowest TTFT p99: {ttft.get('policy', NA)} ({seconds(ttft.get('value'))}"
                             f"{_by(ttft, 'below')}); highest hit ratio: {hit.get('policy', NA)} "
                             f"({pct(hit.get('value'))}{_by(hit, '')})"))
    return Facts(tuple(pairs), "winners at each sweep point")


def _by(w: dict, word: str) -> str:
    if not w.get("runner_up"):
        return ""
    if w.get("by") is None or round(w["by"], 2) == 1.0:
        return f", ties with {w['runner_up']}"
    return f", {w['by']:.2f}x {word + ' ' if word else ''}{w['runner_up']}"
