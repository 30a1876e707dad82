"""Shared pieces of the trace readers: opening (gzip by magic bytes), streaming JSONL lines, loading JSON
documents, and validating a record's optional fields, with errors that name the file and line."""
from __future__ import annotations

import contextlib
import datetime
import gzip
import io
import itertools
import json
import math
import zlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from kvcli.errors import BadInputError, json_type
from kvcli.units import fmt_bytes

_GZIP_MAGIC = b"\x1f\x8b"
T = TypeVar("T")


def require_object(record: Any) -> dict:
    """``record`` when it is a JSON object (a dict). Raises BadInputError naming what it is instead."""
    if not isinstance(record, dict):
        raise BadInputError(f"expected a JSON object, got {json_type(record)}")
    return record


def optional_id(record: dict, key: str) -> str | None:
    """``record[key]`` as an id string (a string or an integer), or None when absent. Raises BadInputError."""
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, float):  # a JSON number with a fraction or an exponent: "not a number" would mislead
        raise BadInputError(f"{key} must be a string or an integer, not {shorten(value)} (a number with a fraction "
                            "or an exponent)")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadInputError(f"{key} must be a string or an integer, not {json_type(value)}")
    return str(value)


def cache_salt(record: dict, where: str = "") -> str:
    """The record's ``cache_salt`` (a tenant's salt: requests of different salts never share cache), ``""`` when
    absent or null. Raises BadInputError when it is not a string (``where`` prefixes the field's name in it)."""
    salt = record.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise BadInputError(f"{where}cache_salt must be a string, not {json_type(salt)}")
    return salt or ""


def served_model(record: dict, where: str = "") -> str:
    """The record's ``model`` (the served model an OpenAI-style request names: a base model or a LoRA adapter),
    ``""`` when absent or null. Raises BadInputError when it is not a string (``where`` prefixes the field's name)."""
    model = record.get("model")
    if model is not None and not isinstance(model, str):
        raise BadInputError(f"{where}model must be a string, not {json_type(model)}")
    return model or ""


