"""Prompt files: one completion prompt per line (no chat template), the format warm, replay and route read for a
``.txt`` file or any text file that does not start with ``{`` or ``[``."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.traces.records import read_all_bytes
from kvcli.traces.request import Request, TokenizerArg


def read_lines(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a prompt file: one per non-blank line (the file is read whole; gzip by its magic bytes).

    Raises:
        BadInputError: the file cannot be read, or is not UTF-8 (the line and column of the first bad byte).
    """
    yield from lines_requests(decode_text(read_all_bytes(path), str(path)), str(path), tokenizer)


def lines_requests(text: str, name: str, tokenizer: TokenizerArg) -> list[Request]:
    """One request per non-blank line of ``text`` (lines end at ``\\n``; a trailing ``\\r`` is dropped), tokenized
    as a completion prompt (:meth:`~kvcli.model.tokenizer_base.Tokenizer.encode_prompt`); ids and sources are
    ``"<name>:<line>"``. The tokenizer is loaded only when a line holds text."""
    lines = text.split("\n")  # lines end at \n only (as the line numbers of errors count them)
    if not any(line.strip() for line in lines):
        return []
    tok = get_tokenizer(tokenizer)
    return [Request(f"{name}:{i}", tok.encode_prompt(line.rstrip("\r")), source=f"{name}:{i}")
            for i, line in enumerate(lines, 1) if line.strip()]


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text of ``data`` (a BOM dropped).

    Raises:
        BadInputError: not UTF-8, naming ``name``, the line and column of the first bad byte and its value (never
            the surrounding bytes).
    """
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BadInputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); prompts must be "
                            f"UTF-8", path=name, line=line) from None
