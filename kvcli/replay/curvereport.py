"""The capacity/TTL curve in the replay report: the table's rows and the ``--plot`` figure.

How to read the figure: the left panel is the hit token ratio an LRU cache of that size would have had on the
trace (x: payload bytes for the model, log scale; top axis: tokens), one line per chunk size, each ending at its
unlimited-cache ratio, its dots the smallest sizes that reach the ``--sizing`` shares of it (90/95/99% by default),
and a dash-dotted vertical line the replay's own cache (the GPU tier, or the capacity given); the dashed line is the
token-granular upper bound (an unlimited radix tree); with
``--optimal``, a dash-dotted line per chunk size is the optimal eviction's (Belady's MIN, :mod:`kvcli.sim.optimal`)
at the same capacities, so the space between the two is what a better policy could win. A curve that
is still rising at the right edge wants more cache; the knee is where more bytes stop paying. The right panel is the
same against the entries' TTL (unlimited capacity); the dotted line marks the trace's span, from which on a TTL is
the same as none.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from kvcli.errors import BadInputError
from kvcli.figures import check_plot_path, plot_paths, save_figure
from kvcli.replay.results import ChunkSizeResult, TraceResult
from kvcli.sim.curve import CurveResult
from kvcli.sim.ttlcurve import TTL_GRID_SECONDS
from kvcli.units import fmt_bytes

Row = tuple[str, Callable[[ChunkSizeResult], str]]
"""One row of the replay table: its label and the cell of one result."""
CurveCell = Callable[[ChunkSizeResult, CurveResult], str]
"""A curve row's cell: of one result and its curve."""


def _capacity_cell(r: ChunkSizeResult, curve: CurveResult, fraction: float) -> str:
    c = curve.capacity_for(fraction)
    if c is None:
        return "no hits"
    return f"{fmt_bytes(c * curve.payload_bytes_per_chunk)} / {c * r.chunk_size:,} tok"


def _ttl(seconds: float | None) -> str:
    return f"> {TTL_GRID_SECONDS[-1]:,g} s" if seconds is None else f"{seconds:,g} s"


def _ttl_cell(r: ChunkSizeResult, curve: CurveResult) -> str:
    if curve.ttl_hit_chunks is None:  # one request without a timestamp is enough
        return "no timestamps" if curve.untimed_requests >= r.requests else f"{curve.untimed_requests:,} untimed"
    if curve.unlimited_hit_tokens == 0:
        return "no hits"
    return " / ".join(_ttl(curve.ttl_for(f)) for f in (0.5, 0.9, 0.99))


def curve_rows(results: list[ChunkSizeResult]) -> list[Row]:
    """Rows for the replay table (label, function of a result): the cache size (payload bytes for the model /
    tokens) that reaches 50, 90 and 99% of the unlimited hit tokens, the TTLs that do, and the curve's memory.
    Empty when no result has a curve (``--no-curve``)."""
    if not any(r.hit_curve is not None for r in results):
        return []
    rule = next(r.hit_curve.ttl_rule for r in results if r.hit_curve is not None)
    rows: list[tuple[str, CurveCell]] = [
        (f"cache for {round(100 * f)}% of unlimited hits", partial(_capacity_cell, fraction=f))
        for f in (0.5, 0.9, 0.99)]
    rows += [(f"TTL ({rule}) for 50 / 90 / 99%", _ttl_cell),
             ("curve memory", lambda r, c: fmt_bytes(c.memory_bytes))]
    return [(label, _with_curve(fn)) for label, fn in rows]


def _with_curve(fn: CurveCell) -> Callable[[ChunkSizeResult], str]:
    """The cell ``fn`` gives a result and its curve; "-" for a result without a curve."""
    def cell(r: ChunkSizeResult) -> str:
        return "-" if r.hit_curve is None else fn(r, r.hit_curve)
    return cell


