"""Anonymized hash-id traces of any trace kvcli reads (``kvcli export``): no text and no token ids, only lengths,
timestamps, sessions and block ids, in the Mooncake or Bailian format.

Block ids: each request's tokens are cut into blocks of ``block_tokens`` (the last one may be shorter); block ``i``'s
digest is ``d_i = HMAC-SHA256(key, d_{i-1} || tokens of block i as little-endian uint32)``, chained from ``d_{-1} =
HMAC-SHA256(key, "kvcli-export-v1 salt:" || cache_salt)`` (so tenants never share ids), and each distinct digest
becomes a sequential integer in order of first appearance (0, 1, 2, ...; with an id map file, continuing the numbers
it holds). Two requests get equal leading ids exactly where their token prefixes are equal block by block, so a replay
of the export hits exactly the original's tokens at every chunk size that is a multiple of ``block_tokens``. The key
(a file the user keeps) makes the digests unguessable from known text and stable across exports; the id map makes
later exports of the same traffic reuse the same integers. Its file: a 64-byte header (:data:`ID_MAP_MAGIC`, the
block tokens as uint64 little-endian, 8 zero bytes, the key's fingerprint :func:`key_fingerprint`), then the
digests in id order, 32 bytes each; a map made with another key or block size is refused, and one without the
header (kvcli before it) is read as digests alone and written back with it. An export holds the map's lock
(:func:`locked_id_map`) from reading it to writing it back, whole, before its output is renamed into place.

Records are written in file order, trace after trace; timestamps as read (seconds; written in the format's unit),
optionally rounded to a multiple of ``round_seconds``; sessions renumbered 0, 1, 2, ... in order of first
appearance; requests without a timestamp or output length are written without one.
"""
from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import math
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from kvcli.errors import BadInputError
from kvcli.outfile import check_output, write_output
from kvcli.traces.hashids import MAX_BLOCK_TOKENS
from kvcli.traces.request import Request

#: output format -> (its own tokens per id, timestamp units per second)
EXPORT_FORMATS = {"mooncake": (512, 1000), "bailian": (16, 1)}
KEY_BYTES = 32
_DIGEST = 32
#: ``--round-seconds`` bounds, seconds: a microsecond (finer rounds nothing a trace records) to about 31 years.
MIN_ROUND_SECONDS, MAX_ROUND_SECONDS = 1e-6, 1e9


