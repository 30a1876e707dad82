"""One ``kvcli route`` run over its traces: each trace read and hashed on its own, the prefill cost curve measured
once (after the first trace is read, for every trace), the planned runs simulated
(:func:`kvcli.route.report.run_routes`), one report per trace with its notes, then the plots.

What the run tells its caller as it goes: :class:`kvcli.route.events.RouteEvents` (the CLI shows them on stderr).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcli.figures import plot_paths
from kvcli.model.load import resolve_tokenizer
from kvcli.model.threads import torch_threads
from kvcli.route.config import RouteConfig
from kvcli.route.events import RouteEvents
from kvcli.route.report import eviction_notes, plan_runs, plot, report_dict, run_routes
from kvcli.route.simulator import load_requests, prefill_cost
from kvcli.traces.order import arrival_order, order_note
from kvcli.traces.paths import display_name, expand_paths, stdin_paths

if TYPE_CHECKING:
    from kvcli.model.costcurve import CostCurve


def route_traces(traces: Sequence[Path], config: RouteConfig, read_as: Any = "auto",
                 events: RouteEvents | None = None, plots: bool = True) -> list[dict]:
    """Simulate every run of ``config`` on each trace, and write ``config.plot`` when set and ``plots`` (False: the
    caller writes them, :func:`write_plots`, e.g. after printing the reports).

    Args:
        traces: trace files, folders (their trace files: :func:`kvcli.traces.paths.expand_paths`) or ``-`` (stdin,
            once), each simulated on its own.
        read_as: the trace format, as :func:`kvcli.traces.detect.read_trace` takes it (a name, ``"auto"``, or a
            :class:`kvcli.traces.hashids.TraceFormat`).
        events: told what happens as it happens (None: nothing told).

    Returns:
        One report per trace, in order: ``trace`` (the file's name), ``cost_curve``, ``runs``, ``winners``
        (:func:`kvcli.route.report.report_dict`) and ``notes`` (the lines
        :meth:`~kvcli.route.events.RouteEvents.note` was told about that trace).

    Raises:
        BadInputError: a missing trace or one without requests, a request without a timestamp when arrivals are
            not Poisson, a plot that cannot be written. RedisFailure: the cache manager's Redis failed.
            ModelFailure: measuring the cost curve failed.
    """
    events = events or RouteEvents()
    idle = config.idle_sweeps
    if idle:
        events.note(f"--sweep {', '.join(idle)} changes none of the policies run ({', '.join(config.policies)}); "
                    f"each runs once")
    cost = functools.cache(functools.partial(measure_cost, config))  # once, when the first trace is read
    with stdin_paths(list(traces)) as given:
        reports = [_route_trace(path, config, read_as, events, cost) for path in expand_paths(given)]
    if plots:
        write_plots(reports, config.plot)
    return reports


def write_plots(reports: list[dict], path: Path | None) -> None:
    """Each report of :func:`route_traces` drawn to its file (:func:`kvcli.figures.plot_paths` of ``path``; None:
    none).

    Raises:
        BadInputError: a plot that cannot be written (:func:`kvcli.figures.save_figure`).
    """
    if path is not None:
        for report, out in zip(reports, plot_paths(path, [r["trace"] for r in reports])):
            plot(report, out)


def measure_cost(config: RouteConfig) -> tuple[CostCurve, dict]:
    """The prefill cost curve of ``config`` and its JSON-ready description
    (:func:`kvcli.route.simulator.prefill_cost`: flat at ``prefill_tps``, else measured now on ``model`` with
    ``threads`` torch threads). Raises BadInputError, ModelFailure."""
    with torch_threads(config.threads if config.prefill_tps is None else None):
        return prefill_cost(config.prefill_tps, config.model)


def _route_trace(path: Path, config: RouteConfig, read_as: Any, events: RouteEvents,
                 cost: Callable[[], tuple[CostCurve, dict]]) -> dict:
    """One trace's report (see :func:`route_traces`); ``cost()`` is called after the trace is read."""
    name, notes = Path(display_name(path)).name, []
    requests = load_requests(path, read_as, resolve_tokenizer(config.tokenizer, config.model), config.sim.chunk_size,
                             config.limit, functools.partial(events.reading, name))
    order = arrival_order([r.timestamp for r in requests]) if config.sim.rate is None else None
    if order is not None:  # simulated in timestamp order (as replay and warm take it): say so
        notes.append(order_note(order, name))
        events.note(notes[-1])
    curve, curve_info = cost()
    events.simulating(name, len(plan_runs(list(config.policies), list(config.points))))
    runs = run_routes(requests, list(config.policies), list(config.points), curve, config.redis_url, events.run,
                      config.redis_timeout)
    events.simulated(name)
    for note in eviction_notes(runs):
        notes.append(note)
        events.note(note)
    return {**report_dict(name, runs, curve_info), "notes": notes}
