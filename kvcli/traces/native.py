"""kvcli's own JSONL trace format (one request per line; ``prompt``, ``messages`` or ``token_ids``).

Format: :mod:`kvcli.traces` (package docstring)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.model.tokenizer_base import TOKEN_DTYPE, check_tools
from kvcli.traces.records import (
    cache_salt,
    iter_rows,
    located,
    optional_count,
    optional_id,
    optional_seconds,
    require_object,
    served_model,
    shorten,
)
from kvcli.traces.request import ChatPrompt, Request, TokenizerArg

NATIVE_PROMPT_KEYS = ("prompt", "messages", "token_ids")


def read_native(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER,
                other: Callable[[dict], str] | None = None) -> Iterator[Request]:
    """Requests of a native trace, JSONL or Parquet (:func:`kvcli.traces.records.iter_rows`; format in the module
    docstring). ``other(record)``: for a record that is not a native one, what it is instead ("" when unknown),
    said after the error (:func:`kvcli.traces.detect.read_trace` names another format's fields there).

    Raises:
        BadInputError: at ``path:line``, a record that is not a native request.
    """
    for line_no, record in iter_rows(path):
        try:
            request = _native_request(record, tokenizer, path, line_no)
        except BadInputError as err:
            hint = other(record) if other is not None and isinstance(record, dict) and not err.path else ""
            raise located(BadInputError(f"{err.reason}; {hint}") if hint else err, path, line_no) from None
        yield request


def _native_request(record: Any, tokenizer: TokenizerArg, path: Path, line_no: int) -> Request:
    record = require_object(record)
    return Request(
        id=optional_id(record, "id") or f"{path.name}:{line_no}",
        token_ids=prompt_tokens(record, tokenizer, "a native record"),
        timestamp=optional_seconds(record.get("timestamp"), "timestamp", divisor=1),
        session_id=optional_id(record, "session_id"),
        cache_salt=cache_salt(record),
        output_length=optional_count(record.get("output_length"), "output_length"),
        source=f"{path}:{line_no}",
        chat=prompt_chat(record),
        model=served_model(record),
    )


def prompt_tokens(record: dict, tokenizer: TokenizerArg, what: str) -> np.ndarray:
    """The prompt token ids of a request object, the one rendering every format of requests shares (native
    records, OpenAI request bodies in Batch files and gateway logs): exactly one of ``prompt`` (a string, a
    completion prompt: :meth:`~kvcli.model.tokenizer_base.Tokenizer.encode_prompt`, with the tokenizer's special
    tokens unless the record's ``add_special_tokens`` is false, as in vLLM's completions request body; true adds
    them whatever ``--no-special-tokens`` says), ``messages`` (chat messages,
    with the request's ``tools``, under the chat template plus the generation prompt:
    :meth:`~kvcli.model.tokenizer_base.Tokenizer.encode_chat`) or ``token_ids``; ``what`` names the object in
    the error. Returns ``[tokens]`` ``'<u4'``.

    Raises:
        BadInputError: none or several of the three, a value of the wrong type (``add_special_tokens`` not a
            bool), bad ``tools`` (a list of objects), or messages the template refuses.
    """
    present = [k for k in NATIVE_PROMPT_KEYS if k in record]
    if len(present) != 1:
        found = ", ".join(present) if present else "none"
        raise BadInputError(f"{what} needs exactly one of prompt, messages, token_ids (found: {found})")
    key = present[0]
    value = record[key]
    tools = check_tools(record.get("tools"))
    if tools and key != "messages":
        raise BadInputError(f"tools go with messages (a chat request), not with {key}")
    add = record.get("add_special_tokens")
    if add is not None and not isinstance(add, bool):
        raise BadInputError(f"add_special_tokens must be true or false, not {shorten(add)}")
    if key == "prompt":
        if not isinstance(value, str):
            raise BadInputError(f"prompt must be a string (token ids go in token_ids, a list of integers), "
                                f"not {json_type(value)}")
        return get_tokenizer(tokenizer).encode_prompt(value, add)
    if key == "messages":
        if not isinstance(value, list):
            raise BadInputError(f"messages must be a list of chat messages, not {json_type(value)}")
        return get_tokenizer(tokenizer).encode_chat(value, add_generation_prompt=True, tools=tools)
    return token_array(value)


def prompt_chat(record: dict) -> ChatPrompt | None:
    """The :class:`~kvcli.traces.request.ChatPrompt` of a request object :func:`prompt_tokens` accepted: its
    ``messages`` and ``tools`` when it is a chat request, else None."""
    messages = record.get("messages")
    return ChatPrompt(messages, record.get("tools") or None) if isinstance(messages, list) else None


def token_array(value: Any, name: str = "token_ids") -> np.ndarray:
    """Validated token ids: a list of integers in ``[0, 2**32)`` as a ``[tokens]`` ``'<u4'`` array; ``name`` is the
    field errors name.

    Raises:
        BadInputError: not a list, or an element that is not such an integer (``name[i]``, its index, is named).
    """
    if not isinstance(value, list):
        raise BadInputError(f"{name} must be a list of integers, not {json_type(value)}")
    if not value:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    try:
        arr = np.array(value)
    except (ValueError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < 0) | (arr > 0xFFFFFFFF))
        if not bad.size:
            return arr.astype(TOKEN_DTYPE)
        i = int(bad[0])
    else:
        i = next((i for i, t in enumerate(value) if type(t) is not int or not 0 <= t <= 0xFFFFFFFF), 0)
    raise BadInputError(f"{name}[{i}] = {shorten(value[i])} is not an integer in [0, 2**32)")
