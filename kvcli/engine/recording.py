"""Files of KV event batches, one JSON line each: kvcli's own recordings (``kvcli events record``), and plain decoded
batches as other subscribers log them.

**kvcli's recording** (this module writes it; version 1), UTF-8 JSON Lines:

* line 1, the header: ``{"kvcli_kv_events": 1, "endpoint": ..., "topic": ..., "replay_endpoint": ...,
  "started_at": "2026-12-05T10:00:00Z"}``;
* one line per batch, in sequence order: ``{"seq": 12, "received_at": 1764928800.25, "topic": "kv", "batch": [ts,
  [event, ...], dp_rank]}``, plus ``"replayed": true`` when the replay socket supplied it. ``seq`` is the engine's
  sequence number, ``received_at`` this machine's clock (seconds since the epoch), ``batch`` the msgpack payload
  as JSON: maps and arrays as the engine sent them (every field kept, known or not), bytes as lowercase hex;
* ``{"missed": [first, last]}``: sequence numbers neither the stream nor the replay socket delivered;
* ``{"seq": ..., "received_at": ..., "topic": ..., "payload_hex": ..., "error": ...}``: a payload that was not a
  KV event batch, kept as its bytes.

**A plain decoded batch** is a line ``[ts, [event, ...], dp_rank]``: the msgpack payload as JSON, bytes hashes as
hex or base64 (msgspec's JSON writes bytes as base64), integer hashes as numbers.

Either file may be gzip-compressed (by its magic bytes). Reading streams it line by line.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvcli.engine.events import EventBatch, decode_batch
from kvcli.errors import BadInputError, KvcliError

FORMAT_KEY, FORMAT_VERSION = "kvcli_kv_events", 1


@dataclass(frozen=True, slots=True)
class RecordedBatch:
    """One batch of a file: the decoded ``batch``, its sequence number and receive time (None in a plain decoded
    batch file), whether the replay socket supplied it, and its ``source`` (``file:line``)."""

    batch: EventBatch
    seq: int | None
    received_at: float | None
    replayed: bool
    source: str


def read_batches(path: Path) -> Iterator[RecordedBatch]:
    """The batches of a kvcli recording or a file of plain decoded batches (module docstring), in file order,
    streamed. The header and ``missed`` lines are skipped.

    Raises:
        BadInputError: at ``path:line``, a line that is not JSON, not a batch, an event malformed, a payload the
            recorder kept undecoded, or a recording of a newer version; the file cannot be read.
    """
    # kvcli.traces loads its format readers with it: imported here, so the recorder does not load them
    from kvcli.traces.records import check_file, iter_jsonl

    check_file(path)
    for line_no, value in iter_jsonl(path):
        if isinstance(value, list):
            batch = decode_batch(value, text_hashes=True, path=str(path), line=line_no)
            yield RecordedBatch(batch, None, None, False, f"{path}:{line_no}")
        elif isinstance(value, dict):
            record = _recorded(value, path, line_no)
            if record is not None:
                yield record
        else:
            raise BadInputError(f"a line is a KV event batch [ts, events, dp_rank] or a kvcli recording's object, "
                                f"got {type(value).__name__}", str(path), line_no)


def _recorded(value: dict, path: Path, line_no: int) -> RecordedBatch | None:
    """One object line of a kvcli recording: its batch, or None for the header and ``missed`` lines."""
    where: dict[str, Any] = {"path": str(path), "line": line_no}
    if FORMAT_KEY in value:
        version = value[FORMAT_KEY]
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
            raise BadInputError(f"a kvcli KV event recording of version {version!r}; this kvcli reads version "
                                f"{FORMAT_VERSION} (upgrade kvcli)", **where)
        return None
    if "missed" in value:
        return None
    if "payload_hex" in value:
        raise BadInputError(f"the recorder could not decode this payload ({value.get('error', 'no reason given')})",
                            **where)
    if "batch" not in value or not _is_seq(value.get("seq")) or not _is_time(value.get("received_at")):
        raise BadInputError("a kvcli recording's batch line has seq (an integer >= 0), received_at (seconds) and "
                            "batch", **where)
    batch = decode_batch(value["batch"], text_hashes=True, **where)
    return RecordedBatch(batch, value["seq"], float(value["received_at"]), value.get("replayed") is True,
                         f"{path}:{line_no}")


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def jsonable(value: Any) -> Any:
    """A msgpack-decoded value as JSON can hold it: bytes as lowercase hex, map keys as strings, tuples as lists;
    anything else not JSON-native (a msgpack extension type) as its ``str``."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


class RecordingWriter:
    """Writes a kvcli recording (module docstring) to ``path``, one whole line at a time, each handed to the OS as
    it is written (no buffer in this process); :meth:`close` fsyncs. A failed write is cut back to the last whole line.

    Raises (from the constructor and each write):
        BadInputError: ``path`` cannot be opened for writing.
        KvcliError: a write failed (disk full, I/O error).
    """

    def __init__(self, path: Path, endpoint: str, topic: str, replay_endpoint: str | None) -> None:
        self.path = path
        try:
            self._file = open(path, "wb", buffering=0)  # unbuffered: each line goes to the OS whole, or not at all
        except OSError as exc:
            raise BadInputError(f"cannot write: {exc.strerror or exc}", str(path)) from None
        self.bytes_written = 0
        started = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        self._line({FORMAT_KEY: FORMAT_VERSION, "endpoint": endpoint, "topic": topic,
                    "replay_endpoint": replay_endpoint, "started_at": started})

    def batch(self, seq: int, received_at: float, topic: str, payload: Any, replayed: bool = False) -> None:
        """A batch line: ``payload`` is the msgpack-decoded batch (made JSON by :func:`jsonable`)."""
        line = {"seq": seq, "received_at": round(received_at, 6), "topic": topic, "batch": jsonable(payload)}
        self._line(line | {"replayed": True} if replayed else line)

    def missed(self, first: int, last: int) -> None:
        """A ``missed`` line: sequence numbers ``first..last`` (inclusive) never arrived."""
        self._line({"missed": [first, last]})

    def undecodable(self, seq: int, received_at: float, topic: str, payload: bytes, error: str) -> None:
        """A payload that was not a KV event batch, kept as hex with the reason."""
        self._line({"seq": seq, "received_at": round(received_at, 6), "topic": topic, "payload_hex": payload.hex(),
                    "error": error})

    def close(self) -> None:
        """Flush, fsync and close (idempotent)."""
        if self._file.closed:
            return
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise KvcliError(f"{self.path}: cannot write: {exc.strerror or exc}") from None
        finally:
            self._file.close()

    def _line(self, value: dict) -> None:
        data = json.dumps(value, separators=(",", ":")).encode() + b"\n"
        try:
            view = memoryview(data)
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("no bytes written")
                view = view[written:]
        except OSError as exc:
            self._cut_back()
            raise KvcliError(f"{self.path}: cannot write: {exc.strerror or exc}") from None
        self.bytes_written += len(data)

    def _cut_back(self) -> None:
        """Drop a partly written line: truncate to the bytes of the whole lines written."""
        try:
            os.ftruncate(self._file.fileno(), self.bytes_written)
            self._file.seek(self.bytes_written)
        except (OSError, ValueError):
            pass  # the write error is the one to report
