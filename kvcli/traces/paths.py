"""Which files a command reads: paths as given, and a directory's trace files."""
from __future__ import annotations

from pathlib import Path

from kvcli.errors import BadInputError

_NOT_TRACES = (".md", ".txt", ".py", ".sh", ".csv", ".png", ".svg")


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files as given; a directory contributes its trace files (sorted; notes, scripts and plots skipped).

    Raises:
        BadInputError: a path does not exist, or a directory holds no trace file.
    """
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                           and p.suffix.lower() not in _NOT_TRACES)
            if not found:
                raise BadInputError("directory holds no trace files", path=str(path))
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            raise BadInputError("no such file", path=str(path))
    return out
