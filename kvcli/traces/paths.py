"""Which files a command reads: paths as given, a directory's trace files, and ``-`` (stdin, spooled to a file)."""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.traces.ragpulse import COMPONENT_FILES

NOT_TRACES = (".md", ".py", ".sh", ".png", ".svg")
TABLES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")  # read only as a gateway log, and only when named
STDIN_NAME = "<stdin>"
_SPOOLED: set[str] = set()
_COMPONENT_NAMES = frozenset(name for name, _ in COMPONENT_FILES)


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files as given; a directory contributes its trace files and ``.txt`` prompt files (sorted; hidden files,
    notes, scripts, CSV, plots and RAGPulse's component files, :data:`kvcli.traces.ragpulse.COMPONENT_FILES`,
    skipped: they are read beside their trace): every command reads the same files of a directory.

    Raises:
        BadInputError: a path does not exist, or a directory holds no prompt or trace file (the message says what
            it holds instead: :func:`skipped_note`).
    """
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                           and p.suffix.lower() not in NOT_TRACES and not _is_table(p)
                           and p.name not in _COMPONENT_NAMES)
            if not found:
                raise BadInputError(f"directory holds no prompt (.txt) or trace files: {skipped_note(path)}",
                                    path=str(path))
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            raise BadInputError("no such file", path=str(path))
    return out


def skipped_note(directory: Path) -> str:
    """What a directory without prompt or trace files holds instead, as :func:`expand_paths` skipped it: its CSV
    files (read only as a gateway log, so only when named), its subdirectories (not searched), then its other
    skipped files (hidden files, notes, scripts, plots); ``"it is empty"`` for an empty one."""
    entries = list(directory.iterdir())
    subdirectories = sum(p.is_dir() for p in entries)
    csv = sum(p.is_file() and _is_table(p) for p in entries)
    other = len(entries) - subdirectories - csv
    parts = []
    if csv:
        parts.append(f"{_count(csv, 'CSV or TSV file')} (kvcli reads CSV and TSV only as a gateway log, and only "
                     "when named: name the file)")
    if subdirectories:
        parts.append(f"{_count(subdirectories, 'subdirectory', 'subdirectories')} (kvcli does not search "
                     "subdirectories: name them)")
    if other:
        parts.append(f"{_count(other, 'other file')} skipped (hidden files, notes, scripts, plots)")
    if not parts:
        return "it is empty"
    return f"it holds {'only ' if len(parts) == 1 else ''}{'; '.join(parts)}"


def _is_table(path: Path) -> bool:
    """A CSV or TSV file (``.gz`` or not): :data:`TABLES`."""
    return path.name.lower().endswith(TABLES)


def _count(n: int, one: str, many: str | None = None) -> str:
    """``"1 thing"`` / ``"3 things"``."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def display_name(path: Path | str) -> str:
    """How a report names a trace file: its path, or ``<stdin>`` for stdin spooled by :func:`stdin_paths`."""
    return STDIN_NAME if str(path) in _SPOOLED else str(path)


@contextlib.contextmanager
def stdin_paths(paths: list[Path]) -> Iterator[list[Path]]:
    """``paths`` with ``-`` replaced by a temporary copy of stdin's bytes (the trace readers read regular files;
    gzip and every format work as for a file), removed on exit. Errors located in that copy name ``<stdin>``.

    Raises:
        BadInputError: ``-`` given more than once.
    """
    if sum(str(p) == "-" for p in paths) > 1:
        raise BadInputError("- (stdin) can be given once")
    if not any(str(p) == "-" for p in paths):
        yield paths
        return
    with tempfile.TemporaryDirectory(prefix="kvcli-stdin-") as tmp:
        spooled = Path(tmp) / "stdin"
        with open(spooled, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        _SPOOLED.add(str(spooled))
        try:
            yield [spooled if str(p) == "-" else p for p in paths]
        except BadInputError as exc:
            if exc.path and exc.path.startswith(str(spooled)):
                raise BadInputError(exc.reason.replace(str(spooled), STDIN_NAME), STDIN_NAME, exc.line) from None
            if str(spooled) in str(exc):  # the copy's path inside the message itself
                raise BadInputError(str(exc).replace(str(spooled), STDIN_NAME)) from None
            raise
        finally:
            _SPOOLED.discard(str(spooled))


def as_given(requests: Iterable, path: Path) -> Iterator:
    """``requests`` (:class:`~kvcli.traces.request.Request`) read from ``path``, their sources naming ``<stdin>``
    where ``path`` is stdin's copy (:func:`stdin_paths`); as they are for any other file."""
    if str(path) not in _SPOOLED:
        yield from requests
        return
    for r in requests:
        yield dataclasses.replace(r, source=r.source.replace(str(path), STDIN_NAME))


@contextlib.contextmanager
def stdin_path(path: Path) -> Iterator[Path]:
    """One path through :func:`stdin_paths`."""
    with stdin_paths([path]) as paths:
        yield paths[0]
