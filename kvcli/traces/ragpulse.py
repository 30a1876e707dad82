"""RAGPulse traces (flashserve/RAGPulse, MIT licence: a week of a university's RAG question answering on
Qwen2.5-14B-Instruct, 7,106 requests; Wang et al., "RAGPulse: An Open-Source RAG Workload Trace to Optimize RAG
Serving Systems", arXiv:2511.12979). Read from the repository's ``data/`` folder and its own replay code
(``example/single_online_instance/preprocess_data.py``, commit 3672232).

The trace, ``0_trace.jsonl``, holds one request a line::

    {"timestamp": "82", "input_length": 3112, "output_length": 192,
     "hash_ids": {"sys_prompt": [8302, 14332, 15199], "passages_ids": [7398, 7370], "history": [15200],
                  "web_search": [], "user_input": [26923]},
     "session_id": "1757476916095-afhwfadnh5ew"}

``hash_ids`` is an object of components, each a list of ids; an id stands for one piece of content (a passage of
the vector database, a 512-token piece of a system prompt or a history, a question), the same id wherever it
recurs. It is not a prefix-chained block id (a Mooncake id names a block *and* everything before it): the same
passage keeps its id at any position. The tokens of each id are in the component files beside the trace, one
``{"<x>_id": id, "token_length": tokens}`` a line (:data:`COMPONENT_FILES`). ``timestamp`` is a string of seconds
from the trace's start.

How kvcli reads it:

* **The prompt** is the components in the record's own key order, each id's tokens in list order, as RAGPulse's
  replay concatenates them (``list(trace["hash_ids"].values())``): in the published data always sys_prompt,
  passages_ids, history, web_search, user_input. Ids are global, as in RAGPulse's code (one id -> tokens map built
  from all five files); an id listed twice with different lengths is an error.
* **input_length** counts more tokens than the ids do (6 to 12 more in the published data: template tokens the
  trace does not place). They are appended as the prompt's last tokens, the request's own (never shared), so the
  prompt has ``input_length`` tokens and no prefix is lengthened by a guess; a record whose ids hold more tokens
  than its ``input_length`` is an error.
* **Token ids** are synthesized per id (:func:`kvcli.traces.synth.run_token_ids`, stride
  :data:`ID_STRIDE`): token ``j`` of id ``k`` is ``synth(k * 2**20 + j)``, so equal ids give equal tokens
  wherever they stand, and two prompts share a prefix exactly as far as their id sequences agree. An id at or
  above ``2**43`` is folded below it by SplitMix64; each request's own tail tokens get a key at ``2**43 + n``
  (n counts the requests in file order), which no id maps to.
* **Segments** (:class:`~kvcli.traces.request.Segment`): one per id, ``kind`` its component, ``key`` the id: what
  came from where, for :mod:`kvcli.sim.blend` (reuse at any position) and reports.
* ``session_id`` and ``output_length`` are kept; the request id is ``"<file>:<line>"``.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type
from kvcli.traces.hashids import HASH_ID_FORMATS, TraceFormat, time_divisor
from kvcli.traces.records import (
    cache_salt,
    checked_rows,
    epoch_seconds,
    finite_number,
    iter_jsonl,
    located,
    optional_count,
    optional_id,
    require_object,
    shorten,
)
from kvcli.traces.request import Outline, Request, Segment, TokenizerArg
from kvcli.traces.synth import run_token_ids, splitmix64_

SCHEMA = HASH_ID_FORMATS["ragpulse"]

#: RAGPulse's component files, found beside the trace, in the order its replay loads them: (file name, the key
#: that holds the id on each of its lines).
COMPONENT_FILES: tuple[tuple[str, str], ...] = (
    ("1_sys_prompt.jsonl", "sys_prompt_id"), ("2_passages.jsonl", "passage_id"), ("3_history.jsonl", "history_id"),
    ("4_user_input.jsonl", "user_input_id"), ("5_web_search.jsonl", "web_search_id"))

#: The most tokens one id may stand for (a line's ``token_length``): 2**20, the token synthesis's stride per key.
ID_STRIDE = 1 << 20
#: The longest prompt a record may declare (``input_length``), tokens: 2**24 (64 MiB of token ids, about what the
#: longest JSONL line kvcli reads holds as a native record's ``token_ids``). A record's token ids are made when it
#: is read, so a short line must not ask for more; the published data's longest prompt is 7,712 tokens.
MAX_PROMPT_TOKENS = 1 << 24
#: A number as text, as JSON writes one (RFC 8259 section 6, leading zeros allowed): sign, digits, fraction,
#: exponent; no blanks, underscores, hex or words.
NUMBER_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
#: Ids below this are their own synthesis keys; the request's own tail tokens take keys from here up.
_KEY_SPACE = 1 << 43


@dataclass(frozen=True)
class ComponentLengths:
    """Tokens per id, from the component files of one folder.

    Attributes:
        folder: where they were looked for (the trace's folder).
        tokens: id -> tokens it stands for.
        missing: the component files that are not there (their ids are unknown).
    """

    folder: Path
    tokens: dict[int, int]
    missing: tuple[str, ...]

    def of(self, component: str, index: int, hash_id: Any) -> int:
        """The tokens of ``hash_id``, the ``index``-th id of ``component``.

        Raises:
            BadInputError: not an integer >= 0, or in no component file.
        """
        if type(hash_id) is not int or not 0 <= hash_id < 2**64:
            raise BadInputError(f"hash_ids.{component}[{index}] = {shorten(hash_id)} is not an integer in "
                                "[0, 2**64)")
        tokens = self.tokens.get(hash_id)
        if tokens is None:
            missing = f"; not found here: {', '.join(self.missing)}" if self.missing else ""
            raise BadInputError(f"hash_ids.{component}[{index}] = {hash_id} is in no component file beside the "
                                f"trace ({self.folder}: {', '.join(name for name, _ in COMPONENT_FILES)}"
                                f"{missing})")
        return tokens


def component_lengths(folder: Path) -> ComponentLengths:
    """The tokens of every id listed in the component files of ``folder`` (those that exist).

    Raises:
        BadInputError: at ``file:line``, a line that is not ``{"<x>_id": id, "token_length": n}`` with the file's
            own id key, an integer id in ``[0, 2**64)`` and ``1 <= n <=`` :data:`ID_STRIDE`; an id listed again with
            another length (naming where it was first).
    """
    tokens: dict[int, int] = {}
    first: dict[int, str] = {}
    missing = []
    for name, key in COMPONENT_FILES:
        path = folder / name
        if not path.is_file():
            missing.append(name)
            continue
        for line_no, record in iter_jsonl(path):
            try:
                hash_id, n = _component_line(record, key)
            except BadInputError as err:
                raise located(err, path, line_no) from None
            seen = tokens.setdefault(hash_id, n)
            if seen != n:
                raise BadInputError(f"id {hash_id} has token_length {n} here but {seen} at {first[hash_id]}",
                                    path=str(path), line=line_no)
            first.setdefault(hash_id, f"{path}:{line_no}")
    return ComponentLengths(folder, tokens, tuple(missing))


def _component_line(record: Any, key: str) -> tuple[int, int]:
    record = require_object(record)
    if set(record) != {key, "token_length"}:
        raise BadInputError(f"a component line is {{\"{key}\": id, \"token_length\": tokens}}, got the keys "
                            f"{', '.join(sorted(record)) or 'none'}")
    hash_id, n = record[key], record["token_length"]
    if type(hash_id) is not int or not 0 <= hash_id < 2**64:
        raise BadInputError(f"{key} must be an integer in [0, 2**64), got {shorten(hash_id)}")
    if type(n) is not int or not 1 <= n <= ID_STRIDE:
        raise BadInputError(f"token_length must be an integer in [1, {ID_STRIDE:,}], got {shorten(n)}")
    return hash_id, n


def parse_seconds(value: Any, divisor: int) -> float | None:
    """A RAGPulse ``timestamp``: a string of a number (``"82"``; RAGPulse writes strings) or a number, finite and
    >= 0, in units of 1/``divisor`` s, as seconds; None when absent. A string must be a number as JSON writes one
    (:data:`NUMBER_TEXT`): Python's ``float`` alone would also take ``" 82 "`` and ``"8_2"``.

    Raises:
        BadInputError: anything else, or a time past the end of the year 9999 (:func:`epoch_seconds`).
    """
    if value is None:
        return None
    number: float | None = None
    if isinstance(value, str):
        number = float(value) if NUMBER_TEXT.fullmatch(value) else None
    else:
        number = finite_number(value)
    if number is None or not np.isfinite(number) or number < 0:
        raise BadInputError(f"timestamp must be a finite number >= 0 (or a string of one), got {shorten(value)}")
    return epoch_seconds(number / divisor, "timestamp", value)


@dataclass(frozen=True)
class _Fields:
    ids: list[int]
    lengths: list[int]
    segments: tuple[Segment, ...]
    components: tuple[str, ...]
    input_length: int
    timestamp: float | None
    session_id: str | None
    output_length: int | None
    cache_salt: str

    @property
    def tail(self) -> int:
        """Tokens ``input_length`` counts beyond the ids' (the request's own last tokens)."""
        return self.input_length - (self.segments[-1].end if self.segments else 0)


def _fields(record: Any, lengths: ComponentLengths, divisor: int) -> _Fields:
    """One record, checked (errors without the file and line: the caller adds them)."""
    record = require_object(record)
    components = record.get("hash_ids")
    if not isinstance(components, dict):
        raise BadInputError(f"a ragpulse record needs hash_ids, an object of components (sys_prompt, passages_ids, "
                            f"...), each a list of ids; got {json_type(components)}")
    input_length = optional_count(record.get("input_length"), "input_length")
    if input_length is None:
        raise BadInputError("a ragpulse record needs input_length (an integer >= 0)")
    if input_length > MAX_PROMPT_TOKENS:
        raise BadInputError(f"input_length {input_length:,} is above {MAX_PROMPT_TOKENS:,} tokens, the longest "
                            "prompt kvcli reads from a ragpulse record (its token ids are made as it is read)")
    ids, counts, segments, at = [], [], [], 0
    for component, listed in components.items():
        if not isinstance(listed, list):
            raise BadInputError(f"hash_ids.{component} must be a list of ids, not {json_type(listed)}")
        for index, hash_id in enumerate(listed):
            n = lengths.of(component, index, hash_id)
            ids.append(hash_id)
            counts.append(n)
            segments.append(Segment(at, at + n, component, str(hash_id)))
            at += n
    if at > input_length:
        raise BadInputError(f"input_length {input_length} is less than the {at:,} tokens of its hash_ids (the "
                            "component files' token_length of each id)")
    return _Fields(ids, counts, tuple(segments), tuple(components), input_length,
                   parse_seconds(record.get("timestamp"), divisor), optional_id(record, "session_id"),
                   optional_count(record.get("output_length"), "output_length"), cache_salt(record))


def iter_ragpulse_records(path: Path, fmt: TraceFormat, skipped: list[BadInputError] | None = None
                          ) -> Iterator[tuple[int, _Fields]]:
    """``(line, fields)`` of each record of a RAGPulse trace, checked against the component files beside it, in
    file order. ``skipped``: with ``fmt.skip_bad_records``, each record that failed its checks (or a line that is
    not JSON), as a located error, instead of raising it.

    Raises:
        BadInputError: a bad component file (:func:`component_lengths`); at ``path:line``, a record that fails its
            checks (unless skipped).
    """
    lengths = component_lengths(path.parent)
    divisor = time_divisor(fmt, SCHEMA)
    yield from checked_rows(path, lambda _, record: _fields(record, lengths, divisor), fmt.skip_bad_records, skipped)


def synth_keys(ids: list[int]) -> np.ndarray:
    """The synthesis keys of hash ids (``[ids]`` uint64): the id below ``2**43``, else SplitMix64 of it folded below
    (module docstring)."""
    keys = np.array(ids, dtype=np.uint64) if ids else np.zeros(0, np.uint64)
    big = keys >= np.uint64(_KEY_SPACE)
    if big.any():
        keys[big] = splitmix64_(keys[big].copy()) % np.uint64(_KEY_SPACE)
    return keys


def read_ragpulse(path: Path, tokenizer: TokenizerArg, fmt: TraceFormat) -> Iterator[Request]:
    """The requests of a RAGPulse trace (module docstring), their token ids synthesized per id and their
    :class:`~kvcli.traces.request.Segment` per id. ``tokenizer`` is not used (there is no text).

    Raises:
        BadInputError: as :func:`iter_ragpulse_records`, while iterating.
    """
    del tokenizer
    for ordinal, (line_no, f) in enumerate(iter_ragpulse_records(path, fmt)):
        keys = np.append(synth_keys(f.ids), np.uint64(_KEY_SPACE + ordinal))
        tokens = run_token_ids(keys, np.array([*f.lengths, f.tail], np.int64), ID_STRIDE)
        yield Request(id=f"{path.name}:{line_no}", token_ids=tokens, timestamp=f.timestamp,
                      session_id=f.session_id, output_length=f.output_length, cache_salt=f.cache_salt,
                      source=f"{path}:{line_no}", segments=f.segments)


def outline_ragpulse(path: Path, fmt: TraceFormat, skipped: list[BadInputError] | None = None
                     ) -> Iterator[Outline]:
    """Each request's prompt length (its ``input_length``) and arrival time, checked as :func:`read_ragpulse` checks
    it, without synthesizing token ids."""
    for _, f in iter_ragpulse_records(path, fmt, skipped):
        yield Outline(f.input_length, f.timestamp)


def ragpulse_note(path: Path, fmt: TraceFormat) -> str:
    """One line for a report: how a RAGPulse trace was read (where the tokens per id come from, the prompt's
    component order, the tokens beyond the ids', the timestamps' unit, sessions, skipped records), after one
    checking pass over the file (no token ids made).

    Raises:
        BadInputError: as :func:`iter_ragpulse_records`.
    """
    skipped: list[BadInputError] = []
    tails: list[int] = []
    orders: dict[tuple[str, ...], int] = {}
    for _, f in iter_ragpulse_records(path, fmt, skipped):
        tails.append(f.tail)
        orders[f.components] = orders.get(f.components, 0) + 1
    common: tuple[str, ...] = max(orders.items(), key=lambda item: item[1])[0] if orders else ()
    parts = [f"read as a RAGPulse trace: tokens per hash id from the component files in {path.parent}; each prompt "
             "is its components in the record's order, one segment per id (as RAGPulse's replay concatenates them"
             + (f": {', '.join(common)}" if common else "") + ")"]
    longest: int = max(tails, default=0)
    if longest:
        parts.append(f"input_length counts {min(tails):,} to {longest:,} tokens more than the ids' "
                     f"({sum(tails):,} in all): each request's own last tokens, never shared")
    unit = (f"timestamps in {fmt.timestamp_unit} (--timestamp-unit)" if fmt.timestamp_unit
            else f"timestamps in {SCHEMA.timestamp_unit} (the format's)")
    parts.append(f"{unit}, sessions: {SCHEMA.sessions}")
    ignored = [option for option, on in (("--hash-block-tokens", fmt.block_tokens is not None),
                                         ("--drop-tail-block", fmt.drop_tail_block)) if on]
    if ignored:
        parts.append(f"{' and '.join(ignored)} {'apply' if len(ignored) > 1 else 'applies'} to fixed-block hash-id "
                     f"traces only: this ragpulse trace is read without {'them' if len(ignored) > 1 else 'it'}")
    if skipped:
        parts.append(f"{len(skipped):,} records failed their checks and were skipped (--skip-bad-records), the first: "
                     f"{skipped[0]}")
    return "; ".join(parts)


def is_component_record(record: dict) -> bool:
    """Whether a first record is a line of a RAGPulse component file (``{"<x>_id": id, "token_length": n}``), not
    a trace record."""
    return "token_length" in record and any(key in record for _, key in COMPONENT_FILES)
