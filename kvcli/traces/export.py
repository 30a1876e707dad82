"""Anonymized hash-id traces of any trace kvcli reads (``kvcli export``): no text and no token ids, only lengths,
timestamps, sessions and block ids, in the Mooncake or Bailian format.

Block ids: each request's tokens are cut into blocks of ``block_tokens`` (the last one may be shorter); block ``i``'s
digest is ``d_i = HMAC-SHA256(key, d_{i-1} || tokens of block i as little-endian uint32)``, chained from ``d_{-1} =
HMAC-SHA256(key, "kvcli-export-v1 salt:" || cache_salt)`` (so tenants never share ids), and each distinct digest
becomes a sequential integer in order of first appearance (0, 1, 2, ...; with an id map file, continuing the numbers
it holds). Two requests get equal leading ids exactly where their token prefixes are equal block by block, so a replay
of the export hits exactly the original's tokens at every chunk size that is a multiple of ``block_tokens``. The key
(a file the user keeps) makes the digests unguessable from known text and stable across exports; the id map (the
digests in id order, 32 bytes each) makes later exports of the same traffic reuse the same integers.

Records are written in file order, trace after trace; timestamps as read (seconds; written in the format's unit),
optionally rounded to a multiple of ``round_seconds``; sessions renumbered 0, 1, 2, ... in order of first
appearance; requests without a timestamp or output length are written without one.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from kvcli.errors import BadInputError
from kvcli.traces.request import Request

#: output format -> (its own tokens per id, timestamp units per second)
EXPORT_FORMATS = {"mooncake": (512, 1000), "bailian": (16, 1)}
KEY_BYTES = 32
_DIGEST = 32


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


def read_id_map(path: Path | None) -> list[bytes]:
    """The digests of an id map file in id order ([] when ``path`` is None or absent).

    Raises:
        BadInputError: unreadable, or not a whole number of 32-byte digests.
    """
    if path is None or not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read the id map: {exc.strerror or exc}", path=str(path)) from None
    if len(data) % _DIGEST:
        raise BadInputError(f"not an id map: {len(data)} bytes is not a whole number of {_DIGEST}-byte digests",
                            path=str(path))
    return [data[i:i + _DIGEST] for i in range(0, len(data), _DIGEST)]


def write_id_map(path: Path, digests: list[bytes], known: int) -> None:
    """Append the digests numbered after the first ``known`` to the id map file."""
    with open(path, "ab") as f:
        f.write(b"".join(digests[known:]))


def export_records(requests: Iterable[Request], fmt: str, numbering: BlockNumbering,
                   round_seconds: float | None = None) -> Iterator[dict[str, Any]]:
    """One output record per request, in order: Mooncake ``{"timestamp" (ms), "input_length", "output_length",
    "hash_ids", "session_id"}`` or Bailian ``{"chat_id", "parent_chat_id", "timestamp" (s), "input_length",
    "output_length", "turn", "hash_ids"}``, each with ``"block_size"`` when it is not the format's own.

    Raises:
        BadInputError: an unknown ``fmt``, ``round_seconds`` not > 0.
    """
    if fmt not in EXPORT_FORMATS:
        raise BadInputError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if round_seconds is not None and not round_seconds > 0:
        raise BadInputError(f"--round-seconds must be > 0, got {round_seconds}")
    own_block, per_second = EXPORT_FORMATS[fmt]
    sessions: dict[str, int] = {}
    last_chat: dict[int, tuple[int, int]] = {}  # session -> (its last chat_id, its turns so far)
    for n, r in enumerate(requests):
        record: dict[str, Any] = {}
        session = None if r.session_id is None else sessions.setdefault(r.session_id, len(sessions))
        if fmt == "bailian":
            parent, turns = last_chat.get(session, (-1, 0)) if session is not None else (-1, 0)
            record.update(chat_id=n, parent_chat_id=parent, turn=turns + 1)
            if session is not None:
                last_chat[session] = (n, turns + 1)
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
        record["hash_ids"] = numbering.ids_of(r.token_ids, r.cache_salt)
        yield record


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
