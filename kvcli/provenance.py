"""Which kvcli made a JSON document, how, when and where: the ``provenance`` object every document carries, so two
saved reports can be compared honestly (same version? same machine? same command line?).

``{"kvcli_version", "command_line", "started_at", "elapsed_seconds", "host"}``: the command line is ``sys.argv``
(or what :func:`begin` was given) with every Redis password masked (:func:`kvcli.redact.mask_argv`);
``started_at`` is the UTC time the command began (ISO 8601, seconds), ``elapsed_seconds`` the wall time from
then to the document; ``host`` is :func:`host_facts`. The command line starts the clock (:func:`begin`); a
library caller that never calls it gets the time ``kvcli.provenance`` was first imported.

Standard library only: library versions come from installed package metadata, so reading them imports
neither torch nor redis. The device a model ran on is the command's own fact (replay's ``context.device``,
a profile's ``device``); ``host.gpus`` lists the NVIDIA GPUs the driver reports, whether used or not."""
from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from kvcli.redact import mask_argv
from kvcli.version import __version__

LIBRARIES = ("torch", "redis", "numpy", "xxhash", "transformers")  # distributions whose versions a document names

_clock: dict[str, float | tuple[str, ...] | None] = {"wall": time.time(), "mono": time.monotonic(), "argv": None}


def begin(argv: list[str] | tuple[str, ...] | None = None) -> None:
    """Start the command's clock now, for the command line ``argv`` (None: ``sys.argv``)."""
    _clock.update(wall=time.time(), mono=time.monotonic(), argv=tuple(argv) if argv is not None else None)


def elapsed_seconds() -> float:
    """Wall seconds since the command began (:func:`begin`)."""
    mono = _clock["mono"]
    assert isinstance(mono, float)
    return time.monotonic() - mono


def provenance() -> dict:
    """This command's provenance object (module docstring): JSON-ready, passwords masked."""
    wall, argv = _clock["wall"], _clock["argv"]
    assert isinstance(wall, float)
    started = datetime.fromtimestamp(wall, tz=timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    line = argv if isinstance(argv, tuple) else tuple(sys.argv)
    return {"kvcli_version": __version__, "command_line": mask_argv(line), "started_at": started,
            "elapsed_seconds": round(elapsed_seconds(), 3), "host": host_facts()}


def host_facts() -> dict:
    """JSON-ready facts of this machine: ``cpu`` (its model, :func:`cpu_model`), ``cores`` (``os.cpu_count``),
    ``usable_cores`` (those this process may run on), ``memory_bytes`` (RAM; 0 where unknown), ``gpus`` (NVIDIA
    GPU models the driver lists; ``[]`` without one), ``platform`` and ``python`` (versions), ``libraries``
    (each of :data:`LIBRARIES`' installed version, None where not installed)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "usable_cores": usable, "memory_bytes": ram_bytes(),
            "gpus": nvidia_gpus(), "platform": platform.platform(), "python": platform.python_version(),
            "libraries": {name: _version(name) for name in LIBRARIES}}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``; else ``platform.processor()``; else ``"unknown"``)."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or "unknown"


def ram_bytes() -> int:
    """The machine's physical memory in bytes (``sysconf``); 0 where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def nvidia_gpus() -> list[str]:
    """The model of each NVIDIA GPU the kernel driver lists (``/proc/driver/nvidia/gpus/*/information``,
    its ``Model:`` line), in bus order; ``[]`` where there is no driver."""
    models = []
    with contextlib.suppress(OSError):
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    models.append(line.partition(":")[2].strip())
    return models


def _version(name: str) -> str | None:
    from importlib import metadata  # ~30 ms: only when a document is written, not for every command

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
