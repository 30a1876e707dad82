"""``kvcli export``: an anonymized hash-id trace (Mooncake or Bailian) of any trace kvcli reads."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from kvcli.cli.options import (
    TRACE_FORMATS_HELP,
    TRACES_HELP,
    AddSpecialTokens,
    DropTailBlock,
    HashBlockTokens,
    SkipBadRecords,
    TextTokenizer,
    TimestampUnit,
    trace_format,
)

#: ``kvcli export --help``'s panels (:func:`~kvcli.cli.options.help_panels`).
EXPORT_PANELS = {
    "Output": ("key_file", "out", "out_format", "block_size", "id_map", "round_seconds"),
    "Input": ("input_format", "tokenizer", "add_special_tokens"),
}


def export(
    traces: Annotated[list[Path], typer.Argument(help=TRACES_HELP + ".")],
    key_file: Annotated[Path, typer.Option(help="HMAC key (kept by you; created with 32 random bytes when it does "
                                                "not exist): the same key gives the same block digests.")],
    out: Annotated[Path, typer.Option(help="The anonymized trace, JSONL (- for stdout).")],
    out_format: Annotated[str, typer.Option("--format", help="mooncake (ms) or bailian (s).")] = "mooncake",
    block_size: Annotated[Optional[int], typer.Option(help="Tokens per hash id (default: the format's, mooncake "
                                                           "512, bailian 16; another size is written as "
                                                           "block_size).", show_default=False)] = None,
    id_map: Annotated[Optional[Path], typer.Option(help="Keep the block numbering in FILE (32 bytes per id, read and "
                                                        "extended; made with one key and block size): later "
                                                        "exports of the same traffic reuse the same ids.",
                                                   show_default=False)] = None,
    round_seconds: Annotated[Optional[float], typer.Option(help="Round timestamps to a multiple of SECONDS "
                                                                "(1e-6 to 1e9).", show_default=False)] = None,
    input_format: Annotated[str, typer.Option("--input-format", help=TRACE_FORMATS_HELP)] = "auto",
    tokenizer: TextTokenizer = None,
    hash_block_tokens: HashBlockTokens = None, timestamp_unit: TimestampUnit = None,
    drop_tail_block: DropTailBlock = False, skip_bad_records: SkipBadRecords = False,
    add_special_tokens: AddSpecialTokens = True,
) -> None:
    """Write an anonymized hash-id trace of TRACE...

    Chained HMAC-SHA256 block digests (under --key-file) numbered
    0, 1, 2, ...; no text and no token ids; lengths, timestamps and sessions kept. Replaying it gives the original's
    hit tokens at every chunk size that is a multiple of --block-size.

    Examples:

      kvcli export chat.jsonl --key-file ~/.kvcli-export.key --out chat.mooncake.jsonl

      kvcli export logs/ --format bailian --key-file team.key --id-map team.ids --round-seconds 1 --out week.jsonl
    """
    from kvcli.model.load import resolve_tokenizer
    from kvcli.model.tokenize import lazy_tokenizer
    from kvcli.traces.export import (
        EXPORT_FORMATS,
        BlockNumbering,
        check_export_options,
        check_export_outputs,
        check_export_paths,
        load_key_and_map,
        locked_id_map,
    )
    from kvcli.traces.paths import expand_paths, stdin_paths

    err = Console(stderr=True, soft_wrap=True)
    fmt = trace_format(input_format, hash_block_tokens, timestamp_unit, drop_tail_block, skip_bad_records,
                       add_special_tokens)
    block = block_size if block_size is not None else EXPORT_FORMATS.get(out_format, (1, 1))[0]
    check_export_options(out_format, block, round_seconds)
    check_export_paths(traces, key_file, out, id_map)
    check_export_outputs(out, id_map)
    with locked_id_map(id_map):
        key, created, known = load_key_and_map(key_file, id_map, block)
        numbering = BlockNumbering(key, block, known)
        tok = lazy_tokenizer(resolve_tokenizer(tokenizer, "cpu"))[0]
        with stdin_paths(traces) as files:
            written = _write(expand_paths(files), fmt, tok, out_format, numbering, round_seconds, out, id_map)
    if created:
        err.print(f"created key file {key_file} (32 random bytes): keep it; later exports with it give equal "
                  f"digests", highlight=False, markup=False)
    err.print(f"wrote {written:,} requests to {out}: {len(numbering.digests) - len(known):,} new block ids of "
              f"{block} tokens ({len(numbering.digests):,} in all)", highlight=False, markup=False)


def _write(files, fmt, tokenizer, out_format, numbering, round_seconds, out: Path, id_map: Path | None) -> int:
    """Export every trace of ``files`` into ``out`` (``-``: stdout; else :func:`kvcli.outfile.write_output`) and
    then the id map (when given), before the output is renamed into place: an id map that cannot be written leaves
    the old output as it was. Returns the requests written."""
    import contextlib
    import itertools
    import sys

    from kvcli.outfile import write_output
    from kvcli.traces.detect import read_trace
    from kvcli.traces.export import export_records, write_id_map, write_jsonl

    requests = itertools.chain.from_iterable(read_trace(path, fmt, tokenizer) for path in files)
    records = export_records(requests, out_format, numbering, round_seconds)
    with contextlib.nullcontext(sys.stdout) if str(out) == "-" else write_output(out, "--out") as f:
        written = write_jsonl(records, f)
        if id_map is not None:
            write_id_map(id_map, numbering.digests, numbering.key, numbering.block_tokens)
    return written
