"""Format detection and the entry point ``read_trace``: a trace file in, requests out."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.mooncake import outline_mooncake, read_mooncake
from kvcli.traces.native import NATIVE_PROMPT_KEYS, read_native
from kvcli.traces.records import (
    check_file,
    json_type,
    read_first_char,
    read_first_line,
    read_first_record,
    stem_and_suffix,
)
from kvcli.traces.request import Outline, Reader, Request, TokenizerArg
from kvcli.traces.sharegpt import read_sharegpt
from kvcli.traces.swe_agent import read_swe_agent


def read_trace(path: str | Path, fmt: str = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """The requests of a trace file, in trace order, read lazily.

    Args:
        path: the trace file (optionally gzip-compressed).
        fmt: ``"auto"`` or one of :data:`FORMATS` (``native``, ``mooncake``, ``sharegpt``, ``swe-agent``).
        tokenizer: tokenizer name (or a loaded :class:`~kvcli.tokenize.Tokenizer`) for text prompts; loaded only
            when a record needs it (Mooncake and ``token_ids`` records never do).

    Returns:
        An iterator of :class:`Request`; record errors surface as it reaches them.

    Raises:
        BadInputError: unknown ``fmt``; file missing or unreadable; format not detectable; (while iterating) a bad
            record, with its line.
    """
    path, fmt = _resolved(path, fmt)
    return FORMATS[fmt](path, tokenizer)


def outline_trace(path: str | Path, fmt: str = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER
                  ) -> Iterator[Outline]:
    """Each request's prompt length (tokens) and arrival time, in trace order, checked exactly as
    :func:`read_trace` checks it (same errors, file and line): a Mooncake trace without synthesizing token ids
    (:func:`kvcli.traces.mooncake.outline_mooncake`), other formats read whole (their lengths need the tokens).

    Raises:
        BadInputError: as :func:`read_trace`.
    """
    path, fmt = _resolved(path, fmt)
    if fmt == "mooncake":
        return outline_mooncake(path)
    return (Outline(len(r.token_ids), r.timestamp) for r in FORMATS[fmt](path, tokenizer))


def _resolved(path: str | Path, fmt: str) -> tuple[Path, str]:
    """``(path, format name)``, the file checked and ``"auto"`` detected."""
    if fmt != "auto" and fmt not in FORMATS:
        raise BadInputError(f"unknown trace format {fmt!r}; valid formats: auto, {', '.join(FORMATS)}")
    path = Path(path)
    check_file(path)
    return path, detect_format(path) if fmt == "auto" else fmt


def detect_format(path: str | Path) -> str:
    """The format name of a trace file, from its suffix and first record (see the module docstring).

    Raises:
        BadInputError: the file is missing, empty, not JSON, or its first record matches no format.
    """
    path = Path(path)
    check_file(path)
    if stem_and_suffix(path)[1] == ".traj":
        return "swe-agent"
    if read_first_char(path) == b"[":  # a JSON list, maybe all on one line: no line of it is read as a line
        refuse_csv(path.name, b"", str(path))
        return "sharegpt"
    first = read_first_line(path)
    refuse_csv(path.name, first[1] if first else b"", str(path), first[0] if first else None)
    line_no, record = read_first_record(path)
    if not isinstance(record, dict):
        raise BadInputError(f"cannot detect the trace format: the first record is {json_type(record)}, "
                            "not an object; pass the format by name", path=str(path), line=line_no)
    for key, fmt in (("hash_ids", "mooncake"), ("conversations", "sharegpt"), ("history", "swe-agent")):
        if key in record:
            return fmt
    if any(k in record for k in NATIVE_PROMPT_KEYS):
        return "native"
    keys = ", ".join(sorted(record)[:10]) or "none"
    raise BadInputError(f"cannot detect the trace format from the first record's keys ({keys}); expected "
                        "hash_ids (mooncake), conversations (sharegpt), history (swe-agent) or "
                        "prompt/messages/token_ids (native)", path=str(path), line=line_no)


# CSV traces kvcli knows by their header, and why each cannot be read as prompts.
_AZURE = ("an Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens): it records prompt lengths "
          "only, no prompt text, token ids or block hashes, so which prompts share a prefix is unknown and no "
          "cache hit can be derived; kvcli does not read it (use a trace with prompts, token_ids or Mooncake "
          "hash_ids)")
_CSV_HEADERS: dict[tuple[str, ...], str] = {("timestamp", "contexttokens", "generatedtokens"): _AZURE}


def refuse_csv(name: str, first_line: bytes, path: str, line: int | None = None) -> None:
    """The one rule every command applies to CSV input: a known CSV trace (by its header) or any ``.csv``/``.tsv``
    file is refused with a message saying what it is; kvcli reads no CSV format (``warm --format lines`` reads
    any text file as one prompt per line).

    Raises:
        BadInputError: at ``path:line``, when the input is CSV.
    """
    header = first_line.strip().removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace").lower()
    known = _CSV_HEADERS.get(tuple(c.strip() for c in header.split(",")))
    if known:
        raise BadInputError(known, path=path, line=line)
    suffix = name.lower().removesuffix(".gz").rpartition(".")[2]
    if suffix in ("csv", "tsv"):
        raise BadInputError(f"a {suffix.upper()} file: kvcli reads no {suffix.upper()} trace format (native JSONL, "
                            f"Mooncake, ShareGPT, SWE-agent); warm --format lines reads it as one prompt per line",
                            path=path)


FORMATS: dict[str, Reader] = {
    "native": read_native,
    "mooncake": read_mooncake,
    "sharegpt": read_sharegpt,
    "swe-agent": read_swe_agent,
}
