"""A document's provenance as the page shows it: the command line, kvcli's version, when it ran and for how long,
and the host (``provenance`` in every kvcli JSON document, :mod:`kvcli.provenance`)."""
from __future__ import annotations

import shlex

from kvcli.html.blocks import Facts
from kvcli.html.numbers import NA, seconds, size


def provenance_facts(body: dict, first: list[tuple[str, str]] | None = None) -> Facts:
    """``first`` (what the view says about the run), then the provenance's facts."""
    p = body.get("provenance") or {}
    host = p.get("host") or {}
    line = p.get("command_line")
    gpus = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in host.get("gpus") or ())
    libraries = ", ".join(f"{k} {v}" for k, v in (host.get("libraries") or {}).items() if v)
    pairs = [*(first or []),
             ("command", _command(line) if isinstance(line, list) else str(line or NA)),
             ("kvcli", f"{p.get('kvcli_version', NA)}, started {p.get('started_at', NA)}, ran "
                       f"{seconds(p.get('elapsed_seconds'))}"),
             ("host", f"{host.get('cpu', NA)}, {host.get('usable_cores', host.get('cores', NA))} cores, "
                      f"{size(host.get('memory_bytes'))} RAM, GPUs: {gpus or 'none'}"),
             ("software", f"Python {host.get('python', NA)}; {libraries or NA}")]
    return Facts(tuple(pairs), "the run")


def _command(line: list) -> str:
    """The command line as a shell would take it, the program as ``kvcli``."""
    words = [str(w) for w in line]
    if words and (words[0].endswith("__main__.py") or words[0].endswith("/kvcli") or words[0] == "kvcli"):
        words[0] = "kvcli"
    return shlex.join(words)
