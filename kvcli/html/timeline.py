"""Explain's per-request breakdown drawn (an explain trace object: ``kvcli explain --json``'s, or the one replay
``--html`` attaches to each trace): the tokens by cause, the top divergence sites, and the per-request cache
timeline: each request at its arrival time, its prompt split into the tokens reused and those lost, by cause, in the
order they lie along the prompt; a brush on the overview below it zooms; a click on a request draws its chunk map
under it."""
from __future__ import annotations

from kvcli.html.blocks import Facts, Figure, Part, Table
from kvcli.html.charts import CAUSE_COLORS, WIDE, WIDTH, cause_color, spec, text_tip, tip
from kvcli.html.numbers import NA, count, pct, seconds

#: the most requests a timeline draws; a longer trace is drawn every k-th request (the page says so).
MAX_REQUESTS = 10_000


def explained_parts(x: dict, where: str) -> list[Part]:
    """The parts for one explained trace ``x``: its figures' facts, the tokens by cause, the timeline with its
    chunk map, the top divergence sites. ``where``: the document kind it came in ("replay": attached to a
    replay's trace)."""
    facts = [("explained at", _cache(x)),
             ("tokens", f"{count(x['prompt_tokens'])} prompt tokens in {count(x['requests'])} requests; reused "
                        f"{count(x['reused_tokens'])} ({pct(_share(x['reused_tokens'], x['prompt_tokens']))}); "
                        f"token-granular bound {count(x['upper_bound_tokens'])} "
                        f"({pct(_share(x['upper_bound_tokens'], x['prompt_tokens']))})")]
    if where == "replay":
        facts.append(("from", "kvcli explain's rules at the chunk size the answer names and the replay's capacity: "
                              "its reused tokens are the replay's hit tokens at that size"))
    return [Facts(tuple(facts), "per request"), causes_figure(x), timeline_figure(x), sites_table(x)]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _cache(x: dict) -> str:
    capacity = "unlimited capacity" if x.get("capacity_chunks") is None else (
        f"an LRU of {count(x['capacity_chunks'])} chunks ({count(x['capacity_chunks'] * x['chunk_size'])} tokens)")
    ttl = "" if x.get("ttl_seconds") is None else (
        f", TTL {seconds(x['ttl_seconds'])} from each chunk's {'last request' if x.get('ttl_refresh') else 'write'}")
    return f"chunk size {x['chunk_size']}, {capacity}{ttl}"


def causes_figure(x: dict) -> Figure:
    """The trace's prompt tokens by cause (reused first), a bar each, with what each cause means."""
    helps = x.get("causes") or {}
    total = x["prompt_tokens"]
    rows = [("reused", x["reused_tokens"])] + [(c, n) for c, n in x["lost_tokens_by_cause"].items()]
    data = [{"cause": c, "tokens": n, "share": _share(n, total), "meaning": helps.get(c, "")} for c, n in rows]
    chart = spec({"width": WIDTH, "height": 24 * len(data), "data": {"values": data}, "mark": "bar",
                  "encoding": {"y": {"field": "cause", "type": "nominal", "sort": list(CAUSE_COLORS), "title": None},
                               "x": {"field": "tokens", "type": "quantitative", "title": "prompt tokens (count)",
                                     "axis": {"format": "~s"}},
                               "color": {**cause_color(None), "legend": None},
                               "tooltip": [text_tip("cause", "cause"), tip("tokens", "tokens", ",.0f"),
                                           tip("share", "share of prompt tokens", ".2%"),
                                           text_tip("meaning", "meaning")]}})
    table = Table(("cause", "tokens", "share"), tuple((c, count(n), pct(_share(n, total))) for c, n in rows))
    return Figure("Where the prompt tokens went", chart, table,
                  "; ".join(f"{c}: {helps[c]}" for c, _ in rows if c in helps), "causes")


def sites_table(x: dict) -> Table:
    """Where prompts first differ from their best predecessor, the places that lost the most tokens first, with
    both prompts' text around the first difference where the trace has text."""
    sites = x.get("top_divergence_sites") or ()
    text = any(s.get("example_ours") or s.get("example_predecessor") for s in sites)
    return Table(("site", "requests", "divergence tokens", "example request",
                  *(("this prompt", "predecessor") if text else ())),
                 tuple((s["site"], count(s["requests"]), count(s["divergence_tokens"]),
                        str(s.get("example_request") or NA),
                        *((str(s.get("example_ours") or NA), str(s.get("example_predecessor") or NA)) if text else ()))
                       for s in sites),
                 "where prompts diverge from their best predecessor" if sites else "no prompt diverged")


