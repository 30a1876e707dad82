"""Format detection and the entry point ``read_trace``: a trace file in, requests out."""
from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.claude_code import outline_claude_code, read_claude_code
from kvcli.traces.hashids import (
    HASH_ID_FORMATS,
    TraceFormat,
    as_trace_format,
    iter_hash_id_records,
    outline_hash_id_trace,
    read_hash_id_trace,
    semantics_note,
)
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


def read_trace(path: str | Path, fmt: str | TraceFormat = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER
               ) -> Iterator[Request]:
    """The requests of a trace file, in trace order, read lazily.

    Args:
        path: the trace file (optionally gzip-compressed).
        fmt: ``"auto"`` or one of :data:`FORMATS` (``native``, ``mooncake``, ``sharegpt``, ``swe-agent``,
            ``bailian``, ``hash-ids``, ``claude-code``), or a :class:`~kvcli.traces.hashids.TraceFormat` that also
            declares hash-id semantics (tokens per id, timestamp unit, the tail block, skipping bad records).
        tokenizer: tokenizer name (or a loaded :class:`~kvcli.tokenize.Tokenizer`) for text prompts; loaded only
            when a record needs it (Mooncake and ``token_ids`` records never do).

    Returns:
        An iterator of :class:`Request`; record errors surface as it reaches them.

    Raises:
        BadInputError: unknown ``fmt``; file missing or unreadable; format not detectable; (while iterating) a bad
            record, with its line.
    """
    path, name, spec = _resolved(path, fmt)
    return _reader(name, spec)(path, tokenizer)


def _reader(name: str, spec: TraceFormat) -> Reader:
    """The reader of format ``name`` under ``spec``'s declarations (a Mooncake trace with any declared goes to the
    hash-id reader, with Mooncake's 512 tokens and ms as its defaults)."""
    if name == "claude-code":
        return functools.partial(read_claude_code, fmt=spec)
    if name in HASH_ID_FORMATS and (name != "mooncake" or spec.declared):
        return functools.partial(read_hash_id_trace, schema=HASH_ID_FORMATS[name], fmt=spec)
    return FORMATS[name]


def outline_trace(path: str | Path, fmt: str | TraceFormat = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER
                  ) -> Iterator[Outline]:
    """Each request's prompt length (tokens) and arrival time, in trace order, checked exactly as
    :func:`read_trace` checks it (same errors, file and line): a Mooncake trace without synthesizing token ids
    (:func:`kvcli.traces.mooncake.outline_mooncake`), other formats read whole (their lengths need the tokens).

    Raises:
        BadInputError: as :func:`read_trace`.
    """
    path, name, spec = _resolved(path, fmt)
    if name == "mooncake" and not spec.declared:
        return outline_mooncake(path)
    if name == "claude-code":
        return outline_claude_code(path, spec)
    if name in HASH_ID_FORMATS:
        return outline_hash_id_trace(path, HASH_ID_FORMATS[name], spec)
    return (Outline(len(r.token_ids), r.timestamp) for r in _reader(name, spec)(path, tokenizer))


def trace_note(path: str | Path, fmt: str | TraceFormat = "auto") -> str | None:
    """One line for a report on how a hash-id trace is read: tokens per id and the timestamp unit, each with
    where it comes from, its sessions, the tail block, and (with ``skip_bad_records``, after a checking pass over
    the file) how many records were skipped; None for other formats.

    Raises:
        BadInputError: as :func:`read_trace`.
    """
    path, name, spec = _resolved(path, fmt)
    if name not in HASH_ID_FORMATS:
        return None
    first = read_first_record(path)[1]
    first_block = first.get("block_size") if isinstance(first, dict) else None
    skipped: list[BadInputError] = []
    if spec.skip_bad_records and name == "claude-code":
        for _ in outline_claude_code(path, spec, skipped):
            pass
    elif spec.skip_bad_records:
        for _ in iter_hash_id_records(path, HASH_ID_FORMATS[name], spec, skipped):
            pass
    return semantics_note(HASH_ID_FORMATS[name], spec, first_block, skipped)


def _resolved(path: str | Path, fmt: str | TraceFormat) -> tuple[Path, str, TraceFormat]:
    """``(path, format name, declarations)``, the file checked and ``"auto"`` detected."""
    spec = as_trace_format(fmt)
    if spec.name != "auto" and spec.name not in FORMATS:
        raise BadInputError(f"unknown trace format {spec.name!r}; valid formats: auto, {', '.join(FORMATS)}")
    path = Path(path)
    check_file(path)
    return path, detect_format(path) if spec.name == "auto" else spec.name, spec


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
    if "hash_ids" in record:
        return hash_id_format(record)
    if isinstance(record.get("requests"), list) and ("hash_id_scope" in record or "block_size" in record):
        return "claude-code"
    for key, fmt in (("conversations", "sharegpt"), ("history", "swe-agent")):
        if key in record:
            return fmt
    if any(k in record for k in NATIVE_PROMPT_KEYS):
        return "native"
    keys = ", ".join(sorted(record)[:10]) or "none"
    raise BadInputError(f"cannot detect the trace format from the first record's keys ({keys}); expected "
                        "hash_ids (mooncake, bailian, hash-ids), conversations (sharegpt), history (swe-agent), "
                        "requests with block_size (claude-code) or prompt/messages/token_ids (native)",
                        path=str(path), line=line_no)


#: fields only a Bailian record has, beside hash_ids
BAILIAN_FIELDS = ("chat_id", "parent_chat_id", "turn", "type")


def hash_id_format(record: dict) -> str:
    """The format of a record with ``hash_ids``: ``bailian`` by its own fields (:data:`BAILIAN_FIELDS`), else
    ``hash-ids`` when it carries ``block_size``, else ``mooncake``."""
    if any(k in record for k in BAILIAN_FIELDS):
        return "bailian"
    return "hash-ids" if "block_size" in record else "mooncake"


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
    "bailian": functools.partial(read_hash_id_trace, schema=HASH_ID_FORMATS["bailian"], fmt=TraceFormat("bailian")),
    "hash-ids": functools.partial(read_hash_id_trace, schema=HASH_ID_FORMATS["hash-ids"],
                                  fmt=TraceFormat("hash-ids")),
    "claude-code": functools.partial(read_claude_code, fmt=TraceFormat("claude-code")),
}
