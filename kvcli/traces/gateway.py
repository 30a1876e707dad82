"""Gateway logs: one row per request an LLM gateway proxied, JSONL or CSV, each with the request's JSON and its
time (LiteLLM's spend-log shape: ``request_id``, ``startTime``, ``proxy_server_request``, ``messages``,
``session_id``, ``completion_tokens``, ...).

Fields (JSONL keys or CSV header names, exact spelling; a CSV cell holding JSON is parsed):

* the request: the first of :data:`REQUEST_FIELDS` that holds a request body with ``messages`` or ``prompt``,
  read as an OpenAI request body (:func:`kvcli.traces.openai.body_request`: ``tools`` rendered, ``cache_salt``
  kept), else ``messages`` (a list, or its JSON text) on its own. LiteLLM stores prompts only with
  ``store_prompts_in_spend_logs``; a row without one is an error naming its line.
* the time: the first of :data:`TIME_FIELDS` the file has, an ISO-8601 string (no zone: UTC) or an epoch number
  in seconds (``--timestamp-unit ms|us`` for others); a request's timestamp is its time minus the first row's,
  in seconds (a row earlier than the first gets a negative one; requests are taken in time order).
* ``request_id`` (else ``id``; default ``"<file name>:<line>"``), ``session_id``, and ``completion_tokens`` as the
  output length, each optional.

A file is a gateway log when its first record (a CSV's header) has a request field of :data:`REQUEST_FIELDS` and
a time field, or ``messages`` and a time field other than ``timestamp`` (:func:`is_gateway_record`).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.hashids import TIMESTAMP_UNITS, TraceFormat
from kvcli.traces.openai import body_request
from kvcli.traces.records import (
    epoch_seconds,
    finite_number,
    iter_csv,
    iter_jsonl,
    located,
    optional_count,
    optional_id,
    read_first_char,
    require_object,
    shorten,
)
from kvcli.traces.request import Request, TokenizerArg

#: fields holding a request's JSON body, in the order they are tried.
REQUEST_FIELDS = ("proxy_server_request", "request_body", "request")
#: fields holding a request's time, in the order they are tried.
TIME_FIELDS = ("startTime", "start_time", "created_at", "timestamp")


def is_gateway_record(keys: Iterable[str]) -> bool:
    """Whether a record (or CSV header) with these keys is a gateway log's (module docstring)."""
    keys = set(keys)
    has_time = any(k in keys for k in TIME_FIELDS)
    return has_time and (any(k in keys for k in REQUEST_FIELDS)
                         or ("messages" in keys and any(k in keys for k in TIME_FIELDS if k != "timestamp")))


def read_gateway(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER, fmt: TraceFormat | None = None
                 ) -> Iterator[Request]:
    """Requests of a gateway log (module docstring), JSONL or CSV (a first non-space character other than ``{``),
    streamed in file order; ``fmt.timestamp_unit`` is the unit of epoch numbers (default seconds).

    Raises:
        BadInputError: at ``path:line``, a row without a request or a time, a request that is not a valid body, a
            time that is neither ISO-8601 nor a finite number, or malformed CSV/JSON.
    """
    csv = read_first_char(path) not in (b"{", None)
    rows: Iterator[tuple[int, Any]] = iter_csv(path) if csv else iter_jsonl(path)
    divisor = TIMESTAMP_UNITS[(fmt.timestamp_unit if fmt else None) or "s"]
    first: float | None = None
    for line_no, row in rows:
        try:
            row = {k: v for k, v in row.items() if v != ""} if csv else require_object(row)  # "": absent
            moment = _moment(row, divisor, csv)
            first = moment if first is None else first
            since = (moment - first) / divisor  # both in the years 1 to 9999 (_moment): a finite difference
            request = _request(row, tokenizer, csv, path, line_no, since)
        except BadInputError as err:
            raise located(err, path, line_no) from None
        yield request


def _request(row: dict, tokenizer: TokenizerArg, csv: bool, path: Path, line_no: int, timestamp: float) -> Request:
    """One row's request (module docstring)."""
    request_id = optional_id(row, "request_id") or optional_id(row, "id") or f"{path.name}:{line_no}"
    session_id, output_length = optional_id(row, "session_id"), _count(row.get("completion_tokens"), csv)

    def made(body: dict, what: str) -> Request:
        return body_request(body, tokenizer, what, request_id, f"{path}:{line_no}", timestamp, session_id,
                            output_length)

    for name in REQUEST_FIELDS:
        body = _json_value(row.get(name), name)
        if isinstance(body, dict) and ("messages" in body or "prompt" in body):
            return made(body, name)
    messages = _json_value(row.get("messages"), "messages")
    if isinstance(messages, list) and messages:
        return made({"messages": messages}, "messages")
    raise BadInputError(f"no request in this row: none of {', '.join(REQUEST_FIELDS)} holds a body with messages or "
                        "prompt, and messages is empty (LiteLLM keeps prompts in its spend logs only with "
                        "store_prompts_in_spend_logs: true)")


def _json_value(value: Any, name: str) -> Any:
    """A field's value, parsed when it is JSON text (``""`` and ``"{}"`` are no request)."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{name} is not JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise BadInputError(f"{name}: JSON nested too deeply") from None


def _count(value: Any, csv: bool) -> int | None:
    """``completion_tokens`` as an output length (a CSV cell's digits as an integer)."""
    if csv and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return optional_count(value, "completion_tokens")


def _moment(row: dict, divisor: int, csv: bool) -> float:
    """The row's time since the epoch in units of 1/``divisor`` s (module docstring): an epoch number as given (so
    differences of epoch numbers are exact), an ISO-8601 time converted. Raises BadInputError: no time, one that is
    neither, or an epoch number outside the years 1 to 9999 (:func:`~kvcli.traces.records.epoch_seconds`)."""
    name = next((k for k in TIME_FIELDS if k in row), None)
    value = row.get(name) if name else None
    if name is None or value is None:
        raise BadInputError(f"no time in this row: a gateway log needs one of {', '.join(TIME_FIELDS)}")
    if csv and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = finite_number(value)
        if number is None:
            raise BadInputError(f"{name} must be finite, got {shorten(value)}")
        epoch_seconds(number / divisor, name, value)
        return number
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise BadInputError(f"{name} = {shorten(value)} is neither an ISO-8601 time nor an epoch number") \
                from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp() * divisor
    raise BadInputError(f"{name} must be an ISO-8601 string or an epoch number, not {json_type(value)}")