def check_export_paths(traces: Sequence[Path], key_file: Path, out: Path, id_map: Path | None = None) -> None:
    """Refuse an export that would write onto a file it reads: ``out`` onto the key file, the id map or an input
    trace, and the id map onto the key file or an input trace; and a key file that is an input trace. ``traces``
    as given to ``kvcli export`` (a directory stands for its trace files, :func:`kvcli.traces.paths.expand_paths`;
    ``-``, stdin, for none); ``out`` ``-`` is stdout, never refused. Two paths are one file by
    :func:`os.path.samefile` where both exist (a link, a hard link), else by their resolved paths. Reads no file
    and writes none, so it runs before the key file is created.

    Raises:
        BadInputError: a write onto a file read, naming both options; an input trace that does not exist.
    """
    from kvcli.traces.paths import expand_paths

    inputs = [("an input trace", p) for p in expand_paths([p for p in traces if str(p) != "-"])]
    read = [("--key-file", key_file), *([] if id_map is None else [("--id-map", id_map)]), *inputs]
    written = ([] if str(out) == "-" else [("--out", out)]) + ([] if id_map is None else [("--id-map", id_map)])
    for option, path in written:
        for source, other in read:
            if source != option and _same_file(path, other):
                what = source if source.startswith("--") or str(other) == str(path) else f"{source} ({other})"
                raise BadInputError(f"{option} is the same file as {what}: the export would write into it; "
                                    f"give {option} another file", path=str(path))
    for _, trace in inputs:
        if _same_file(key_file, trace):
            raise BadInputError("--key-file is an input trace: its bytes would be the HMAC key; give the key its "
                                "own file (created, 32 random bytes, when missing)", path=str(key_file))


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: :func:`os.path.samefile` where both exist, else resolved paths."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def load_key(path: Path) -> tuple[bytes, bool]:
    """``(key, created)``: the key file's bytes, or, when it does not exist, 32 fresh random bytes written to it
    (mode 0600).

    Raises:
        BadInputError: unreadable, or shorter than 16 bytes.
    """
    if not path.exists():
        key = secrets.token_bytes(KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        except OSError as exc:
            raise BadInputError(f"cannot create the key file: {exc.strerror or exc}", path=str(path)) from None
        return key, True
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read the key file: {exc.strerror or exc}", path=str(path)) from None
    if len(key) < 16:
        raise BadInputError(f"a key file of {len(key)} bytes: a key needs at least 16 (kvcli writes 32 random bytes "
                            "to a key file that does not exist)", path=str(path))
    return key, False


class BlockNumbering:
    """Chained keyed block digests -> sequential ids (module docstring). ``ids_of`` mutates the numbering.

    Args:
        key: the HMAC key.
        block_tokens: tokens per block, >= 1.
        known: digests already numbered (id = position), e.g. from an id map file.
    """

    def __init__(self, key: bytes, block_tokens: int, known: Iterable[bytes] = ()) -> None:
        if type(block_tokens) is not int or block_tokens < 1:
            raise BadInputError(f"--block-size must be an integer >= 1, got {block_tokens!r}")
        self.key, self.block_tokens = key, block_tokens
        self.digests: list[bytes] = list(known)
        self._ids = {d: i for i, d in enumerate(self.digests)}

    def ids_of(self, token_ids: np.ndarray, cache_salt: str = "") -> list[int]:
        """The ``ceil(len(token_ids) / block_tokens)`` block ids of one prompt (``[tokens]`` uint32)."""
        data = np.ascontiguousarray(token_ids, dtype="<u4").tobytes()
        step = 4 * self.block_tokens
        digest = hmac.digest(self.key, b"kvcli-export-v1 salt:" + cache_salt.encode(), "sha256")
        out = []
        for start in range(0, len(data), step):
            digest = hmac.digest(self.key, digest + data[start:start + step], "sha256")
            i = self._ids.get(digest)
            if i is None:
                i = self._ids[digest] = len(self.digests)
                self.digests.append(digest)
            out.append(i)
        return out


#: The id map's header: magic, block tokens (uint64 little-endian), 8 reserved zero bytes, key fingerprint.
ID_MAP_MAGIC = b"kvcli-id-map-v2\0"
ID_MAP_HEADER_BYTES = len(ID_MAP_MAGIC) + 16 + _DIGEST


@dataclass(frozen=True)
class IdMap:
    """An id map file's digests in id order and what its header says they were made with (module docstring).

    Attributes:
        digests: the digests, id = position.
        block_tokens: tokens per block of the exports that made it (None: a map of kvcli before the header, which
            says nothing about its key or block size).
        fingerprint: :func:`key_fingerprint` of their key (None: as ``block_tokens``).
    """

    digests: list[bytes]
    block_tokens: int | None = None
    fingerprint: bytes | None = None


def key_fingerprint(key: bytes) -> bytes:
    """32 bytes that tell keys apart without revealing them: ``HMAC-SHA256(key, "kvcli-export-v1 id map")``."""
    return hmac.digest(key, b"kvcli-export-v1 id map", "sha256")


def read_id_map(path: Path | None) -> IdMap:
    """An id map file: its digests in id order and what its header says (an empty :class:`IdMap` when ``path`` is
    None, absent or empty).

    Raises:
        BadInputError: unreadable, or not an id map (a short header, or not a whole number of 32-byte digests).
    """
    if path is None or not path.exists():
        return IdMap([])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read the id map: {exc.strerror or exc}", path=str(path)) from None
    return parse_id_map(data, str(path))


def check_id_map(found: IdMap, path: Path, block_tokens: int, key: bytes | None = None) -> None:
    """Refuse to extend an id map made with another block size, or (``key`` given) another key: its ids number
    other digests, so the new ids would mean nothing to the exports it numbered before. A map without a header
    (kvcli before it) records neither and is not refused.

    Raises:
        BadInputError: naming ``path``, the mismatch and the way out.
    """
    if found.block_tokens is not None and found.block_tokens != block_tokens:
        raise BadInputError(f"the id map was made with --block-size {found.block_tokens}, not {block_tokens}: its "
                            f"ids stand for blocks of {found.block_tokens} tokens; give --block-size "
                            f"{found.block_tokens}, or another --id-map", path=str(path))
    if found.fingerprint is not None and key is not None and found.fingerprint != key_fingerprint(key):
        raise BadInputError("the id map was made with another --key-file: its ids number other digests; give the "
                            "key it was made with, or another --id-map", path=str(path))


def parse_id_map(data: bytes, path: str) -> IdMap:
    """An id map file's bytes: with the header (:data:`ID_MAP_MAGIC` ...), or without (digests alone).

    Raises:
        BadInputError: a short header, or digests that are not a whole number of 32 bytes (naming ``path``).
    """
    block = fingerprint = None
    if data.startswith(ID_MAP_MAGIC):
        if len(data) < ID_MAP_HEADER_BYTES:
            raise BadInputError(f"not an id map: a header of {len(data)} bytes, not {ID_MAP_HEADER_BYTES}", path=path)
        at = len(ID_MAP_MAGIC)
        block = int.from_bytes(data[at:at + 8], "little")
        fingerprint = data[at + 16:ID_MAP_HEADER_BYTES]
        data = data[ID_MAP_HEADER_BYTES:]
    if len(data) % _DIGEST:
        raise BadInputError(f"not an id map: {len(data)} bytes is not a whole number of {_DIGEST}-byte digests",
                            path=path)
    return IdMap([data[i:i + _DIGEST] for i in range(0, len(data), _DIGEST)], block, fingerprint)


def id_map_bytes(digests: list[bytes], key: bytes, block_tokens: int) -> bytes:
    """An id map file's bytes: the header (magic, ``block_tokens``, the key's fingerprint), then the digests."""
    return (ID_MAP_MAGIC + block_tokens.to_bytes(8, "little") + bytes(8) + key_fingerprint(key)
            + b"".join(digests))


def write_id_map(path: Path, digests: list[bytes], key: bytes, block_tokens: int) -> None:
    """Write the id map file whole (:func:`id_map_bytes`) through :func:`kvcli.outfile.write_output`: a reader
    sees the old map or the new one, never part of one.

    Raises:
        BadInputError: it cannot be written (the old map kept).
    """
    with write_output(path, "--id-map", binary=True) as f:
        f.write(id_map_bytes(digests, key, block_tokens))


@contextlib.contextmanager
def locked_id_map(path: Path | None) -> Iterator[None]:
    """Hold the id map's lock for the block: ``fcntl.flock`` on a lock file of kvcli's own beside it
    (``.NAME.kvcli-lock``, created when missing and left there: a lock file removed while held would let a third
    export in); two exports that would extend one map at once would number the same digests twice. Nothing for
    ``path`` None.

    Raises:
        BadInputError: another process holds the lock (refused at once, not waited for), or the lock file cannot
            be created or locked.
    """
    if path is None:
        yield
        return
    real = Path(os.path.realpath(path))
    lock = real.with_name(f".{real.name}.kvcli-lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise BadInputError(f"--id-map {path}: cannot create its lock file {lock}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInputError(f"--id-map {path} is in use by another kvcli export (it holds {lock}); run the "
                                "exports that share a map one after another") from None
        except OSError as exc:
            raise BadInputError(f"--id-map {path}: cannot lock {lock}: {exc.strerror or exc}") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def check_export_outputs(out: Path, id_map: Path | None) -> None:
    """Check, before any file is touched, that ``out`` (``-``: stdout, not checked) and the id map can be written
    (:func:`kvcli.outfile.check_output`) and that an existing id map is a regular file.

    Raises:
        BadInputError: naming the option.
    """
    if str(out) != "-":
        check_output(out, "--out")
    if id_map is not None and check_output(id_map, "--id-map").exists() and not id_map.is_file():
        raise BadInputError(f"--id-map {id_map} is not a regular file: an id map is read and written whole")


def load_key_and_map(key_file: Path, id_map: Path | None, block_tokens: int) -> tuple[bytes, bool, list[bytes]]:
    """``(key, created, digests)``: the key (:func:`load_key`) and the id map's digests in id order (``[]`` without
    one), checked against each other (:func:`check_id_map`); a missing key file is not created for a map made with
    a key. Call it holding :func:`locked_id_map`.

    Raises:
        BadInputError: as :func:`load_key`, :func:`read_id_map` and :func:`check_id_map`; a missing key file for a
            map made with a key.
    """
    found = read_id_map(id_map)
    if id_map is not None:
        check_id_map(found, id_map, block_tokens)
        if found.fingerprint is not None and not key_file.exists():
            raise BadInputError(f"the id map was made with another --key-file: {key_file} does not exist (a new key "
                                "would number other digests); give the key it was made with", path=str(id_map))
    key, created = load_key(key_file)
    if id_map is not None:
        check_id_map(found, id_map, block_tokens, key)
    return key, created, found.digests


def check_export_options(fmt: str, block_tokens: int, round_seconds: float | None) -> None:
    """Refuse, before any file is touched: an unknown output ``fmt``; ``block_tokens`` not an integer in ``[1,
    MAX_BLOCK_TOKENS]`` (what the hash-id readers accept, so every export can be read back); ``round_seconds``
    not finite or not in ``[MIN_ROUND_SECONDS, MAX_ROUND_SECONDS]`` seconds (infinity would write NaN
    timestamps, a subnormal one infinite quotients).

    Raises:
        BadInputError: naming the option.
    """
    if fmt not in EXPORT_FORMATS:
        raise BadInputError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if type(block_tokens) is not int or not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
        raise BadInputError(f"--block-size must be an integer in [1, {MAX_BLOCK_TOKENS:,}], got {block_tokens!r}")
    if round_seconds is not None and not (math.isfinite(round_seconds)
                                          and MIN_ROUND_SECONDS <= round_seconds <= MAX_ROUND_SECONDS):
        raise BadInputError(f"--round-seconds must be in [{MIN_ROUND_SECONDS:g}, {MAX_ROUND_SECONDS:g}] seconds, "
                            f"got {round_seconds}")


def export_records(requests: Iterable[Request], fmt: str, numbering: BlockNumbering,
                   round_seconds: float | None = None) -> Iterator[dict[str, Any]]:
    """One output record per request, in order: Mooncake ``{"timestamp" (ms), "input_length", "output_length",
    "hash_ids", "session_id"}`` or Bailian ``{"chat_id", "parent_chat_id", "timestamp" (s), "input_length",
    "output_length", "turn", "hash_ids"}``, each with ``"block_size"`` when it is not the format's own.

    Bailian's links: a request whose trace names the request it continues (:class:`~kvcli.traces.request.TurnLink`,
    a Bailian input's ``parent_chat_id``) keeps that link, renumbered, whatever the order of the two in the input:
    each chat id of a session gets its number where it is first named, as a request or as a parent (a parent the
    input does not hold keeps a number no record has, so its children stay one session). Its ``turn`` is its own,
    else one more than its parent's where the parent came first, else 2. Any other request of a session continues
    the session's previous one in input order (turn = its place in the session); a request without a session is a
    first turn.

    Raises:
        BadInputError: as :func:`check_export_options`.
    """
    check_export_options(fmt, numbering.block_tokens, round_seconds)
    own_block, per_second = EXPORT_FORMATS[fmt]
    sessions: dict[str, int] = {}
    chats = _ChatNumbers()
    last_chat: dict[int, int] = {}  # session -> its last chat_id, for requests without a link
    turns: dict[int, int] = {}  # chat_id -> its turn
    for r in requests:
        record: dict[str, Any] = {}
        session = None if r.session_id is None else sessions.setdefault(r.session_id, len(sessions))
        if fmt == "bailian":
            if r.link is not None:
                chat = chats.named((r.session_id, r.id))
                parent = -1 if r.link.parent is None else chats.named((r.session_id, r.link.parent))
                turn = r.link.turn or (1 if parent == -1 else turns.get(parent, 1) + 1)
            else:
                chat = chats.fresh()
                parent = -1 if session is None else last_chat.get(session, -1)
                turn = 1 if parent == -1 else turns[parent] + 1
            if session is not None:
                last_chat[session] = chat
            turns[chat] = turn
            record.update(chat_id=chat, parent_chat_id=parent, turn=turn)
        if r.timestamp is not None:
            t = r.timestamp if round_seconds is None else round(r.timestamp / round_seconds) * round_seconds
            record["timestamp"] = _number(t * per_second)
        record["input_length"] = len(r.token_ids)
        if r.output_length is not None:
            record["output_length"] = r.output_length
        if fmt == "mooncake" and session is not None:
            record["session_id"] = session
        if numbering.block_tokens != own_block:
            record["block_size"] = numbering.block_tokens
        record["hash_ids"] = numbering.ids_of(r.token_ids, r.hash_salt)
        yield record


class _ChatNumbers:
    """Bailian chat ids of an export: 0, 1, 2, ... in order of first use, a chat the input names (by its session and
    its own id) keeping one number wherever it is named again."""

    def __init__(self) -> None:
        self._named: dict[tuple[str | None, str], int] = {}
        self._next = 0

    def fresh(self) -> int:
        """A number no chat has had."""
        self._next += 1
        return self._next - 1

    def named(self, key: tuple[str | None, str]) -> int:
        """The number of the chat ``key`` names, given it the first time."""
        if key not in self._named:
            self._named[key] = self.fresh()
        return self._named[key]


def _number(x: float) -> int | float:
    """``x`` as an integer when it is one (Mooncake's timestamps are integers), else as it is."""
    return int(x) if float(x).is_integer() else x


def write_jsonl(records: Iterable[dict], out: IO[str]) -> int:
    """Each record as one JSON line on ``out``; returns how many."""
    n = 0
    for record in records:
        out.write(json.dumps(record, separators=(", ", ": ")) + "\n")
        n += 1
    return n
