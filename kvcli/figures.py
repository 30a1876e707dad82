"""Where figures go: the ``--plot`` file check and one file per trace, for every command that draws
(``replay --plot``: :mod:`kvcli.replay.curvereport`; ``route --plot``: :mod:`kvcli.route.report`).

Standard library only; matplotlib is imported by the modules that draw, when they draw."""
from __future__ import annotations

from pathlib import Path

from kvcli.errors import BadInputError

SUFFIXES = (".png", ".svg")


def check_plot_path(path: str | Path | None) -> None:
    """Raise BadInputError unless ``path`` is None or ends in ``.png`` or ``.svg`` (checked before any work)."""
    if path is not None and Path(path).suffix.lower() not in SUFFIXES:
        raise BadInputError(f"--plot must end in .png or .svg, got {Path(path).name!r}")


def plot_paths(path: str | Path, traces: list[str]) -> list[Path]:
    """One figure per trace: ``path`` itself for one trace, else ``{stem}-{trace stem}{suffix}`` beside it (the
    trace's file name up to its first dot: ``plot-chat.png`` for ``chat.jsonl.gz``)."""
    path = Path(path)
    if len(traces) == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{Path(t).name.split('.')[0]}{path.suffix}") for t in traces]