def write_plots(results: list[TraceResult], path: str | Path, kv_bytes_per_token: int, model_id: str) -> list[Path]:
    """Write :func:`curve_figure` of each trace (paths from :func:`plot_paths`); returns the paths written.

    Raises:
        BadInputError: a bad suffix, a file that cannot be written, or no curve (``--no-curve``).
    """
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for result, out in zip(results, plot_paths(path, [r.trace for r in results])):
        fig = curve_figure(result, kv_bytes_per_token, model_id)
        try:
            save_figure(fig, out, dpi=110, bbox_inches="tight", pad_inches=0.1)
        finally:
            plt.close(fig)
        written.append(out)
    return written


def curve_figure(result: TraceResult, kv_bytes_per_token: int, model_id: str):
    """Two panels for one trace: hit token ratio (%) against cache size (payload bytes, log) and against TTL
    (seconds, log); one line per chunk size (and its optimal eviction's, dash-dotted, where the plan has it), the
    token-granular upper bound dashed. Returns a matplotlib Figure
    (Agg backend; the caller closes it)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    rows = [r for r in result.per_chunk_size if r.hit_curve is not None]
    curves = [r.hit_curve for r in result.per_chunk_size if r.hit_curve is not None]  # the rows' curves
    if not rows:
        raise BadInputError("--plot needs the curve: drop --no-curve (and --namespace)")
    fig, (cap, ttl) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    bound = 100 * rows[0].to_dict()["upper_bound_ratio"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    widths = np.linspace(3.2, 1.2, len(rows)) if len(rows) > 1 else [1.6]  # lines that coincide stay visible
    timed = any(c.ttl_hit_chunks is not None for c in curves)
    for i, (r, c) in enumerate(zip(rows, curves)):
        color, lw = colors[i % len(colors)], widths[i]
        if c.unlimited_hit_tokens == 0:  # nothing to draw; still named in the legends
            for ax in (cap, ttl) if timed else (cap,):
                ax.plot([], [], color=color, lw=lw, label=f"chunk size {r.chunk_size}: no hits")
            continue
        caps = c.capacities(400)[1:]
        if caps.size:
            x = caps * c.payload_bytes_per_chunk
            y = 100 * c.hit_chunks_by_capacity[caps] * c.chunk_size / max(r.prompt_tokens, 1)
            cap.plot(x, y, drawstyle="steps-post", color=color, lw=lw, label=f"chunk size {r.chunk_size}")
            if r.plan is not None and r.plan.optimal is not None:
                hits = r.plan.optimal[0]
                opt = 100 * hits[np.minimum(caps, len(hits) - 1)] * c.chunk_size / max(r.prompt_tokens, 1)
                cap.plot(x, opt, drawstyle="steps-post", color=color, lw=max(lw - 0.4, 1.0), ls="-.",
                         label=f"chunk size {r.chunk_size}: optimal eviction (MIN)")
            for share, k in _marked_sizes(r, c):
                y = 100 * c.hit_tokens(k) / r.prompt_tokens
                cap.plot([k * c.payload_bytes_per_chunk], [y], "o", color=color, ms=4 + 2 * lw, mec="white", zorder=3)
                if i == 0:  # the shares once, beside the first chunk size's dots
                    cap.annotate(f"{100 * share:g}%", (k * c.payload_bytes_per_chunk, y), textcoords="offset points",
                                 xytext=(-4, 6), ha="right", fontsize=7, color=color)
        if c.ttl_seconds is not None and c.ttl_hit_chunks is not None:  # both None together
            keep = _ttl_range(c)
            ratio = 100 * c.ttl_hit_chunks[keep] * c.chunk_size / max(r.prompt_tokens, 1)
            ttl.plot(c.ttl_seconds[keep], ratio, marker="o", ms=2 + lw, color=color, lw=lw,
                     label=f"chunk size {r.chunk_size}")
    held = _capacity_marker(result)
    if held is not None:
        cap.axvline(held[0], color="black", ls="-.", lw=1, label=held[1])
    for ax in (cap, ttl) if timed else (cap,):
        if bound > 0:
            ax.axhline(bound, color="grey", ls="--", lw=1, label="token-granular bound")
        ax.set_ylabel("hit token ratio (%)")
        top_ratio = max([bound] + [100 * c.unlimited_hit_tokens / max(r.prompt_tokens, 1)
                                   for r, c in zip(rows, curves)])
        ax.set_ylim(0, max(5.0, min(100.0, 1.1 * top_ratio)))
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xscale("log")
    lo, hi = cap.get_xlim()
    span2 = np.log2(hi / lo)
    step = 5 if span2 > 20 else 2 if span2 > 8 else 1  # 1 KiB, 32 KiB, 1 MiB, ... or 1, 4, 16 KiB, ...
    ticks = [2.0 ** e for e in range(0, 70, step) if lo <= 2.0 ** e <= hi]
    cap.xaxis.set_major_locator(FixedLocator(ticks))
    cap.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v).replace(".0 ", " ")))
    cap.xaxis.set_minor_formatter(NullFormatter())
    cap.set_xlabel(f"cache size: KV payload bytes for {model_id} ({kv_bytes_per_token:,} bytes/token), log")
    top = cap.secondary_xaxis("top", functions=(lambda b: b / kv_bytes_per_token, lambda t: t * kv_bytes_per_token))
    top.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
    top.set_xlabel("cache size (tokens)")
    optimal = any(r.plan is not None and r.plan.optimal is not None for r in rows)
    shares = sorted({s["fraction"] for r in rows for s in (r.sizing or ())}) or [0.9]
    cap.set_title(("LRU and optimal eviction" if optimal else "LRU") + ": hit ratio by cache size (dots: "
                  + "/".join(f"{100 * f:g}" for f in shares) + "% of unlimited)", fontsize=10)
    cap.legend(fontsize=8, loc="upper left")
    span = next((c.span_seconds for c in curves if c.span_seconds), None)
    if timed:
        if span:
            ttl.axvline(span, color="grey", ls=":", lw=1, label=f"trace span {span:,.0f} s")
        ttl.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        ttl.set_xlabel(f"TTL (s, expiry {curves[0].ttl_rule}), log; unlimited capacity")
        ttl.legend(fontsize=8, loc="upper left")
    else:
        ttl.text(0.5, 0.5, "no TTL curve: the trace has no timestamps", ha="center", va="center",
                 transform=ttl.transAxes)
        ttl.set_xticks([])
        ttl.set_yticks([])
    ttl.set_title("TTL: hit ratio by entry lifetime", fontsize=10)
    name = Path(result.trace).name
    fig.suptitle(f"{name}: {result.requests:,} requests", fontsize=11)
    return fig


def _marked_sizes(r: ChunkSizeResult, curve: CurveResult) -> list[tuple[float, int]]:
    """``(share, capacity in chunks)`` of the dots on a chunk size's line: its sizing (``--sizing``), else 90% of
    the unlimited hits; capacities of 0 chunks (a log axis has no room for them) left out."""
    if r.sizing:
        points = [(s["fraction"], s["capacity_chunks"]) for s in r.sizing]
    else:
        points = [(0.9, curve.capacity_for(0.9))]
    return [(share, k) for share, k in points if k]


def _capacity_marker(result: TraceResult) -> tuple[float, str] | None:
    """Where the replay's own cache stands on the size axis (payload bytes) and its legend label: the GPU tier or
    the capacity given; None when unlimited (the lines' right ends)."""
    cap = result.capacity
    if cap is None or cap["kind"] == "unlimited":
        return None
    sizes = [r["capacity_payload_bytes"] for r in cap["per_chunk_size"] if r["capacity_payload_bytes"]]
    if not sizes:
        return None
    what = "GPU tier per node" if cap["kind"] == "gpu tier" else "the replay's capacity"
    return max(sizes), f"{what}: {fmt_bytes(max(sizes))}"


def _ttl_range(curve) -> np.ndarray:
    """Grid TTLs up to the first one past the trace's span (later ones all equal the unlimited cache)."""
    grid = curve.ttl_seconds
    if not curve.span_seconds:
        return np.arange(min(len(grid), 4))
    past = int(np.searchsorted(grid, curve.span_seconds, side="left"))
    return np.arange(min(past + 1, len(grid)))


def _tokens(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"
