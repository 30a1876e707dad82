"""Format detection and the entry point ``read_trace``: a trace file in, requests out."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.mooncake import read_mooncake
from kvcli.traces.native import _NATIVE_PROMPT_KEYS, read_native
from kvcli.traces.records import (
    _check_file,
    _first_char,
    _first_record,
    _json_type,
    _stem_and_suffix,
)
from kvcli.traces.request import Reader, Request, TokenizerArg
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
    if fmt != "auto" and fmt not in FORMATS:
        raise BadInputError(f"unknown trace format {fmt!r}; valid formats: auto, {', '.join(FORMATS)}")
    path = Path(path)
    _check_file(path)
    if fmt == "auto":
        fmt = detect_format(path)
    return FORMATS[fmt](path, tokenizer)


def detect_format(path: str | Path) -> str:
    """The format name of a trace file, from its suffix and first record (see the module docstring).

    Raises:
        BadInputError: the file is missing, empty, not JSON, or its first record matches no format.
    """
    path = Path(path)
    _check_file(path)
    if _stem_and_suffix(path)[1] == ".traj":
        return "swe-agent"
    if _first_char(path) == b"[":
        return "sharegpt"
    line_no, record = _first_record(path)
    if not isinstance(record, dict):
        raise BadInputError(f"cannot detect the trace format: the first record is {_json_type(record)}, "
                            "not an object; pass the format by name", path=str(path), line=line_no)
    for key, fmt in (("hash_ids", "mooncake"), ("conversations", "sharegpt"), ("history", "swe-agent")):
        if key in record:
            return fmt
    if any(k in record for k in _NATIVE_PROMPT_KEYS):
        return "native"
    keys = ", ".join(sorted(record)[:10]) or "none"
    raise BadInputError(f"cannot detect the trace format from the first record's keys ({keys}); expected "
                        "hash_ids (mooncake), conversations (sharegpt), history (swe-agent) or "
                        "prompt/messages/token_ids (native)", path=str(path), line=line_no)


FORMATS: dict[str, Reader] = {
    "native": read_native,
    "mooncake": read_mooncake,
    "sharegpt": read_sharegpt,
    "swe-agent": read_swe_agent,
}
