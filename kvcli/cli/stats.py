"""``kvcli stats``: a workload at a glance (no Redis)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcli.cli.options import (
    TRACE_FORMATS_HELP,
    TRACES_HELP,
    AddSpecialTokens,
    BlendRecompute,
    DropTailBlock,
    HashBlockTokens,
    JsonOut,
    Reuse,
    SkipBadRecords,
    TextTokenizer,
    TimestampUnit,
    trace_format,
)


def stats(
    traces: Annotated[list[Path], typer.Argument(help=TRACES_HELP + ".")],
    top: Annotated[int, typer.Option(help="Shared prefixes listed per trace.")] = 10,
    max_tokens: Annotated[int, typer.Option(help="Distinct prompt tokens held per trace, at most (4 bytes each; "
                                                 "a hash-id trace's are made from its block ids).")] = 1 << 27,
    # 1 << 27: kvcli.analysis.stats.MAX_TOKENS, spelled out so that --help loads neither numpy nor the radix
    fmt: Annotated[str, typer.Option("--format", help=TRACE_FORMATS_HELP)] = "auto",
    tokenizer: TextTokenizer = None,
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
    reuse: Reuse = "prefix", blend_recompute: BlendRecompute = None,
    json_out: JsonOut = False,
) -> None:
    """The workload at a glance, without Redis: requests, sessions, prompt-length percentiles, the share of prompt
    tokens inside a prefix shared with an earlier request (exact to the token), and the shared prefixes that would
    save the most tokens, with their first words for text traces; with --reuse blend, beside the shared prefix, the
    tokens reusable at any position (CacheBlend).

    Examples:

      kvcli stats sample_traces/

      kvcli stats sample_traces/ragpulse_head60/0_trace.jsonl --reuse blend

      kvcli stats spend_logs.jsonl --tokenizer ~/models/Qwen2.5-7B-Instruct --top 5 --json
    """
    from kvcli.analysis.report import print_stats, to_body
    from kvcli.analysis.workload import trace_reports
    from kvcli.sim.blend import blend_fraction
    from kvcli.tables import stdout_console
    from kvcli.units import json_document

    if top < 0:
        from kvcli.errors import BadInputError

        raise BadInputError(f"--top must be >= 0, got {top}")
    fraction = blend_fraction(reuse, blend_recompute)
    spec = trace_format(fmt, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                        add_special_tokens)
    reports = trace_reports(traces, spec, tokenizer, top, max_tokens, fraction)
    if json_out:
        typer.echo(json_document("stats", to_body(reports), indent=1))
    else:
        print_stats(reports, stdout_console())
