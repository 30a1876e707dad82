"""Where figures go: the ``--plot`` file check, one file per trace, and the one way a figure is written, for every
command that draws (``replay --plot``: :mod:`kvcli.replay.curvereport`; ``route --plot``: :mod:`kvcli.route.report`).

Standard library only; matplotlib is imported by the modules that draw, when they draw."""
from __future__ import annotations

from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.outfile import check_output, write_output

SUFFIXES = (".png", ".svg")


def check_plot_path(path: str | Path | None) -> None:
    """Raise BadInputError unless ``path`` is None or ends in ``.png`` or ``.svg`` and can be written
    (:func:`kvcli.outfile.check_output`: a folder that exists and is writable, not a directory); checked before
    any work."""
    if path is None:
        return
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise BadInputError(f"--plot must end in .png or .svg, got {path.name!r}")
    check_output(path, "--plot")


def save_figure(fig, path: str | Path, **savefig) -> None:
    """Write matplotlib figure ``fig`` to ``path`` in the format its suffix names, by
    :func:`kvcli.outfile.write_output` (a full disk leaves the old file, not a 0-byte one); ``savefig``: more
    arguments of ``Figure.savefig`` (dpi, bbox_inches, ...).

    Raises:
        BadInputError: ``path`` cannot be written (naming ``--plot``).
    """
    with write_output(path, "--plot", binary=True) as f:
        fig.savefig(f, format=Path(path).suffix.lower().lstrip("."), **savefig)


def plot_paths(path: str | Path, traces: list[str]) -> list[Path]:
    """One figure per trace: ``path`` itself for one trace, else ``{stem}-{trace stem}{suffix}`` beside it (the
    trace's file name up to its first dot: ``plot-chat.png`` for ``chat.jsonl.gz``); a name already given to an
    earlier trace (two ``x.jsonl`` in different folders, or one trace given twice) gets ``-2``, ``-3``, ... after
    the trace stem, so that no figure overwrites another."""
    path = Path(path)
    if len(traces) == 1:
        return [path]
    out: list[Path] = []
    taken: set[str] = set()
    for trace in traces:
        stem, n = f"{path.stem}-{Path(trace).name.split('.')[0]}", 1
        name = stem
        while name in taken:
            n += 1
            name = f"{stem}-{n}"
        taken.add(name)
        out.append(path.with_name(name + path.suffix))
    return out
