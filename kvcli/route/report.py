"""The routing report: run every policy at every sweep point, summarize, and show it (table, JSON, plot).

Per run (policy x sweep point) the summary holds: hit token ratio across the cluster and the single-node bound
(:func:`kvcli.route.simulator.single_node_hit_tokens`), prefill tokens computed, per-node requests and computed tokens
(max/mean and coefficient of variation = population std / mean), the peak request imbalance (max - min outstanding
requests at any moment), queue wait and TTFT p50/p90/p99, end-to-end p50/p99 (seconds), throughput (requests per
second over the makespan, first arrival to last finish), cache-manager lookups (count, timeouts, measured Redis
round trip and injected delay, in ms) and evictions (chunks); with ``--tier``, the hit tokens each tier served
(``hit_tokens_by_tier``, tier name -> tokens, adding up to ``hit_tokens``). Percentiles are numpy's default
(linear).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from kvcli.errors import BadInputError
from kvcli.figures import check_plot_path, save_figure
from kvcli.route.cachemanager import DelaySpec
from kvcli.route.policies import POLICIES, config_fields, make_policy
from kvcli.route.simulator import SimConfig, SimRequest, SimResult, simulate, single_node_hit_tokens
from kvcli.store.server import open_redis
from kvcli.tables import print_table
from kvcli.units import parse_capacity, parse_duration

# Sweepable CLI names -> the SimConfig field each sets. Which policies a parameter affects follows from the field
# (kvcli.route.policies.config_fields): cluster, workload and arrival fields affect all; the others only their policy.
SWEEP_FIELDS = {"nodes": "nodes", "node-capacity": "capacity_tokens", "max-batch": "max_batch",
                "decode-tpot": "decode_tpot", "rate": "rate", "seed": "seed", "abs-threshold": "abs_threshold",
                "rel-threshold": "rel_threshold", "cache-threshold": "cache_threshold", "w": "cost_weight",
                "temperature": "temperature", "lookup-delay": "lookup_delay", "lookup-timeout": "lookup_timeout"}


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadInputError("expected an integer") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise BadInputError("expected a number") from None


def _sweep_parsers(kv_bytes_per_token) -> dict[str, Callable]:
    """Sweepable CLI names -> parser of one value (raises BadInputError)."""
    parsers = {"nodes": _int, "node-capacity": lambda v: parse_capacity(v, kv_bytes_per_token), "max-batch": _int,
               "decode-tpot": _float, "rate": _float, "seed": _int, "abs-threshold": _float,
               "rel-threshold": _float, "cache-threshold": _float, "w": _float, "temperature": _float,
               "lookup-delay": DelaySpec.parse, "lookup-timeout": parse_duration}
    assert parsers.keys() == SWEEP_FIELDS.keys()
    return parsers


def sweep_points(config: SimConfig, sweeps: list[str], kv_bytes_per_token) -> list[tuple[dict, SimConfig]]:
    """The cartesian product of ``--sweep PARAM=v1,v2`` options: ``[(labels {param: text}, config)]``; ``[({},
    config)]`` without sweeps. A value repeated in one option counts once.

    Raises:
        BadInputError: an unknown parameter (listing the sweepable names), one given twice, or a value that does
            not parse or that SimConfig rejects (naming the parameter and the value).
    """
    parsers = _sweep_parsers(kv_bytes_per_token)
    axes: list[list[tuple[str, str, str, Any]]] = []  # per sweep: (name, text, field, value) per value
    for text in sweeps:
        name, _, values = (part.strip() for part in text.partition("="))
        if name not in parsers or not values:
            raise BadInputError(f"bad --sweep {text!r}; use PARAM=v1,v2,... with PARAM one of {', '.join(parsers)}")
        if any(axis[0][0] == name for axis in axes):
            raise BadInputError(f"--sweep {name} given twice; list all its values in one: {name}=v1,v2,...")
        field, axis, seen = SWEEP_FIELDS[name], [], []
        for value in (v.strip() for v in values.split(",")):
            if not value:
                continue
            try:
                parsed = parsers[name](value)
                dataclasses.replace(config, **{field: parsed})  # SimConfig's checks, on this value alone
            except BadInputError as exc:
                raise BadInputError(f"--sweep {name}={value}: {exc}") from None
            if parsed not in seen:
                seen.append(parsed)
                axis.append((name, value, field, parsed))
        if not axis:
            raise BadInputError(f"bad --sweep {text!r}: no values")
        axes.append(axis)
    points = []
    for combo in itertools.product(*axes):
        labels = {name: text for name, text, _, _ in combo}
        points.append((labels, dataclasses.replace(config, **{f: v for _, _, f, v in combo})))
    return points


def plan_runs(policies: list[str], points: list[tuple[dict, SimConfig]]) -> list[tuple[str, dict, SimConfig]]:
    """The runs to simulate, ``[(policy, labels, config)]`` in policy order, then point order: each policy once per
    distinct value of the config fields its run depends on (:func:`kvcli.route.policies.config_fields`), so a sweep of
    ``abs-threshold`` runs ``cache-aware`` at each value and every other policy once. ``labels`` keeps only the
    swept parameters that affect the policy."""
    seen, out = set(), []
    for name in policies:
        for labels, config in points:
            fields = config_fields(name, config)
            key = (name, tuple(getattr(config, f) for f in fields))
            if key not in seen:
                seen.add(key)
                out.append((name, {k: v for k, v in labels.items() if SWEEP_FIELDS[k] in fields}, config))
    return out


def _pcts(values: np.ndarray, qs=(50, 90, 99), scale: float = 1.0) -> dict[str, float | None]:
    if values.size == 0:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(v) * scale for q, v in zip(qs, np.percentile(values, qs))}


def _spread(per_node: np.ndarray) -> dict[str, float]:
    mean = float(per_node.mean())
    return {"max_over_mean": float(per_node.max()) / mean if mean else 0.0,
            "cv": float(per_node.std()) / mean if mean else 0.0}


def summarize(result: SimResult, config: SimConfig, bound_hit_tokens: int) -> dict:
    """The report's figures for one simulation (see the module docstring). Plain JSON-ready values."""
    prompt, hit = int(result.prompt_tokens.sum()), int(result.hit_tokens.sum())
    computed = result.prompt_tokens - result.hit_tokens
    reqs = np.bincount(result.node, minlength=result.nodes)
    toks = np.bincount(result.node, weights=computed, minlength=result.nodes)
    span = float(result.finish.max() - result.arrival.min()) if result.node.size else 0.0
    looked = result.looked_up
    return {
        "requests": int(result.node.size), "prompt_tokens": prompt, "hit_tokens": hit,
        "hit_token_ratio": hit / prompt if prompt else 0.0,
        "single_node_hit_token_ratio": bound_hit_tokens / prompt if prompt else 0.0,
        "prefill_tokens": prompt - hit,
        "per_node": {"requests": reqs.tolist(), "prefill_tokens": [int(t) for t in toks],
                     "requests_spread": _spread(reqs), "prefill_tokens_spread": _spread(toks),
                     "peak_request_imbalance": result.peak_imbalance},
        "queue_wait_seconds": _pcts(result.prefill_start - result.dispatch),
        "ttft_seconds": _pcts(result.first_token - result.arrival),
        "e2e_seconds": _pcts(result.finish - result.arrival, (50, 99)),
        "throughput": {"makespan_seconds": span, "requests_per_second": result.node.size / span if span else 0.0,
                       "prompt_tokens_per_second": prompt / span if span else 0.0},
        "lookups": {"count": int(looked.sum()), "timeouts": int(result.timed_out.sum()),
                    "measured_latency_counted": config.count_measured_latency,
                    "measured_seconds": _pcts(result.measured[looked], (50, 99, 100)),
                    "injected_seconds": _pcts(result.injected[looked], (50, 99))},
        "evictions": result.evictions,
        **({"hit_tokens_by_tier": dict(zip(config.tier_names, result.hit_tokens_by_tier))}
           if config.tier_names else {}),
    }


