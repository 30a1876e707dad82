"""Mooncake traces: the FAST'25 rows (kvcache-ai/Mooncake ``FAST25-release/traces``: ``hash_ids`` of 512-token
blocks, ``timestamp`` in ms) and the rows aiperf and Dynamo write in the same format, as JSONL or Parquet (format
``mooncake``; the same rows with ``block_size`` on each record: ``hash-ids``).

The fields, as aiperf's ``MooncakeTrace`` model defines them (ai-dynamo/aiperf
``src/aiperf/dataset/loader/models.py`` at 02b0d5c3, its loader ``mooncake_trace.py``) and Dynamo's exporters write
them (ai-dynamo/dynamo ``benchmarks/coding/mooncake.py`` at 20f9cbff, ``benchmarks/exgentic_trace/
convert_to_mooncake.py`` at e13ed053). A row is one request; its prompt is given by one of:

* ``input_length`` (prompt tokens) with ``hash_ids``: ``ceil(input_length / B)`` block ids, B tokens each (512, a
  record's ``block_size``, ``--hash-block-tokens``), token ids synthesized per id (:mod:`kvcli.traces.hashids`).
  Without ``hash_ids`` aiperf sends a random prompt of that length: its blocks are the row's own, never shared.
* ``messages`` (OpenAI chat messages) and optional ``tools`` (function definitions, only with ``messages``): a chat
  request, rendered under the chat template with the generation prompt and tokenized as a native record's
  (:func:`kvcli.traces.native.prompt_tokens`). ``hash_ids`` and ``input_length`` beside them are not used.
* ``text_input``: a text prompt, sent as one user message (aiperf's default chat endpoint sends it so).
* ``payload``: a whole OpenAI request body, sent as it is (:func:`kvcli.traces.openai.body_request`); a ``prompt``
  given as a list in it is the prompt's token ids (integers in ``[0, 2**32)``), taken as they are.

A row of ``messages``, ``text_input`` or a ``payload`` of text is a text prompt (:func:`text_field`): ``kvcli stats``
and ``kvcli explain`` show excerpts of a trace whose first row is one, as of any text trace.

``extra`` (an object) is shallow-merged into the request body as aiperf sends it (its keys win): its ``cache_salt``
(vLLM's request field) is the request's tenant salt, like a record's own ``cache_salt`` (the two may not differ);
its other keys (sampling, ``max_tokens``) do not change the prompt. ``output_length`` is the tokens generated.

Sessions and time: ``session_id`` links a conversation's turns (rows without one are each their own). ``timestamp``
(ms, or ``--timestamp-unit``) is the arrival time. A row with ``delay`` (same unit) and no ``timestamp`` arrives
``delay`` after its session's previous turn arrived: aiperf and Dynamo start that wait when the previous turn's
response has ended (Dynamo's exporters write ``delay`` = this turn's start - the previous turn's end), which the
trace does not record, so the time is the earliest the turn can arrive. A ``delay`` row whose previous turn has no
time (or that has no previous turn) has no time; a row with both fields takes its ``timestamp``. In a Parquet file,
a ``timestamp`` column of Arrow type ``timestamp`` (any unit, with or without a time zone) is the instant's time
since the Unix epoch, the same seconds as its number of ms since the epoch in an integer column; a ``timestamp`` or
``delay`` column of type ``duration`` is its length. Both carry their own unit: ``--timestamp-unit`` does not apply
to them (:func:`kvcli.traces.records.optional_seconds`).

Whole and delta rows: a row's prompt is whole (Mooncake's, Dynamo's exporters': a session's later rows repeat its
earlier blocks) unless its session's rows are deltas, as aiperf's agentic-code generator writes them
(``src/aiperf/dataset/agentic_code_gen/writer.py`` at b26a1814: a session's first row carries ``group_id``, each
later row only the turn's new tokens and fresh ids) or as a row's ``context_mode`` declares it
(``deltas_without_responses``, ``deltas_with_responses``; ``message_array_with_responses`` is whole). A session's
first row sets its mode; a later row's ``context_mode`` must agree. In a delta session turn k's prompt is turn
k - 1's, then (``deltas_without_responses``, and ``group_id`` sessions) turn k - 1's response, ``output_length``
tokens of its own (generated live in a replay, so never shared with another session), then turn k's new tokens --
the cumulative input ``previous_input + previous_output + new_tokens`` of the generator; the chat template's
few tokens between turns are not modelled. Delta prompts are given as token ids (a block cut by a turn's end
cannot be a whole block), so they share no chunk with a whole row's identical blocks; a session of delta rows holds
only ``input_length`` rows.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenizer_base import TOKEN_DTYPE
from kvcli.traces.hashids import BlockIds, HashIdSchema, TraceFormat, time_divisor
from kvcli.traces.openai import body_request, prompt_is_token_ids
from kvcli.traces.records import (
    EPOCH_SECONDS_RANGE,
    cache_salt,
    checked_rows,
    optional_count,
    optional_id,
    optional_seconds,
    require_object,
    shorten,
)
from kvcli.traces.request import BlockKeys, HashIdRequest, Outline, Request, TokenizerArg
from kvcli.traces.synth import SYNTH_VOCAB, block_token_ids

MOONCAKE_BLOCK_TOKENS = 512
#: synthesized Mooncake token ids are < this, so they are ordinary (non-special) cl100k_base ids.
MOONCAKE_VOCAB = SYNTH_VOCAB
#: the fields that give a row's prompt as a request (text, or a payload's token ids: :func:`text_field`) instead of
#: blocks: a row holds one of them at most
TEXT_KEYS = ("messages", "text_input", "payload")
#: fields only a Mooncake row has among the formats kvcli detects: a first record with one of them is Mooncake
#: (:func:`kvcli.traces.detect.record_format`), its ``messages`` then not a native record's
MOONCAKE_KEYS = ("input_length", "delay", "text_input", "payload", "extra", "context_mode")
#: aiperf's ``context_mode`` values (``ConversationContextMode``) -> how a session's rows make its prompts: None
#: whole rows; ``"live"`` deltas with each turn's response between them; ``"canned"`` deltas alone
CONTEXT_MODES: dict[str, str | None] = {"message_array_with_responses": None, "deltas_without_responses": "live",
                                        "deltas_with_responses": "canned"}


def text_field(record: Any) -> str | None:
    """The field of :data:`TEXT_KEYS` a row gives its prompt as text by, or None: a row of blocks, a ``payload`` of
    token ids (:func:`kvcli.traces.openai.prompt_is_token_ids`), a record that is not an object. Checks nothing else
    (the reader does)."""
    if not isinstance(record, dict):
        return None
    key = next((k for k in TEXT_KEYS if k in record), None)
    return None if key == "payload" and prompt_is_token_ids(record[key]) else key


def mooncake_token_ids(hash_ids: list[int], input_length: int) -> np.ndarray:
    """The token ids the reader synthesizes for a Mooncake record: equal hash ids give equal 512-token blocks.

    Token ``j`` (0 <= j < 512) of block ``b`` is ``((splitmix64(key_b * 512 + j) >> 32) * 100256) >> 32``, all in
    wrapping uint64 arithmetic, where ``key_b`` is ``hash_ids[b]`` itself below ``2**54`` (``2**63 // 512``; a
    larger id is folded below it by SplitMix64, :class:`kvcli.traces.hashids.BlockIds`) and ``splitmix64`` is the
    output function of Vigna's SplitMix64::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)

    (the high 32 bits of the mix, mapped onto ``[0, 100256)`` by multiply-shift -- Lemire's range reduction,
    uniform like ``% 100256`` but without a 64-bit division). The blocks are concatenated and cut to
    ``input_length`` tokens. Ids are < 100,256, i.e. ordinary (non-special) cl100k_base ids. Vectorized: no
    Python loop per block or token (:func:`kvcli.traces.synth.block_token_ids`).

    Args:
        hash_ids: block ids, integers in ``[0, 2**64)``, ``ceil(input_length / 512)`` of them.
        input_length: prompt length in tokens, >= 0.

    Returns:
        ``[input_length]`` ``'<u4'`` array.

    Raises:
        BadInputError: a hash id that is not such an integer, or not ``ceil(input_length / 512)`` of them.
    """
    keys = BlockIds(TraceFormat("mooncake")).keys(hash_ids, input_length, MOONCAKE_BLOCK_TOKENS)
    return block_token_ids(keys, MOONCAKE_BLOCK_TOKENS, input_length)


@dataclass
class _Session:
    """What a session's next row needs of the rows before it."""

    mode: str | None  # None (whole rows), "live" or "canned" (delta rows: CONTEXT_MODES)
    time: float | None = None  # the previous turn's arrival, seconds
    length: int = 0  # tokens of the previous turn's prompt (delta rows)
    pending: int = 0  # the previous turn's output_length, threaded in before the next delta ("live")
    tokens: np.ndarray | None = None  # delta rows' prompt so far, in a buffer that grows by doubling


