"""The tokenizer interface the trace readers use, and OpenAI-style chat message checks.

Two backends implement :class:`Tokenizer`: tiktoken encodings with kvcli's ChatML template
(:mod:`kvcli.model.tokenize`) and a Hugging Face checkpoint's own tokenizer and chat template
(:mod:`kvcli.model.hf_tokenizer`). :func:`kvcli.model.tokenize.get_tokenizer` picks one by name.

Token ids are always a 1-D little-endian ``uint32`` array (``'<u4'``, :data:`TOKEN_DTYPE`).
"""
from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from kvcli.errors import BadInputError, json_type

TOKEN_DTYPE = np.dtype("<u4")
_JSON_KW: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False}


class Conversation(ABC):
    """A conversation read message by message (one per trace conversation; mutated by :meth:`append`).

    :meth:`prompt` gives the token ids a serving engine prefills to answer the conversation as it stands: the
    messages appended so far under the chat template, plus the generation prompt.
    """

    @abstractmethod
    def append(self, message: dict) -> None:
        """Add one message at the end. Raises BadInputError for an invalid message (nothing is added)."""

    @abstractmethod
    def prompt(self) -> np.ndarray:
        """``[tokens]`` ``'<u4'`` ids of every message so far plus the generation prompt (a fresh array).

        Raises:
            BadInputError: the chat template refuses the conversation (e.g. roles that must alternate).
        """


class Tokenizer(ABC):
    """Text and chat messages to token ids. Get one with :func:`kvcli.model.tokenize.get_tokenizer`.

    Attributes:
        name: the tokenizer's identity, part of every chunk hash's root: ``"cl100k_base"`` for tiktoken,
            ``"hf-tokenizer@<16 hex digits>"`` (a digest of the vocabulary) for a Hugging Face tokenizer.
        n_vocab: vocabulary size, special tokens included.
    """

    name: str
    n_vocab: int
    #: whether :meth:`encode_prompt` adds the tokenizer's special tokens by default (``--no-special-tokens``:
    #: a copy made by :meth:`with_special_tokens`); part of neither the name nor the chunk hashes
    add_special_tokens: bool = True

    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as a piece of a message: no special tokens added (no BOS).

        Returns:
            ``[tokens]`` ``'<u4'`` array (a fresh array; empty for ``""``).
        """

    def encode_prompt(self, text: str, add_special_tokens: bool | None = None) -> np.ndarray:
        """Token ids of a whole completion prompt as a serving engine tokenizes it (vLLM's ``/v1/completions``:
        the tokenizer's own special tokens added, e.g. a BOS, unless the request's ``add_special_tokens`` is false;
        None: :attr:`add_special_tokens`). Default: :meth:`encode` (no special tokens to add)."""
        return self.encode(text)

    @property
    def prompt_bos_id(self) -> int | None:
        """The token id :meth:`encode_prompt` puts in front of every prompt when it adds special tokens (a BOS),
        or None when it adds none."""
        return None

    def with_special_tokens(self, add: bool) -> Tokenizer:
        """This tokenizer, with :meth:`encode_prompt` adding special tokens by default or not (a shallow copy when
        that changes; the same name)."""
        if add == self.add_special_tokens:
            return self
        other = copy.copy(self)
        other.add_special_tokens = add
        return other

    @abstractmethod
    def decode(self, token_ids) -> str:
        """Text of ``token_ids``; for display and debugging."""

    @abstractmethod
    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list | None = None) -> np.ndarray:
        """Token ids of a conversation under this tokenizer's chat template.

        Args:
            messages: OpenAI-style messages, in order.
            add_generation_prompt: append the prompt of the next assistant turn.
            tools: an OpenAI request's ``tools`` (function definitions), part of the prompt prefix: a Hugging Face
                template renders them itself; kvcli's ChatML renders :func:`with_tools`. None or ``[]``: none.

        Returns:
            ``[tokens]`` ``'<u4'`` array.

        Raises:
            BadInputError: ``messages`` is not a list of valid messages, or the template refuses it.
        """

    @abstractmethod
    def conversation(self) -> Conversation:
        """An empty :class:`Conversation` under this tokenizer's chat template."""


