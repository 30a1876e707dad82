"""ShareGPT conversations (and glaive tool-use): one request per assistant turn."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvcli.errors import BadInputError, json_type
from kvcli.model.tokenize import DEFAULT_TOKENIZER, get_tokenizer
from kvcli.model.tokenizer_base import message_text, tools_message
from kvcli.traces.chat import chat_requests
from kvcli.traces.records import (
    iter_records,
    located,
    optional_id,
    require_object,
    shorten,
)
from kvcli.traces.request import Request, TokenizerArg

_SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool", "tool": "tool",
}


def read_sharegpt(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a ShareGPT file (JSON list, one object, or JSONL): one per assistant turn."""
    tok = get_tokenizer(tokenizer)
    for record_no, record in iter_records(path):
        try:
            session_id, messages = _sharegpt_conversation(record, path, record_no)
            requests = chat_requests(messages, tok, session_id, f"{path}:{record_no}")
        except BadInputError as err:
            raise located(err, path, record_no) from None
        yield from requests


def _sharegpt_conversation(record: Any, path: Path, record_no: int) -> tuple[str, list[dict]]:
    """``(session_id, messages)`` of one ShareGPT conversation, roles mapped to chat roles."""
    record = require_object(record)
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise BadInputError("a sharegpt record needs 'conversations', a list of {from, value} turns")
    session_id = (optional_id(record, "id") or optional_id(record, "conversation_id")
                  or f"{path.name}#{record_no}")
    messages: list[dict] = []
    system, tools = record.get("system"), record.get("tools")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    tools_turn = tools_message(tools)  # the rendering of every request's tools with kvcli's own template
    if tools_turn is not None:
        messages.append(tools_turn)
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadInputError(f"conversations[{i}] must be an object with from and value")
        speaker, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise BadInputError(f"conversations[{i}].from = {shorten(speaker)} is not one of "
                                f"{', '.join(_SHAREGPT_ROLES)}")
        message = {"role": role, "content": value}
        if not isinstance(value, (str, list)):
            raise BadInputError(f"conversations[{i}].value must be a string or a list of content parts, "
                                f"not {json_type(value)}")
        try:
            message_text(message)  # content parts are joined as in any chat message: checked here, where named
        except BadInputError as err:
            raise BadInputError(f"conversations[{i}].value: {err.reason}") from None
        messages.append(message)
    return session_id, messages
