"""SWE-agent trajectories (``.traj``): one request per assistant message (an LLM call)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.traces.chat import _chat_requests, _MessageError
from kvcli.traces.records import (
    _load_json,
    _stem_and_suffix,
)
from kvcli.traces.request import Request, TokenizerArg


def read_swe_agent(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a SWE-agent ``.traj`` file: one per assistant message (an LLM call)."""
    tok = get_tokenizer(tokenizer)
    document = _load_json(path)
    history = document.get("history") if isinstance(document, dict) else None
    if not isinstance(history, list):
        raise BadInputError("a swe-agent trajectory must be a JSON object with a 'history' list of messages",
                            path=str(path))
    stem = _stem_and_suffix(path)[0]
    try:
        requests = _chat_requests(history, tok, stem, str(path), per_agent=True)
    except _MessageError as err:
        raise BadInputError(f"history[{err.index}]: {err.reason}", path=str(path), line=err.index + 1) from None
    yield from requests