@dataclass(frozen=True)
class _Row:
    """One row's checked fields, before its prompt is made."""

    session_id: str | None
    time: float | None
    output_length: int | None
    salt: str
    extra: dict | None
    text_key: str | None
    mode: str | None  # the session's mode once this row is taken


class _Reader:
    """The rows of one file, in order, with the session state a row's time and (delta rows) prompt need."""

    def __init__(self, path: Path, schema: HashIdSchema, fmt: TraceFormat, tokenizer: TokenizerArg,
                 synthesize: bool) -> None:
        self.path, self.schema, self.tokenizer, self.synthesize = path, schema, tokenizer, synthesize
        self.blocks = BlockIds(fmt)
        self.divisor = time_divisor(fmt, schema)
        self.sessions: dict[str, _Session] = {}

    def row(self, record: Any, number: int) -> Request | Outline:
        """The request (or, without ``synthesize``, the outline) of one row, its session's state then moved on.

        Raises:
            BadInputError: a row that fails its checks (without its location: the caller adds it); the session's
                state is left as it was.
        """
        row = self._check(require_object(record))
        out = self._text(record, row, number) if row.text_key is not None else self._blocks(record, row, number)
        if row.session_id is not None:
            self.sessions.setdefault(row.session_id, _Session(row.mode)).time = row.time
        return out

    def _check(self, record: dict) -> _Row:
        session_id = optional_id(record, "session_id")
        timestamp = optional_seconds(record.get("timestamp"), "timestamp", divisor=self.divisor)
        delay = optional_seconds(record.get("delay"), "delay", divisor=self.divisor, instant=False)
        output_length = optional_count(record.get("output_length"), "output_length")
        extra = record.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise BadInputError(f"extra must be an object (fields merged into the request body), not "
                                f"{json_type(extra)}")
        salt = cache_salt(record)
        extra_salt = cache_salt(extra, "extra.") if extra else ""
        if salt and extra_salt and salt != extra_salt:
            raise BadInputError(f"cache_salt {shorten(salt)} and extra.cache_salt {shorten(extra_salt)} differ: a "
                                "request has one tenant salt")
        text = [k for k in TEXT_KEYS if k in record]
        if len(text) > 1:
            raise BadInputError(f"a mooncake row gives its prompt by one of {', '.join(TEXT_KEYS)} (found: "
                                f"{', '.join(text)})")
        if "tools" in record and text != ["messages"]:
            raise BadInputError("tools go with messages (a chat request)")
        declared = record.get("context_mode")
        if declared is not None and declared not in CONTEXT_MODES:
            raise BadInputError(f"context_mode must be one of {', '.join(CONTEXT_MODES)}, got {shorten(declared)}")
        session = self.sessions.get(session_id) if session_id is not None else None
        if session is None:
            mode = CONTEXT_MODES[declared] if declared is not None else ("live" if "group_id" in record else None)
        else:
            mode = session.mode
            if declared is not None and CONTEXT_MODES[declared] != mode:
                raise BadInputError(f"context_mode {declared} is not its session's (session {shorten(session_id)}: "
                                    f"{_mode_name(mode)}, from its first row)")
        if text and mode is not None:
            raise BadInputError(f"a {text[0]} row is a whole prompt, but session {shorten(session_id)} holds delta "
                                f"rows ({_mode_name(mode)}): a delta session holds input_length rows only")
        if timestamp is None and delay is not None and session is not None and session.time is not None:
            timestamp = session.time + delay
            if not timestamp < EPOCH_SECONDS_RANGE[1]:
                raise BadInputError(f"delay ({delay:.12g} s) after its session's previous turn ({session.time:.12g} s) "
                                    "is a time past the year 9999, the range a Python datetime (and a Parquet "
                                    "timestamp column) holds")
        return _Row(session_id, timestamp, output_length, extra_salt or salt, extra, text[0] if text else None,
                    mode)

    def _text(self, record: dict, row: _Row, number: int) -> Request | Outline:
        """A row whose prompt is a request (``messages``, ``text_input``, ``payload``): text tokenized even for an
        outline (its length needs the tokens), a payload's token ids taken as they are."""
        key = row.text_key
        assert key is not None
        value = record[key]
        if key == "payload":
            if not isinstance(value, dict):
                raise BadInputError(f"payload must be a request object, not {json_type(value)}")
            body = dict(value)
        elif key == "text_input":
            if not isinstance(value, str):
                raise BadInputError(f"text_input must be a string, not {json_type(value)}")
            body = {"messages": [{"role": "user", "content": value}]}
        else:
            body = {"messages": value, **({"tools": record["tools"]} if record.get("tools") is not None else {})}
        body.update(row.extra or {})
        if row.salt:
            body["cache_salt"] = row.salt
        request = body_request(body, self.tokenizer, key, f"{self.path.name}:{number}", f"{self.path}:{number}",
                               row.time, row.session_id, row.output_length)
        return request if self.synthesize else Outline(len(request.token_ids), row.time)

    def _blocks(self, record: dict, row: _Row, number: int) -> Request | Outline:
        """A row whose prompt is blocks: whole (a :class:`HashIdRequest`), or a delta on its session's prompt."""
        length = optional_count(record.get("input_length"), "input_length")
        if length is None:
            raise BadInputError(f"a {self.schema.name} row needs input_length (an integer >= 0), or its prompt as "
                                f"{', '.join(TEXT_KEYS)}")
        block = self.blocks.block_tokens(record.get("block_size"), self.schema)
        if record.get("hash_ids") is None:
            keys = self._private(length, block)
        else:
            keys = self.blocks.keys(record["hash_ids"], length, block)
        if row.mode is None:
            if not self.synthesize:
                return Outline(length, row.time)
            return HashIdRequest(id=f"{self.path.name}:{number}", blocks=BlockKeys(keys, block, length),
                                 timestamp=row.time, session_id=row.session_id, output_length=row.output_length,
                                 cache_salt=row.salt, source=f"{self.path}:{number}")
        assert row.session_id is not None  # a delta mode comes from a session
        session = self.sessions.setdefault(row.session_id, _Session(row.mode))
        response = session.pending if session.mode == "live" else 0  # a new session has none pending
        total = session.length + response + length
        tokens = None
        if self.synthesize:
            parts = [block_token_ids(self._private(response, block), block, response)] if response else []
            parts.append(block_token_ids(keys, block, length))
            tokens = _extend(session, parts, total)
        session.length, session.pending = total, row.output_length or 0
        if tokens is None:
            return Outline(total, row.time)
        return Request(id=f"{self.path.name}:{number}", token_ids=tokens, timestamp=row.time,
                       session_id=row.session_id, cache_salt=row.salt, output_length=row.output_length,
                       source=f"{self.path}:{number}")

    def _private(self, tokens: int, block: int) -> np.ndarray:
        """``ceil(tokens / block)`` keys no hash id maps to (:meth:`BlockIds.private_key`), in file order."""
        return np.array([self.blocks.private_key(block) for _ in range(math.ceil(tokens / block))], np.uint64)


