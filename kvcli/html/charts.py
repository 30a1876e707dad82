"""Vega-Lite building blocks every view shares: the causes' colours, axis and tooltip helpers, and the spec's
common settings. Specs are plain JSON-ready dicts, written as Vega-Lite's documentation writes them
(https://vega.github.io/vega-lite/docs/)."""
from __future__ import annotations

from typing import Any

#: each cause of a request's tokens (kvcli explain's, and "reused") and its colour, in the order a prompt lays them
#: out: reused first, then the causes of the tokens lost.
CAUSE_COLORS = {
    "reused": "#2ca02c",
    "expiry": "#ff7f0e",
    "eviction": "#d62728",
    "hybrid_block": "#e377c2",
    "chunk_boundary": "#bcbd22",
    "last_token": "#8c564b",
    "cache_salt": "#9467bd",
    "divergence": "#1f77b4",
    "new": "#b0b0b0",
}

#: the width (CSS pixels) of a chart's plotting area: one chart and its table side by side on a laptop screen.
WIDTH = 520
WIDE = 1000  # the timeline's


def cause_color(title: str | None = "tokens") -> dict:
    """The ``color`` encoding of a ``cause`` field with :data:`CAUSE_COLORS` (the same colour in every figure)."""
    return {"field": "cause", "type": "nominal", "title": title,
            "scale": {"domain": list(CAUSE_COLORS), "range": list(CAUSE_COLORS.values())},
            "legend": {"orient": "top", "direction": "horizontal", "columns": 4}}


def chunk_sizes(rows: list[dict]) -> list[str]:
    """The chunk sizes of replay's rows as text, in the rows' (numeric) order: an ordinal axis's and a legend's
    order."""
    return [str(r["chunk_size"]) for r in rows]


def ordinal(field: str, title: str, order: list[str]) -> dict:
    """An ordinal axis over ``field`` in the given order (chunk sizes as text, numeric order)."""
    return {"field": field, "type": "ordinal", "title": title, "sort": order, "axis": {"labelAngle": 0}}


def tip(field: str, title: str, fmt: str | None = None, kind: str = "quantitative") -> dict:
    """One tooltip row (``fmt``: a d3 format such as ``",.0f"`` or ``".1%"``)."""
    out: dict[str, Any] = {"field": field, "type": kind, "title": title}
    if fmt:
        out["format"] = fmt
    return out


def text_tip(field: str, title: str) -> dict:
    """A tooltip row of text."""
    return tip(field, title, kind="nominal")


def level(value: float, label: str) -> dict:
    """A layer: a dashed horizontal line at ``value`` on the y scale, ``label`` above its left end (a bound)."""
    return {"data": {"values": [{"level": value, "label": label}]}, "layer": [
        {"mark": {"type": "rule", "strokeDash": [6, 4], "color": "#555"},
         "encoding": {"y": {"field": "level", "type": "quantitative"}}},
        {"mark": {"type": "text", "align": "left", "dx": 4, "dy": -7, "color": "#555"},
         "encoding": {"y": {"field": "level", "type": "quantitative"}, "x": {"value": 0}, "text": {"field": "label"}}}]}


def marks_at(rows: list[dict], x: dict, color: str, tooltip: list[dict] | None = None) -> dict:
    """A layer: a dotted vertical line at each row's ``x["field"]`` on the x scale ``x`` (the same dict as the other
    layers', so the scales merge), its ``label`` written up the line at its top."""
    rule: dict = {"mark": {"type": "rule", "strokeDash": [2, 3], "color": color}, "encoding": {"x": x}}
    if tooltip:
        rule["encoding"]["tooltip"] = tooltip
    return {"data": {"values": rows}, "layer": [
        rule, {"mark": {"type": "text", "angle": 270, "align": "right", "baseline": "bottom", "dx": -4, "dy": -3,
                        "color": color},
               "encoding": {"x": x, "y": {"value": 0}, "text": {"field": "label"}}}]}


def spec(body: dict, datasets: dict[str, list] | None = None, title: str | None = None) -> dict:
    """A complete Vega-Lite spec: ``body`` (a mark and its encoding, a layer, a concatenation) with named
    ``datasets`` (shared by the views that say ``{"data": {"name": ...}}``), a ``title`` above it, and the page's
    look (font, no frame around the plot, tooltips on)."""
    out: dict[str, Any] = {**body}
    if datasets:
        out["datasets"] = datasets
    if title:
        out["title"] = {"text": title, "anchor": "start", "fontSize": 13}
    out["config"] = {"font": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
                     "view": {"stroke": None}, "axis": {"labelFontSize": 11, "titleFontSize": 12},
                     "legend": {"labelFontSize": 11, "titleFontSize": 12}, "mark": {"tooltip": True}}
    return out
