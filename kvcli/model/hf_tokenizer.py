"""A Hugging Face tokenizer folder (a checkpoint's own tokenizer and chat template) behind kvcli's
:class:`~kvcli.model.tokenizer_base.Tokenizer` interface.

Rules, chosen to give the token ids a serving engine (vLLM, SGLang, TGI) prefills:

* ``messages`` render with the tokenizer's own chat template:
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``, after the message
  normalization vLLM applies before the template (``vllm/entrypoints/chat_utils.py``, "string" content format):
  only ``role``, ``content``, ``name``, ``tool_calls`` and ``tool_call_id`` are passed; content given as a list
  of parts becomes the text of its parts joined with ``"\\n"`` (other parts as compact JSON, as
  :func:`~kvcli.model.tokenizer_base.message_text` renders them); a tool call's ``arguments`` JSON string becomes
  an object (``{}`` when it is not a JSON object). A conversation the template refuses (many templates raise on
  roles that do not alternate) is a one-line BadInputError. No messages (e.g. a ShareGPT conversation that opens
  with the assistant) render to no tokens: an engine refuses an empty conversation, and replay skips the request.
* a ``prompt`` (completion) text is tokenized as vLLM's ``/v1/completions`` does: with the tokenizer's own
  special tokens added (e.g. a BOS), and special-token text in it recognized as special tokens.
* message pieces (``encode``, used for output lengths) get no special tokens added.

**Prefix sharing depends on the template.** A multi-turn trace's turn k+1 prompt is rendered from its whole
message prefix, exactly as the engine would; it starts with turn k's prompt only when the template renders the
answered assistant turn as a continuation of the generation prompt (true of ChatML-style templates such as
Qwen's and of Llama 3's; false of templates that drop earlier reasoning or move the system prompt). kvcli
measures whatever the template does; it never forces a prefix.

Identity: :attr:`HFTokenizer.name` is ``"hf-tokenizer@<16 hex>"``, the xxh3-64 of the tokenizer's full
serialized definition (``tokenizer.json`` as the ``tokenizers`` library writes it: vocabulary, merges,
normalizer, pre-tokenizer, post-processor, added tokens), so equal tokenizers in two folders share chunks and
two different ones never do. The chat template is not part of it: it changes token ids, which the chunk hashes
already cover.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvcli.errors import BadInputError
from kvcli.model.hf_offline import one_line, transformers
from kvcli.model.tokenizer_base import (
    TOKEN_DTYPE,
    Conversation,
    Tokenizer,
    check_messages,
    message_text,
    part_text,
)

#: files whose presence makes a folder a tokenizer folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: message keys an OpenAI-compatible engine passes on to the chat template.
_ENGINE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def has_tokenizer(path: str | Path) -> bool:
    """Whether folder ``path`` holds a tokenizer (one of :data:`TOKENIZER_FILES`)."""
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer loaded offline from a folder. Build it with :func:`load_hf_tokenizer`.

    Attributes:
        name: ``"hf-tokenizer@<digest>"`` (see the module docstring). n_vocab: ``len(tokenizer)``, added
        tokens included. path: the folder. chat_template: the template text, or None when the folder has none.
    """

    def __init__(self, tokenizer: Any, path: str) -> None:
        self._tok, self.path = tokenizer, path
        self.n_vocab = len(tokenizer)
        self.chat_template = tokenizer.chat_template
        self.name = f"hf-tokenizer@{_digest(tokenizer)}"

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r}, name={self.name!r}, n_vocab={self.n_vocab})"

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` with no special tokens added. Returns ``[tokens]`` ``'<u4'``."""
        return np.array(self._tok.encode(text, add_special_tokens=False), dtype=TOKEN_DTYPE)

    def encode_prompt(self, text: str, add_special_tokens: bool | None = None) -> np.ndarray:
        """Token ids of a completion prompt: the tokenizer's special tokens added (e.g. BOS), as vLLM does, unless
        ``add_special_tokens`` is False (None: :attr:`add_special_tokens`)."""
        add = self.add_special_tokens if add_special_tokens is None else add_special_tokens
        return np.array(self._tok.encode(text, add_special_tokens=add), dtype=TOKEN_DTYPE)

    @property
    def prompt_bos_id(self) -> int | None:
        """The BOS id the tokenizer puts in front of a prompt when it adds special tokens (Llama 3's
        ``<|begin_of_text|>``), or None (Qwen's tokenizers add none)."""
        bos = self._tok.bos_token_id
        head = self._tok.encode("", add_special_tokens=True)
        return bos if bos is not None and head[:1] == [bos] else None

    def decode(self, token_ids) -> str:
        """Text of ``token_ids`` (special tokens kept)."""
        return self._tok.decode([int(t) for t in token_ids])

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list | None = None) -> np.ndarray:
        """``apply_chat_template`` of the normalized messages (module docstring), with ``tools`` handed to the
        template as an OpenAI-compatible engine hands a request's tools (a template that does not use them renders
        none, as on the engine). Returns ``[tokens]`` ``'<u4'``; empty for no messages (an empty request, which
        replay skips: engines refuse an empty conversation).

        Raises:
            BadInputError: invalid messages; the folder has no chat template; the template refuses them.
        """
        engine_messages = [engine_message(m) for m in check_messages(messages)]
        if not engine_messages:  # transformers (and an OpenAI-compatible server) refuse an empty conversation
            return np.zeros(0, dtype=TOKEN_DTYPE)
        if self.chat_template is None:
            raise BadInputError(f"tokenizer {self.path} has no chat template, so it cannot render messages; use a "
                                f"checkpoint whose tokenizer_config.json or chat_template.jinja has one")
        try:
            ids = self._tok.apply_chat_template(engine_messages, tools=tools or None, tokenize=True,
                                                add_generation_prompt=add_generation_prompt, return_dict=False)
        except Exception as exc:  # jinja2's TemplateError from raise_exception(), or a template bug
            raise BadInputError(f"the chat template of {self.path} refuses these messages: {one_line(exc)}") \
                from None
        return np.array(ids, dtype=TOKEN_DTYPE)

    def conversation(self) -> Conversation:
        """An empty conversation: each prompt renders the whole message prefix with the template."""
        return _TemplateConversation(self)


class _TemplateConversation(Conversation):
    def __init__(self, tok: HFTokenizer) -> None:
        self._tok = tok
        self._messages: list[dict] = []

    def append(self, message: dict) -> None:
        message_text(check_messages([message])[0])  # validates content as the tiktoken backend does
        self._messages.append(message)

    def prompt(self) -> np.ndarray:
        return self._tok.encode_chat(self._messages, add_generation_prompt=True)


def engine_message(message: dict) -> dict:
    """The message as an OpenAI-compatible engine hands it to the chat template (module docstring); a new dict,
    ``message`` is not modified."""
    out = {k: message[k] for k in _ENGINE_KEYS if k in message}
    if isinstance(out.get("content"), list):
        out["content"] = "\n".join(part_text(p) for p in out["content"])
    calls = out.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_parsed_call(c) for c in calls]
    elif isinstance(calls, list):  # an empty list: the template's plain assistant path, as vLLM does
        del out["tool_calls"]
    return out


def _parsed_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else {}
        except json.JSONDecodeError:
            args = {}
    function["arguments"] = args if isinstance(args, dict) else {}
    return {**call, "function": function}


def load_hf_tokenizer(path: str) -> HFTokenizer:
    """Load the tokenizer (and chat template) of folder ``path`` with ``AutoTokenizer``, offline.

    Raises:
        BadInputError: no such folder, no tokenizer files in it, or transformers cannot load it (one line).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise BadInputError("no such tokenizer folder (a tokenizer is a tiktoken encoding name or a Hugging Face "
                            "checkpoint/tokenizer folder)", path=path)
    if not has_tokenizer(folder):
        raise BadInputError(f"no tokenizer in this folder (none of {', '.join(TOKENIZER_FILES)})", path=path)
    tf = transformers()
    try:
        tok = tf.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # OSError, ValueError, json errors: all mean "not a loadable tokenizer"
        raise BadInputError(f"cannot load the tokenizer: {one_line(exc)}", path=path) from None
    return HFTokenizer(tok, str(folder))


def _digest(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:  # a tokenizer without a tokenizers-library backend: its vocabulary and special tokens
        definition = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return xxhash.xxh3_64_hexdigest(definition.encode())
