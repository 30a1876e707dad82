"""The kvcli command line (typer). Thin: parse options, call the library, print. Results on stdout, progress on
stderr, one-line errors with exit codes: 0 done, 2 bad input, 3 Redis failure, 4 model failure, 1 other kvcli error,
130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM). Passwords in a Redis URL never reach the output.
"""
from __future__ import annotations

import atexit
import functools
import gc
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kvcli import provenance
from kvcli.cli.options import (
    CAPACITY_BYTES_HELP,
    CAPACITY_TOKENS_HELP,
    DEFAULT_CHUNK_SIZES,
    DEFAULT_REDIS_TIMEOUT,
    LIMIT_HELP,
    REPLAY_GPU_BLOCKS_HELP,
    TRACE_FORMATS_HELP,
    TRACES_HELP,
    AddSpecialTokens,
    BlendRecompute,
    Device,
    DropTailBlock,
    Dtype,
    HashBlockTokens,
    HelpCommand,
    HtmlOut,
    JsonOut,
    KvDtype,
    Model,
    RedisTimeout,
    RedisUrl,
    Reuse,
    SkipBadRecords,
    Threads,
    TimestampUnit,
    Tokenizer,
    chunk_sizes_option,
    help_panels,
    parse_chunk_sizes,
    replay_capacity_tokens,
    seed_option,
    timeout_seconds,
    trace_format,
)
from kvcli.errors import BadInputError, KvcliError, RedisFailure, redis_error_text
from kvcli.redact import mask_url
from kvcli.replay.events import ReplayEvents
from kvcli.units import parse_size
from kvcli.version import __version__

if TYPE_CHECKING:
    from kvcli.replay.results import ReplayConfig, TraceResult

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Chunk-hash KV-cache analysis for LLM serving: replay traces, warm and inspect caches, "
                       "simulate cache-aware routing.")
err = Console(stderr=True, soft_wrap=True)  # stderr lines are never hard-wrapped: a grep must find them whole


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print kvcli's version and exit.")] = False) -> None:
    """kvcli: how much prefill would a chunk-hash KV cache save on your traffic, at which chunk size, at what
    cost in objects, metadata, bytes and lookups, and how should requests be routed to use it?"""
    provenance.begin()  # every JSON document's start time and elapsed seconds count from here