def optional_count(value: Any, key: str) -> int | None:
    """``value`` as a count (an integer >= 0, not a boolean), or None. Raises BadInputError naming ``key``."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise BadInputError(f"{key} must be an integer >= 0, got {shorten(value)}")
    return value


def optional_seconds(value: Any, key: str, divisor: int, instant: bool = True) -> float | None:
    """``value`` in seconds, or None when it is None. ``value`` is a finite number >= 0 in units of 1/``divisor`` s
    (:func:`finite_number`: an integer too large for a float is not one), or a Parquet temporal value
    (:func:`iter_parquet`), which carries its own unit (``divisor`` does not apply): an Arrow ``duration`` (a
    :class:`datetime.timedelta` >= 0) is its length; with ``instant``, an Arrow ``timestamp`` (a
    :class:`datetime.datetime`, naive as Arrow gives a column without a time zone: UTC) is its time since the Unix
    epoch (1970-01-01T00:00:00Z, UTC). A temporal value is taken exactly in whole microseconds and divided
    once, so an instant of ``n`` ms gives the same float as the number ``n`` with ``divisor`` 1000.

    Raises:
        BadInputError: naming ``key``: anything else, a number or a duration < 0 (a duration said in seconds), a
            timestamp before the epoch, with ``instant`` a number past the end of the year 9999
            (:func:`epoch_seconds`), or a timestamp where ``instant`` is False (a delay is a length of time, not
            an instant).
    """
    if value is None:
        return None
    number = finite_number(value)
    if number is not None and number >= 0:
        return epoch_seconds(number / divisor, key, value) if instant else number / divisor
    if isinstance(value, datetime.datetime):
        if not instant:
            raise BadInputError(f"{key} must be a number or a duration, not a timestamp ({value.isoformat()})")
        micros = (value - (_EPOCH_UTC if value.tzinfo is not None else _EPOCH)) // _MICROSECOND
        if micros < 0:
            raise BadInputError(f"{key} must be at or after the Unix epoch (1970-01-01T00:00:00Z), got "
                                f"{value.isoformat()}")
        return micros / 1_000_000
    if isinstance(value, datetime.timedelta):
        if value < datetime.timedelta(0):
            raise BadInputError(f"{key} must be a duration >= 0, got {value // _MICROSECOND / 1_000_000} s")
        return (value // _MICROSECOND) / 1_000_000
    raise BadInputError(f"{key} must be a finite number >= 0, got {shorten(value)}")


#: 0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z in seconds since the Unix epoch: the years 1 to 9999, the times a
#: Python datetime (and so a Parquet ``timestamp`` column, :func:`iter_parquet`) holds; a trace's time is in them.
EPOCH_SECONDS_RANGE = (-62_135_596_800, 253_402_300_800)


def epoch_seconds(seconds: float, key: str, value: Any) -> float:
    """``seconds`` (a trace's time since the Unix epoch, its unit applied) when it is in the years 1 to 9999
    (:data:`EPOCH_SECONDS_RANGE`, the end exclusive), as a typed Parquet column's time must be; ``value`` is the
    number the trace gave, for the error.

    Raises:
        BadInputError: naming ``key`` and ``value``, a time outside those years (or NaN).
    """
    first, end = EPOCH_SECONDS_RANGE
    if not first <= seconds < end:
        raise BadInputError(f"{key} {shorten(value)} is {seconds:.12g} s since the Unix epoch, a time outside the "
                            "years 1 to 9999, the range a Python datetime (and a Parquet timestamp column) holds")
    return seconds


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (an int or a float, not a boolean) that a float holds finite;
    None for anything else: NaN, an infinity, an integer too large for a float (past about 1.8e308), a non-number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of more than about 308 digits: JSON allows it, a float cannot hold it
        return None
    return number if math.isfinite(number) else None


_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MICROSECOND = datetime.timedelta(microseconds=1)


def shorten(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (with "..."), for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def located(err: BadInputError, path: Path, line: int) -> BadInputError:
    """``err`` again, located at ``path:line`` (unless it already has a location)."""
    if err.path:
        return err
    return BadInputError(err.reason, path=str(path), line=line)


# --------------------------------------------------------------------------------------------- file helpers

def check_file(path: Path) -> None:
    """Raise BadInputError unless ``path`` is an existing regular file."""
    if not path.exists():
        raise BadInputError("file not found", path=str(path))
    if path.is_dir():
        raise BadInputError("a directory: a reader reads one trace file (kvcli replay DIR and "
                            "kvcli.traces.paths.expand_paths take each trace file of a directory)", path=str(path))
    if not path.is_file():
        raise BadInputError("not a regular file", path=str(path))


def stem_and_suffix(path: Path) -> tuple[str, str]:
    """``(stem, suffix)`` of ``path`` with a trailing ``.gz`` removed first: ``a.traj.gz`` -> ``("a", ".traj")``."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    p = Path(name)
    return p.stem, p.suffix


def _open_binary(path: Path) -> io.BufferedIOBase:
    """``path`` opened for reading bytes, through gzip when it starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as raw:
            magic = raw.read(2)
        return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")
    except OSError as exc:
        raise BadInputError(f"cannot open: {exc.strerror or exc}", path=str(path)) from None


_READ_ERRORS = (OSError, EOFError, zlib.error)
_UTF8_BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 20  # bytes read at a time where a reader takes a file in blocks

#: The longest line of a JSONL trace kvcli reads, in bytes, its line end included (64 MiB). A record is parsed
#: whole, and parsing takes many times its bytes in memory, so a longer line is refused as soon as this many bytes
#: of it are read, never read whole. Readers look it up on each call.
MAX_LINE_BYTES = 64 << 20


def _read_error(exc: Exception, path: Path, lines_read: int) -> BadInputError:
    """A read failure (an I/O error, gzip data cut short or corrupt) located at the line the reading had reached:
    ``lines_read`` complete lines were read before it."""
    return BadInputError(f"cannot read past line {lines_read} ({type(exc).__name__}: {exc})" if lines_read else
                         f"cannot read ({type(exc).__name__}: {exc})", path=str(path), line=lines_read + 1)


def _iter_lines(path: Path) -> Generator[tuple[int, bytes], None, None]:
    """``(line_no, line)`` for each non-blank line (bytes; decoded by the JSON parser), 1-based, streamed: at most
    :data:`MAX_LINE_BYTES` + 1 bytes of a line are held at once.

    Raises:
        BadInputError: at ``path:line_no``, a line longer than :data:`MAX_LINE_BYTES`, or the file cannot be read
            there (gzip data cut short or corrupt, an I/O error).
    """
    line_no, limit = 0, MAX_LINE_BYTES
    try:
        with _open_binary(path) as f:
            while line := f.readline(limit + 1):
                line_no += 1
                if len(line) > limit:
                    raise BadInputError(f"line longer than {fmt_bytes(limit)}, the longest trace line kvcli reads "
                                        "(each record is parsed whole); split the record or shorten its prompt",
                                        path=str(path), line=line_no)
                if line.strip():
                    yield line_no, line
    except _READ_ERRORS as exc:
        raise _read_error(exc, path, line_no) from None


def iter_raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line_no, line)`` of each non-blank line as bytes, unparsed, streamed (gunzipped): for a pass that looks at a
    few fields of every record before the records are parsed (:mod:`kvcli.traces.hashids`'s Bailian chains).

    Raises:
        BadInputError: as :func:`iter_jsonl`, a line too long or a file that cannot be read.
    """
    return _iter_lines(path)


def read_first_line(path: Path) -> tuple[int, bytes] | None:
    """``(line_no, line)`` of the first non-blank line, or None for a blank file."""
    with contextlib.closing(_iter_lines(path)) as lines:
        return next(lines, None)


def _parse_line(path: Path, line_no: int, line: bytes) -> Any:
    """The JSON value of one line (UTF-8; a BOM is allowed).

    Raises:
        BadInputError: at ``path:line_no``, invalid JSON or not UTF-8.
    """
    try:
        return json.loads(line.rstrip(b"\r\n"))  # without its line end: an error at the end names its column
    except RecursionError:
        raise BadInputError("JSON nested too deeply", path=str(path), line=line_no) from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=str(path), line=line_no) from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line)",
                            path=str(path), line=line_no) from None


