"""SemiAnalysis's Claude-Code session traces (Hugging Face ``semianalysisai/cc-traces-*``, e.g.
``cc-traces-weka-061526``): one row per session, ``{"id", "models", "block_size": 64, "hash_id_scope": "local",
"requests": [{"t", "model", "in", "out", "hash_ids", "api_time", ...}, ...]}``, read from its dataset card and
viewer (no file of it is on this machine).

Each element of ``requests`` is one request: ``in`` prompt tokens, ``out`` output tokens, ``t`` seconds from the
session's start (``--timestamp-unit`` overrides), ``hash_ids`` blocks of ``block_size`` tokens (64;
``--hash-block-tokens`` when a row has none). ``hash_id_scope: "local"`` (the default) means ids are numbered per
session: id 3 of one session is not id 3 of another, so each ``(session, id)`` pair gets its own key and ids of
different sessions never collide; ``"global"`` shares ids across sessions (one key per global id, numbered from the
same counter as the sessions' own, so a global id never meets a session-private key). The session is the row's ``id``; a
request's id is ``"<session>:<k>"`` (k = 1-based position). Rows are JSONL lines (or a JSON list of rows).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvcli.errors import BadInputError, json_type
from kvcli.traces.hashids import HASH_ID_FORMATS, BlockIds, TraceFormat, time_divisor
from kvcli.traces.records import (
    iter_records,
    located,
    optional_count,
    optional_id,
    optional_seconds,
    require_object,
    shorten,
)
from kvcli.traces.request import BlockKeys, HashIdRequest, Outline, Request, TokenizerArg

SCHEMA = HASH_ID_FORMATS["claude-code"]


class _Scoped:
    """Scoped ids -> dense keys 0, 1, 2, ... in order of first appearance (one dict entry per distinct
    ``(session, id)``; ``session`` None for the ids of ``"global"`` rows, shared by every such row)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str | None, int], int] = {}

    def keys(self, session: str | None, hash_ids: Any) -> Any:
        if not isinstance(hash_ids, list):
            return hash_ids  # BlockIds.keys names the problem
        out = []
        for i, h in enumerate(hash_ids):
            if type(h) is not int or h < 0:
                raise BadInputError(f"hash_ids[{i}] = {shorten(h)} is not an integer >= 0")
            out.append(self._keys.setdefault((session, h), len(self._keys)))
        return out


def _iter(path: Path, fmt: TraceFormat, synthesize: bool, skipped: list[BadInputError] | None = None
          ) -> Iterator[Request | Outline]:
    blocks, scoped = BlockIds(fmt), _Scoped()
    divisor = time_divisor(fmt, SCHEMA)
    for row_no, row in iter_records(path):
        try:
            row = require_object(row)
            session = optional_id(row, "id") or f"{path.name}#{row_no}"
            requests = row.get("requests")
            if not isinstance(requests, list):
                raise BadInputError(f"a claude-code row needs requests (a list), got {json_type(requests)}")
            block_tokens = blocks.block_tokens(row.get("block_size"), SCHEMA)
            scope = row.get("hash_id_scope", "local")
            if scope not in ("local", "global"):
                raise BadInputError(f"hash_id_scope must be 'local' or 'global', got {shorten(scope)}")
        except BadInputError as err:
            if fmt.skip_bad_records:
                if skipped is not None:
                    skipped.append(located(err, path, row_no))
                continue
            raise located(err, path, row_no) from None
        for k, item in enumerate(requests, 1):
            try:
                item = require_object(item)
                length = optional_count(item.get("in"), "in")
                if length is None:
                    raise BadInputError("a claude-code request needs in (prompt tokens, an integer >= 0)")
                ids = scoped.keys(session if scope == "local" else None, item.get("hash_ids"))
                keys = blocks.keys(ids, length, block_tokens)
                t = optional_seconds(item.get("t"), "t", divisor=divisor)
                out = optional_count(item.get("out"), "out")
            except BadInputError as err:
                located_err = BadInputError(f"requests[{k - 1}]: {err.reason}", path=str(path), line=row_no)
                if fmt.skip_bad_records:
                    if skipped is not None:
                        skipped.append(located_err)
                    continue
                raise located_err from None
            if synthesize:
                yield HashIdRequest(id=f"{session}:{k}", blocks=BlockKeys(keys, block_tokens, length),
                                    timestamp=t, session_id=session, output_length=out, source=f"{path}:{row_no}")
            else:
                yield Outline(length, t)


def read_claude_code(path: Path, tokenizer: TokenizerArg, fmt: TraceFormat) -> Iterator[Request]:
    """Requests of a Claude-Code session trace (module docstring), token ids synthesized per (scoped) id when
    first read (:class:`~kvcli.traces.request.HashIdRequest`).
    ``tokenizer`` is not used.

    Raises:
        BadInputError: at ``path:row``, while iterating, a malformed row or request (unless skipped).
    """
    del tokenizer
    for r in _iter(path, fmt, True):
        assert isinstance(r, Request)
        yield r


def outline_claude_code(path: Path, fmt: TraceFormat, skipped: list[BadInputError] | None = None
                        ) -> Iterator[Outline]:
    """Each request's prompt length and time, checked as :func:`read_claude_code` checks it, no token ids; with
    ``fmt.skip_bad_records``, each skipped row or request's error is appended to ``skipped``."""
    for r in _iter(path, fmt, False, skipped):
        assert isinstance(r, Outline)
        yield r