def handle_errors(fn):
    """Turn kvcli's errors into one line on stderr and their exit code (never a traceback); the Redis URL's
    passwords are masked in every message."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from kvcli.redact import redact
        from kvcli.store.server import ENV_URL

        url = kwargs.get("redis_url") or os.environ.get(ENV_URL)
        # torch's C++ start-up imports numpy and clears whatever error that import raises, a KeyboardInterrupt
        # included: imported here, before any command imports torch, a Ctrl-C during it stops the command
        import numpy  # noqa: F401
        try:
            return fn(*args, **kwargs)
        except KvcliError as exc:
            err.print(f"[red]kvcli: error:[/] {escape(redact(str(exc), url))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:  # the reader of stdout stopped (| head): quiet, as if SIGPIPE had ended the command
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            raise typer.Exit(128 + signal.SIGPIPE) from None
        except MemoryError:
            err.print("[red]kvcli: error:[/] out of memory running the model; try a smaller --model or --measure")
            raise typer.Exit(4) from None
        except Exception as exc:  # a redis-py error that no kvcli code wrapped: redis is loaded if one was raised
            from redis.exceptions import RedisClusterException, RedisError

            if not isinstance(exc, (RedisError, RedisClusterException)):
                raise
            err.print(f"[red]kvcli: error:[/] Redis: {escape(redact(redis_error_text(exc), url))}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(3) from None
    return wrapper


def parse_measure(text: str, priced: bool = False) -> int | None:
    """``--measure``: ``"all"`` -> None (every request runs the model); ``"N"`` -> N >= 0; ``"auto"`` -> 2, or 0
    when prefill is priced for other hardware (``priced``: nothing here needs timing)."""
    if text.strip().lower() == "auto":
        return 0 if priced else 2
    if text.strip().lower() == "all":
        return None
    if not text.strip().isdigit():
        raise BadInputError(f"--measure must be a count or 'all', got {text!r}")
    return int(text)


def parse_capacity_option(text: str, tokens: int | None, size_bytes: int | None
                          ) -> tuple[str, int | None, int | None]:
    """``--capacity`` with ``--capacity-tokens`` / ``--capacity-bytes``: ``(mode, tokens, bytes)`` for
    :class:`~kvcli.replay.results.ReplayConfig`: "auto" and "unlimited" as they are; a size (tokens, or bytes of
    the model's KV, :func:`kvcli.sim.tiers.parse_tier`'s reading) becomes the tokens or the bytes.

    Raises:
        BadInputError: an unreadable or zero size, or a size with --capacity-tokens / --capacity-bytes.
    """
    from kvcli.sim.tiers import parse_tier

    mode = text.strip().lower()
    if mode in ("auto", "unlimited"):
        return mode, tokens, size_bytes
    if tokens is not None or size_bytes is not None:
        raise BadInputError("--capacity SIZE and --capacity-tokens / --capacity-bytes: give one")
    try:
        spec = parse_tier(f"cache={text}")
    except BadInputError as exc:
        raise BadInputError(f"--capacity must be auto, unlimited or a size: {str(exc).removeprefix('--tier ')}"
                            ) from None
    return "auto", spec.tokens, spec.bytes


def parse_sizing(text: str) -> tuple[float, ...]:
    """``--sizing "0.9,0.95,0.99"`` -> shares (each checked by :class:`~kvcli.replay.results.ReplayConfig`); "" or
    "none": none. Raises BadInputError for a share that is not a number."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise BadInputError(f"--sizing takes shares of the unlimited hits, e.g. 0.9,0.95,0.99, got {text!r}"
                            ) from None


JOBS_HELP = ("Worker processes for each trace's independent units (chunk size x layout), each with its own Redis "
             "connection; the report is identical to --jobs 1. Default: the cores, capped by the units, for a replay "
             "that runs no model (--prefill-tps with --measure 0); else 1, so no worker slows the prefills it times "
             "(docs/replay.md, 'Parallel replay'). --jobs 1 also keeps an index-only replay from reading the trace "
             "ahead in a child process.")
RAY_HELP = ("Run the units as Ray tasks: a cluster address, or 'local' for a local instance (pip install "
            "'kvcli\\[ray]'). A cluster needs --redis-url its machines can reach, and the trace files on each.")


#: ``kvcli replay --help``'s panels (:func:`~kvcli.cli.options.help_panels`), the common path first.
REPLAY_PANELS = {
    "Common options": ("chunk_sizes", "model", "hardware", "prefill_tps", "capacity", "capacity_bytes",
                       "capacity_tokens", "full", "json_out", "plot"),
    "The model and its prefill's price": ("prefill_profile", "mfu", "precision", "measure", "measure_max_tokens",
                                          "measure_seconds", "calibrate_seconds", "dtype", "kv_dtype", "device",
                                          "threads", "seed"),
    "Store, server and network": ("redis_url", "redis_timeout", "payload", "store_mode", "link_gbps", "rtt_ms",
                                  "layout", "pipeline", "namespace", "keep", "allow_evictions", "gpu_blocks"),
    "Curves and the capacity planner": ("upper_bound", "curve", "ttl_refresh", "sizing", "tier", "price",
                                        "optimal", "admit_after", "policy"),
    "Traces and the run": ("fmt", "tokenizer", "add_special_tokens", "limit", "hash_block_tokens", "timestamp_unit",
                           "drop_tail_block", "skip_bad_records", "jobs", "ray"),
}


