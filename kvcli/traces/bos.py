"""A double BOS: a text prompt that already holds the rendered chat template, BOS first, and got another BOS from
the tokenizer, which adds its special tokens to a completion prompt as vLLM's ``/v1/completions`` does
(``add_special_tokens`` true by default). Its tokens then start ``[BOS, BOS, ...]`` and match the same conversation
sent as messages (``[BOS, ...]``) in one token at most: a hit of 0 at any chunk size above 1.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kvcli.model.tokenize import get_tokenizer, is_tokenizer_path
from kvcli.traces.detect import detect_format, read_trace
from kvcli.traces.hashids import HASH_ID_FORMATS, TraceFormat, as_trace_format
from kvcli.traces.request import Request, TokenizerArg


def prompt_bos(tokenizer: TokenizerArg) -> int | None:
    """The BOS id ``tokenizer`` adds in front of a text prompt, or None (a tiktoken name: none, nothing loaded)."""
    if isinstance(tokenizer, str) and not is_tokenizer_path(tokenizer):
        return None
    return get_tokenizer(tokenizer).prompt_bos_id


#: What a double BOS means and what to do, after the line's count of prompts.
_WHY = ("the text already holds the rendered chat template's BOS and the tokenizer added another, as vLLM's "
        "/v1/completions does, so it shares at most that BOS with the same conversation sent as messages; "
        "--no-special-tokens (or \"add_special_tokens\": false in the record) reads it as an engine called with "
        "add_special_tokens=false")


def _doubled(ids, bos: int) -> bool:
    return len(ids) >= 2 and ids[0] == bos and ids[1] == bos


def double_bos_note(requests: Iterable[Request], bos: int, bos_text: str) -> str | None:
    """One line naming the requests whose token ids start with two ``bos`` (``bos_text``, its text), or None."""
    count, first = 0, ""
    for request in requests:
        if _doubled(request.token_ids, bos):
            count += 1
            first = first or request.source or request.id
    if not count:
        return None
    starts = "prompts start" if count != 1 else "prompt starts"
    return f"double BOS: {count:,} {starts} with two {bos_text!r} (id {bos}; first {first}): {_WHY}"


def prompt_bos_note(token_ids, tokenizer: TokenizerArg) -> str | None:
    """One line naming a double BOS at the start of one prompt's ``token_ids`` (``[tokens]``) under ``tokenizer``
    (its BOS: :func:`prompt_bos`), or None: no double BOS, or a tokenizer that adds none (a tiktoken name: nothing
    is loaded)."""
    bos = prompt_bos(tokenizer)
    if bos is None or not _doubled(token_ids, bos):
        return None
    return f"double BOS: the prompt starts with two {get_tokenizer(tokenizer).decode([bos])!r} (id {bos}): {_WHY}"


def trace_bos_note(path: str | Path, fmt: str | TraceFormat, tokenizer: TokenizerArg) -> str | None:
    """:func:`double_bos_note` of a trace file, read again (text formats only, and only when the tokenizer adds a
    BOS: hash-id traces and tiktoken names are never read).

    Raises:
        BadInputError: as :func:`kvcli.traces.detect.read_trace`.
    """
    bos = prompt_bos(tokenizer)
    spec = as_trace_format(fmt)
    name = spec.name if spec.name != "auto" else detect_format(path)
    if bos is None or name in HASH_ID_FORMATS or name == "mooncake":
        return None
    return double_bos_note(read_trace(path, fmt, tokenizer), bos, get_tokenizer(tokenizer).decode([bos]))
