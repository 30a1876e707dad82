"""``kvcli events``: a serving engine's KV events. ``kvcli events record`` subscribes to them over ZMQ and writes
them to a file (:mod:`kvcli.engine.record`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvcli.cli.options import JsonOut

#: ``kvcli events``; app.py registers its commands (wrapped in its error handler) and adds it to kvcli's app.
events_app = typer.Typer(no_args_is_help=True, help="A serving engine's KV events (vLLM, SGLang, Mooncake Store).")


def record(
    endpoint: Annotated[str, typer.Argument(help="The engine's ZMQ PUB endpoint, e.g. tcp://localhost:5557 (vLLM: "
                                                 "--kv-events-config's endpoint, tcp://*:5557 by default).")],
    out: Annotated[Path, typer.Option("--out", help="The recording to write (overwritten): one JSON line per "
                                                    "batch, after a header line.")],
    topic: Annotated[str, typer.Option(help="Subscribe to this topic prefix (vLLM's --kv-events-config topic; "
                                            "default: every topic).")] = "",
    replay: Annotated[Optional[str], typer.Option(help="The engine's ZMQ ROUTER replay endpoint (vLLM: "
                                                       "replay_endpoint), asked for the batches a gap in the "
                                                       "sequence numbers says were missed.")] = None,
    max_batches: Annotated[Optional[int], typer.Option(help="Stop after this many batches.")] = None,
    duration: Annotated[Optional[str], typer.Option(help="Stop after this long (e.g. 30s, 10m, 2h).")] = None,
    json_out: JsonOut = False,
) -> None:
    """Record a serving engine's KV events over ZMQ.

    The events (BlockStored, BlockRemoved, AllBlocksCleared) as the engine publishes them over ZMQ, one batch per
    line: its sequence number, the time it arrived and the batch as the engine sent it (vLLM's
    maps or arrays, SGLang's, Mooncake Store's; bytes as hex). A gap in the sequence numbers is filled from
    --replay when given, else noted as missed. Ctrl-C or SIGTERM ends the recording with the file whole (its last
    line complete, fsynced); the summary goes to stdout, progress and gaps to stderr.

    Examples:

      kvcli events record tcp://localhost:5557 --out events.jsonl --replay tcp://localhost:5558

      kvcli events record tcp://gpu-node:5557 --out kv.jsonl --topic kv --duration 10m --json
    """
    from kvcli.engine.record import RecordConfig, record
    from kvcli.errors import BadInputError
    from kvcli.units import json_document

    if max_batches is not None and max_batches < 1:
        raise BadInputError(f"--max-batches must be >= 1, got {max_batches}")
    seconds = _minutes(duration) if duration is not None else None
    if seconds is not None and seconds <= 0:
        raise BadInputError(f"--duration must be > 0, got {duration!r}")
    if out.is_dir():
        raise BadInputError("--out is a directory; give the recording's file name", str(out))
    config = RecordConfig(endpoint, out, topic, replay, max_batches, seconds)
    typer.echo(f"recording {endpoint}" + (f" (topic {topic!r})" if topic else "") + f" to {out}; Ctrl-C stops",
               err=True)
    summary = record(config, note=lambda line: typer.echo(f"note: {line}", err=True))
    if json_out:
        typer.echo(json_document("events record", _body(summary), indent=1))
    else:
        _print(summary)
    if summary.signal_number is not None:
        raise typer.Exit(128 + summary.signal_number)


def _minutes(text: str) -> float:
    """``--duration``: kvcli's durations (5ms, 1.5s, a bare number of seconds), plus ``Nm`` and ``Nh``."""
    from kvcli.units import parse_duration

    scale = {"m": 60, "h": 3600}.get(text.strip()[-1:].lower())
    if scale and text.strip()[:-1].replace(".", "", 1).isdigit():
        return float(text.strip()[:-1]) * scale
    return parse_duration(text)


def _body(summary) -> dict:
    return {"out": summary.out, "batches": summary.batches, "replayed_batches": summary.replayed,
            "events": dict(sorted(summary.events.items())), "blocks_stored": summary.blocks_stored,
            "blocks_removed": summary.blocks_removed, "gaps": summary.gaps, "missed_batches": summary.missed,
            "publisher_restarts": summary.restarts, "bad_payloads": summary.bad_payloads,
            "first_seq": summary.first_seq, "last_seq": summary.last_seq, "bytes_written": summary.bytes_written,
            "elapsed_seconds": round(summary.elapsed_seconds, 3), "stopped_by": summary.stopped_by}


def _print(summary) -> None:
    from rich.table import Table

    from kvcli.tables import print_table, stdout_console
    from kvcli.units import fmt_bytes

    table = Table(title=f"KV events recorded to {summary.out}", show_header=False)
    seqs = "-" if summary.first_seq is None else f"{summary.first_seq}..{summary.last_seq}"
    rows = [("batches", f"{summary.batches:,} (replayed {summary.replayed:,})"), ("sequence numbers", seqs),
            *((f"{name} events", f"{n:,}") for name, n in sorted(summary.events.items())),
            ("blocks stored / removed", f"{summary.blocks_stored:,} / {summary.blocks_removed:,}"),
            ("gaps / missed batches", f"{summary.gaps:,} / {summary.missed:,}"),
            ("publisher restarts", f"{summary.restarts:,}"), ("payloads not batches", f"{summary.bad_payloads:,}"),
            ("written", f"{fmt_bytes(summary.bytes_written)} in {summary.elapsed_seconds:.1f} s"),
            ("stopped by", summary.stopped_by)]
    for name, value in rows:
        table.add_row(name, value)
    print_table(stdout_console(), table)