@app.command(cls=help_panels(REPLAY_PANELS))
@handle_errors
def replay(
    traces: Annotated[list[Path], typer.Argument(help=TRACES_HELP + ".")],
    chunk_sizes: Annotated[str, chunk_sizes_option("Chunk sizes to compare")] = DEFAULT_CHUNK_SIZES,
    redis_url: RedisUrl = None,
    model: Model = "cpu",
    dtype: Dtype = None,
    kv_dtype: KvDtype = "auto",
    device: Device = "auto",
    measure: Annotated[str, typer.Option(help="Requests per trace that run the model, or 'all'. auto: 2, or 0 "
                                              "with --hardware, --prefill-profile or --prefill-tps (prefill "
                                              "priced elsewhere).")] = "auto",
    measure_max_tokens: Annotated[Optional[int], typer.Option(
        help="Most tokens of a measured prompt that run the model; longer prompts run their first tokens (default "
             "2,048 with a count, as --measure-seconds allows; with --measure all, whole prompts unless given).",
        show_default=False)] = None,
    measure_seconds: Annotated[float, typer.Option(help="Model time per trace for measured requests (CPU seconds "
                                                        "of the model's thread on a CPU): sets how many tokens of "
                                                        "each run (at most --measure-max-tokens).")] = 2.0,
    calibrate_seconds: Annotated[float, typer.Option(help="Model time per trace for extending the cost curve to "
                                                          "the trace's prompt lengths (up to their 95th "
                                                          "percentile; CPU seconds on a CPU).")] = 4.0,
    store_mode: Annotated[str, typer.Option(help="async: stores run off the request's path (LMCache, vLLM "
                                                 "offloading); sync: on it. Picks the net benefit that "
                                                 "recommends; both are shown.")] = "async",
    link_gbps: Annotated[Optional[float], typer.Option(help="Network model: link to Redis in Gbit/s (default: "
                                                            "100 when prefill is priced, else measure the given "
                                                            "server).")] = None,
    rtt_ms: Annotated[Optional[float], typer.Option(help="Network model: round trip to Redis in ms (default: "
                                                         "0.1 when prefill is priced, else measure the given "
                                                         "server).")] = None,
    allow_evictions: Annotated[bool, typer.Option(help="Run even when the server would evict keys to fit the "
                                                       "replay (maybe other people's).")] = False,
    threads: Threads = 1,
    payload: Annotated[str, typer.Option(help="real: measured requests move real KV through Redis; "
                                              "accounted: index and metadata only, payload bytes counted.")] = "real",
    capacity: Annotated[str, typer.Option(help="The cache's size per node: auto (with --hardware or a GPU "
                                               "--prefill-profile, the GPU tier an engine would have: HBM x 0.9 "
                                               "- weights - 3 GiB; else unlimited), unlimited, or a size (3M "
                                               "tokens, 64GiB).")] = "auto",
    sizing: Annotated[str, typer.Option(help="Shares of the unlimited cache's hits whose smallest cache size "
                                             "the report gives, with its bill.")] = "0.9,0.95,0.99",
    capacity_tokens: Annotated[Optional[int], typer.Option(help=CAPACITY_TOKENS_HELP)] = None,
    capacity_bytes: Annotated[Optional[str], typer.Option(help=CAPACITY_BYTES_HELP)] = None,
    gpu_blocks: Annotated[Optional[int], typer.Option(metavar="N", show_default=False,
                                                      help=REPLAY_GPU_BLOCKS_HELP)] = None,
    prefill_tps: Annotated[Optional[float], typer.Option(help="Price prefill at this flat tokens/s instead of "
                                                             "calibrating the model; overheads priced too (the "
                                                             "network model, a PCIe 5.0 x16 host link). "
                                                             "Deterministic: nothing is timed here.")] = None,
    hardware: Annotated[Optional[str], typer.Option(
        help="Price prefill, and moving KV to and from the device, on this accelerator (h100-sxm, h200, b200, "
             "a100-80gb, l40s, mi300x, ...: kvcli hardware lists them): a roofline of the model's exact FLOPs and "
             "bytes. Deterministic: nothing is timed here.", show_default=False)] = None,
    mfu: Annotated[Optional[float], typer.Option(
        help="With --hardware: the share of the dense peak a prefill reaches, 0.01 to 1 (default: the "
             "accelerator's published MFU at the precision, with its interval: kvcli hardware).",
        show_default=False)] = None,
    precision: Annotated[str, typer.Option(
        metavar="auto|fp8",
        help="With --hardware: the precision of the engine's matrix multiplies: auto (the model's bf16 or fp16) or "
             "fp8 (an FP8 checkpoint served W8A8, as vLLM --quantization fp8: the FP8 peak at the accelerator's "
             "fp8 MFU, 1-byte weights).")] = "auto",
    prefill_profile: Annotated[Optional[Path], typer.Option(
        help="Price prefill, and moving KV to and from the device, with a profile `kvcli profile` measured (on "
             "a GPU elsewhere, typically, or through an engine with --engine) for this --model and --dtype; "
             "preferred over any MFU (with --hardware, that accelerator only sizes the GPU tier). Deterministic: "
             "nothing is timed here.", show_default=False)] = None,
    tokenizer: Tokenizer = None,
    fmt: Annotated[str, typer.Option("--format", help=TRACE_FORMATS_HELP)] = "auto",
    hash_block_tokens: HashBlockTokens = None,
    timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False,
    skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
    limit: Annotated[Optional[int], typer.Option(help=LIMIT_HELP)] = None,
    namespace: Annotated[Optional[str], typer.Option(help="Count the chunks of this namespace (e.g. one "
                                                          "`kvcli warm` filled) as hits; it is read, never "
                                                          "written.")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the run's own namespace (what it stored) on the server; "
                                            "deleted after the report by default.")] = False,
    upper_bound: Annotated[bool, typer.Option(help="Compute the token-granular upper bound (memory grows "
                                                   "4 bytes per distinct token).")] = True,
    reuse: Reuse = "prefix",
    blend_recompute: BlendRecompute = None,
    curve: Annotated[bool, typer.Option(help="Compute the hit-token curve over every cache capacity and a grid "
                                             "of TTLs (memory: ~55-95 bytes per distinct chunk per chunk "
                                             "size).")] = True,
    ttl_refresh: Annotated[bool, typer.Option(help="TTL curve: an entry lives from its last access, not its last "
                                                   "write.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write the curve (hit ratio vs cache bytes and vs TTL) to "
                                                      "FILE.png or FILE.svg; one file per trace.")] = None,
    seed: Annotated[int, seed_option("Seed for model weights and measured-request sampling.")] = 0,
    layout: Annotated[str, typer.Option(help="Key layout(s): kvcli, lmcache (LMCache 0.5.6's redis:// keys and "
                                             "lookup), lmcache-resp (its resp:// connector), lmcache-mp (its "
                                             "multiprocess mode), or several side by side: kvcli,lmcache.")
                      ] = "kvcli",
    pipeline: Annotated[int, typer.Option(help="Index-only lookups and stores (--payload accounted, no "
                                               "--namespace) batched this many requests per round trip (one "
                                               "script; two round trips on a cluster or with a capacity), with the "
                                               "same results; 1: one request at a time.")] = 256,
    tier: Annotated[Optional[list[str]], typer.Option(
        help="Capacity planner: a cache tier NAME=SIZE (tokens, or bytes of --model's KV), repeatable, fastest "
             "first: gpu, host (cpu) or any other name for a shared store such as redis. Per chunk size: hits, "
             "bytes read and written, load vs recompute time per tier (docs/planner.md).",
        show_default=False)] = None,
    optimal: Annotated[bool, typer.Option(help="Capacity planner: the optimal eviction's hit tokens (Belady's MIN "
                                               "with the prefix rule) beside the LRU curve, and the gap split into "
                                               "policy and capacity.")] = False,
    admit_after: Annotated[int, typer.Option(help="Capacity planner: store a chunk only from its N-th request on; "
                                                  "hits and bytes written beside storing every chunk.")] = 1,
    policy: Annotated[Optional[str], typer.Option(help="Capacity planner: eviction policies beside LRU at the "
                                                       "chosen capacity: lfu, s3fifo (libCacheSim: pip install "
                                                       "'kvcli\\[policies]').", show_default=False)] = None,
    price: Annotated[Optional[list[str]], typer.Option(
        help="The bill: gpu-hour=$ (per accelerator-hour) and TIER=$ (per GB-month of that --tier), repeatable; "
             "money per day of the trace's traffic and accelerators freed.", show_default=False)] = None,
    json_out: JsonOut = False,
    full: Annotated[bool, typer.Option("--full", help="Print every row of each trace's table (the compact table "
                                                      "holds the rows that decide the answer).")] = False,
    redis_timeout: RedisTimeout = DEFAULT_REDIS_TIMEOUT,
    jobs: Annotated[Optional[int], typer.Option(help=JOBS_HELP, show_default=False)] = None,
    ray: Annotated[Optional[str], typer.Option(help=RAY_HELP, show_default=False)] = None,
    html: HtmlOut = None,
) -> None:
    """Replay traces through a KV cache: what each chunk size saves.

    Replay prompt traces through a chunk-hash KV-cache store on Redis and report, per chunk size, hit token
    ratio, objects, bytes, round trips, measured prefill savings and the net benefit that picks the chunk size.

    Examples:

      kvcli replay sample_traces/

      kvcli replay trace.jsonl --chunk-sizes 64,256 --measure all --json > report.json

      kvcli replay mooncake.jsonl --payload accounted --measure 0 --prefill-tps 5000 --capacity-bytes 64GiB

      kvcli replay trace.jsonl --link-gbps 25 --rtt-ms 0.2     # a Redis across a 25 Gbit/s network
      kvcli replay trace.jsonl --layout kvcli,lmcache --chunk-sizes 256
      kvcli replay sample_traces/ragpulse_head60/0_trace.jsonl --reuse blend --payload accounted --measure 0 \\
          --prefill-tps 3000
      kvcli replay chat.jsonl --model ~/models/Qwen2.5-0.5B-Instruct --chunk-sizes 16,64
      kvcli replay mooncake.jsonl --payload accounted --measure 0 --prefill-tps 5000 --plot curve.png

      kvcli replay mooncake.jsonl --payload accounted --model llama-3-8b --hardware h100-sxm --chunk-sizes 512 \\
          --tier gpu=20GB --tier host=200GB --tier redis=2TB --optimal --price gpu-hour=2.5 --price host=1.5
    """
    from kvcli.replay.results import ReplayConfig
    from kvcli.replay.runner import ModelOptions, run_replay
    from kvcli.sim.blend import blend_fraction
    from kvcli.store.kvstore import parse_layouts
    from kvcli.store.server import open_redis
    from kvcli.traces.paths import stdin_paths

    options = ModelOptions(model, dtype, device, seed, prefill_tps, threads, hardware, mfu,
                           None if prefill_profile is None else str(prefill_profile), precision)
    sizes = parse_chunk_sizes(chunk_sizes)
    engine_tokens = replay_capacity_tokens(gpu_blocks, sizes, capacity_tokens, capacity_bytes)
    mode, capacity_tokens, capacity_bytes_ = parse_capacity_option(capacity, engine_tokens, parse_size(capacity_bytes))
    config = ReplayConfig(
        chunk_sizes=sizes, payload=payload, measure=parse_measure(measure, options.priced),
        capacity_tokens=capacity_tokens, measure_max_tokens=measure_max_tokens, capacity_bytes=capacity_bytes_,
        capacity=mode, sizing=parse_sizing(sizing), namespace=namespace, keep=keep, limit=limit, seed=seed,
        upper_bound=upper_bound,
        measure_seconds=measure_seconds, calibrate_seconds=calibrate_seconds, store_mode=store_mode,
        link_gbps=link_gbps, rtt_seconds=None if rtt_ms is None else rtt_ms / 1e3, allow_evictions=allow_evictions,
        layouts=parse_layouts(layout), hit_curve=curve, ttl_refresh=ttl_refresh, pipeline=pipeline,
        priced=options.priced, plan=plan_options(tier, optimal, admit_after, policy, price),
        kv_dtype=kv_dtype, blend_recompute=blend_fraction(reuse, blend_recompute))
    _check_run(config, jobs, plot, html)
    timeout = timeout_seconds(redis_timeout)
    read_as = trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                           add_special_tokens)
    explained: dict[str, dict] | None = None  # with --html: each trace's per-request breakdown, for its timeline
    with _ReplayConsole() as events:
        url = redis_url or os.environ.get("REDIS_URL")
        events.phase(f"connecting to Redis at {mask_url(url)}" if url else "starting the embedded Redis server")
        with stdin_paths(traces) as files, open_redis(redis_url, timeout) as (client, target):
            results, context = run_replay(client, target, files, config, options, read_as, tokenizer, events,
                                          jobs, ray)
            if html is not None:
                from kvcli.cli.report import explain_replayed

                events.phase("explaining each request for the HTML report's timeline")
                explained = explain_replayed(files, results, config, read_as, tokenizer, model, dtype)
    _show_replay(results, context, plot, json_out, html, explained, full)