def iter_jsonl(path: Path, invalid: list[BadInputError] | None = None) -> Iterator[tuple[int, Any]]:
    """``(line_no, value)`` of each non-blank line of a JSONL file, streamed.

    ``invalid``: where a line that is not JSON (or not UTF-8) goes, as its located error, instead of being
    raised (``--skip-bad-records``: a log cut mid-line by a rotation or a crash). None: raised.

    Raises:
        BadInputError: at ``path:line``, invalid JSON or not UTF-8 (without ``invalid``), or the file cannot be
            read.
    """
    for line_no, line in _iter_lines(path):
        try:
            value = _parse_line(path, line_no, line)
        except BadInputError as err:
            if invalid is None:
                raise
            invalid.append(err)
            continue
        yield line_no, value


def checked_rows(path: Path, check: Callable[[int, Any], T], skip: bool,
                 skipped: list[BadInputError] | None = None) -> Iterator[tuple[int, T]]:
    """``(number, check(number, value))`` of each record of a row-per-request file (:func:`iter_rows`: a JSONL
    file's lines, a Parquet file's rows), in file order: the one loop of the readers whose records may be skipped
    (``--skip-bad-records``). ``check`` raises BadInputError (without a location) for a bad record; with ``skip``,
    that error, or a line that is not JSON, is appended to ``skipped`` (located at ``path:number``) and the record
    skipped; without, it is raised located.

    Raises:
        BadInputError: at ``path:number``, a record ``check`` refuses or a line that is not JSON (unless ``skip``).
    """
    invalid = (skipped if skipped is not None else []) if skip else None  # lines that are not JSON
    for number, record in iter_rows(path, invalid):
        try:
            fields = check(number, record)
        except BadInputError as err:
            if not skip:
                raise located(err, path, number) from None
            if skipped is not None:
                skipped.append(located(err, path, number))
            continue
        yield number, fields


def load_json(path: Path) -> Any:
    """The single JSON value of a file (loaded whole).

    Raises:
        BadInputError: invalid JSON, not UTF-8, or the file cannot be read (located at the line reached).
    """
    try:
        data = read_all_bytes(path)
        return json.loads(data)
    except RecursionError:
        raise BadInputError("JSON nested too deeply", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=str(path),
                            line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})", path=str(path)) from None


def read_all_bytes(path: Path) -> bytes:
    """Every byte of the file, read in blocks (gunzipped). Raises BadInputError at the line reached."""
    blocks: list[bytes] = []
    lines = 0
    try:
        with _open_binary(path) as f:
            while block := f.read1(_BLOCK):  # read1: what one step decompressed, so a cut names its line
                blocks.append(block)
                lines += block.count(b"\n")
    except _READ_ERRORS as exc:
        raise _read_error(exc, path, lines) from None
    return b"".join(blocks)


def read_first_char(path: Path) -> bytes | None:
    """The first non-whitespace byte of the file, after any UTF-8 BOM (reads up to 4 KiB at a time), or None.

    Raises:
        BadInputError: the file cannot be read (located at the line reached).
    """
    lines = 0
    try:
        with _open_binary(path) as f:
            chunk = f.read1(4096)  # read1: what one step decompressed, so a cut further on is not read here
            if chunk.startswith(_UTF8_BOM):
                chunk = chunk[len(_UTF8_BOM):]
            while chunk:
                stripped = chunk.lstrip()
                if stripped:
                    return stripped[:1]
                lines += chunk.count(b"\n")
                chunk = f.read1(4096)
    except _READ_ERRORS as exc:
        raise _read_error(exc, path, lines) from None
    return None


