"""One request of a trace, tokenized, its outline (length and time), and the reader signature every format
implements."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kvcli.model.tokenizer_base import Tokenizer


class BlockKeys(NamedTuple):
    """The block keys a hash-id request's token ids were synthesized from
    (:func:`kvcli.traces.synth.block_token_ids`): equal keys at one block size give equal token blocks, so the
    reuse upper bound can match requests on their keys (:class:`kvcli.replay.upper_bound.UpperBound`).

    Attributes:
        keys: ``[blocks]`` uint64, ``blocks == ceil(len(token_ids) / block_tokens)``.
        block_tokens: tokens per key, >= 1.
    """

    keys: np.ndarray
    block_tokens: int


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
        blocks: the block keys of a hash-id request's synthesized token ids (None for any other request).
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

    def __repr__(self) -> str:
        """One line: the id, source, token count and first tokens (not the whole array)."""
        head = ", ".join(str(int(t)) for t in self.token_ids[:4])
        more = ", ..." if len(self.token_ids) > 4 else ""
        return (f"Request({self.id!r}, {len(self.token_ids):,} tokens [{head}{more}], timestamp={self.timestamp}, "
                f"session_id={self.session_id!r}, cache_salt={self.cache_salt!r}, source={self.source!r})")


class Outline(NamedTuple):
    """What a replay's first pass needs of a request, where a format can give it without the token ids
    (:func:`kvcli.traces.detect.outline_trace`): the same values as its :class:`Request`."""

    prompt_tokens: int
    """``len(token_ids)``, tokens."""
    timestamp: float | None
    """Arrival time, seconds from the trace's start, or None."""


TokenizerArg = str | Tokenizer
Reader = Callable[[Path, TokenizerArg], Iterator[Request]]
