"""One request of a trace, tokenized, its outline (length and time), and the reader signature every format
implements."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kvcli.model.tokenizer_base import Tokenizer
from kvcli.traces.synth import block_token_ids


class BlockKeys(NamedTuple):
    """The block keys a hash-id request's token ids are synthesized from
    (:func:`kvcli.traces.synth.block_token_ids`): equal keys at one block size give equal token blocks, so the
    reuse upper bound can match requests on their keys (:class:`kvcli.sim.upper_bound.UpperBound`) and the
    store hash their chunks from them (a :class:`kvcli.store.hashing.BlockPrompt`).

    Attributes:
        keys: ``[blocks]`` uint64, ``blocks == ceil(length / block_tokens)``.
        block_tokens: tokens per key, >= 1.
        length: the prompt's tokens (``len(token_ids)``), >= 0.
    """

    keys: np.ndarray
    block_tokens: int
    length: int

    def token_ids(self) -> np.ndarray:
        """The synthesized token ids, ``[length]`` ``'<u4'`` (:func:`kvcli.traces.synth.block_token_ids`)."""
        return block_token_ids(self.keys, self.block_tokens, self.length)


class ChatPrompt(NamedTuple):
    """The chat messages a request's prompt was rendered from (for ``kvcli explain``, which names the message where
    two prompts first differ).

    Attributes:
        messages: the OpenAI-style messages under the chat template, in order (the trace's own objects: not to be
            modified).
        tools: the request's ``tools`` (function definitions), or None.
    """

    messages: Sequence[dict]
    tools: list | None = None


class TurnLink(NamedTuple):
    """Where a trace itself places a request in its conversation, by naming the request it continues (Alibaba's
    Bailian traces: ``parent_chat_id``), for a writer that keeps the link (:func:`kvcli.traces.export.export_records`).

    Attributes:
        parent: the trace's id of the request this one continues; None for a first turn.
        turn: the trace's own 1-based turn number, or None when it gives none.
    """

    parent: str | None
    turn: int | None = None


class Segment(NamedTuple):
    """One labelled token range of a prompt: which part of the request the tokens ``[start, end)`` came from, for
    an analysis that reuses a part wherever it recurs (:mod:`kvcli.sim.blend`) or names it. A reader fills them
    where its format says what the parts are: RAGPulse's components, one segment per hash id
    (:mod:`kvcli.traces.ragpulse`); a chat reader could give one per message. Segments are in prompt order and do
    not overlap; they need not cover the prompt (tokens between or after them belong to no part).

    Attributes:
        start: the first token's index, >= 0.
        end: one past the last token's, ``start < end <= len(token_ids)``.
        kind: what the part is: a RAGPulse component (``"sys_prompt"``, ``"passages_ids"``, ``"history"``,
            ``"web_search"``, ``"user_input"``), or a reader's own word (a chat message's role).
        key: what the trace names the part by (a RAGPulse hash id, as text): equal keys of one trace stand for the
            same content; an analysis that matches parts compares their tokens, not their keys.
    """

    start: int
    end: int
    kind: str
    key: str


#: what :func:`hash_salt` puts between a cache salt and a model name (a NUL, which no salt a trace gives holds)
MODEL_SEPARATOR = "\0model="


def hash_salt(cache_salt: str, model: str) -> str:
    """The salt a request's chunk hashes are chained under: ``cache_salt`` alone when ``model`` is "", else
    ``cache_salt + "\0model=" + model``, so that requests naming different served models (a base model and its
    LoRA adapters) never share blocks, as vLLM keys every block of an adapter's request by the adapter
    (``vllm/v1/core/kv_cache_utils.py`` ``_gen_lora_extra_hash_keys``), while a trace naming no model hashes as
    it always has. :func:`split_hash_salt` undoes it."""
    return cache_salt + MODEL_SEPARATOR + model if model else cache_salt


def split_hash_salt(salt: str) -> tuple[str, str]:
    """``(cache_salt, model)`` of a :func:`hash_salt` value (``model`` "" when it names none)."""
    cache, sep, model = salt.partition(MODEL_SEPARATOR)
    return cache, model if sep else ""


def models_note(models: Mapping[str, int]) -> str | None:
    """The note a report gives a trace that names two served models or more (``models``: requests per model name,
    "" left out), else None: their requests never share cached blocks (:func:`hash_salt`)."""
    named = sorted(((n, m) for m, n in models.items() if m), key=lambda x: (-x[0], x[1]))
    if len(named) < 2:
        return None
    listed = ", ".join(f"{m!r} ({n:,} request{'s' if n != 1 else ''})" for n, m in named[:4])
    more = f" and {len(named) - 4:,} more" if len(named) > 4 else ""
    return (f"the trace names {len(named):,} models, {listed}{more}: requests of different models (a base "
            "model and its LoRA adapters) never share cached blocks, as vLLM keys an adapter's blocks by it")


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace, tokenized.

    Attributes:
        id: the trace's id for it, else ``"<file>:<line>"``.
        token_ids: ``[tokens]`` little-endian uint32 prompt token ids.
        timestamp: arrival time in seconds from the trace's start, or None.
        session_id: conversation/session id, or None.
        cache_salt: tenant salt ("" when none); requests of different salts never share cache.
        output_length: tokens the request generated (for routing's decode time), or None.
        source: ``"<file>:<line>"`` (1-based record number) for error messages.
        chat: the messages the prompt was rendered from, for a chat request (None for a text, token-id or hash-id
            prompt).
        blocks: the block keys of a hash-id request's synthesized token ids (None for any other request; a
            :class:`HashIdRequest` synthesizes its ``token_ids`` from them on first use).
        link: the request this one continues, where the trace names it (:class:`TurnLink`); None where the trace
            links no turns that way (a session's requests then follow one another in arrival order).
        segments: the prompt's labelled parts (:class:`Segment`, in prompt order), where the format names them
            (None: it does not).
        model: the served model the request names (its ``model`` field: the base model's name or a LoRA
            adapter's), "" when it names none; requests naming different models never share cache
            (:attr:`hash_salt`).
    """

    id: str
    token_ids: np.ndarray
    timestamp: float | None = None
    session_id: str | None = None
    cache_salt: str = ""
    output_length: int | None = None
    source: str = ""
    chat: ChatPrompt | None = None
    blocks: BlockKeys | None = None
    link: TurnLink | None = None
    segments: tuple[Segment, ...] | None = None
    model: str = ""

    @property
    def hash_salt(self) -> str:
        """What the request shares cached blocks under (:func:`hash_salt`): its cache salt, and its model when it
        names one."""
        return hash_salt(self.cache_salt, self.model)

    @property
    def prompt_tokens(self) -> int:
        """``len(token_ids)``, tokens (a :class:`HashIdRequest` does not synthesize them for it)."""
        return len(self.token_ids)

    @property
    def prompt(self):
        """What the store hashes the prompt from (:meth:`kvcli.store.hashing.PromptChunker.chunk`): the token ids
        ``[tokens]``, or for a hash-id request its :class:`BlockKeys` (its chunks hashed from the keys, whether or
        not its token ids were synthesized)."""
        return self.token_ids if self.blocks is None else self.blocks

    def __repr__(self) -> str:
        """One line: the id, source, token count and first tokens (not the whole array)."""
        n = self.prompt_tokens
        head = ", ".join(str(int(t)) for t in self.token_ids[:4]) if self.blocks is None else "block keys"
        more = ", ..." if n > 4 and self.blocks is None else ""
        return (f"Request({self.id!r}, {n:,} tokens [{head}{more}], timestamp={self.timestamp}, "
                f"session_id={self.session_id!r}, cache_salt={self.cache_salt!r}, source={self.source!r})")


