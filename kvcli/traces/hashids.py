"""Hash-id traces: records of prefix block ids instead of text, each id standing for a block of a known number of
tokens, read with explicit semantics.

Formats (``HASH_ID_FORMATS``; each record has ``input_length`` and ``hash_ids``):

* ``mooncake`` -- Mooncake FAST'25 (kvcache-ai/Mooncake ``FAST25-release/traces``): 512 tokens per id, ``timestamp``
  in ms, optional ``session_id``, and the rows aiperf and Dynamo write (``delay``, ``messages``, ``tools``,
  ``extra``, Parquet): read by :mod:`kvcli.traces.mooncake`.
* ``bailian`` -- Alibaba's Qwen-Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon, Apache-2.0; the
  KVCache-in-the-wild ATC'25 traces): 16 tokens per id, ``timestamp`` in seconds, ``chat_id``, ``parent_chat_id``
  (-1 for a session's first turn), ``turn``, ``type``; the session is the root of the ``parent_chat_id`` chain over
  the whole file, whatever its order (read by this module).
* ``ragpulse`` -- RAGPulse's component hash ids, each id its own number of tokens (:mod:`kvcli.traces.ragpulse`
  reads it; listed here for its timestamps' unit and sessions).
* ``hash-ids`` -- any other hash-id trace whose records carry ``block_size`` (the kvcache-simulator shape
  ``{"block_size", "hash_ids", "input_length"}``), or any hash-id trace read with ``--hash-block-tokens``;
  ``timestamp`` in ms (Mooncake's convention) unless ``--timestamp-unit`` says otherwise; otherwise a Mooncake row
  (:mod:`kvcli.traces.mooncake` reads it).

Every record is checked: ``len(hash_ids) == ceil(input_length / B)``. The block size ``B`` is never guessed: a
record's ``block_size``, else ``--hash-block-tokens``, else the format's own; a record whose ``block_size``
disagrees with ``--hash-block-tokens`` is an error. Ids are integers in ``[0, 2**64)``. Token ids are synthesized
per id by :func:`kvcli.traces.synth.block_token_ids` (the block key is the id itself when it is below
``2**63 // B``; a larger id is folded into that range by SplitMix64, so two distinct large ids share tokens with
probability about ``B / 2**63`` a pair), so any chunk size replays any block size. A record whose block size is
not the first record's gets its ids folded the same way with the size mixed in (``k * B + j`` would otherwise let
small ids of two sizes share tokens: id 2 at 8 tokens is the first half of id 1 at 16), so ids of two block sizes
never share a block.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type
from kvcli.traces.records import (
    cache_salt,
    checked_rows,
    iter_raw_lines,
    optional_count,
    optional_id,
    optional_seconds,
    require_object,
    shorten,
)
from kvcli.traces.request import BlockKeys, HashIdRequest, Outline, Request, TokenizerArg, TurnLink
from kvcli.traces.synth import splitmix64_

#: ``--timestamp-unit`` names -> units per second.
TIMESTAMP_UNITS = {"s": 1, "ms": 1000, "us": 1_000_000}


#: The largest tokens per hash id accepted (a record's ``block_size``, ``--hash-block-tokens``): 2**20, far above any
#: engine's block (vLLM 16, Mooncake 512) or a whole long prompt; a larger one is an error in the trace.
MAX_BLOCK_TOKENS = 1 << 20

@dataclass(frozen=True)
class TraceFormat:
    """A trace format (a name of :data:`kvcli.traces.detect.FORMATS`, or ``"auto"``) and what the user declared
    about hash-id traces; other formats ignore the declarations.

    Attributes:
        name: the format, or ``"auto"`` (detected per file).
        block_tokens: ``--hash-block-tokens``: tokens per hash id (None: the record's ``block_size`` or the
            format's own).
        timestamp_unit: ``--timestamp-unit``: ``s``, ``ms`` or ``us`` (None: the format's own).
        drop_tail_block: ``--drop-tail-block``: each request's last hash id is made its own (never shared): the
            last block id of a Bailian request can change once decoding starts.
        skip_bad_records: ``--skip-bad-records``: a record that fails its checks is skipped and counted instead of
            stopping the read.
        add_special_tokens: ``--add-special-tokens/--no-special-tokens``: whether a text prompt gets the
            tokenizer's special tokens (a BOS), as vLLM's completions do by default; a record's own
            ``add_special_tokens`` wins (:func:`kvcli.traces.native.prompt_tokens`). Not a hash-id option.

    Raises:
        BadInputError: ``block_tokens`` < 1 or an unknown ``timestamp_unit``.
    """

    name: str = "auto"
    block_tokens: int | None = None
    timestamp_unit: str | None = None
    drop_tail_block: bool = False
    skip_bad_records: bool = False
    add_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.block_tokens is not None and (type(self.block_tokens) is not int
                                              or not 1 <= self.block_tokens <= MAX_BLOCK_TOKENS):
            raise BadInputError(f"--hash-block-tokens must be an integer in [1, {MAX_BLOCK_TOKENS:,}], got "
                                f"{self.block_tokens!r}")
        if self.timestamp_unit is not None and self.timestamp_unit not in TIMESTAMP_UNITS:
            raise BadInputError(f"--timestamp-unit must be one of {', '.join(TIMESTAMP_UNITS)}, got "
                                f"{self.timestamp_unit!r}")


def as_trace_format(fmt: str | TraceFormat) -> TraceFormat:
    """``fmt`` as a :class:`TraceFormat` (a name: nothing declared)."""
    return fmt if isinstance(fmt, TraceFormat) else TraceFormat(fmt)


@dataclass(frozen=True)
class HashIdSchema:
    """What a hash-id format says itself: tokens per id (None: each record's ``block_size``), its timestamps'
    unit, and where its sessions come from (for the report's note)."""

    name: str
    block_tokens: int | None
    timestamp_unit: str
    sessions: str


_MOONCAKE_SESSIONS = ("session_id when present (a delay row: its session's previous turn's time + delay, the earliest "
                      "it can come; a group_id or context_mode session: delta rows, each turn's prompt the previous "
                      "one's, its response and the new tokens)")

HASH_ID_FORMATS = {
    "mooncake": HashIdSchema("mooncake", 512, "ms", _MOONCAKE_SESSIONS),
    "bailian": HashIdSchema("bailian", 16, "s", "the root of each parent_chat_id chain"),
    "hash-ids": HashIdSchema("hash-ids", None, "ms", _MOONCAKE_SESSIONS),
    "claude-code": HashIdSchema("claude-code", 64, "s", "one per session row; hash ids scoped to it"),
    "ragpulse": HashIdSchema("ragpulse", None, "s", "session_id when present"),
}


class BlockIds:
    """Block keys of hash-id requests for :func:`~kvcli.traces.synth.block_token_ids`, checked; one per reader
    (it numbers the private keys of dropped tail blocks, in file order, so every read of a file gives the same
    tokens)."""

    def __init__(self, fmt: TraceFormat) -> None:
        self.fmt = fmt
        self._private = 0  # private keys handed out so far
        self._first_block: int | None = None  # the block size of the first record read

    def block_tokens(self, record_value: Any, schema: HashIdSchema) -> int:
        """Tokens per id for one record: its ``block_size``, else ``--hash-block-tokens``, else the format's.

        Raises:
            BadInputError: a malformed ``block_size``, one that contradicts ``--hash-block-tokens``, or none known.
        """
        declared = self.fmt.block_tokens
        if record_value is not None:
            if type(record_value) is not int or not 1 <= record_value <= MAX_BLOCK_TOKENS:
                raise BadInputError(f"block_size must be an integer in [1, {MAX_BLOCK_TOKENS:,}], got "
                                    f"{shorten(record_value)}")
            if declared is not None and declared != record_value:
                raise BadInputError(f"block_size {record_value} contradicts --hash-block-tokens {declared}")
            return record_value
        if declared is not None:
            return declared
        if schema.block_tokens is not None:
            return schema.block_tokens
        raise BadInputError("a hash-id record without block_size: its tokens per hash id are unknown; pass "
                            "--hash-block-tokens B")

    def keys(self, hash_ids: Any, input_length: int, block_tokens: int) -> np.ndarray:
        """The ``[blocks]`` uint64 keys of one record's ``hash_ids``, checked: ``len(hash_ids) ==
        ceil(input_length / block_tokens)``; the last one private with ``drop_tail_block``.

        Raises:
            BadInputError: not a list of integers in ``[0, 2**64)``, or the wrong number of them.
        """
        if not isinstance(hash_ids, list):
            raise BadInputError(f"hash_ids must be a list of integers, not {json_type(hash_ids)}")
        ids = _id_array(hash_ids)
        need = -(-input_length // block_tokens)
        if len(hash_ids) != need:
            raise BadInputError(f"{len(hash_ids)} hash_ids for input_length {input_length} at {block_tokens} tokens "
                                f"per id: expected ceil({input_length}/{block_tokens}) = {need}")
        limit = np.uint64(2**63 // block_tokens)
        if self._first_block is None:
            self._first_block = block_tokens
        if block_tokens != self._first_block:
            # Another block size than the first record's: token j of key k is synthesized from k * B + j, so
            # small ids of two sizes would share tokens (id 2 at 8 tokens is the first half of id 1 at 16). Such
            # a record's ids get a key space of their own, folded by SplitMix64 with the size mixed in.
            ids = splitmix64_(ids ^ splitmix64_(np.array([block_tokens], np.uint64))) % limit
        big = ids >= limit
        if big.any():
            ids[big] = splitmix64_(ids[big].copy()) % limit
        if self.fmt.drop_tail_block and len(ids):
            ids[-1] = self.private_key(block_tokens)
        return ids

    def private_key(self, block_tokens: int) -> np.uint64:
        """A key no hash id maps to (``2**63 // block_tokens`` and up, one per call, in call order; for another
        block size than the first record's, placed by SplitMix64 in ``[2**63 // B, 2**64 // B)``, so private blocks
        of two sizes do not line up token for token)."""
        self._private += 1
        low = 2**63 // block_tokens
        if self._first_block is None or block_tokens == self._first_block:
            return np.uint64(low + self._private - 1)
        mixed = splitmix64_(np.array([self._private ^ (block_tokens << 40)], np.uint64))[0]
        return np.uint64(low + int(mixed) % (2**64 // block_tokens - low))


def _id_array(hash_ids: list) -> np.ndarray:
    """``hash_ids`` as a fresh uint64 array. Raises BadInputError naming the first id not in ``[0, 2**64)``."""
    try:
        arr = np.array(hash_ids, dtype=np.uint64) if hash_ids else np.zeros(0, dtype=np.uint64)
        if all(type(h) is int for h in hash_ids):
            return arr
    except (ValueError, OverflowError, TypeError):
        pass
    i = next((i for i, h in enumerate(hash_ids) if type(h) is not int or not 0 <= h < 2**64), 0)
    raise BadInputError(f"hash_ids[{i}] = {shorten(hash_ids[i])} is not an integer in [0, 2**64)")


def time_divisor(fmt: TraceFormat, schema: HashIdSchema) -> int:
    """Timestamp units per second: ``--timestamp-unit``, else the format's."""
    return TIMESTAMP_UNITS[fmt.timestamp_unit or schema.timestamp_unit]


class _Sessions:
    """Bailian sessions: the root of each record's ``parent_chat_id`` chain over the whole file, whatever the order of
    its records (a turn may come before the turn it continues). ``parents`` maps each ``chat_id`` that names a parent
    to that parent (:func:`chain_parents`, a pass over the file before its records are read); a parent the file does
    not hold (a cut trace), or holds as a first turn, is the root."""

    def __init__(self, parents: dict[str, str]) -> None:
        self._parents = parents
        self._root: dict[str, str] = {}

    def of(self, record: dict) -> str | None:
        """The session of one record (its root's ``chat_id``; None for a record with neither id).

        Raises:
            BadInputError: its chain of parents comes back to a chat it has passed (a loop, a self-parent included).
        """
        chat = optional_id(record, "chat_id")
        parent = optional_id(record, "parent_chat_id")
        return chat if parent in (None, "-1") else self.root(parent)

    def root(self, chat: str) -> str:
        """The root of ``chat``'s chain (memoized along the path walked).

        Raises:
            BadInputError: the chain loops.
        """
        path: list[str] = []
        seen: set[str] = set()
        node = chat
        while node not in self._root and node in self._parents:
            if node in seen:
                raise BadInputError(f"the parent_chat_id chain from {chat} loops back to chat_id {node}")
            seen.add(node)
            path.append(node)
            node = self._parents[node]
        root = self._root.get(node, node)
        for step in path:
            self._root[step] = root
        return root


_CHAT_ID = re.compile(rb'"chat_id"\s*:\s*(-?\d+|"[^"]*")\s*[,}]')
_PARENT_ID = re.compile(rb'"parent_chat_id"\s*:\s*(-?\d+|"[^"]*")\s*[,}]')


def chain_link(line: bytes) -> tuple[str | None, str | None] | None:
    """``(chat_id, parent_chat_id)`` of one Bailian JSONL line as :func:`~kvcli.traces.records.optional_id` reads
    them (a string, an integer as its decimal text; None when absent, and the parent None for ``-1``), or None for a
    line that is not a JSON object or holds another type there (its record's own check names the problem).

    A line that starts with ``{`` and holds one ``"chat_id"``, at most one ``"parent_chat_id"``, no other ``{`` and
    no backslash is one object with no nested object and no quote inside a string, so those two keys are its own
    and their values are read off the bytes where they stand; any other line is parsed whole (``json.loads``),
    which gives the same pair (``tests/traces/test_hashids.py`` checks the two agree).
    """
    if (line.count(b'"chat_id"') == 1 and line.count(b'"parent_chat_id"') <= 1 and b"\\" not in line
            and line.count(b"{") == 1 and line.lstrip().startswith(b"{")):
        chat = _CHAT_ID.search(line)
        parent = _PARENT_ID.search(line)
        if chat is not None and (parent is not None or b'"parent_chat_id"' not in line):
            return _id_text(chat.group(1)), (None if parent is None else _parent_text(_id_text(parent.group(1))))
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            return None
        return optional_id(record, "chat_id"), _parent_text(optional_id(record, "parent_chat_id"))
    except (ValueError, RecursionError, BadInputError):
        return None


def _id_text(token: bytes) -> str:
    """A JSON integer or plain string token as :func:`~kvcli.traces.records.optional_id` makes it a string."""
    return token[1:-1].decode("utf-8", "surrogateescape") if token.startswith(b'"') else str(int(token))


def _parent_text(parent: str | None) -> str | None:
    return None if parent == "-1" else parent


def chain_parents(path: Path) -> dict[str, str]:
    """``chat_id -> parent_chat_id`` of every record of a Bailian file that names a parent (``-1`` and absent
    aside), from one pass over its lines (:func:`chain_link`); a ``chat_id`` given twice keeps its first parent.

    Raises:
        BadInputError: the file cannot be read (located at the line reached), a line too long.
    """
    parents: dict[str, str] = {}
    for _, line in iter_raw_lines(path):
        link = chain_link(line)
        if link is not None and link[0] is not None and link[1] is not None:
            parents.setdefault(link[0], link[1])
    return parents


@dataclass(frozen=True)
class _Fields:
    input_length: int
    keys: np.ndarray
    block_tokens: int
    timestamp: float | None
    session_id: str | None
    output_length: int | None
    request_id: str | None
    cache_salt: str
    link: TurnLink


def _fields(record: Any, schema: HashIdSchema, blocks: BlockIds, sessions: _Sessions | None) -> _Fields:
    """One Bailian line record, checked (errors without the file and line: the caller adds them); its session from
    ``sessions`` (None: not wanted, left None)."""
    record = require_object(record)
    input_length = optional_count(record.get("input_length"), "input_length")
    if input_length is None:
        raise BadInputError(f"a {schema.name} record needs input_length (an integer >= 0)")
    if "hash_ids" not in record:
        raise BadInputError(f"a {schema.name} record needs hash_ids (a list of block ids)")
    block_tokens = blocks.block_tokens(record.get("block_size"), schema)
    keys = blocks.keys(record["hash_ids"], input_length, block_tokens)
    timestamp = optional_seconds(record.get("timestamp"), "timestamp", divisor=time_divisor(blocks.fmt, schema))
    parent = optional_id(record, "parent_chat_id")
    turn = optional_count(record.get("turn"), "turn")
    session = None if sessions is None else sessions.of(record)
    return _Fields(input_length, keys, block_tokens, timestamp, session,
                   optional_count(record.get("output_length"), "output_length"), optional_id(record, "chat_id"),
                   cache_salt(record), TurnLink(None if parent == "-1" else parent, turn or None))


def iter_hash_id_records(path: Path, schema: HashIdSchema, fmt: TraceFormat,
                         skipped: list[BadInputError] | None = None, sessions: bool = False
                         ) -> Iterator[tuple[int, _Fields]]:
    """``(line, fields)`` of each record of a Bailian trace, checked, in file order; with ``sessions``, each
    record's session (the root of its ``parent_chat_id`` chain over the whole file: :func:`chain_parents` reads the
    file once more first).

    ``skipped``: with ``fmt.skip_bad_records``, each record that failed its checks, or a line that is not JSON, is
    appended here (located errors) instead of raised.

    Raises:
        BadInputError: at ``path:line``, a record that fails its checks (unless skipped).
    """
    blocks = BlockIds(fmt)
    chains = _Sessions(chain_parents(path)) if sessions else None
    yield from checked_rows(path, lambda _, record: _fields(record, schema, blocks, chains), fmt.skip_bad_records,
                             skipped)


def read_hash_id_trace(path: Path, tokenizer: TokenizerArg, schema: HashIdSchema, fmt: TraceFormat
                       ) -> Iterator[Request]:
    """Requests of a Bailian trace, token ids synthesized per id (module docstring) when first read
    (:class:`~kvcli.traces.request.HashIdRequest`), each with its session and :class:`TurnLink` (its
    ``parent_chat_id`` and ``turn``). ``tokenizer`` is not used (there is no text). The other hash-id formats:
    :mod:`kvcli.traces.mooncake`.

    Raises:
        BadInputError: at ``path:line``, while iterating, a record that fails its checks (unless skipped).
    """
    del tokenizer
    for line_no, f in iter_hash_id_records(path, schema, fmt, sessions=True):
        yield HashIdRequest(id=f.request_id or f"{path.name}:{line_no}",
                            blocks=BlockKeys(f.keys, f.block_tokens, f.input_length), timestamp=f.timestamp,
                            session_id=f.session_id, output_length=f.output_length, cache_salt=f.cache_salt,
                            source=f"{path}:{line_no}", link=f.link)


def outline_hash_id_trace(path: Path, schema: HashIdSchema, fmt: TraceFormat) -> Iterator[Outline]:
    """Each request's prompt length and arrival time, checked as :func:`read_hash_id_trace` checks it, without
    synthesizing token ids."""
    for _, f in iter_hash_id_records(path, schema, fmt):
        yield Outline(f.input_length, f.timestamp)


def semantics_note(schema: HashIdSchema, fmt: TraceFormat, first_block_size: Any,
                   skipped: list[BadInputError] | None, time_type: str | None = None) -> str:
    """One line for the report: how a hash-id trace was read (tokens per id and from where, the timestamp unit and
    from where, sessions, the tail block, skipped records). ``time_type``: the Arrow type of a Parquet file's
    ``timestamp`` column when it is a time type (``"timestamp[ms]"``, :func:`~kvcli.traces.records.parquet_time_types`),
    whose values carry their own unit; None for numbers."""
    if first_block_size is not None:
        block = f"{first_block_size} tokens per hash id (the first record's block_size)"
    elif fmt.block_tokens is not None:
        block = f"{fmt.block_tokens} tokens per hash id (--hash-block-tokens)"
    else:
        block = f"{schema.block_tokens} tokens per hash id (the format's)"
    unit = (f"timestamps in {fmt.timestamp_unit} (--timestamp-unit)" if fmt.timestamp_unit
            else f"timestamps in {schema.timestamp_unit} (the format's)")
    if time_type is not None:
        unit = f"timestamps from the column's own time type ({time_type})" + (
            ", not --timestamp-unit (numbers only)" if fmt.timestamp_unit else "")
    parts = [f"read as a {schema.name} hash-id trace: {block}, {unit}, sessions: {schema.sessions}"]
    if fmt.drop_tail_block:
        parts.append("each request's last hash id made its own (--drop-tail-block): its tail block is never shared, "
                     "so hits can only fall, by at most one block per request; prompt lengths are unchanged")
    if skipped:
        parts.append(f"{len(skipped):,} records failed their checks and were skipped (--skip-bad-records), the first: "
                     f"{skipped[0]}")
    return "; ".join(parts)