def plan_options(tiers: list[str] | None, optimal: bool, admit_after: int, policy: str | None,
                 prices: list[str] | None):
    """The capacity planner's options from replay's ``--tier``, ``--optimal``, ``--admit-after``, ``--policy`` and
    ``--price`` (:class:`kvcli.replay.results.PlanOptions`). Raises BadInputError naming the option."""
    from kvcli.replay.bill import parse_prices
    from kvcli.replay.results import PlanOptions
    from kvcli.sim.eviction import parse_policies
    from kvcli.sim.tiers import parse_tier

    return PlanOptions(tuple(parse_tier(t) for t in tiers or ()), optimal, admit_after, parse_policies(policy),
                       parse_prices(prices))


def _check_run(config: ReplayConfig, jobs: int | None, plot: Path | None, html: Path | None = None) -> None:
    """replay's options that are not the config's, checked against it: ``--jobs`` >= 1; ``--plot`` a .png or
    .svg file, and only with the curve it draws; ``--html`` in a folder that exists."""
    from kvcli.figures import check_plot_path
    from kvcli.replay.results import check_count

    check_count("--jobs", jobs)
    check_plot_path(plot)
    if html is not None:  # the HTML report's modules only where one is asked for
        from kvcli.html.page import check_report_path

        check_report_path(html)
    if plot is not None and (not config.hit_curve or config.namespace is not None):
        raise BadInputError("--plot draws the capacity/TTL curve: it needs the curve (no --no-curve, no --namespace)")


