"""Format detection and the entry point ``read_trace``: a trace file in, requests out."""
from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenize import DEFAULT_TOKENIZER, prompt_tokenizer
from kvcli.traces.claude_code import outline_claude_code, read_claude_code
from kvcli.traces.gateway import REQUEST_FIELDS, TIME_FIELDS, is_gateway_record, read_gateway
from kvcli.traces.hashids import (
    HASH_ID_FORMATS,
    TraceFormat,
    as_trace_format,
    iter_hash_id_records,
    outline_hash_id_trace,
    read_hash_id_trace,
    semantics_note,
)
from kvcli.traces.lines import read_lines
from kvcli.traces.mooncake import MOONCAKE_KEYS, TEXT_KEYS, outline_mooncake, read_mooncake, text_field
from kvcli.traces.native import NATIVE_PROMPT_KEYS, read_native
from kvcli.traces.openai import BATCH_KEYS, read_openai_batch
from kvcli.traces.ragpulse import is_component_record, outline_ragpulse, ragpulse_note, read_ragpulse
from kvcli.traces.records import (
    check_file,
    is_parquet,
    parquet_columns,
    parquet_time_types,
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
            ``bailian``, ``hash-ids``, ``claude-code``, ``ragpulse``, ``openai-batch``, ``gateway``, ``lines``), or a
            :class:`~kvcli.traces.hashids.TraceFormat` that also declares hash-id semantics (tokens per id, timestamp
            unit, the tail block, skipping bad records).
        tokenizer: tokenizer name (or a loaded :class:`~kvcli.model.tokenizer_base.Tokenizer`) for text prompts;
            loaded only when a record needs it (Mooncake and ``token_ids`` records never do).

    Returns:
        An iterator of :class:`Request`; record errors surface as it reaches them.

    Raises:
        BadInputError: unknown ``fmt``; file missing or unreadable; format not detectable; (while iterating) a bad
            record, with its line.
    """
    path, name, spec = _resolved(path, fmt)
    return _reader(name, spec)(path, prompt_tokenizer(tokenizer, spec.add_special_tokens))


def _reader(name: str, spec: TraceFormat) -> Reader:
    """The reader of format ``name`` under ``spec``'s declarations."""
    if name == "claude-code":
        return functools.partial(read_claude_code, fmt=spec)
    if name == "gateway":
        return functools.partial(read_gateway, fmt=spec)
    if name in MOONCAKE_ROWS:
        return functools.partial(read_mooncake, schema=HASH_ID_FORMATS[name], fmt=spec)
    if name == "ragpulse":
        return functools.partial(read_ragpulse, fmt=spec)
    if name in HASH_ID_FORMATS:
        return functools.partial(read_hash_id_trace, schema=HASH_ID_FORMATS[name], fmt=spec)
    if name == "native" and spec.name == "auto":  # detected: a later Mooncake row says what to pass
        return functools.partial(read_native, other=_mooncake_fields)
    return _PLAIN_READERS[name]


def outline_trace(path: str | Path, fmt: str | TraceFormat = "auto", tokenizer: TokenizerArg = DEFAULT_TOKENIZER
                  ) -> Iterator[Outline]:
    """Each request's prompt length (tokens) and arrival time, in trace order, checked exactly as
    :func:`read_trace` checks it (same errors, file and line): a hash-id trace without synthesizing token ids
    (:func:`kvcli.traces.hashids.outline_hash_id_trace`), other formats read whole (their lengths need the tokens).

    Raises:
        BadInputError: as :func:`read_trace`.
    """
    path, name, spec = _resolved(path, fmt)
    if name == "claude-code":
        return outline_claude_code(path, spec)
    if name in MOONCAKE_ROWS:
        return outline_mooncake(path, HASH_ID_FORMATS[name], spec, tokenizer)
    if name == "ragpulse":
        return outline_ragpulse(path, spec)
    if name in HASH_ID_FORMATS:
        return outline_hash_id_trace(path, HASH_ID_FORMATS[name], spec)
    return (Outline(len(r.token_ids), r.timestamp, r.model)
            for r in _reader(name, spec)(path, prompt_tokenizer(tokenizer, spec.add_special_tokens)))