def config_dict(config: SimConfig) -> dict:
    """``config`` as JSON-ready values (the delay as its text form; the tier fields only with tiers)."""
    out = dataclasses.asdict(config)
    out["lookup_delay"] = str(config.lookup_delay)
    if config.first_tier is None:
        del out["first_tier"], out["lower_tiers"]
    return out


def run_routes(requests: list[SimRequest], policies: list[str], points: list[tuple[dict, SimConfig]], cost,
               redis_url: str | None = None, on_run: Callable[[str], None] | None = None,
               timeout: float | None = None) -> list[dict]:
    """Simulate the runs of :func:`plan_runs` (each policy at each sweep point that changes it); one summary dict
    per run, with ``policy``, ``sweep`` (the swept parameters that affect it) and ``config`` added. Opens Redis
    (:func:`kvcli.store.server.open_redis`: ``redis_url``, ``$REDIS_URL`` or the embedded server; ``timeout``
    seconds for the connect and each reply, None: its default) only when a policy needs it. Raises RedisFailure,
    BadInputError."""
    needs = any(POLICIES[p].needs_redis for p in policies)
    with (open_redis(redis_url, timeout) if needs else contextlib.nullcontext((None, None))) as (client, _):
        runs, bounds = [], {}
        for name, labels, config in plan_runs(policies, points):
            key = (config.nodes, config.capacity_chunks, config.lower_tiers, config.rate,
                   config.seed if config.rate else None)
            if key not in bounds:
                bounds[key] = single_node_hit_tokens(requests, config)
            if on_run:
                on_run(f"{name} {' '.join(f'{k}={v}' for k, v in labels.items())}".strip())
            policy = make_policy(name, config, client)
            try:
                result = simulate(requests, policy, config, cost)
            finally:
                policy.close()
            summary = summarize(result, config, bounds[key])
            summary["lookups"].update(policy.stats())
            runs.append({"policy": name, "sweep": labels, **summary, "config": config_dict(config)})
    return runs


