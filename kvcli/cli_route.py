"""``kvcli route``: the typer command (registered by kvcli.cli as ``app.command("route")(route)``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import Progress

from .cachemanager import DelaySpec, parse_duration
from .errors import KvcliError
from .route import SimConfig, kv_bytes_per_token, load_requests, parse_capacity, prefill_cost

Opt = typer.Option


def route(
    trace: Annotated[Path, typer.Argument(help="Trace: native JSONL, mooncake, sharegpt, swe-agent (.gz ok).")],
    policy: Annotated[list[str], Opt("--policy", "-p", help="round-robin, least-loaded, random, prefix, "
                                     "cache-manager, cache-aware, cost, or all; repeat or comma-separate.")] = ["all"],
    nodes: Annotated[int, Opt(help="Serving nodes.")] = 4,
    node_capacity: Annotated[str, Opt(help="KV cache per node: tokens (3M, 500k) or bytes (40GB, 64GiB, "
                                      "at --model's KV bytes/token), or 'unlimited'.")] = "3M",
    chunk_size: Annotated[int, Opt(help="Tokens per chunk (Mooncake traces: 512-token blocks).")] = 256,
    prefill_tps: Annotated[Optional[float], Opt(help="Prefill tokens/s per node; default: measure the "
                                                "--model's cost curve now.")] = None,
    model: Annotated[str, Opt(help="Model preset for the cost curve and byte capacities.")] = "cpu",
    decode_tpot: Annotated[float, Opt(help="Seconds per output token after the first.")] = 0.02,
    max_batch: Annotated[int, Opt(help="Requests a node serves at once; prefill runs one at a time.")] = 64,
    output_length: Annotated[int, Opt(help="Output tokens of requests whose trace gives none.")] = 128,
    rate: Annotated[Optional[float], Opt(help="Poisson arrivals, requests/s (default: trace timestamps).")] = None,
    seed: Annotated[int, Opt(help="Seed of every random choice (arrivals, random, cost, delays).")] = 0,
    abs_threshold: Annotated[float, Opt(help="cache-aware: balance when max-min load > this (requests).")] = 32,
    rel_threshold: Annotated[float, Opt(help="cache-aware: ...and max > this x min.")] = 1.0001,
    cache_threshold: Annotated[float, Opt(help="cache-aware: prefix route above this match ratio.")] = 0.5,
    w: Annotated[float, Opt("--w", help="cost: weight of tokens to prefill vs outstanding load.")] = 1.0,
    temperature: Annotated[float, Opt(help="cost: softmax temperature in tokens (0 = lowest wins).")] = 0.0,
    lookup_delay: Annotated[str, Opt(help="cache-manager injected delay: 5ms, lognormal:MEDIAN:P99.")] = "0",
    lookup_timeout: Annotated[Optional[str], Opt(help="cache-manager: fall back to least-loaded after.")] = None,
    count_lookup_latency: Annotated[bool, Opt(help="Add the measured Redis round trip to TTFT.")] = True,
    redis_url: Annotated[Optional[str], Opt(envvar="REDIS_URL", help="Redis for cache-manager (default: "
                                            "embedded).", show_default=False)] = None,
    sweep: Annotated[list[str], Opt(help="PARAM=v1,v2 (repeatable): nodes, node-capacity, abs-threshold, w, "
                                    "temperature, lookup-delay, rate, ...")] = [],
    limit: Annotated[Optional[int], Opt(help="Only the first N requests.")] = None,
    fmt: Annotated[str, Opt("--format", help="auto, native, mooncake, sharegpt, swe-agent.")] = "auto",
    tokenizer: Annotated[str, Opt(help="tiktoken encoding for text prompts.")] = "cl100k_base",
    json_out: Annotated[bool, Opt("--json", help="Print one JSON document on stdout.")] = False,
    plot: Annotated[Optional[Path], Opt(help="Write hit ratio vs TTFT p99 to FILE.png or FILE.svg.")] = None,
) -> None:
    """Simulate KV-cache-aware routing across serving nodes and its conflict with load balance: per policy (and
    sweep point) hit token ratio, per-node load spread, queue wait, TTFT and end-to-end percentiles, lookups.

    Examples:

      kvcli route sample_traces/mooncake_conversation_head1000.jsonl.gz --chunk-size 512 --prefill-tps 10000

      kvcli route chat.jsonl --rate 4 --policy prefix,cache-aware --sweep abs-threshold=2,8,32 --plot ca.png

      kvcli route trace.jsonl -p cache-manager --lookup-delay lognormal:1ms:50ms --lookup-timeout 20ms --json
    """
    from .policies import resolve_policies
    from .route_report import check_plot_path, plot as write_plot, render, report_dict, run_routes, sweep_points

    err = Console(stderr=True)
    try:
        kv = lambda: kv_bytes_per_token(model)  # noqa: E731 (only called for byte capacities)
        config = SimConfig(
            nodes=nodes, capacity_tokens=parse_capacity(node_capacity, kv), chunk_size=chunk_size,
            max_batch=max_batch, decode_tpot=decode_tpot, default_output_tokens=output_length, rate=rate, seed=seed,
            abs_threshold=abs_threshold, rel_threshold=rel_threshold, cache_threshold=cache_threshold, cost_weight=w,
            temperature=temperature, lookup_delay=DelaySpec.parse(lookup_delay), count_measured_latency=
            count_lookup_latency, lookup_timeout=None if lookup_timeout is None else parse_duration(lookup_timeout))
        points, names = sweep_points(config, sweep, kv), resolve_policies(policy)
        check_plot_path(plot)
        with Progress(console=err, transient=True) as bar:
            track = lambda it: bar.track(it, description="hashing trace")  # noqa: E731
            requests = load_requests(trace, fmt, tokenizer, chunk_size, limit, track)
            cost, cost_info = prefill_cost(prefill_tps, model)
            task = bar.add_task("simulating", total=len(points) * len(names))
            runs = run_routes(requests, names, points, cost, redis_url,
                              lambda what: bar.update(task, advance=1, description=f"simulating {what}"))
        report = report_dict(trace.name, runs, cost_info)
        if plot is not None:
            write_plot(report, plot)
    except KvcliError as exc:
        err.print(f"[red]kvcli: error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    if json_out:
        typer.echo(json.dumps(report, indent=1))
    else:
        out = Console()
        render(report, out if out.is_terminal else Console(width=120))  # pipes and files: no 80-column cut
