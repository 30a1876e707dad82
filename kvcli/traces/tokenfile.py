"""Token-id files (``kvcli inspect --tokens FILE``): one prompt's token ids as UTF-8 text, read strictly."""
from __future__ import annotations

import re
from pathlib import Path

from kvcli.errors import BadInputError

MAX_TOKEN_ID = 2**32 - 1
_SEPARATORS = re.compile(r"[\s,]+")
_ID = re.compile(r"[0-9]+")
_SHOWN = 40  # characters of a bad token a message quotes


def read_token_file(path: Path) -> list[int]:
    """The token ids in the file at ``path`` (:func:`parse_token_ids` of its UTF-8 text, a BOM dropped).

    Raises:
        BadInputError: the file cannot be read, is not UTF-8, or holds anything but token ids and separators.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text (byte {exc.start}): --tokens wants token ids as text, e.g. '1 2 3'",
                            path=str(path)) from None
    return parse_token_ids(text, str(path))


def parse_token_ids(text: str, name: str) -> list[int]:
    """The token ids in ``text``, in order: decimal integers in ``[0, 2**32)`` separated by whitespace and/or
    commas (``1 2 3``, ``1,2,3``, one id a line), optionally inside one JSON array (``[1, 2, 3]``: a ``[`` before
    the first id and a ``]`` after the last). Empty text (or ``[]``) holds no ids.

    Args:
        text: the file's text.
        name: the file's name, for messages.

    Raises:
        BadInputError: anything else (a word, a sign, a decimal point, a JSON object, an id of 2**32 or more),
            naming ``name``, the 1-based line (lines end at ``\\n``) and the first bad token:
            ``t.txt:1: 'x' is not a token id ...``.
    """
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):  # one JSON array: its brackets become separators
        start, end = text.index("["), text.rindex("]")
        text = text[:start] + " " + text[start + 1:end] + " " + text[end + 1:]
    ids: list[int] = []
    for line_number, line in enumerate(text.split("\n"), 1):
        for token in _SEPARATORS.split(line):
            if not token:
                continue
            digits = token.lstrip("0") if _ID.fullmatch(token) else None  # int() of 4,300+ digits raises
            if digits is None or len(digits) > 10 or int(digits or "0") > MAX_TOKEN_ID:
                shown = repr(token[:_SHOWN]) + ("..." if len(token) > _SHOWN else "")
                raise BadInputError(f"{shown} is not a token id (token ids are integers in [0, 2**32) separated "
                                    "by whitespace or commas, e.g. '1 2 3' or '[1, 2, 3]')", path=name,
                                    line=line_number)
            ids.append(int(digits or "0"))
    return ids
