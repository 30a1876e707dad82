"""Mooncake (FAST'25) JSONL traces: ``hash_ids`` of 512-token blocks; token ids synthesized per block on first use."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.tokenize import DEFAULT_TOKENIZER
from kvcli.traces.records import (
    iter_jsonl,
    located,
    optional_count,
    optional_id,
    optional_seconds,
    require_object,
    shorten,
)
from kvcli.traces.request import BlockKeys, HashIdRequest, Outline, Request, TokenizerArg
from kvcli.traces.synth import SYNTH_VOCAB, block_token_ids

MOONCAKE_BLOCK_TOKENS = 512
#: synthesized Mooncake token ids are < this, so they are ordinary (non-special) cl100k_base ids.
MOONCAKE_VOCAB = SYNTH_VOCAB
_MAX_HASH_ID = 2**55  # hash_id * 512 + 511 must fit in uint64


def read_mooncake(path: Path, tokenizer: TokenizerArg = DEFAULT_TOKENIZER) -> Iterator[Request]:
    """Requests of a Mooncake JSONL trace; token ids synthesized by :func:`mooncake_token_ids` when first read
    (:class:`~kvcli.traces.request.HashIdRequest`).

    ``tokenizer`` is not used (there is no text); the ids are valid ordinary cl100k_base ids.
    """
    del tokenizer
    for line_no, record in iter_jsonl(path):
        try:
            request = _mooncake_request(record, path, line_no)
        except BadInputError as err:
            raise located(err, path, line_no) from None
        yield request


def _mooncake_request(record: Any, path: Path, line_no: int) -> Request:
    input_length, blocks, timestamp, session_id, output_length = _mooncake_fields(record)
    return HashIdRequest(
        id=f"{path.name}:{line_no}",
        blocks=BlockKeys(blocks, MOONCAKE_BLOCK_TOKENS, input_length),
        timestamp=timestamp,
        session_id=session_id,
        output_length=output_length,
        source=f"{path}:{line_no}",
    )


def outline_mooncake(path: Path) -> Iterator[Outline]:
    """Each request's prompt length and arrival time, checked exactly as :func:`read_mooncake` checks it (the same
    errors, file and line), without synthesizing token ids: the first pass of a replay (~4x less work)."""
    for line_no, record in iter_jsonl(path):
        try:
            input_length, _, timestamp, _, _ = _mooncake_fields(record)
        except BadInputError as err:
            raise located(err, path, line_no) from None
        yield Outline(input_length, timestamp)


def _mooncake_fields(record: Any) -> tuple[int, np.ndarray, float | None, str | None, int | None]:
    """``(input_length, hash ids [blocks] uint64, timestamp s, session id, output_length)`` of one record, checked.

    Raises:
        BadInputError: a missing or malformed field (without the file and line: the caller adds them).
    """
    record = require_object(record)
    input_length = optional_count(record.get("input_length"), "input_length")
    if input_length is None:
        raise BadInputError("a mooncake record needs input_length (an integer >= 0)")
    if "hash_ids" not in record:
        raise BadInputError("a mooncake record needs hash_ids (a list of block ids)")
    blocks = _checked_blocks(record["hash_ids"], input_length)
    return (input_length, blocks, optional_seconds(record.get("timestamp"), "timestamp", divisor=1000),
            optional_id(record, "session_id"), optional_count(record.get("output_length"), "output_length"))


def mooncake_token_ids(hash_ids: list[int], input_length: int) -> np.ndarray:
    """Deterministic token ids for a Mooncake request: equal hash ids give equal 512-token blocks.

    Token ``j`` (0 <= j < 512) of block ``b`` is ``((splitmix64(hash_ids[b] * 512 + j) >> 32) * 100256) >> 32``,
    all in wrapping uint64 arithmetic, where ``splitmix64`` is the output function of Vigna's SplitMix64::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)

    (the high 32 bits of the mix, mapped onto ``[0, 100256)`` by multiply-shift -- Lemire's range reduction,
    uniform like ``% 100256`` but without a 64-bit division). The blocks are concatenated and cut to
    ``input_length`` tokens. Ids are < 100,256, i.e. ordinary (non-special) cl100k_base ids. Vectorized: no
    Python loop per block or token.

    Args:
        hash_ids: block ids, integers in ``[0, 2**55)``; ``len(hash_ids) * 512 >= input_length``.
        input_length: prompt length in tokens, >= 0.

    Returns:
        ``[input_length]`` ``'<u4'`` array.

    Raises:
        BadInputError: a hash id that is not such an integer, or too few blocks for ``input_length``.
    """
    return _synthesize(_checked_blocks(hash_ids, input_length), input_length)


def _checked_blocks(hash_ids: Any, input_length: int) -> np.ndarray:
    """The ``ceil(input_length / 512)`` leading hash ids as uint64 ``[blocks]``, checked (see
    :func:`mooncake_token_ids`)."""
    if not isinstance(hash_ids, list):
        raise BadInputError(f"hash_ids must be a list of integers, not {type(hash_ids).__name__}")
    blocks = _hash_id_array(hash_ids)  # a bad id is named first, whatever the list's length
    if len(hash_ids) * MOONCAKE_BLOCK_TOKENS < input_length:
        raise BadInputError(f"{len(hash_ids)} hash_ids cover {len(hash_ids) * MOONCAKE_BLOCK_TOKENS} tokens, "
                            f"fewer than input_length {input_length} ({MOONCAKE_BLOCK_TOKENS} tokens per block)")
    n_blocks = -(-input_length // MOONCAKE_BLOCK_TOKENS)  # ceil
    return blocks[:n_blocks]


def _synthesize(blocks: np.ndarray, input_length: int) -> np.ndarray:
    """Token ids ``[input_length]`` ``'<u4'`` of uint64 block ids ``[blocks]`` (:func:`mooncake_token_ids`)."""
    return block_token_ids(blocks, MOONCAKE_BLOCK_TOKENS, input_length)


def _hash_id_array(hash_ids: list) -> np.ndarray:
    try:
        arr = np.array(hash_ids) if hash_ids else np.zeros(0, dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < 0) | (arr >= _MAX_HASH_ID))
        if not bad.size:
            return arr.astype(np.uint64)
        i = int(bad[0])
    else:
        i = next((i for i, h in enumerate(hash_ids) if type(h) is not int or not 0 <= h < _MAX_HASH_ID), 0)
    raise BadInputError(f"hash_ids[{i}] = {shorten(hash_ids[i])} is not an integer in [0, 2**55)")