def trace_note(path: str | Path, fmt: str | TraceFormat = "auto") -> str | None:
    """One line for a report on how a hash-id trace is read: tokens per id and the timestamp unit, each with
    where it comes from, its sessions, the tail block, and (with ``skip_bad_records``, after a checking pass over
    the file) how many records were skipped. For another format, a line naming the hash-id options given that it
    is read without (None when none was given).

    Raises:
        BadInputError: as :func:`read_trace`.
    """
    path, name, spec = _resolved(path, fmt)
    if name not in HASH_ID_FORMATS:
        given = [option for option, on in (("--hash-block-tokens", spec.block_tokens is not None),
                                           ("--timestamp-unit", spec.timestamp_unit is not None),
                                           ("--drop-tail-block", spec.drop_tail_block)) if on]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            return f"{' and '.join(given)} {verb} to hash-id traces only: this {name} trace is read without them"
        return None
    if name == "ragpulse":
        return ragpulse_note(path, spec)
    first = read_first_record(path)[1]
    first_block = first.get("block_size") if isinstance(first, dict) else None
    skipped: list[BadInputError] = []
    if spec.skip_bad_records and name == "claude-code":
        for _ in outline_claude_code(path, spec, skipped):
            pass
    elif spec.skip_bad_records and name in MOONCAKE_ROWS:
        for _ in outline_mooncake(path, HASH_ID_FORMATS[name], spec, DEFAULT_TOKENIZER, skipped):
            pass
    elif spec.skip_bad_records:
        for _ in iter_hash_id_records(path, HASH_ID_FORMATS[name], spec, skipped):
            pass
    time_type = parquet_time_types(path).get("timestamp") if is_parquet(path) else None
    note = semantics_note(HASH_ID_FORMATS[name], spec, first_block, skipped, time_type)
    field = next((k for k in TEXT_KEYS if k in first), None) if isinstance(first, dict) else None
    if name in MOONCAKE_ROWS and field is not None:  # no hash id in that row: say so before the blocks' rules
        prompt = (f"text ({field}), tokenized as the request it makes," if text_field(first) is not None
                  else f"token ids ({field}.prompt),")
        note = f"its first row's prompt is {prompt} without hash ids; rows of hash_ids: {note}"
    return note


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
        BadInputError: the file is missing, empty, not JSON, or its first record matches no format or more than
            one (:func:`record_format`); a file named as JSON whose first line is not an object
            (:func:`refuse_json_value`); CSV other than a gateway log (:func:`refuse_csv`).
    """
    path = Path(path)
    check_file(path)
    if is_parquet(path):
        return parquet_format(path)
    suffix = stem_and_suffix(path)[1].lower()
    if suffix == ".traj":
        return "swe-agent"
    if suffix == ".txt":
        return "lines"
    if read_first_char(path) == b"[":  # a JSON list, maybe all on one line: no line of it is read as a line
        refuse_csv(path.name, b"", str(path))
        return "sharegpt"
    first = read_first_line(path)
    if first is not None:
        text = text_format(path.name, first[1], str(path), first[0])
        if text is not None:
            return text
    line_no, record = read_first_record(path)
    if not isinstance(record, dict):
        raise BadInputError(f"cannot detect the trace format: the first record is {json_type(record)}, "
                            "not an object; pass the format by name", path=str(path), line=line_no)
    return record_format(record, path, line_no)


#: the formats whose rows are read through :func:`kvcli.traces.records.iter_rows`, Parquet rows among them
MOONCAKE_ROWS = ("mooncake", "hash-ids")
PARQUET_FORMATS = (*MOONCAKE_ROWS, "native")


def parquet_format(path: Path) -> str:
    """The format of a Parquet file's rows, from its columns and first row (:func:`record_format`: a column is a
    field of every row, null or not, so a ``delay`` column makes Mooncake rows though the first turn's delay is
    null): Mooncake rows or native records, the formats read a row at a time.

    Raises:
        BadInputError: at ``path:1``, a first row that fits no format, several, or another format.
    """
    record = {**dict.fromkeys(parquet_columns(path)), **read_first_record(path)[1]}
    name = record_format(record, path, 1)
    if name not in PARQUET_FORMATS:
        raise BadInputError(f"a Parquet file's rows are read as {', '.join(PARQUET_FORMATS)} records; its first row "
                            f"fits {name}", path=str(path), line=1)
    return name


def record_format(record: dict, path: Path, line_no: int) -> str:
    """The one format whose signature a first record fits: a hash-id format (``hash_ids``, or a field only a
    Mooncake row has, :data:`kvcli.traces.mooncake.MOONCAKE_KEYS`; :func:`hash_id_format` tells them apart,
    RAGPulse's object of components among them), ``claude-code`` (a ``requests`` list with ``block_size`` or
    ``hash_id_scope``), ``sharegpt`` (``conversations``), ``swe-agent`` (``history``), ``openai-batch``
    (``custom_id`` and ``body``), ``gateway`` (:func:`kvcli.traces.gateway.is_gateway_record`) or ``native``
    (``prompt``, ``messages`` or ``token_ids``). No signature wins over another: a record that fits two is refused.
    The exceptions are ``messages`` beside a gateway row's fields (the gateway's copy of the request's) or beside a
    Mooncake row's (aiperf's chat rows), which alone do not make the record native.

    Raises:
        BadInputError: at ``path:line_no``, no format fits, or more than one does (the error names them and says to
            pass one); a line of a RAGPulse component file (named as such: it is read beside its trace).
    """
    requests = isinstance(record.get("requests"), list)
    mooncake_only = any(k in record for k in MOONCAKE_KEYS)
    fits = {hash_id_format(record): "hash_ids" in record or mooncake_only,
            "claude-code": requests and ("hash_id_scope" in record or "block_size" in record),
            "sharegpt": "conversations" in record, "swe-agent": "history" in record,
            "openai-batch": all(k in record for k in BATCH_KEYS), "gateway": is_gateway_record(record),
            "native": any(k in record for k in NATIVE_PROMPT_KEYS)}
    if (fits["gateway"] or mooncake_only or "hash_ids" in record) and not any(k in record for k in ("prompt",
                                                                                                     "token_ids")):
        fits["native"] = False
    found = [name for name, fit in fits.items() if fit]
    if len(found) == 1:
        return found[0]
    keys = ", ".join(sorted(record)[:10]) or "none"
    if not found and is_component_record(record):
        raise BadInputError(f"a RAGPulse component file (its keys: {keys}), not a trace: it gives the tokens of "
                            "each hash id to the trace beside it; name the trace (RAGPulse's 0_trace.jsonl)",
                            path=str(path), line=line_no)
    if found:
        raise BadInputError(f"ambiguous trace format: the first record's keys ({keys}) fit {' and '.join(found)}; "
                            f"pass the format by name (--format {' or --format '.join(found)}; kvcli export: "
                            "--input-format)", path=str(path), line=line_no)
    raise BadInputError(f"cannot detect the trace format from the first record's keys ({keys}); expected "
                        "hash_ids (mooncake, bailian, hash-ids, ragpulse), a Mooncake row's input_length or delay "
                        "(mooncake), conversations (sharegpt), history (swe-agent), requests with block_size "
                        "(claude-code), custom_id and body (openai-batch), a request and a time field (gateway: "
                        f"{', '.join(REQUEST_FIELDS)} or messages, and "
                        f"{', '.join(TIME_FIELDS)}) or prompt/messages/token_ids (native)",
                        path=str(path), line=line_no)


def text_format(name: str, first_line: bytes, path: str, line: int | None = None) -> str | None:
    """The format a file's first non-blank line says, when it is not a JSON object: ``gateway`` for a CSV header
    with a gateway log's columns (:func:`kvcli.traces.gateway.is_gateway_record`), ``lines`` (one prompt per line)
    for any other text that does not start with ``{``; None for a JSON object's line. The rule every command
    applies, warm's ``-`` (stdin) included.

    Raises:
        BadInputError: at ``path:line``, other CSV input (:func:`refuse_csv`), or a file named as JSON whose first
            line is a JSON value other than an object (:func:`refuse_json_value`).
    """
    text = first_line.strip().removeprefix(b"\xef\xbb\xbf")
    if text.startswith(b"{"):
        return None
    if is_gateway_record(csv_header(text)):
        return "gateway"
    refuse_csv(name, first_line, path, line)
    refuse_json_value(name, text, path, line)
    return "lines"


#: suffixes that name a file JSON (a trailing ``.gz`` aside): its lines are records, never prompt text
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")


def refuse_json_value(name: str, text: bytes, path: str, line: int | None = None) -> None:
    """Refuse a file named as JSON (:data:`JSON_SUFFIXES`) whose first line ``text`` is a JSON value other than an
    object (null, a number, a string, a boolean): its records cannot be read, and reading it as prompt lines
    would take its JSON objects for text. Other text, and any file named otherwise, is left to be read as lines.

    Raises:
        BadInputError: at ``path:line``, naming what the line is.
    """
    if Path(name.lower().removesuffix(".gz")).suffix not in JSON_SUFFIXES:
        return
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError): prompt text
        return
    raise BadInputError(f"the first record is {json_type(value)}, not a JSON object: each line of a JSONL trace is "
                        "one object (--format lines reads the file as one prompt per line)", path=path, line=line)


def csv_header(line: bytes) -> list[str]:
    """The column names of a CSV header line (quoted names unquoted, spaces around them dropped)."""
    import csv

    try:
        row = next(csv.reader([line.decode("utf-8", "replace")]), [])
    except csv.Error:
        return []
    return [c.strip() for c in row]


#: fields only a Bailian record has, beside hash_ids
BAILIAN_FIELDS = ("chat_id", "parent_chat_id", "turn", "type")


def hash_id_format(record: dict) -> str:
    """The format of a record with ``hash_ids``: ``ragpulse`` when they are an object (RAGPulse's components, each
    a list of ids: no other hash-id format could read it), else ``bailian`` by its own fields
    (:data:`BAILIAN_FIELDS`), else ``hash-ids`` when it carries ``block_size``, else ``mooncake``."""
    if isinstance(record.get("hash_ids"), dict):
        return "ragpulse"
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
    """The one rule every command applies to CSV input other than a gateway log (:func:`text_format`): a known CSV
    trace (by its header) or any ``.csv``/``.tsv`` file is refused with a message saying what it is (``--format
    lines`` reads any text file as one prompt per line).

    Raises:
        BadInputError: at ``path:line``, when the input is CSV.
    """
    header = first_line.strip().removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace").lower()
    known = _CSV_HEADERS.get(tuple(c.strip() for c in header.split(",")))
    if known:
        raise BadInputError(known, path=path, line=line)
    suffix = name.lower().removesuffix(".gz").rpartition(".")[2]
    if suffix in ("csv", "tsv"):
        raise BadInputError(f"a {suffix.upper()} file: kvcli reads {suffix.upper()} only as a gateway log (a "
                            f"header with a request column, {', '.join(REQUEST_FIELDS)} or messages, and a time "
                            f"column, {', '.join(TIME_FIELDS)}); --format lines reads it as one prompt per line",
                            path=path)


# The formats whose reader takes no declarations; the others are built by _reader for what the user declared.
def _mooncake_fields(record: dict) -> str:
    """For a record of a file detected as native that is not a native record: its fields only a Mooncake row has
    (``hash_ids``, :data:`kvcli.traces.mooncake.MOONCAKE_KEYS`) and what to pass, or "" when it has none (aiperf's
    rows whose first is a chat of ``session_id`` and ``messages`` alone are detected as native)."""
    keys = [k for k in ("hash_ids", *MOONCAKE_KEYS) if k in record]
    if not keys:
        return ""
    return (f"its {', '.join(keys)} {'is' if len(keys) == 1 else 'are'} a Mooncake row's: the file was read as "
            "native records (its first record has no field only a Mooncake row has); pass --format mooncake")


_PLAIN_READERS: dict[str, Reader] = {"native": read_native, "sharegpt": read_sharegpt, "swe-agent": read_swe_agent,
                                     "openai-batch": read_openai_batch, "lines": read_lines}
FORMATS: dict[str, Reader] = {name: _reader(name, TraceFormat(name)) for name in (
    "native", "mooncake", "sharegpt", "swe-agent", "bailian", "hash-ids", "claude-code", "ragpulse", "openai-batch",
    "gateway", "lines")}
