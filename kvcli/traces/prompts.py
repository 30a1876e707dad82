"""Prompts to warm, read from prompt files, trace files, directories and stdin, tokenized into Requests.

A source is a lines file (one prompt per line, blank lines skipped, no chat template), a trace in any format
:mod:`kvcli.traces` reads (``.gz`` accepted), a directory of prompt files (``.txt``) and trace files, or ``-``
(stdin, read as bytes whatever the locale; a trace on stdin is spooled to a temporary file, since the trace readers
read regular files only). Text must be UTF-8: anything else is a one-line error naming the file (or ``<stdin>``)
and line. CSV input follows the rule every command applies (:func:`kvcli.traces.detect.refuse_csv`). A trace's
requests come in arrival order (:mod:`kvcli.traces.order`). Output: :class:`kvcli.traces.Request` objects,
``token_ids`` ``[tokens]`` uint32, ids ``file:line`` for lines. Cost: one pass over each source; all prompts are
held in memory (warm plans the whole run before it writes).
"""
from __future__ import annotations

import dataclasses
import gzip
import sys
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from kvcli.errors import BadInputError
from kvcli.model.tokenize import prompt_tokenizer
from kvcli.traces.detect import detect_format, read_trace, text_format
from kvcli.traces.hashids import TraceFormat, as_trace_format
from kvcli.traces.lines import decode_text, lines_requests
from kvcli.traces.order import arrival_order, order_note
from kvcli.traces.paths import STDIN_NAME, expand_paths
from kvcli.traces.records import read_first_char
from kvcli.traces.request import Request, TokenizerArg


def read_prompts(sources: Sequence[str], fmt: str | TraceFormat = "auto", tokenizer: TokenizerArg = "cl100k_base",
                 stdin: IO | None = None, notify=None) -> list[Request]:
    """Prompts from files, directories (their ``.txt`` prompt files and trace files) and ``-`` (stdin), tokenized.

    A source is a prompt file, one prompt per line (blank lines skipped, line ends stripped, no chat template;
    tokenized as a completion prompt, :meth:`~kvcli.model.tokenizer_base.Tokenizer.encode_prompt`),
    or a trace in any format replay reads (traces.py: native JSONL with ``prompt``/``messages``/``token_ids``,
    Mooncake, ShareGPT, SWE-agent; ``.gz`` accepted). ``fmt="auto"`` reads a ``.txt`` (``.txt.gz``) file as
    lines, and any other source as a trace when its first non-blank character is ``{`` or ``[`` (or it ends in
    ``.traj``), else as lines; ``"lines"`` or a trace format name forces one. A directory contributes its files
    in name order: ``.txt`` prompt files and the trace files replay reads (hidden files, notes, scripts and plots
    skipped). All prompts are held in memory (warm plans the whole run before it writes).

    ``fmt`` may also be a :class:`~kvcli.traces.hashids.TraceFormat` (a name with hash-id declarations).
    ``stdin``: where ``-`` reads from (default ``sys.stdin``'s bytes); ``notify(line)`` hears a trace was reordered.

    Raises:
        BadInputError: a missing or unreadable source, text that is not UTF-8, CSV, a directory with neither prompt
            nor trace files, or a bad record (with ``file:line``).
    """
    out: list[Request] = []
    tokenizer = prompt_tokenizer(tokenizer, as_trace_format(fmt).add_special_tokens)
    for source in sources:
        if source == "-":
            out.extend(_from_stdin(_stdin_bytes(stdin), fmt, tokenizer, notify))
            continue
        name = as_trace_format(fmt).name
        for path in expand_paths([Path(source)]):
            if name == "lines" or (name == "auto" and _looks_like_lines(path)):
                out.extend(lines_requests(_read_text(path), str(path), tokenizer))
            else:
                out.extend(_in_order(read_trace(path, fmt, tokenizer), str(path), notify))
    return out


def _stdin_bytes(stdin: IO | None) -> bytes:
    """Everything on ``stdin`` as the bytes that were sent, whatever the locale (a text stream decoded in the C
    locale hands invalid bytes over as surrogates: they are turned back into those bytes)."""
    source = stdin if stdin is not None else sys.stdin
    data = source.buffer.read() if hasattr(source, "buffer") else source.read()
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def _in_order(requests, name: str, notify) -> list[Request]:
    """A trace's requests in arrival order (:mod:`kvcli.traces.order`), saying so when that reorders them."""
    requests = list(requests)
    order = arrival_order([r.timestamp for r in requests])
    if order is None:
        return requests
    if notify:
        notify(f"note: {order_note(order, name)}")
    return [requests[i] for i in order.tolist()]


def _read_bytes(path: Path, limit: int = -1) -> bytes:
    """The file's bytes (gunzipped when it starts with the gzip magic), or its first ``limit`` bytes."""
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            return f.read(limit)
    except (OSError, EOFError, zlib.error) as exc:
        raise BadInputError(f"cannot read: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}",
                            path=str(path)) from None


def _read_text(path: Path) -> str:
    """The file's UTF-8 text (gunzipped when it starts with the gzip magic)."""
    return decode_text(_read_bytes(path), str(path))


def _looks_like_lines(path: Path) -> bool:
    """Auto-detection, the rule of every command (:func:`kvcli.traces.detect.detect_format`): a lines file, or
    a trace; an empty file holds no prompts."""
    return read_first_char(path) is None or detect_format(path) == "lines"


def _from_stdin(data: bytes, fmt: str | TraceFormat, tokenizer: TokenizerArg, notify=None) -> list[Request]:
    start = data.lstrip().removeprefix(b"\xef\xbb\xbf")[:1]
    name = as_trace_format(fmt).name
    if name == "lines" or (name == "auto" and start != b"[" and text_format(
            STDIN_NAME, data.lstrip().split(b"\n", 1)[0], STDIN_NAME, 1) == "lines"):
        return lines_requests(decode_text(data, STDIN_NAME), STDIN_NAME, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:  # read_trace reads regular files only
        path = Path(tmp) / "stdin.jsonl"
        path.write_bytes(data)
        try:
            requests = [dataclasses.replace(r, source=r.source.replace(str(path), STDIN_NAME),
                                            id=r.id.replace(path.name, STDIN_NAME))
                        for r in read_trace(path, fmt, tokenizer)]
        except BadInputError as exc:
            if exc.path and exc.path.startswith(str(path)):
                raise BadInputError(exc.reason, STDIN_NAME, exc.line) from None
            raise
        return _in_order(requests, STDIN_NAME, notify)
