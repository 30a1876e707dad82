"""Chat histories to requests: one request per assistant message, its prompt every earlier message."""
from __future__ import annotations

from typing import Any

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.tokenize import Tokenizer, message_role, message_text
from kvcli.traces.request import Request


class _MessageError(Exception):
    """A bad message at ``index`` of a message list (internal; turned into a located BadInputError)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


def _chat_requests(messages: list, tok: Tokenizer, session_id: str, source: str,
                   per_agent: bool = False) -> list[Request]:
    """One request per assistant message: prompt = the earlier messages + generation prompt.

    Each message is encoded once (header, text, footer separately), so prompts are exact token prefixes of
    later prompts. With ``per_agent`` the history is kept per ``message["agent"]`` (SWE-agent), and messages
    with ``is_demo`` are context only. ``source`` gets ``:<index + 1>`` appended when ``per_agent``.

    Raises:
        BadInputError (plain lists) / _MessageError (``per_agent``): a bad message.
    """
    histories: dict[Any, list[np.ndarray]] = {}
    requests = []
    for index, message in enumerate(messages):
        try:
            role, text_ids = message_role(message), tok.encode(message_text(message))
        except BadInputError as err:
            if per_agent:
                raise _MessageError(index, err.reason) from None
            raise BadInputError(f"message {index + 1}: {err.reason}") from None
        history = histories.setdefault(message.get("agent") if per_agent else None, [])
        if role == "assistant" and not (per_agent and message.get("is_demo")):
            k = len(requests) + 1
            requests.append(Request(
                id=f"{session_id}:{k}",
                token_ids=np.concatenate(history + [tok.generation_prompt]),
                session_id=session_id,
                output_length=len(text_ids),
                source=f"{source}:{index + 1}" if per_agent else source,
            ))
        history.append(np.concatenate((tok.header(role), text_ids, tok.footer)))
    return requests