def _is_json_document(path: Path) -> bool:
    """True when the file is one JSON value rather than JSONL: it starts with ``[`` or with a lone ``{`` line."""
    if read_first_char(path) == b"[":
        return True
    first = read_first_line(path)
    return first is not None and first[1].strip().removeprefix(_UTF8_BOM) == b"{"


def read_first_record(path: Path) -> tuple[int, Any]:
    """``(line_no, value)`` of the first record: the first non-blank JSONL line, the whole JSON document, or a
    Parquet file's first row (:func:`iter_parquet`)."""
    if is_parquet(path):
        with contextlib.closing(iter_parquet(path)) as rows:
            row = next(rows, None)
        if row is None:
            raise BadInputError("empty Parquet file: no rows, so no format to detect", path=str(path))
        return row
    if _is_json_document(path):
        return 1, load_json(path)
    first = read_first_line(path)
    if first is None:
        raise BadInputError("empty file: no records, so no format to detect", path=str(path))
    return first[0], _parse_line(path, *first)


def iter_csv(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line_no, row)`` of each data row of a CSV file with a header row (:mod:`csv`, streamed; UTF-8, a BOM
    allowed; a field may span lines): ``line_no`` is the 1-based line the row starts on, ``row`` maps each header
    name to its cell (``""`` when the row is short). A field may hold up to :data:`MAX_LINE_BYTES` characters.

    Raises:
        BadInputError: at ``path:line_no``, malformed CSV, text that is not UTF-8, or the file cannot be read there.
    """
    import csv

    csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))
    line_no = 0
    try:
        with io.TextIOWrapper(cast(BinaryIO, _open_binary(path)), encoding="utf-8-sig", newline="") as text:
            rows = csv.reader(text)
            header = next(rows, None)
            line_no = rows.line_num
            while header is not None:
                start = line_no + 1
                row = next(rows, None)
                line_no = rows.line_num
                if row is None:
                    return
                if any(cell.strip() for cell in row):
                    yield start, dict(itertools.zip_longest(header, row[:len(header)], fillvalue=""))
    except csv.Error as exc:
        raise BadInputError(f"malformed CSV: {exc}", path=str(path), line=line_no + 1) from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text ({exc.reason})", path=str(path), line=line_no + 1) from None
    except _READ_ERRORS as exc:
        raise _read_error(exc, path, line_no) from None


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(record_no, value)``: the elements of a JSON list (1-based index), a JSON object as record 1, or the
    lines of a JSONL file (1-based line)."""
    if not _is_json_document(path):
        yield from iter_jsonl(path)
        return
    document = load_json(path)
    if isinstance(document, list):
        yield from enumerate(document, 1)
    else:
        yield 1, document


# --------------------------------------------------------------------------------------------- Parquet

_PARQUET_MAGIC = b"PAR1"
#: rows a Parquet file is read in at a time (Arrow record batches): a Mooncake row with ``messages`` can hold a long
#: chat, so a batch is kept small.
PARQUET_BATCH_ROWS = 256


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is an Apache Parquet file: it starts with the format's magic bytes ``PAR1`` (Parquet's
    file layout: ``PAR1``, the column chunks, the footer, ``PAR1``)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _PARQUET_MAGIC
    except OSError:
        return False