def sweep_grid(runs: list[dict]) -> list[dict]:
    """The sweep points of ``runs`` (``[{}]`` without a sweep): the product of every swept value seen, parameters
    and values in order of first appearance. Parameters that affect none of the runs' policies are not in it."""
    axes: dict[str, list[str]] = {}
    for r in runs:
        for k, v in r["sweep"].items():
            if v not in axes.setdefault(k, []):
                axes[k].append(v)
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def runs_at(runs: list[dict], point: dict) -> list[dict]:
    """The run of each policy that stands for sweep point ``point`` (its labels agree with the point's)."""
    return [r for r in runs if all(point.get(k) == v for k, v in r["sweep"].items())]


def winners(runs: list[dict]) -> list[dict]:
    """Per sweep point (:func:`sweep_grid`, each policy's run at it from :func:`runs_at`): the policy with the lowest
    TTFT p99 and the one with the highest hit ratio, each with the runner-up and the ratio between them (``by``:
    runner-up p99 / best p99; best hit / runner-up hit; None when dividing by 0); runner-up, its value and ``by``
    None when the policy ran alone (no margin: a ratio of 1 would read as a tie). Ties go to the earlier policy."""
    out = []
    for point in sweep_grid(runs):
        group = runs_at(runs, point)
        entry = {"sweep": point}
        for metric, get, lower in (("ttft_p99_seconds", lambda r: r["ttft_seconds"]["p99"], True),
                                   ("hit_token_ratio", lambda r: r["hit_token_ratio"], False)):
            ranked = sorted(group, key=lambda r: get(r) if lower else -get(r))
            best = ranked[0]
            entry[metric] = {"policy": best["policy"], "value": get(best), "runner_up": None,
                             "runner_up_value": None, "by": None}
            if len(ranked) > 1:
                second = ranked[1]
                num, den = (get(second), get(best)) if lower else (get(best), get(second))
                entry[metric].update(runner_up=second["policy"], runner_up_value=get(second),
                                     by=num / den if den else None)
        out.append(entry)
    return out


