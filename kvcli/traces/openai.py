"""OpenAI-shaped requests: the request body every OpenAI-compatible format carries, and OpenAI Batch input files.

A **request body** is what a client POSTs to ``/v1/chat/completions`` (``messages``, ``tools``, ``model``, ...) or
``/v1/completions`` (``prompt``). Its prompt is rendered exactly as a native record's
(:func:`kvcli.traces.native.prompt_tokens`): ``messages`` with the request's ``tools`` under the chat template plus
the generation prompt, so a Batch line, a gateway log row and the native record ``{"messages": ..., "tools": ...}``
of the same request give the same token ids. A ``prompt`` given as a list (the completions API's token-id prompt)
is the prompt's token ids, as a native record's ``token_ids``. ``cache_salt`` (vLLM's request field) is the tenant
salt; ``model`` (:attr:`kvcli.traces.request.Request.model`: requests naming different models never share cache)
and the sampling fields do not change the prompt. A file of bodies, one per line, is a native trace.

**OpenAI Batch input** (JSONL; ``fmt="openai-batch"``): ``{"custom_id": ..., "method": "POST", "url":
"/v1/chat/completions", "body": {...}}`` per line. ``id`` is ``custom_id``; there are no timestamps or sessions.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.native import prompt_chat, prompt_tokens, token_array
from kvcli.traces.records import (
    cache_salt,
    iter_jsonl,
    located,
    optional_id,
    require_object,
    served_model,
)
from kvcli.traces.request import Request, TokenizerArg

#: the keys that make a record an OpenAI Batch input line.
BATCH_KEYS = ("custom_id", "body")


def body_request(body: Any, tokenizer: TokenizerArg, what: str, request_id: str, source: str,
                 timestamp: float | None = None, session_id: str | None = None,
                 output_length: int | None = None) -> Request:
    """The :class:`Request` of one OpenAI request body (module docstring); ``what`` names the body in errors.

    Raises:
        BadInputError: the body is not an object, has neither ``messages`` nor ``prompt``, or holds a bad value
            (see :func:`~kvcli.traces.native.prompt_tokens`); a ``prompt`` (without ``messages``) that is neither a
            string nor a list; a list ``prompt`` with an element that is not a token
            id (an integer in ``[0, 2**32)``) or with ``tools``; ``cache_salt`` that is not a string.
    """
    if not isinstance(body, dict):
        raise BadInputError(f"{what} must be a request object, not {json_type(body)}")
    if "messages" not in body and "prompt" not in body:
        keys = ", ".join(sorted(body)[:10]) or "none"
        raise BadInputError(f"{what} has neither messages (a chat completion) nor prompt (a completion); its keys: "
                            f"{keys}")
    salt = cache_salt(body, f"{what}.")
    if prompt_is_token_ids(body):
        tokens = _prompt_token_ids(body, what)
    elif "messages" not in body and not isinstance(body["prompt"], str):
        raise BadInputError(f"{what}.prompt must be a string (text) or a list of token ids (integers in "
                            f"[0, 2**32)), not {json_type(body['prompt'])}")
    else:
        try:
            tokens = prompt_tokens({k: body[k] for k in ("messages", "prompt", "tools") if k in body}, tokenizer,
                                   what)
        except BadInputError as err:
            raise BadInputError(f"{what}: {err.reason}") from None
    return Request(id=request_id, token_ids=tokens, timestamp=timestamp, session_id=session_id,
                   cache_salt=salt, output_length=output_length, source=source, chat=prompt_chat(body),
                   model=served_model(body, f"{what}."))


def prompt_is_token_ids(body: Any) -> bool:
    """Whether a request body gives its prompt as token ids (a completion's ``prompt`` that is a list, with no
    ``messages``) rather than as text; checks nothing else (:func:`body_request` does)."""
    return isinstance(body, dict) and isinstance(body.get("prompt"), list) and "messages" not in body


def _prompt_token_ids(body: dict, what: str) -> np.ndarray:
    """A completion body's ``prompt`` given as a list: its token ids, ``[tokens]`` ``'<u4'``.

    Raises:
        BadInputError: ``tools`` beside it, or an element that is not an integer in ``[0, 2**32)`` (a list of
            strings is a batch of prompts, several requests, not one).
    """
    if body.get("tools"):
        raise BadInputError(f"{what}: tools go with messages (a chat request), not with prompt")
    try:
        return token_array(body["prompt"], f"{what}.prompt")
    except BadInputError as err:
        raise BadInputError(f"{err.reason}: a prompt given as a list is one request's token ids") from None


def read_openai_batch(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of an OpenAI Batch input file (module docstring), in file order.

    Raises:
        BadInputError: at ``path:line``, a line that is not a Batch request (no ``custom_id`` or ``body``) or a bad
            body (:func:`body_request`).
    """
    for line_no, record in iter_jsonl(path):
        try:
            record = require_object(record)
            if any(k not in record for k in BATCH_KEYS):
                raise BadInputError("an OpenAI Batch line needs custom_id and body")
            request = body_request(record["body"], tokenizer, "body",
                                   optional_id(record, "custom_id") or f"{path.name}:{line_no}", f"{path}:{line_no}")
        except BadInputError as err:
            raise located(err, path, line_no) from None
        yield request