def timeline_data(x: dict) -> tuple[list[dict], list[dict], int, bool]:
    """The timeline's rows: one per request (``i`` its arrival index, ``t`` its arrival time in seconds or its
    index when the trace has no timestamps, ``x`` where it is drawn (:func:`positions`), ``n`` prompt tokens,
    ``reused``, ``lost`` reusable tokens lost, ``pred``, ``site``) and one per span of a prompt (``i``, ``cause``,
    ``a``..``b`` token positions); the stride (every k-th request, past :data:`MAX_REQUESTS`) and whether ``t`` is
    a time."""
    per = x["per_request"]
    stride = max(1, -(-len(per) // MAX_REQUESTS))
    timed = bool(per) and all(r.get("timestamp_seconds") is not None for r in per)
    picked = range(0, len(per), stride)
    times = [float(per[i]["timestamp_seconds"]) if timed else float(i) for i in picked]
    requests, spans = [], []
    for i, t, at in zip(picked, times, positions(times)):
        r = per[i]
        lost = r["lost_tokens_by_cause"]
        requests.append({"i": i, "id": r["id"], "t": t, "x": at, "n": r["prompt_tokens"], "reused": r["reused_tokens"],
                         "lost": sum(v for c, v in lost.items() if c != "new"),
                         "pred": r.get("predecessor") or "none", "site": r.get("divergence_site") or ""})
        spans += [{"i": i, "cause": cause, "a": a, "b": b} for cause, a, b in _spans(r)]
    return requests, spans, stride, timed


def positions(times: list[float]) -> list[float]:
    """Where each request is drawn on the time axis (``times``: arrival times in arrival order, seconds): at its
    time, except that the requests of one instant stand side by side over the first 80% of the gap to the next
    instant (the last instant's: the gap before it, or 1 s), so that none hides another."""
    instants = sorted(set(times))
    gaps = {t: b - t for t, b in zip(instants, instants[1:])}
    if instants:
        gaps[instants[-1]] = gaps[instants[-2]] if len(instants) > 1 else 1.0
    size: dict[float, int] = {}
    for t in times:
        size[t] = size.get(t, 0) + 1
    seen: dict[float, int] = {}
    out = []
    for t in times:
        k = seen[t] = seen.get(t, -1) + 1
        out.append(t + 0.8 * gaps[t] * k / size[t])
    return out


def _spans(r: dict) -> list[tuple[str, int, int]]:
    """A request's ``token_spans``; from a document without them, its counts laid in explain's order (reused, then
    the causes as the document lists them, which is that order)."""
    if r.get("token_spans") is not None:
        return [(c, int(a), int(b)) for c, a, b in r["token_spans"]]
    out, at = [], 0
    for cause, n in [("reused", r["reused_tokens"]), *r["lost_tokens_by_cause"].items()]:
        if n:
            out.append((cause, at, at + n))
            at += n
    return out


def timeline_figure(x: dict) -> Figure:
    """The per-request cache timeline (module docstring), its overview with the brush, and the chunk map of the
    request clicked (at first, the one that lost the most reusable tokens)."""
    requests, spans, stride, timed = timeline_data(x)
    cs = x["chunk_size"]
    first = max(requests, key=lambda r: (r["lost"], -r["i"]))["i"] if requests else 0
    t_title = ("arrival time (s from the trace's start; requests of one instant side by side)" if timed
               else "request (arrival order)")
    req_tips = [text_tip("id", "request"), tip("t", "arrival (s)" if timed else "arrival index", ",.3~f"),
                tip("n", "prompt tokens", ",.0f"), tip("reused", "reused tokens", ",.0f"),
                tip("lost", "reusable tokens lost", ",.0f"), text_tip("pred", "best prefix from"),
                text_tip("site", "differs at")]
    lookup = {"lookup": "i", "from": {"data": {"name": "requests"}, "key": "i",
                                      "fields": ["id", "t", "x", "n", "reused", "lost", "pred", "site"]}}
    span_tips = [text_tip("cause", "tokens"), tip("a", "from token", ",.0f"), tip("b", "to token", ",.0f"),
                 tip("tokens", "tokens", ",.0f")]
    detail = {
        "width": WIDE, "height": 300, "data": {"name": "spans"},
        "transform": [lookup, {"calculate": "datum.b - datum.a", "as": "tokens"}],
        "params": [{"name": "pick", "value": [{"i": first}],
                    "select": {"type": "point", "fields": ["i"], "on": "click", "clear": False}}],
        "mark": {"type": "bar", "size": 3, "clip": True},  # zoomed: the requests outside stay outside
        "encoding": {"x": {"field": "x", "type": "quantitative", "title": t_title,
                           "scale": {"domain": {"param": "brush"}, "nice": False, "padding": 4}},
                     "y": {"field": "a", "type": "quantitative", "title": "prompt tokens (position in the prompt)",
                           "axis": {"format": "~s"}},
                     "y2": {"field": "b"}, "color": cause_color(),
                     "opacity": {"condition": {"param": "pick", "value": 1}, "value": 0.7},
                     "tooltip": req_tips[:1] + span_tips + req_tips[1:]}}
    overview = {
        "width": WIDE, "height": 60, "data": {"name": "requests"},
        "layer": [{"params": [{"name": "brush", "select": {"type": "interval", "encodings": ["x"]}}],
                   "mark": {"type": "bar", "size": 2, "color": "#b0b0b0"},
                   "encoding": {"x": {"field": "x", "type": "quantitative", "title": "drag here to zoom the timeline",
                                      "scale": {"nice": False, "padding": 4}},
                                "y": {"field": "n", "type": "quantitative", "title": "tokens", "stack": None,
                                      "axis": {"format": "~s", "tickCount": 2}}}},
                  {"mark": {"type": "bar", "size": 2, "color": CAUSE_COLORS["reused"]},
                   "encoding": {"x": {"field": "x", "type": "quantitative"},
                                "y": {"field": "reused", "type": "quantitative", "stack": None}}}]}
    label = ("'request ' + datum.id + ': ' + format(datum.n, ',') + ' prompt tokens, ' + format(datum.reused, ',')"
             " + ' reused; best prefix from ' + datum.pred + (datum.site ? '; differs at ' + datum.site : '')")
    chunk_map = {
        "width": WIDE, "height": 50,
        "layer": [{"data": {"name": "spans"},
                   "transform": [{"filter": {"param": "pick", "empty": False}},
                                 {"calculate": f"datum.a / {cs}", "as": "ca"},
                                 {"calculate": f"datum.b / {cs}", "as": "cb"},
                                 {"calculate": "datum.b - datum.a", "as": "tokens"}],
                   "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
                   "encoding": {"x": {"field": "ca", "type": "quantitative",
                                      "title": f"chunk (of {cs} tokens; a partial last chunk is never cached)",
                                      "axis": {"tickMinStep": 1, "grid": True}},
                                "x2": {"field": "cb"}, "color": cause_color(),
                                "tooltip": span_tips + [tip("ca", "from chunk", ",.2f"),
                                                        tip("cb", "to chunk", ",.2f")]}},
                  {"data": {"name": "requests"},
                   "transform": [{"filter": {"param": "pick", "empty": False}}, {"calculate": label, "as": "label"}],
                   "mark": {"type": "text", "align": "left", "baseline": "bottom", "dy": -4, "fontSize": 12},
                   "encoding": {"x": {"value": 0}, "y": {"value": 0}, "text": {"field": "label"}}}]}
    chart = spec({"vconcat": [detail, overview, chunk_map], "spacing": 18, "resolve": {"scale": {"x": "independent"}}},
                 {"requests": requests, "spans": spans})
    sampled = (f" Drawn every {stride}th request of {count(len(x['per_request']))} (the figure's limit is "
               f"{count(MAX_REQUESTS)}); the totals count every request." if stride > 1 else "")
    return Figure("Per-request cache timeline: each prompt's tokens, reused and lost by cause", chart, None,
                  "Each bar is one request at its arrival, its prompt from token 0 (bottom) up: reused tokens first, "
                  "then the lost ones in the order they lie along the prompt. Drag on the strip below it to zoom; "
                  "click a request to draw its chunk map underneath; hover for the numbers." + sampled, "timeline")