def iter_parquet(path: Path) -> Generator[tuple[int, dict[str, Any]], None, None]:
    """``(row_no, row)`` of each row of a Parquet file (1-based), read through pyarrow a record batch at a time
    (``pyarrow.parquet.ParquetFile.iter_batches``): each row as a dict of its columns' Python values (lists, nested
    dicts). A null column, or a null field of a struct (Parquet gives every value of a struct column the union of
    the fields its values have), is left out, as a JSON record leaves out a field it does not have. An Arrow
    ``timestamp`` is a :class:`datetime.datetime` (naive without a time zone), a ``duration`` a
    :class:`datetime.timedelta` (:func:`optional_seconds` reads both), both to the microsecond: a nanosecond
    value's nanoseconds below a whole microsecond are dropped (Python's types hold microseconds).

    Raises:
        BadInputError: at ``path:row``, a file pyarrow cannot read there (not Parquet, corrupt, cut short), or a
            value Python cannot hold (a timestamp outside the years 1 to 9999, a duration of 1e9 days or more),
            naming its column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_no = 0
    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        coarse = pa.schema([f.with_type(_microsecond_type(f.type)) for f in schema])
        cast = None if coarse.equals(schema) else coarse
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in _batch_rows(batch if cast is None else batch.cast(cast, safe=False), path, row_no):
                row_no += 1
                yield row_no, _without_nulls(row)
    except (pa.ArrowException, OSError) as exc:
        raise BadInputError(f"cannot read Parquet past row {row_no} ({type(exc).__name__}: {exc})" if row_no else
                            f"cannot read Parquet ({type(exc).__name__}: {exc})", path=str(path),
                            line=row_no + 1) from None


def _microsecond_type(t: Any) -> Any:
    """Arrow type ``t`` with every nanosecond ``timestamp`` (its time zone kept) and ``duration`` in it, at any depth
    of structs and lists, in microseconds instead: the values Python's :mod:`datetime` types can hold."""
    import pyarrow as pa

    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    if pa.types.is_duration(t) and t.unit == "ns":
        return pa.duration("us")
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_microsecond_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = t.value_field.with_type(_microsecond_type(t.value_type))
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    return t


def _batch_rows(batch: Any, path: Path, before: int) -> list[dict[str, Any]]:
    """A record batch's rows as Python dicts (``before``: rows of the file ahead of it).

    Raises:
        BadInputError: at ``path:row``, the first value Python cannot hold (a timestamp outside the years 1 to
            9999, a duration of 1e9 days or more, a nanosecond value nested where :func:`_microsecond_type` does
            not reach), naming its column and type, in words (:func:`_beyond`).
    """
    try:
        return batch.to_pylist()
    except (ValueError, OverflowError) as exc:
        for i in range(batch.num_rows):
            for name, column in zip(batch.schema.names, batch.columns):
                try:
                    column.slice(i, 1).to_pylist()
                except (ValueError, OverflowError) as cell:
                    raise BadInputError(f"cannot read column {name} ({column.type}): {_beyond(column.type, cell)}",
                                        path=str(path), line=before + i + 1) from None
        raise BadInputError(f"cannot read Parquet past row {before} ({type(exc).__name__}: {exc})",
                            path=str(path), line=before + 1) from None


def _beyond(t: Any, error: Exception) -> str:
    """A value of Arrow type ``t`` that Python cannot hold, in words, with pyarrow's or Python's own (``error``:
    "date value out of range", "Python int too large to convert to C int") in brackets; those alone for a type
    other than a timestamp or a duration."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return f"a timestamp outside the years 1 to 9999, the range a Python datetime holds ({error})"
    if pa.types.is_duration(t):
        return f"a duration of 1e9 days or more either way, past what a Python timedelta holds ({error})"
    return str(error)


def _without_nulls(value: Any) -> Any:
    """``value`` with every dict's null entries left out, at every depth (list elements kept as they are)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def parquet_columns(path: Path) -> list[str]:
    """The column names of a Parquet file's schema (its footer; no row is read).

    Raises:
        BadInputError: a file pyarrow cannot read as Parquet.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise BadInputError(f"cannot read Parquet ({type(exc).__name__}: {exc})", path=str(path), line=1) from None


def parquet_time_types(path: Path) -> dict[str, str]:
    """The Arrow type, in Arrow's words (``"timestamp[ms]"``, ``"timestamp[us, tz=UTC]"``, ``"duration[ms]"``), of
    each top-level column of a Parquet file's schema that is a ``timestamp`` or a ``duration``: a column whose values
    carry their own unit (:func:`optional_seconds`), by name. Reads the footer only.

    Raises:
        BadInputError: a file pyarrow cannot read as Parquet.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(path).schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise BadInputError(f"cannot read Parquet ({type(exc).__name__}: {exc})", path=str(path), line=1) from None
    return {f.name: str(f.type) for f in schema if pa.types.is_timestamp(f.type) or pa.types.is_duration(f.type)}


def iter_rows(path: Path, invalid: list[BadInputError] | None = None) -> Iterator[tuple[int, Any]]:
    """``(number, record)`` of each record of a row-per-request file: a Parquet file's rows (:func:`iter_parquet`,
    numbered from 1) or a JSONL file's lines (:func:`iter_jsonl`, ``invalid`` as there).

    Raises:
        BadInputError: as :func:`iter_parquet` or :func:`iter_jsonl`.
    """
    if is_parquet(path):
        yield from iter_parquet(path)
    else:
        yield from iter_jsonl(path, invalid)
