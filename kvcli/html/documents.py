"""kvcli's JSON documents read for a page: each a ``--json`` output (``schema_version``, ``command``,
``provenance``, then the command's body), checked enough that a file that is no such document is one line naming
it."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.units import SCHEMA_VERSION


@dataclass(frozen=True)
class Document:
    """One document. ``name``: where it came from (the file as given; errors and the page name it). ``kind``: its
    ``command`` ("replay", "explain", "route", ...). ``body``: the whole document."""

    name: str
    kind: str
    body: dict


def read_document(path: str | Path) -> Document:
    """The kvcli document in ``path`` (a file a command's ``--json`` wrote; ``-``: stdin, named ``<stdin>``).

    Raises:
        BadInputError: naming the file: missing or unreadable, not JSON, or JSON that is no kvcli document.
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInputError("no such file", path=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read it: {getattr(exc, 'strerror', None) or exc}", path=name) from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"not a kvcli JSON document: not JSON ({exc.msg} at line {exc.lineno})",
                            path=name) from None
    return as_document(body, name)


def as_document(body: object, name: str) -> Document:
    """``body`` (a parsed document) as a :class:`Document` named ``name``.

    Raises:
        BadInputError: naming ``name``: not a JSON object with ``schema_version`` and ``command``, or another schema
            version than this kvcli's.
    """
    if not isinstance(body, dict) or not isinstance(body.get("command"), str) or "schema_version" not in body:
        raise BadInputError('not a kvcli JSON document (no "schema_version" and "command"): write one with a '
                            "command's --json", path=name)
    if body["schema_version"] != SCHEMA_VERSION:
        raise BadInputError(f"schema_version {body['schema_version']!r}: this kvcli reads version {SCHEMA_VERSION}",
                            path=name)
    return Document(name, body["command"], body)
