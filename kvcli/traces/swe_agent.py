"""SWE-agent trajectories (``.traj``): one request per assistant message (an LLM call)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.traces.chat import MessageError, chat_requests
from kvcli.traces.records import (
    load_json,
    stem_and_suffix,
)
from kvcli.traces.request import Request, TokenizerArg


def read_swe_agent(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a SWE-agent ``.traj`` file: one per assistant message (an LLM call)."""
    tok = get_tokenizer(tokenizer)
    document = load_json(path)
    history = document.get("history") if isinstance(document, dict) else None
    if not isinstance(history, list):
        raise BadInputError("a swe-agent trajectory must be a JSON object with a 'history' list of messages",
                            path=str(path))
    stem = stem_and_suffix(path)[0]
    try:
        requests = chat_requests(history, tok, stem, str(path), per_agent=True)
    except MessageError as err:
        raise BadInputError(f"history[{err.index}]: {err.reason}", path=str(path), line=err.index + 1) from None
    yield from requests