def _mode_name(mode: str | None) -> str:
    return next(name for name, m in CONTEXT_MODES.items() if m == mode)


def _extend(session: _Session, parts: list[np.ndarray], total: int) -> np.ndarray:
    """``parts`` written after the session's prompt so far, in its buffer (doubled when full: earlier turns' views
    keep the buffer they were cut from); returns the ``[total]`` prompt as a read-only view."""
    buffer = session.tokens
    if buffer is None or len(buffer) < total:
        grown = np.empty(max(total, 2 * (0 if buffer is None else len(buffer))), TOKEN_DTYPE)
        if buffer is not None:
            grown[:session.length] = buffer[:session.length]
        buffer = session.tokens = grown
    at = session.length
    for part in parts:
        buffer[at:at + len(part)] = part
        at += len(part)
    view = buffer[:total]
    view.flags.writeable = False
    return view


def _iter(path: Path, schema: HashIdSchema, fmt: TraceFormat, tokenizer: TokenizerArg, synthesize: bool,
          skipped: list[BadInputError] | None = None) -> Iterator[Request | Outline]:
    reader = _Reader(path, schema, fmt, tokenizer, synthesize)
    for _, out in checked_rows(path, lambda number, record: reader.row(record, number), fmt.skip_bad_records, skipped):
        yield out