def _show_replay(results: list[TraceResult], context: dict, plot: Path | None, json_out: bool,
                 html: Path | None = None, explained: dict[str, dict] | None = None, full: bool = False) -> None:
    """The report on stdout (JSON with ``--json``, with ``explained``'s per-request breakdowns when drawn; every row
    of each table with ``full``; each trace's summary line went to stderr as it finished), then the HTML page and
    the plots (paths on stderr): a page or plot that fails to write (a disk filled during the run: its folder was
    checked before) raises BadInputError after the report is out. Raises RedisFailure, after all that, when a run's
    keys could not be deleted."""
    from kvcli.cli.report import replay_document, write_document_html
    from kvcli.replay.curvereport import write_plots
    from kvcli.replay.report import print_report
    from kvcli.tables import stdout_console

    document = replay_document(results, context, explained) if json_out or html is not None else ""
    if json_out:
        typer.echo(document)
    else:
        print_report(results, stdout_console(), context, full)
    if html is not None:
        write_document_html(html, document)
    if plot is not None:
        for path in write_plots(results, plot, context["kv_bytes_per_token"], context["model_id"]):
            err.print(f"plot written: {path}", highlight=False)
    left = [r.left_behind for r in results if r.left_behind]
    if left:  # the report stands; the run's keys could not be deleted
        raise RedisFailure("; ".join(left))