_TOKEN_SLOT = Request.__dict__["token_ids"]  # the field's own storage (a slot), under the property below


class HashIdRequest(Request):
    """A :class:`Request` of a hash-id trace whose ``token_ids`` are synthesized from its ``blocks`` on first use
    (then kept): made with ``token_ids=None``. Reading, hashing its chunks (:attr:`prompt`) and its upper bound
    need only the keys; a model run or a token-level consumer reads ``token_ids`` as from any request."""

    __slots__ = ()

    def __init__(self, id: str, token_ids: np.ndarray | None = None, **fields) -> None:
        if fields.get("blocks") is None:
            raise ValueError("a HashIdRequest needs its blocks")
        super().__init__(id, token_ids, **fields)  # type: ignore[arg-type]

    @property
    def token_ids(self) -> np.ndarray:
        """``[tokens]`` ``'<u4'``: synthesized from :attr:`blocks` the first time it is read."""
        tokens = _TOKEN_SLOT.__get__(self)
        if tokens is None:
            assert self.blocks is not None
            tokens = self.blocks.token_ids()
            _TOKEN_SLOT.__set__(self, tokens)
        return tokens

    @token_ids.setter
    def token_ids(self, tokens: np.ndarray | None) -> None:  # the dataclass's __init__ and unpickling set it
        _TOKEN_SLOT.__set__(self, tokens)

    def __getstate__(self) -> list:
        """The fields in order, as the dataclass pickles them, but the token ids as held: None until synthesized, so
        pickling a request (to a worker process) neither synthesizes them nor sends them (a 512-token block is 2 KiB
        of ids against its one key)."""
        return [_TOKEN_SLOT.__get__(self) if f.name == "token_ids" else getattr(self, f.name) for f in fields(self)]

    @property
    def prompt_tokens(self) -> int:
        """``blocks.length``, tokens (no token id synthesized)."""
        assert self.blocks is not None
        return self.blocks.length


class Outline(NamedTuple):
    """What a replay's first pass needs of a request, where a format can give it without the token ids
    (:func:`kvcli.traces.detect.outline_trace`): the same values as its :class:`Request`."""

    prompt_tokens: int
    """``len(token_ids)``, tokens."""
    timestamp: float | None
    """Arrival time, seconds from the trace's start, or None."""
    model: str = ""
    """The served model it names (:attr:`Request.model`), "" for none."""


TokenizerArg = str | Tokenizer
Reader = Callable[[Path, TokenizerArg], Iterator[Request]]
