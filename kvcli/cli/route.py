"""``kvcli route``: the typer command (registered by kvcli.cli as ``app.command("route")(route)``)."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

from kvcli.cli.options import (
    DEFAULT_REDIS_TIMEOUT,
    LIMIT_HELP,
    TRACE_FORMATS_HELP,
    TRACES_HELP,
    AddSpecialTokens,
    DropTailBlock,
    HashBlockTokens,
    SkipBadRecords,
    Threads,
    TimestampUnit,
    html_option,
    one_chunk_size,
    redis_timeout_option,
    redis_url_option,
    seed_option,
    timeout_seconds,
    trace_format,
)
from kvcli.errors import KvcliError
from kvcli.route.events import RouteEvents
from kvcli.units import json_document, parse_duration

Opt = typer.Option
err = Console(stderr=True, soft_wrap=True)


CLUSTER, POLICY, MANAGER, IO = "Cluster and workload", "Policies and sweep", "cache-manager", "Input and output"


def route(
    traces: Annotated[list[Path], typer.Argument(help=TRACES_HELP + "; each simulated on its own.",
                                                 show_default=False)],
    policy: Annotated[list[str], Opt("--policy", "-p", metavar="<names>", help="round-robin, least-loaded, random, "
                                     "prefix, cache-manager, cache-aware, cost, or all; repeat or comma-separate.",
                                     rich_help_panel=POLICY)] = ["all"],
    nodes: Annotated[int, Opt(help="Serving nodes.", rich_help_panel=CLUSTER)] = 4,
    node_capacity: Annotated[Optional[str], Opt(metavar="<size>", help="KV cache per node: tokens (3M tokens, 500k "
                                                "tok, 250000) or bytes (40GB, 64GiB, at --model's KV bytes/token), "
                                                "or 'unlimited'. Default: 3M tokens.", show_default=False,
                                                rich_help_panel=CLUSTER)] = None,
    tier: Annotated[Optional[list[str]], Opt(metavar="<name=size>", help="A cache tier NAME=SIZE instead of "
                                             "--node-capacity, repeatable, fastest first: gpu/host names one cache "
                                             "per node (the first is the node's own), any other (redis) one shared "
                                             "by all nodes, after them (docs/routing.md).",
                                             rich_help_panel=CLUSTER, show_default=False)] = None,
    chunk_size: Annotated[str, Opt("--chunk-size", "--chunk-sizes", help="Tokens per chunk, one size (Mooncake "
                                   "traces: 512-token blocks).", rich_help_panel=CLUSTER)] = "256",
    prefill_tps: Annotated[Optional[float], Opt(help="Prefill tokens/s per node; default: measure the "
                                                "--model's cost curve now.", rich_help_panel=CLUSTER)] = None,
    model: Annotated[str, Opt(help="Model preset or Hugging Face checkpoint folder for the cost curve and byte "
                                   "capacities.",
                              rich_help_panel=CLUSTER)] = "cpu",
    threads: Threads = 1,
    decode_tpot: Annotated[float, Opt(help="Seconds per output token after the first.",
                                      rich_help_panel=CLUSTER)] = 0.02,
    max_batch: Annotated[int, Opt(help="Requests a node serves at once; prefill runs one at a time.",
                                  rich_help_panel=CLUSTER)] = 64,
    output_length: Annotated[int, Opt(help="Output tokens of requests whose trace gives none.",
                                      rich_help_panel=CLUSTER)] = 128,
    rate: Annotated[Optional[float], Opt(help="Poisson arrivals, requests/s (default: trace timestamps).",
                                         rich_help_panel=CLUSTER)] = None,
    seed: Annotated[int, seed_option("Seed of every random choice (arrivals, random, cost, delays).",
                                     rich_help_panel=POLICY)] = 0,
    abs_threshold: Annotated[float, Opt(help="cache-aware: balance when max-min load > this (requests).",
                                        rich_help_panel=POLICY)] = 32,
    rel_threshold: Annotated[float, Opt(help="cache-aware: ...and max > this x min (>= 1).",
                                        rich_help_panel=POLICY)] = 1.0001,
    cache_threshold: Annotated[float, Opt(help="cache-aware: prefix route above this match ratio (0-1).",
                                          rich_help_panel=POLICY)] = 0.5,
    w: Annotated[float, Opt("--w", help="cost: weight of tokens to prefill vs outstanding load.",
                            rich_help_panel=POLICY)] = 1.0,
    temperature: Annotated[float, Opt(help="cost: softmax temperature in tokens (0 = lowest wins).",
                                      rich_help_panel=POLICY)] = 0.0,
    lookup_delay: Annotated[str, Opt(metavar="<delay>", help="Injected lookup delay: 5ms, or lognormal:MEDIAN:P99 "
                                     "(e.g. lognormal:1ms:50ms).", rich_help_panel=MANAGER)] = "0",
    lookup_timeout: Annotated[Optional[str], Opt(metavar="<time>", help="Fall back to least-loaded after this "
                                                 "(e.g. 20ms; default: wait).", rich_help_panel=MANAGER)] = None,
    count_rtt: Annotated[bool, Opt("--count-rtt/--no-count-rtt", help="Add the measured Redis round trip to TTFT "
                                   "(--no-count-rtt: exact, repeatable runs). Old names: --count-lookup-latency, "
                                   "--no-count-lookup-latency.",
                                   rich_help_panel=MANAGER, show_default=False)] = True,
    count_lookup_latency: Annotated[Optional[bool], Opt("--count-lookup-latency/--no-count-lookup-latency",
                                                        hidden=True)] = None,
    redis_url: Annotated[Optional[str], redis_url_option("Redis for cache-manager (default: embedded).",
                                                         metavar="<url>", rich_help_panel=MANAGER)] = None,
    redis_timeout: Annotated[str, redis_timeout_option(
        "cache-manager: longest wait for the connect and each Redis reply (e.g. 10s, 500ms); then the run fails. "
        "A dropped connection is retried twice first.", metavar="<time>",
        rich_help_panel=MANAGER)] = DEFAULT_REDIS_TIMEOUT,
    sweep: Annotated[list[str], Opt(metavar="<p=v1,v2>", help="Repeatable; PARAM: nodes, node-capacity, max-batch, "
                                    "decode-tpot, rate, seed, abs-threshold, rel-threshold, cache-threshold, w, "
                                    "temperature, lookup-delay, lookup-timeout.", rich_help_panel=POLICY)] = [],
    limit: Annotated[Optional[int], Opt(help=LIMIT_HELP, rich_help_panel=IO)] = None,
    fmt: Annotated[str, Opt("--format", help=TRACE_FORMATS_HELP, rich_help_panel=IO)] = "auto",
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
    tokenizer: Annotated[Optional[str], Opt(help="tiktoken encoding or tokenizer folder for text prompts (default: "
                                             "the --model folder's own, else cl100k_base).", show_default=False,
                                             rich_help_panel=IO)] = None,
    json_out: Annotated[bool, Opt("--json", help="Print one JSON document on stdout.", rich_help_panel=IO)] = False,
    plot: Annotated[Optional[Path], Opt(metavar="<file>", help="Write hit ratio vs TTFT p99 to FILE.png or FILE.svg.",
                                        rich_help_panel=IO)] = None,
    html: Annotated[Optional[Path], html_option(rich_help_panel=IO)] = None,
) -> None:
    """Simulate KV-cache-aware routing against load balance.

    Routing across serving nodes and its conflict with load balance: per policy (and
    sweep point) hit token ratio, per-node load spread, queue wait, TTFT and end-to-end percentiles, lookups.

    Examples:

      kvcli route sample_traces/mooncake_conversation_head1000.jsonl.gz --chunk-size 512 --prefill-tps 10000

      kvcli route chat.jsonl --rate 4 --policy prefix,cache-aware --sweep abs-threshold=2,8,32 --plot ca.png

      kvcli route trace.jsonl -p cache-manager --lookup-delay lognormal:1ms:50ms --lookup-timeout 20ms --json

      kvcli route chat.jsonl --rate 4 --tier 'gpu=1M tokens' --tier 'host=8M tokens' --tier 'redis=64M tokens'

      kvcli route trace.jsonl --sweep nodes=2,4,8 --html route.html    # policies against load, drawn
    """
    from kvcli.route.cachemanager import DelaySpec
    from kvcli.route.config import RouteConfig
    from kvcli.route.runner import route_traces, write_plots
    from kvcli.route.simulator import SimConfig, kv_bytes_per_token, node_cache_options

    try:
        if html is not None:
            from kvcli.html.page import check_report_path

            check_report_path(html)
        timeout, kv = timeout_seconds(redis_timeout), lambda: kv_bytes_per_token(model)
        sim = SimConfig(
            nodes=nodes, chunk_size=one_chunk_size(chunk_size), **node_cache_options(node_capacity, tier or (), kv),
            max_batch=max_batch, decode_tpot=decode_tpot, default_output_tokens=output_length, rate=rate, seed=seed,
            abs_threshold=abs_threshold, rel_threshold=rel_threshold, cache_threshold=cache_threshold, cost_weight=w,
            temperature=temperature, lookup_delay=DelaySpec.parse(lookup_delay), count_measured_latency=
            count_rtt if count_lookup_latency is None else count_lookup_latency,
            lookup_timeout=None if lookup_timeout is None else parse_duration(lookup_timeout))
        config = RouteConfig(sim, tuple(policy), tuple(sweep), model=model, prefill_tps=prefill_tps, threads=threads,
                             limit=limit, tokenizer=tokenizer, plot=plot, redis_url=redis_url, redis_timeout=timeout)
        read_as = trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                               add_special_tokens)
        with _RouteConsole() as events:
            reports = route_traces(traces, config, read_as, events, plots=False)
        _show_route(reports, json_out, html)  # the reports, then the plots: a plot that fails to write loses no report
        write_plots(reports, config.plot)
    except KvcliError as exc:  # also handled by kvcli.cli.app.handle_errors; here for apps that mount route alone
        err.print(f"[red]kvcli: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None


def _show_route(reports: list[dict], json_out: bool, html: Path | None = None) -> None:
    """The reports on stdout: one JSON document with ``json_out``, else each trace's tables and winners; with
    ``html``, that JSON document drawn there too."""
    if json_out or html is not None:
        document = json_document("route", {"traces": reports}, indent=1)
        if html is not None:
            from kvcli.cli.report import write_document_html

            write_document_html(html, document)
        if json_out:
            typer.echo(document)
            return
    from kvcli.route.report import render
    from kvcli.tables import stdout_console

    console = stdout_console()  # pipes and files: wide, no 80-column cut
    for i, report in enumerate(reports):
        if i:
            console.print()
        render(report, console)


class _RouteConsole(RouteEvents):
    """A route run's events on stderr: each note as a ``kvcli: note:`` line; on a terminal, a transient bar per
    trace while it is hashed, and one over its simulations."""

    def __enter__(self) -> _RouteConsole:
        self.bar = Progress(console=err, transient=True, disable=not err.is_terminal)
        self.bar.__enter__()
        self.task: TaskID | None = None  # the current trace's simulations
        return self

    def note(self, line: str) -> None:
        err.print(f"kvcli: note: {line}", markup=False, highlight=False)

    def reading(self, name: str, requests: Iterable[Any]) -> Iterable[Any]:
        return self.bar.track(requests, description=f"hashing {name}")

    def simulating(self, name: str, runs: int) -> None:
        self.task = self.bar.add_task(f"simulating {name}", total=runs)

    def run(self, what: str) -> None:
        assert self.task is not None
        self.bar.update(self.task, advance=1, description=f"simulating {what}")

    def simulated(self, name: str) -> None:
        assert self.task is not None
        self.bar.remove_task(self.task)
        self.task = None

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