class _ReplayConsole(ReplayEvents):
    """A replay's events on stderr: on a terminal, a transient spinner for each phase and a bar per trace's
    requests (redrawn at most 10 times a second); elsewhere one line per phase with the seconds since the command
    began (:func:`kvcli.provenance.elapsed_seconds`). Each trace's summary line is printed as soon as that trace
    is done, either way."""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
        self.bar.__enter__()
        self.task: int | None = None  # the current phase's (or trace's requests') task
        self.counting: str | None = None  # the trace whose requests the task counts
        self.shown = 0.0  # time.monotonic() of the last redraw
        return self

    def phase(self, text: str) -> None:
        if self.bar.disable:
            err.print(f"[{provenance.elapsed_seconds():6.1f}s] {text}", markup=False, highlight=False)
            return
        self._replace(text, None)
        self.counting = None

    def requests(self, trace: str, done: int, total: int | None) -> None:
        if self.bar.disable:
            return
        now = time.monotonic()
        if self.counting != trace:
            self._replace(f"replay {trace}", total)
            self.counting = trace
        elif (total is None or done < total) and now - self.shown < 0.1:
            return
        self.shown = now
        assert self.task is not None
        self.bar.update(self.task, completed=done)

    def trace_done(self, result: TraceResult) -> None:
        from kvcli.replay.report import summary_line

        err.print(summary_line(result), highlight=False, markup=False)

    def note(self, line: str) -> None:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    def _replace(self, description: str, total: int | None) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(description, total=total)

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)
        return False


