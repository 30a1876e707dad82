"""What an engine reported per request: its prompt tokens found in the prefix cache, read from a JSONL log.

Three row shapes, told apart row by row:

* **vLLM's** ``RequestOutput`` (or a log of it): ``request_id`` (else ``id``) and ``num_cached_tokens`` (else
  ``cached_tokens``), with the prompt's length as ``prompt_tokens`` or ``len(prompt_token_ids)``, optional.
* **An OpenAI response** (chat or completion, from vLLM's server with ``--enable-prompt-tokens-details``, SGLang,
  OpenAI): ``id`` and ``usage.prompt_tokens_details.cached_tokens``, the prompt's length ``usage.prompt_tokens``.
* **A gateway log row** holding the response body under one of :data:`RESPONSE_FIELDS` (an object, or its JSON
  text; LiteLLM's spend logs keep it under ``response``): the response read as above, its id the row's
  ``request_id`` (else ``id``, else the response's).

Counts are tokens. ``.gz`` files are read as gzip.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcli.errors import BadInputError

#: gateway row fields that hold a response body, in the order they are tried.
RESPONSE_FIELDS = ("response", "response_body", "proxy_server_response")


@dataclass(frozen=True)
class EngineReport:
    """One request as the engine reported it.

    Attributes:
        id: the request's id (None: the row has none). cached_tokens: prompt tokens the prefix cache supplied.
        prompt_tokens: the prompt's length as the engine counted it (None: not reported). source: ``file:line``.
    """

    id: str | None
    cached_tokens: int
    prompt_tokens: int | None
    source: str


def read_engine_log(path: Path) -> list[EngineReport]:
    """Every row of an engine log (module docstring), in file order.

    Raises:
        BadInputError: at ``path:line``, a line that is not JSON, not an object, or holds no cached token count
            (an OpenAI response without ``prompt_tokens_details``: start vLLM's server with
            ``--enable-prompt-tokens-details``) or more cached tokens than its own prompt tokens; the file cannot
            be read or holds no rows.
    """
    from kvcli.traces.records import check_file, iter_jsonl

    check_file(path)
    reports = []
    for line_no, value in iter_jsonl(path):
        try:
            reports.append(engine_row(value, f"{path}:{line_no}"))
        except ValueError as err:
            raise BadInputError(str(err), str(path), line_no) from None
    if not reports:
        raise BadInputError("no rows: an engine log has one JSON object a request", str(path))
    return reports


def engine_row(value: Any, source: str = "") -> EngineReport:
    """One row of an engine log (module docstring) as an :class:`EngineReport`.

    Raises:
        ValueError: the row is none of the three shapes, a count is not an integer >= 0, or the cached tokens
            exceed the row's prompt tokens.
    """
    if not isinstance(value, dict):
        raise ValueError(f"a row is a JSON object, got {type(value).__name__}")
    for key in ("num_cached_tokens", "cached_tokens"):
        if key in value:
            prompt = value.get("prompt_tokens")
            if prompt is None and isinstance(value.get("prompt_token_ids"), list):
                prompt = len(value["prompt_token_ids"])
            return _report(_id(value, "request_id", "id"), _count(value[key], key),
                           None if prompt is None else _count(prompt, "prompt_tokens"), source)
    if "usage" in value:
        return _response(value, _id(value, "id"), source)
    for key in RESPONSE_FIELDS:
        if key in value:
            body = value[key]
            if isinstance(body, str):
                try:
                    body = json.loads(body)
                except json.JSONDecodeError:
                    raise ValueError(f"{key} holds text that is not JSON") from None
            if not isinstance(body, dict):
                raise ValueError(f"{key} is a response object, got {type(body).__name__}")
            return _response(body, _id(value, "request_id", "id") or _id(body, "id"), source)
    raise ValueError("no cached token count: a row has num_cached_tokens (vLLM's RequestOutput), "
                     "usage.prompt_tokens_details.cached_tokens (an OpenAI response) or a response under "
                     + ", ".join(RESPONSE_FIELDS))


def _response(body: dict, rid: str | None, source: str) -> EngineReport:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        raise ValueError(f"usage is an object, got {type(usage).__name__}")
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict) or "cached_tokens" not in details:
        raise ValueError("usage has no prompt_tokens_details.cached_tokens (vLLM's server reports it with "
                         "--enable-prompt-tokens-details)")
    prompt = usage.get("prompt_tokens")
    return _report(rid, _count(details["cached_tokens"], "cached_tokens"),
                   None if prompt is None else _count(prompt, "prompt_tokens"), source)


def _report(rid: str | None, cached: int, prompt: int | None, source: str) -> EngineReport:
    """The row's report, its cached tokens checked against its own prompt length (tokens).

    Raises:
        ValueError: more tokens cached than the prompt holds.
    """
    if prompt is not None and cached > prompt:
        raise ValueError(f"{cached} cached tokens in a prompt of {prompt} tokens: an engine caches at most the "
                         "prompt")
    return EngineReport(rid, cached, prompt, source)


def _id(row: dict, *keys: str) -> str | None:
    for key in keys:
        value = row.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is an integer >= 0, got {value!r}")
    return value