def tools_message(tools: Any) -> dict | None:
    """The system message kvcli's own rendering gives a request's tools: ``"Tools available:\\n"`` then the
    tools as text (a string as given, as glaive's ``tools`` field holds it; anything else its JSON,
    ``json.dumps(tools, ensure_ascii=False)``, keys in their given order); None for no tools (None, ``""``, ``[]``,
    ``"[]"``)."""
    if not tools:
        return None
    text = tools if isinstance(tools, str) else json.dumps(tools, ensure_ascii=False)
    if text.strip() in ("", "[]"):
        return None
    return {"role": "system", "content": "Tools available:\n" + text}


def with_tools(messages: list[dict], tools: Any) -> list[dict]:
    """``messages`` with :func:`tools_message` inserted after a leading system message (first when there is
    none), so a shared system prompt stays a shared prefix; ``messages`` itself when there are no tools."""
    extra = tools_message(tools)
    if extra is None:
        return messages
    at = 1 if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    return [*messages[:at], extra, *messages[at:]]


def check_tools(tools: Any) -> list | None:
    """An OpenAI request's ``tools``: a list of objects (None when absent or null).

    Raises:
        BadInputError: not a list, or an element that is not an object (its index is named).
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadInputError(f"tools must be a list of tool objects, not {json_type(tools)}")
    bad = next((i for i, t in enumerate(tools) if not isinstance(t, dict)), None)
    if bad is not None:
        raise BadInputError(f"tools[{bad}] must be an object like {{'type': 'function', 'function': ...}}, "
                            f"not {json_type(tools[bad])}")
    return tools


def check_messages(messages: Any) -> list[dict]:
    """``messages`` itself when it is a list of messages each with a valid role (see :func:`message_role`).

    Raises:
        BadInputError: not a list, or a bad message (its 1-based position is named).
    """
    if not isinstance(messages, list):
        raise BadInputError(f"messages must be a list of message objects, not {json_type(messages)}")
    for i, message in enumerate(messages):
        try:
            message_role(message)
        except BadInputError as err:
            raise BadInputError(f"message {i + 1}: {err.reason}") from None
    return messages


def message_role(message: Any) -> str:
    """The ``role`` of a message.

    Raises:
        BadInputError: ``message`` is not a dict, or its role is missing or not a non-empty string.
    """
    if not isinstance(message, dict):
        raise BadInputError(f"a message must be an object with role and content, not {json_type(message)}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise BadInputError(f"a message needs a non-empty string 'role', got {role!r}")
    return role


def message_text(message: dict) -> str:
    """The text a message renders to between its header and footer (content, then tool calls as JSON).

    * ``content`` when it is a string; ``""`` when it is missing or ``null``;
    * for OpenAI content parts (a list), the ``text`` of each ``{"type": "text", "text": ...}`` part joined with
      ``"\\n"``; any other part renders as its compact JSON (``json.dumps(part, sort_keys=True,
      separators=(",", ":"), ensure_ascii=False)``), so equal parts give equal tokens;
    * then, when the message has ``tool_calls`` (or the legacy ``function_call``), their JSON text (same
      settings), after a ``"\\n"`` when the text so far is not empty.

    Raises:
        BadInputError: ``content`` is neither a string, null, nor a list of content parts.
    """
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(part_text(p) for p in content)
    else:
        raise BadInputError(f"message content must be a string, null or a list of parts, "
                            f"not {json_type(content)}")
    calls = message.get("tool_calls") or message.get("function_call")
    if calls:
        text = f"{text}\n{json.dumps(calls, **_JSON_KW)}" if text else json.dumps(calls, **_JSON_KW)
    return text


def part_text(part: Any) -> str:
    """The text of one content part: a string as is, a ``text`` part's text, anything else its compact JSON."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            return part["text"]
        return json.dumps(part, **_JSON_KW)
    raise BadInputError(f"a content part must be an object like {{'type': 'text', 'text': ...}}, "
                        f"not {json_type(part)}")