def eviction_notes(runs: list[dict]) -> list[str]:
    """One note per run whose Redis server evicted keys while it ran (the cache-manager policy's index: its lookups
    then missed what the nodes held, so its hits are too low)."""
    return [f"{r['policy']}: the server evicted {r['lookups']['server_evicted_keys']:,} keys during the run "
            f"(whoever's): evicted index entries answered lookups as misses, so its hits are too low; give the "
            f"server room (maxmemory) or a noeviction policy" for r in runs if r["lookups"].get("server_evicted_keys")]


def report_dict(trace: str, runs: list[dict], cost_info: dict) -> dict:
    """The one JSON document of ``kvcli route --json``."""
    return {"trace": trace, "cost_curve": cost_info, "runs": runs, "winners": winners(runs)}


def _fmt(x, spec=".3g") -> str:
    return "–" if x is None else format(x, spec)


def _ms(seconds, spec: str) -> str:
    """Seconds shown as milliseconds (``-`` for None)."""
    return "–" if seconds is None else format(seconds * 1e3, spec)


def _count(n: float) -> str:
    """``12_500_000`` -> ``"12.5M"``."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def _table(title: str, head: list[str], columns: list[str]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for col in head:
        table.add_column(col, no_wrap=True)
    for col in columns:  # as wide as the header's longest word, so headers wrap but never lose letters
        table.add_column(col, justify="right", min_width=max(7, *(len(w) for w in col.split())))
    return table


def render(report: dict, console: Console) -> None:
    """The tables (cache; hit tokens by tier with tiers; balance; latency; cache-manager lookups when any) and the
    winners, on ``console``.
    Per sweep point the best hit ratio and the best TTFT p99 are bold green."""
    runs, sweep = report["runs"], any(r["sweep"] for r in report["runs"])
    point = lambda r: json.dumps(r["sweep"], sort_keys=True)  # noqa: E731
    best_p99 = {(w["ttft_p99_seconds"]["policy"], json.dumps(w["sweep"], sort_keys=True)) for w in report["winners"]}
    best_hit = {(w["hit_token_ratio"]["policy"], json.dumps(w["sweep"], sort_keys=True)) for w in report["winners"]}
    head = ["policy"] + (["sweep"] if sweep else [])
    cache = _table(f"{report['trace']}: cache and throughput", head, [
        "hit %", "1-node bound %", "prefill tokens", "evicted chunks", "req/s"])
    balance = _table("balance across nodes (outstanding requests; prefill tokens computed)", head, [
        "req max/ mean", "req CV", "tokens max/ mean", "tokens CV", "peak imbalance"])
    lat = _table("latency, seconds", head, ["wait p50", "wait p99", "TTFT p50", "TTFT p90", "TTFT p99",
                                           "e2e p50", "e2e p99"])
    looks = _table("cache-manager lookups", head, ["lookups", "timeouts", "Redis ms p50", "Redis ms p99",
                                                  "injected ms p50", "injected ms p99", "index writes"])
    names = list(dict.fromkeys(t for r in runs for t in r.get("hit_tokens_by_tier", {})))
    tiers = _table("hit tokens by tier (they add up to the hit tokens)", head, names)
    mark = lambda text, win: f"[bold green]{text}[/]" if win else text  # noqa: E731
    for r in runs:
        first = [r["policy"]] + ([" ".join(f"{k}={v}" for k, v in r["sweep"].items()) or "any"] if sweep else [])
        n, lk, key = r["per_node"], r["lookups"], (r["policy"], point(r))
        cache.add_row(*first, mark(f"{100 * r['hit_token_ratio']:.1f}", key in best_hit),
                      f"{100 * r['single_node_hit_token_ratio']:.1f}", _count(r["prefill_tokens"]),
                      _count(r["evictions"]), _fmt(r["throughput"]["requests_per_second"]))
        if "hit_tokens_by_tier" in r:
            tiers.add_row(*first, *(_count(r["hit_tokens_by_tier"].get(t, 0)) for t in names))
        balance.add_row(*first, f"{n['requests_spread']['max_over_mean']:.2f}", f"{n['requests_spread']['cv']:.2f}",
                        f"{n['prefill_tokens_spread']['max_over_mean']:.2f}",
                        f"{n['prefill_tokens_spread']['cv']:.2f}", str(n["peak_request_imbalance"]))
        w, t, e = r["queue_wait_seconds"], r["ttft_seconds"], r["e2e_seconds"]
        lat.add_row(*first, _fmt(w["p50"]), _fmt(w["p99"]), _fmt(t["p50"]), _fmt(t["p90"]),
                    mark(_fmt(t["p99"]), key in best_p99), _fmt(e["p50"]), _fmt(e["p99"]))
        if lk["count"]:
            looks.add_row(*first, str(lk["count"]), str(lk["timeouts"]), _ms(lk["measured_seconds"]["p50"], ".2f"),
                          _ms(lk["measured_seconds"]["p99"], ".2f"), _ms(lk["injected_seconds"]["p50"], ".3g"),
                          _ms(lk["injected_seconds"]["p99"], ".3g"), str(lk.get("index_writes", "-")))
    for table in (cache,) + ((tiers,) if tiers.row_count else ()) + (balance, lat) + \
            ((looks,) if looks.row_count else ()):
        print_table(console, table, keep=len(head))  # split by columns, never cut, when the console is narrow
    for w in report["winners"]:
        where = " ".join(f"{k}={v}" for k, v in w["sweep"].items())
        t, h = w["ttft_p99_seconds"], w["hit_token_ratio"]
        console.print(f"{where + ': ' if where else ''}lowest TTFT p99: [bold]{t['policy']}[/] {t['value']:.3g} s"
                      f"{margin(t, 'below ', lambda v: f'{v:.3g} s')}; highest hit ratio: [bold]{h['policy']}[/] "
                      f"{100 * h['value']:.1f}%{margin(h, '', lambda v: f'{100 * v:.1f}%')}", highlight=False,
                      soft_wrap=not console.is_terminal)


def margin(entry: dict, word: str, show: Callable[[float], str]) -> str:
    """The winner's margin over the runner-up as the summary line prints it: ``", 1.43x below least-loaded"``,
    ``", ties with cost"`` when the ratio prints as 1.00 (or both values are equal), ``", cost 0.0%"`` when the
    ratio is undefined, and nothing when the winner ran alone (no runner-up)."""
    if entry["runner_up"] is None:
        return ""
    by = entry["by"]
    if entry["value"] == entry["runner_up_value"] or (by is not None and f"{by:.2f}" == "1.00"):
        return f", ties with {entry['runner_up']}"
    if by is None:
        return f", {entry['runner_up']} {show(entry['runner_up_value'])}"
    return f", {by:.2f}x {word}{entry['runner_up']}"


def _short(text: str, width: int = 60) -> str:
    """``text`` cut in the middle to ``width`` characters (a long trace name must not overflow the title)."""
    return text if len(text) <= width else text[:width // 2 - 1] + "…" + text[-(width - width // 2):]


# Label offsets (points) tried in turn around a marker: right-above, right-below, left-above, left-below, then further.
_LABEL_SPOTS = [(dx * k, dy * k, "left" if dx > 0 else "right", "bottom" if dy > 0 else "top")
                for k in (1, 2.5, 4) for dx, dy in ((5, 4), (5, -4), (-5, 4), (-5, -4))]


def _place_labels(fig, ax, labels: list[tuple[float, float, str]], points: list[tuple[float, float]]) -> None:
    """Annotate each ``(x, y, text)`` at the first spot of :data:`_LABEL_SPOTS` where it stays inside the axes and
    overlaps no marker (``points``) and no label placed before (else the spot with the least overlap); clipped to
    the axes either way."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    r = 4 * fig.dpi / 72  # a marker's half width, pixels
    placed = [Bbox.from_extents(px - r, py - r, px + r, py + r)
              for px, py in ax.transData.transform(points)] if points else []

    def overlap(a, b) -> float:
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        return w * h if w > 0 and h > 0 else 0.0

    for x, y, text in labels:
        best = None
        for dx, dy, ha, va in _LABEL_SPOTS:
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, fontsize=7,
                               annotation_clip=True, clip_on=True, in_layout=False)
            box = note.get_window_extent(renderer)
            outside = (max(inside.x0 - box.x0, 0) + max(box.x1 - inside.x1, 0)) * box.height + \
                      (max(inside.y0 - box.y0, 0) + max(box.y1 - inside.y1, 0)) * box.width
            score = 10 * outside + sum(overlap(box, other) for other in placed)
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, note, box)
            else:
                note.remove()
            if score == 0:
                break
        assert best is not None  # _LABEL_SPOTS is not empty
        placed.append(best[2])


