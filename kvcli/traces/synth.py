"""Token ids synthesized for hash-id traces (no text): one deterministic function of (block key, position) that
every hash-id reader uses, whatever its block size, so equal keys give equal tokens and distinct keys distinct ones.
"""
from __future__ import annotations

import numpy as np

from kvcli.model.tokenizer_base import TOKEN_DTYPE

#: synthesized token ids are < this, so they are ordinary (non-special) cl100k_base ids.
SYNTH_VOCAB = 100_256


def block_token_ids(keys: np.ndarray, block_tokens: int, input_length: int) -> np.ndarray:
    """Token ids of a prompt made of blocks of ``block_tokens`` tokens, block ``b`` standing for ``keys[b]``.

    Token ``j`` (0 <= j < block_tokens) of block ``b`` is ``((splitmix64(keys[b] * block_tokens + j) >> 32) *
    100256) >> 32``, in wrapping uint64 arithmetic, where ``splitmix64`` is the output function of Vigna's
    SplitMix64::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)

    (its high 32 bits mapped onto ``[0, 100256)`` by multiply-shift, Lemire's range reduction). The blocks are
    concatenated and cut to ``input_length`` tokens. With ``block_tokens`` 512 this is Mooncake's function
    (:func:`kvcli.traces.mooncake.mooncake_token_ids`). ``keys[b] * block_tokens + j`` is one-to-one while every
    key is below ``2**64 // block_tokens``, so distinct keys give independent pseudo-random blocks: two distinct
    16-token blocks coincide with probability about 100256**-16. Vectorized: no Python loop per block or token.

    Args:
        keys: ``[blocks]`` uint64 block keys, each < ``2**64 // block_tokens``; ``blocks * block_tokens >=
            input_length``.
        block_tokens: tokens per block, >= 1.
        input_length: prompt length in tokens, >= 0.

    Returns:
        ``[input_length]`` ``'<u4'`` token ids, each < 100,256. Made :data:`PIECE_TOKENS` at a time: besides the
        result (4 bytes a token), a long prompt needs a few 8-byte arrays of one piece, not of the whole prompt.
    """
    out = np.empty(input_length, dtype=TOKEN_DTYPE)  # only the prompt's own tokens: a long block is cut, not made
    k, b = keys.astype(np.uint64), np.uint64(block_tokens)
    for start in range(0, input_length, PIECE_TOKENS):
        i = np.arange(start, min(start + PIECE_TOKENS, input_length), dtype=np.uint64)
        out[start:start + len(i)] = synth_tokens_(k[i // b] * b + i % b)
    return out


def run_token_ids(keys: np.ndarray, lengths: np.ndarray, block_tokens: int) -> np.ndarray:
    """Token ids of a prompt made of runs of varying lengths: run ``b`` is the first ``lengths[b]`` tokens of the
    block :func:`block_token_ids` makes for key ``keys[b]`` at ``block_tokens`` tokens per key (token ``j`` of run
    ``b`` is ``synth(keys[b] * block_tokens + j)``), the runs concatenated. The same function of (key, position),
    so equal keys give equal runs wherever they stand, and a run of ``block_tokens`` tokens is
    :func:`block_token_ids`'s whole block. Vectorized, :data:`PIECE_TOKENS` at a time.

    Args:
        keys: ``[runs]`` uint64 keys, each < ``2**64 // block_tokens``.
        lengths: ``[runs]`` tokens of each run, each in ``[0, block_tokens]``.
        block_tokens: the key stride, >= 1.

    Returns:
        ``[lengths.sum()]`` ``'<u4'`` token ids, each < 100,256.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    out = np.empty(total, dtype=TOKEN_DTYPE)
    k, b = keys.astype(np.uint64), np.uint64(block_tokens)
    starts = (ends - lengths).astype(np.uint64)
    for start in range(0, total, PIECE_TOKENS):
        i = np.arange(start, min(start + PIECE_TOKENS, total), dtype=np.int64)
        run = np.searchsorted(ends, i, side="right")
        out[start:start + len(i)] = synth_tokens_(k[run] * b + (i.astype(np.uint64) - starts[run]))
    return out


#: Tokens :func:`block_token_ids` synthesizes at once (its temporary arrays: about 32 bytes a token of one piece).
PIECE_TOKENS = 1 << 20


def first_token_ids(keys: np.ndarray, block_tokens: int) -> np.ndarray:
    """Token 0 of each block of :func:`block_token_ids` (``[blocks]`` ``'<u4'``), without the others."""
    return synth_tokens_(keys.astype(np.uint64) * np.uint64(block_tokens))


def synth_tokens_(x: np.ndarray) -> np.ndarray:
    """The token ids of synthesis inputs ``x`` (``[tokens]`` contiguous uint64, ``key * block_tokens + j``:
    :func:`block_token_ids`), computed **in place** in ``x``; returns them as ``'<u4'``."""
    x = splitmix64_(x)
    x >>= _S32
    x *= _VOCAB
    x >>= _S32
    return x.astype(TOKEN_DTYPE)


def splitmix64_(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a contiguous uint64 array, elementwise, wrapping, **in place**; returns ``x``."""
    x += _SM64_GAMMA
    x ^= x >> _S30
    x *= _SM64_M1
    x ^= x >> _S27
    x *= _SM64_M2
    x ^= x >> _S31
    return x


_SM64_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_SM64_M1 = np.uint64(0xBF58476D1CE4E5B9)
_SM64_M2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
_VOCAB = np.uint64(SYNTH_VOCAB)