def read_mooncake(path: Path, tokenizer: TokenizerArg, schema: HashIdSchema, fmt: TraceFormat) -> Iterator[Request]:
    """Requests of a Mooncake trace (module docstring), JSONL or Parquet (:func:`kvcli.traces.records.iter_rows`),
    in file order: a whole block row as a :class:`~kvcli.traces.request.HashIdRequest` (token ids synthesized when
    first read), a text row tokenized with ``tokenizer``, a delta row as the token ids of its session's prompt.

    Raises:
        BadInputError: at ``path:line`` (a Parquet file's row number), while iterating, a row that fails its checks
            (unless ``fmt.skip_bad_records``).
    """
    for r in _iter(path, schema, fmt, tokenizer, True):
        assert isinstance(r, Request)
        yield r


def outline_mooncake(path: Path, schema: HashIdSchema, fmt: TraceFormat, tokenizer: TokenizerArg,
                     skipped: list[BadInputError] | None = None) -> Iterator[Outline]:
    """Each row's prompt length (tokens) and arrival time (seconds), checked as :func:`read_mooncake` checks it,
    without synthesizing token ids (a text row is tokenized with ``tokenizer``: its length needs the tokens); with
    ``fmt.skip_bad_records``, each skipped row's error is appended to ``skipped``.

    Raises:
        BadInputError: as :func:`read_mooncake`.
    """
    for r in _iter(path, schema, fmt, tokenizer, False, skipped):
        assert isinstance(r, Outline)
        yield r