def plot(report: dict, path: str | Path) -> None:
    """Write :func:`plot_figure` of ``report`` to ``path`` (``.png`` or ``.svg``; BadInputError else, or when it
    cannot be written), trimmed to what it draws."""
    check_plot_path(path)
    import matplotlib.pyplot as plt

    fig = plot_figure(report)
    try:
        save_figure(fig, path, bbox_inches="tight", pad_inches=0.1)
    finally:
        plt.close(fig)


def plot_figure(report: dict):
    """Hit token ratio (y) against TTFT p99 (x; log scale when the points span more than a decade, labelled at 1, 2
    and 5 times each power of ten up to 2.5 decades) for every run; one colour and marker per policy, its sweep points
    joined in sweep order and labelled (labels kept inside the axes and apart where possible); the legend sits right
    of the axes, the title is two lines (the trace name cut to 60 characters). Up and to the left is better.
    Returns the matplotlib Figure (Agg backend; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
    markers = dict(zip(POLICIES, "osD^vPX"))
    labels: dict[tuple[float, float], list[str]] = {}  # sweep points that land on one spot share a label
    for name in dict.fromkeys(r["policy"] for r in report["runs"]):
        runs = [r for r in report["runs"] if r["policy"] == name]
        x = [r["ttft_seconds"]["p99"] for r in runs]
        y = [100 * r["hit_token_ratio"] for r in runs]
        ax.plot(x, y, marker=markers.get(name, "o"), label=name, alpha=0.85)
        for r, xi, yi in zip(runs, x, y):
            if r["sweep"]:
                text = " ".join(f"{k}={v}" for k, v in r["sweep"].items())
                if text not in labels.setdefault((xi, yi), []):
                    labels[(xi, yi)].append(text)
    bounds = sorted({100 * r["single_node_hit_token_ratio"] for r in report["runs"]})
    if len(bounds) == 1:
        ax.axhline(bounds[0], color="grey", ls="--", lw=1, label="1-node bound")
    p99s = [r["ttft_seconds"]["p99"] for r in report["runs"] if r["ttft_seconds"]["p99"]]
    log = bool(p99s) and max(p99s) > 10 * min(p99s)  # log only when the points span a decade or more
    if log:
        ax.set_xscale("log")
        decades = np.log10(max(p99s) / min(p99s))
        subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0, 3.0) if decades <= 4 else (1.0,)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(LogLocator(base=10, subs=range(2, 10)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.06, y=0.08)
    ax.set_xlabel(f"TTFT p99 (s{', log scale' if log else ''})")
    ax.set_ylabel("hit token ratio (%)")
    ax.set_title(f"Cache hits vs tail latency (up and left is better)\n{_short(report['trace'])}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.canvas.draw()  # final limits and layout, so the labels can be placed in display space
    _place_labels(fig, ax, [(xi, yi, ", ".join(texts)) for (xi, yi), texts in labels.items()],
                  [(r["ttft_seconds"]["p99"], 100 * r["hit_token_ratio"]) for r in report["runs"]])
    return fig