def _register() -> None:
    from kvcli.cli.audit import audit
    from kvcli.cli.cache import INSPECT_PANELS, WARM_PANELS, inspect, purge, warm
    from kvcli.cli.events import events_app
    from kvcli.cli.events import record as record_events
    from kvcli.cli.explain import explain
    from kvcli.cli.export import EXPORT_PANELS, export
    from kvcli.cli.hardware import hardware
    from kvcli.cli.profile import profile
    from kvcli.cli.report import report
    from kvcli.cli.route import route
    from kvcli.cli.stats import stats

    for name, fn in (("warm", warm), ("inspect", inspect), ("purge", purge), ("route", route),
                     ("profile", profile), ("hardware", hardware), ("export", export), ("stats", stats),
                     ("explain", explain), ("report", report), ("audit", audit)):
        panels = {"warm": WARM_PANELS, "inspect": INSPECT_PANELS, "export": EXPORT_PANELS}.get(name)
        app.command(name, cls=help_panels(panels) if panels else HelpCommand)(handle_errors(fn))
    events_app.command("record", cls=HelpCommand)(handle_errors(record_events))
    app.add_typer(events_app, name="events")


_register()


_signals: list[int] = []  # every SIGINT / SIGTERM received, in order


def _interrupt(signum, frame) -> None:
    """SIGINT and SIGTERM unwind the same way (KeyboardInterrupt), so the embedded server is stopped and the run's
    namespace deleted; a second one during that cleanup interrupts it (the replay then names what was left)."""
    _signals.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point: exit 130 after SIGINT, 143 after SIGTERM (128 + the last signal's number)."""
    # Registered first, so it runs after every other exit handler: the objects left are frozen out of the
    # collector, whose passes over them in the interpreter's teardown took ~1 s with torch imported on this
    # 2-vCPU machine (0.3 s frozen); they are freed by their reference counts as the process ends.
    atexit.register(gc.freeze)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        app()
    except (SystemExit, KeyboardInterrupt) as exc:  # typer turns KeyboardInterrupt into exit 130
        # after a signal the exit is 128 + its number, even when a library swallowed its KeyboardInterrupt
        interrupted = isinstance(exc, KeyboardInterrupt) or bool(_signals)
        if not interrupted:
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):  # exiting already: a further signal is noted, not raised
            signal.signal(sig, lambda signum, frame: _signals.append(signum))
        signum = _signals[-1] if _signals else signal.SIGINT
        err.print("kvcli: interrupted" if signum == signal.SIGINT else "kvcli: terminated (SIGTERM)")
        sys.exit(128 + signum)


if __name__ == "__main__":
    main()
