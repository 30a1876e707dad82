"""Prompts to warm, read from prompt files, trace files, directories and stdin, tokenized into Requests.

A source is a lines file (one prompt per line, blank lines skipped, no chat template), a trace in any format
:mod:`kvcli.traces` reads (``.gz`` accepted), a directory of prompt files (``.txt``) and trace files, or ``-``
(stdin; a trace on stdin is
spooled to a temporary file, since the trace readers read regular files only). Output: :class:`kvcli.traces.Request`
objects, ``token_ids`` ``[tokens]`` uint32, ids ``file:line`` for lines. Cost: one pass over each source; all
prompts are held in memory (warm plans the whole run before it writes).
"""
from __future__ import annotations

import dataclasses
import gzip
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from kvcli.errors import BadInputError
from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.detect import read_trace
from kvcli.traces.paths import _NOT_TRACES, expand_paths
from kvcli.traces.request import Request, TokenizerArg


def read_prompts(sources: Sequence[str], fmt: str = "auto", tokenizer: TokenizerArg = "cl100k_base",
                 stdin: TextIO | None = None) -> list[Request]:
    """Prompts from files, directories (their ``.txt`` prompt files and trace files) and ``-`` (stdin), tokenized.

    A source is a prompt file, one prompt per line (blank lines skipped, line ends stripped, no chat template;
    tokenized as a completion prompt, :meth:`~kvcli.model.tokenizer_base.Tokenizer.encode_prompt`),
    or a trace in any format replay reads (traces.py: native JSONL with ``prompt``/``messages``/``token_ids``,
    Mooncake, ShareGPT, SWE-agent; ``.gz`` accepted). ``fmt="auto"`` reads a ``.txt`` (``.txt.gz``) file as
    lines, and any other source as a trace when its first non-blank character is ``{`` or ``[`` (or it ends in
    ``.traj``), else as lines; ``"lines"`` or a trace format name forces one. A directory contributes its files
    in name order: ``.txt`` prompt files and the trace files replay reads (hidden files, notes, scripts and plots
    skipped). All prompts are held in memory (warm plans the whole run before it writes).

    Raises:
        BadInputError: a missing or unreadable source, a directory with neither prompt nor trace files, or a bad
            record (with ``file:line``).
    """
    out: list[Request] = []
    for source in sources:
        if source == "-":
            out.extend(_from_stdin((stdin or sys.stdin).read(), fmt, tokenizer))
            continue
        for path in _expand(Path(source)):
            if fmt == "lines" or (fmt == "auto" and (_is_txt(path) or _looks_like_lines(path))):
                out.extend(_lines(_read_text(path).splitlines(), str(path), tokenizer))
            else:
                out.extend(read_trace(path, fmt, tokenizer))
    return out


def _is_txt(path: Path) -> bool:
    return path.name.lower().removesuffix(".gz").endswith(".txt")


def _expand(path: Path) -> list[Path]:
    """A file as given; a directory's prompt (``.txt``) and trace files, sorted (replay's skip list otherwise)."""

    if not path.is_dir():
        return expand_paths([path])
    found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                   and (_is_txt(p) or p.suffix.lower() not in _NOT_TRACES))
    if not found:
        raise BadInputError("directory holds no prompt (.txt) or trace files", path=str(path))
    return found


def _read_text(path: Path, limit: int = -1) -> str:
    """The file's text (gunzipped when it starts with the gzip magic), or its first ``limit`` characters."""
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as f:
            return f.read(limit)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read: {exc}", path=str(path)) from None


def _looks_like_lines(path: Path) -> bool:
    if path.name.removesuffix(".gz").endswith(".traj"):
        return False
    return _read_text(path, 4096).lstrip()[:1] not in ("{", "[")


def _lines(lines: list[str], name: str, tokenizer: TokenizerArg) -> list[Request]:
    tok = get_tokenizer(tokenizer)
    return [Request(f"{name}:{i}", tok.encode_prompt(line.rstrip("\r")), source=f"{name}:{i}")
            for i, line in enumerate(lines, 1) if line.strip()]


def _from_stdin(text: str, fmt: str, tokenizer: TokenizerArg) -> list[Request]:
    if fmt == "lines" or (fmt == "auto" and text.lstrip()[:1] not in ("{", "[")):
        return _lines(text.splitlines(), "<stdin>", tokenizer)
    with tempfile.TemporaryDirectory() as tmp:  # read_trace reads regular files only
        path = Path(tmp) / "stdin.jsonl"
        path.write_text(text, encoding="utf-8")
        return [dataclasses.replace(r, source=r.source.replace(str(path), "<stdin>"),
                                    id=r.id.replace(path.name, "<stdin>")) for r in read_trace(path, fmt, tokenizer)]
