"""Chat histories to requests: one request per assistant message, its prompt every earlier message."""
from __future__ import annotations

from typing import Any

from kvcli.errors import BadInputError
from kvcli.model.tokenizer_base import Conversation, Tokenizer, message_role, message_text
from kvcli.traces.request import ChatPrompt, Request


class MessageError(Exception):
    """A bad message at ``index`` of a message list (internal; turned into a located BadInputError)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


def chat_requests(messages: list, tok: Tokenizer, session_id: str, source: str,
                   per_agent: bool = False) -> list[Request]:
    """One request per assistant message: prompt = the earlier messages under the chat template + generation
    prompt (:meth:`Conversation.prompt`).

    With the tiktoken backend each message is encoded once (header, text, footer separately), so prompts are
    exact token prefixes of later prompts. With a Hugging Face template each prompt renders its whole message
    prefix, as the serving engine does; whether turn k's prompt is a prefix of turn k+1's is then the template's
    doing (:mod:`kvcli.model.hf_tokenizer`). With ``per_agent`` the history is kept per ``message["agent"]``
    (SWE-agent), and messages with ``is_demo`` are context only. ``source`` gets ``:<index + 1>`` appended when
    ``per_agent``. ``output_length`` is the token count of the assistant message's text (no special tokens).

    Raises:
        BadInputError (plain lists) / MessageError (``per_agent``): a bad message, or one the template refuses.
    """
    conversations: dict[Any, Conversation] = {}
    histories: dict[Any, list[dict]] = {}  # the messages each conversation holds, for the requests' ChatPrompt
    requests: list[Request] = []
    for index, message in enumerate(messages):
        try:
            role = message_role(message)
            agent = message.get("agent") if per_agent else None
            conversation = conversations.get(agent)
            if conversation is None:
                conversation = conversations[agent] = tok.conversation()
                histories[agent] = []
            if role == "assistant" and not (per_agent and message.get("is_demo")):
                k = len(requests) + 1
                requests.append(Request(
                    id=f"{session_id}:{k}",
                    token_ids=conversation.prompt(),
                    session_id=session_id,
                    output_length=len(tok.encode(message_text(message))),
                    source=f"{source}:{index + 1}" if per_agent else source,
                    chat=ChatPrompt(list(histories[agent])),
                ))
            conversation.append(message)
            histories[agent].append(message)
        except BadInputError as err:
            if per_agent:
                raise MessageError(index, err.reason) from None
            raise BadInputError(f"message {index + 1}: {err.reason}") from None
    return requests
