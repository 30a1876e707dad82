"""The kvcli command line (typer). Thin: parse options, call the library, print. Results on stdout, progress on
stderr, one-line errors with exit codes: 0 done, 2 bad input, 3 Redis failure, 4 model failure, 1 other kvcli error.
"""
from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import redis
import typer
from redis.exceptions import RedisClusterException
from rich.console import Console
from rich.markup import escape

from kvcli.errors import BadInputError, KvcliError
from kvcli.units import parse_size

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Chunk-hash KV-cache analysis for LLM serving: replay traces, warm and inspect caches, "
                       "simulate cache-aware routing.")
err = Console(stderr=True)

@app.callback()
def _root() -> None:
    """kvcli: how much prefill would a chunk-hash KV cache save on your traffic, at which chunk size, at what
    cost in objects, metadata, bytes and lookups, and how should requests be routed to use it?"""


RedisUrl = Annotated[Optional[str], typer.Option(
    "--redis-url", envvar="REDIS_URL", help="Redis URL (redis://, rediss://, unix://). Default: an embedded "
    "server started for this command.", show_default=False)]


def handle_errors(fn):
    """Turn kvcli's errors into one line on stderr and their exit code (never a traceback)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KvcliError as exc:
            err.print(f"[red]kvcli: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except (redis.RedisError, RedisClusterException) as exc:
            err.print(f"[red]kvcli: error:[/] Redis: {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None
        except MemoryError:
            err.print("[red]kvcli: error:[/] out of memory running the model; try a smaller --model or --measure")
            raise typer.Exit(4) from None
    return wrapper


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"16,64,256"`` -> ``(16, 64, 256)``; BadInputError on anything else."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BadInputError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise BadInputError(f"{what} must be positive integers, got {text!r}")
    return values


def parse_measure(text: str) -> int | None:
    """``"all"`` -> None (every request runs the model); ``"N"`` -> N >= 0."""
    if text.strip().lower() == "all":
        return None
    if not text.strip().isdigit():
        raise BadInputError(f"--measure must be a count or 'all', got {text!r}")
    return int(text)


@app.command()
@handle_errors
def replay(
    traces: Annotated[list[Path], typer.Argument(help="Trace files or directories (native JSONL, Mooncake, "
                                                  "ShareGPT, SWE-agent .traj; .gz accepted).")],
    chunk_sizes: Annotated[str, typer.Option(help="Chunk sizes to compare, tokens.")] = "16,64,256,1024",
    redis_url: RedisUrl = None,
    model: Annotated[str, typer.Option(help="Model preset: tiny, cpu, qwen2.5-0.5b, llama-3-8b, ...")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="KV/model dtype (float32, bfloat16, float16).")] = None,
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")] = "auto",
    measure: Annotated[str, typer.Option(help="Requests per trace that run the model, or 'all'.")] = "2",
    measure_max_tokens: Annotated[int, typer.Option(help="Longest prompt picked for measuring.")] = 512,
    payload: Annotated[str, typer.Option(help="real: measured requests move real KV through Redis; "
                                              "accounted: index and metadata only, payload bytes counted.")] = "real",
    capacity_tokens: Annotated[Optional[int], typer.Option(help="LRU capacity per chunk size, tokens.")] = None,
    capacity_bytes: Annotated[Optional[str], typer.Option(help="LRU capacity, payload bytes (e.g. 2GiB).")] = None,
    prefill_tps: Annotated[Optional[float], typer.Option(help="Estimate prefill at this tokens/s instead of "
                                                             "calibrating the model.")] = None,
    tokenizer: Annotated[str, typer.Option(help="tiktoken encoding for text prompts.")] = "cl100k_base",
    fmt: Annotated[str, typer.Option("--format", help="auto, native, mooncake, sharegpt, swe-agent.")] = "auto",
    limit: Annotated[Optional[int], typer.Option(help="Replay only the first N requests of each trace.")] = None,
    namespace: Annotated[Optional[str], typer.Option(help="Count the chunks of this namespace (e.g. one "
                                                          "`kvcli warm` filled) as hits; it is read, never "
                                                          "written.")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the run's own namespace (what it stored) on the server; "
                                            "deleted after the report by default.")] = False,
    upper_bound: Annotated[bool, typer.Option(help="Compute the token-granular upper bound (memory grows "
                                                   "4 bytes per distinct token).")] = True,
    seed: Annotated[int, typer.Option(help="Seed for model weights and measured-request sampling.")] = 0,
    pipeline: Annotated[int, typer.Option(help="Estimated requests per pipelined round trip (same results; lookup "
                                               "latency from sampled unpipelined lookups); 1: one by one.")] = 256,
    jobs: Annotated[Optional[int], typer.Option(help="Processes replaying chunk sizes at once (same results). "
                                                     "Default: the cores, at most one per chunk size.",
                                                show_default=False)] = None,
    threads: Annotated[str, typer.Option(help="torch threads per process, or auto: measured in this run (the "
                                              "faster of 1 and the cores per job).")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Replay prompt traces through a chunk-hash KV-cache store on Redis and report, per chunk size, hit token
    ratio, objects, bytes, round trips, measured prefill savings and the net benefit that picks the chunk size.

    Examples:

      kvcli replay sample_traces/

      kvcli replay trace.jsonl --chunk-sizes 64,256 --measure all --json > report.json

      kvcli replay mooncake.jsonl --payload accounted --measure 0 --prefill-tps 5000 --capacity-bytes 64GiB
    """
    from kvcli.replay.report import print_report, stdout_console, summary_line, to_json
    from kvcli.replay.results import ReplayConfig
    from kvcli.replay.runner import ModelOptions, run_replay
    from kvcli.store.server import open_redis

    if payload not in ("real", "accounted"):
        raise BadInputError(f"--payload must be real or accounted, got {payload!r}")
    for flag, value in (("--limit", limit), ("--measure-max-tokens", measure_max_tokens),
                        ("--capacity-tokens", capacity_tokens), ("--pipeline", pipeline)):
        if value is not None and value < 1:
            raise BadInputError(f"{flag} must be >= 1, got {value}")
    if prefill_tps is not None and not 0 < prefill_tps < float("inf"):
        raise BadInputError(f"--prefill-tps must be a positive number, got {prefill_tps}")
    config = ReplayConfig(
        chunk_sizes=parse_int_list(chunk_sizes, "--chunk-sizes"), payload=payload,
        measure=parse_measure(measure), measure_max_tokens=measure_max_tokens, capacity_tokens=capacity_tokens,
        capacity_bytes=parse_size(capacity_bytes), namespace=namespace, keep=keep, limit=limit, seed=seed,
        upper_bound=upper_bound, pipeline=pipeline)
    options = ModelOptions(model, dtype, device, seed, prefill_tps, _threads(threads))
    with open_redis(redis_url) as (client, target), _progress() as progress:
        results, context = run_replay(client, target, traces, config, options, fmt, tokenizer, progress, jobs)
    if json_out:
        typer.echo(to_json(results, context))
    else:
        print_report(results, stdout_console(), context)
    for result in results:
        err.print(summary_line(result), highlight=False)


def _threads(text: str) -> int | None:
    """``--threads``: ``auto`` -> None (measured), else a count >= 1."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise BadInputError(f"--threads must be a count >= 1 or auto, got {text!r}")
    return int(text)


class _progress:
    """A rich progress bar on stderr, one task per trace; a no-op when stderr is not a terminal."""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True)
        self.bar.__enter__()
        self.tasks: dict[str, int] = {}
        return self.update

    def update(self, name: str, done: int, total: int) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.bar.add_task(f"replay {name}", total=total)
        self.bar.update(self.tasks[name], completed=done)

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)
        return False


def _register() -> None:
    from kvcli.cli.cache import inspect, purge, warm
    from kvcli.cli.route import route

    for name, fn in (("warm", warm), ("inspect", inspect), ("purge", purge), ("route", route)):
        app.command(name)(handle_errors(fn))


_register()


def _terminate(signum, frame) -> None:
    """SIGTERM unwinds like Ctrl-C, so the embedded server is stopped and a fresh namespace deleted."""
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except KeyboardInterrupt:
        err.print("kvcli: interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
