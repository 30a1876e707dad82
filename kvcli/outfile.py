"""Files a user names for kvcli to write (``export --out`` and ``--id-map``, ``profile --out``, ``replay`` and
``route --plot``): one writer and one check for all of them. Standard library only.

What is written, by what the path names when the command starts (a symbolic link is followed: its target is
written by these rules and the link stays a link, pointing where it pointed):

* **a regular file, or nothing**: a temporary file is created beside it, exclusively, under a name of kvcli's own
  (``.NAME.kvcli-<16 hex>.tmp``: never a file of the user's), written, flushed to the disk (fsync), then renamed
  onto the path (:func:`os.replace`): a reader sees the old file or the whole new one, never part of one. The new
  file keeps the old one's permission bits (a new one gets 0666 less the umask); a hard link to the old file keeps
  the old contents. On any failure (a full disk, an error, Ctrl-C) kvcli's temporary file is removed and the old
  file is left as it was.
* **a FIFO or a character device** (``/dev/null``, a terminal): opened for writing in place, never created,
  replaced or removed (a FIFO's writer waits for its reader, as ``cat > fifo`` does).
* **a directory, a block device, a socket**: refused.

:func:`check_output` checks all of that before the command's work starts (the folder exists and is writable, an
existing file is writable), so a run is not thrown away on a name it cannot write; :func:`write_output` writes.
Errors are one line naming the option and the path (:class:`~kvcli.errors.BadInputError`, exit 2).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kvcli.errors import BadInputError

_TEMP_SUFFIX = ".tmp"


def check_output(path: str | Path, option: str) -> Path:
    """Check, before any work, that ``path`` can be written by :func:`write_output` (module docstring); returns
    the file that will be written (``path`` with symbolic links resolved). Writes nothing.

    Args:
        path: the path the user gave.
        option: the option that named it (``--out``), for the message.

    Raises:
        BadInputError: one line naming ``option`` and ``path``: a directory, a block device or a socket at the path;
            no folder to write it in; a folder or an existing file that is not writable (the permission bits, or a
            read-only file system); a path that cannot be examined (a symbolic link loop).
    """
    given, real = Path(path), Path(os.path.realpath(path))
    try:
        mode: int | None = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise BadInputError(f"{option} {given}: {exc.strerror or exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise BadInputError(f"{option} {given} is a directory; give a file name")
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise BadInputError(f"{option} {given} is a {_kind(mode)}: kvcli writes regular files, FIFOs and character "
                            "devices")
    if mode is None or stat.S_ISREG(mode):
        folder = real.parent
        if not folder.is_dir():
            raise BadInputError(f"{option} {given}: no folder {folder} to write it in")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise BadInputError(f"{option} {given}: the folder {folder} is not writable")
    if mode is not None and not os.access(real, os.W_OK):
        raise BadInputError(f"{option} {given}: not writable")
    return real


def _kind(mode: int) -> str:
    """What a file of ``mode`` that kvcli does not write is, in words."""
    return "block device" if stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"


@contextlib.contextmanager
def write_output(path: str | Path, option: str, binary: bool = False) -> Iterator[IO[Any]]:
    """An open file whose contents become ``path``'s when the block ends without an exception (module
    docstring): for a regular file or a missing path, kvcli's temporary file beside it, fsynced and renamed onto
    the path at the end; for a FIFO or a character device, the path itself opened for writing. When the block
    raises, the temporary file is removed, the path is left as it was, and the exception goes on.

    Args:
        path: the path the user gave (a symbolic link: its target is written).
        option: the option that named it, for messages.
        binary: a binary file (else UTF-8 text).

    Raises:
        BadInputError: as :func:`check_output`, or writing the file failed (``cannot write``, with the system's
            reason, e.g. "No space left on device"; an OSError from the block that names no file is taken as
            the write's), the old file kept.
    """
    real = check_output(path, option)
    mode, encoding = ("wb", None) if binary else ("w", "utf-8")
    try:
        existing: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        try:
            fd = os.open(real, os.O_WRONLY)  # in place: no O_CREAT, no O_TRUNC
            with open(fd, mode, encoding=encoding) as f:
                yield f
        except OSError as exc:
            raise _cannot_write(option, path, exc, kept=False) from None
        return
    fd, temp = _create_temp(real, option, path, None if existing is None else stat.S_IMODE(existing.st_mode))
    try:
        with open(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, real)
    except OSError as exc:
        raise _cannot_write(option, path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def _create_temp(real: Path, option: str, given: str | Path, keep_mode: int | None) -> tuple[int, Path]:
    """``(descriptor, path)`` of a new empty file beside ``real`` under a name no other file has (created with
    O_EXCL), with ``keep_mode``'s permission bits (None: 0666 less the umask)."""
    for _ in range(100):
        temp = real.with_name(f".{real.name}.kvcli-{secrets.token_hex(8)}{_TEMP_SUFFIX}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _cannot_write(option, given, exc) from None
        if keep_mode is not None:
            with contextlib.suppress(OSError):
                os.fchmod(fd, keep_mode)
        return fd, temp
    raise BadInputError(f"{option} {given}: cannot create a temporary file beside it")


def _cannot_write(option: str, path: str | Path, exc: OSError, kept: bool = True) -> OSError | BadInputError:
    """The one-line error of a failed write to ``path`` (``kept``: through a temporary file, so the old file is
    as it was); an OSError about another file (``exc.filename``: an input the block read) as it is."""
    name = exc.filename
    if isinstance(name, (str, bytes, os.PathLike)) and os.path.realpath(name) != os.path.realpath(path) \
            and ".kvcli-" not in os.path.basename(os.fsdecode(name)):
        return exc
    return BadInputError(f"{option} {path}: cannot write: {exc.strerror or exc}"
                         + ("; the file was left as it was" if kept else ""))
