"""Mooncake (FAST'25) JSONL traces: ``hash_ids`` of 512-token blocks, read by the hash-id reader
(:mod:`kvcli.traces.hashids`, format ``mooncake``: 512 tokens per id, timestamps in ms, the same checks as every
hash-id format); this module names the format's constants and its token synthesis."""
from __future__ import annotations

import numpy as np

from kvcli.traces.hashids import BlockIds, TraceFormat
from kvcli.traces.synth import SYNTH_VOCAB, block_token_ids

MOONCAKE_BLOCK_TOKENS = 512
#: synthesized Mooncake token ids are < this, so they are ordinary (non-special) cl100k_base ids.
MOONCAKE_VOCAB = SYNTH_VOCAB


def mooncake_token_ids(hash_ids: list[int], input_length: int) -> np.ndarray:
    """The token ids the reader synthesizes for a Mooncake record: equal hash ids give equal 512-token blocks.

    Token ``j`` (0 <= j < 512) of block ``b`` is ``((splitmix64(key_b * 512 + j) >> 32) * 100256) >> 32``, all in
    wrapping uint64 arithmetic, where ``key_b`` is ``hash_ids[b]`` itself below ``2**54`` (``2**63 // 512``; a
    larger id is folded below it by SplitMix64, :class:`kvcli.traces.hashids.BlockIds`) and ``splitmix64`` is the
    output function of Vigna's SplitMix64::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)

    (the high 32 bits of the mix, mapped onto ``[0, 100256)`` by multiply-shift -- Lemire's range reduction,
    uniform like ``% 100256`` but without a 64-bit division). The blocks are concatenated and cut to
    ``input_length`` tokens. Ids are < 100,256, i.e. ordinary (non-special) cl100k_base ids. Vectorized: no
    Python loop per block or token (:func:`kvcli.traces.synth.block_token_ids`).

    Args:
        hash_ids: block ids, integers in ``[0, 2**64)``, ``ceil(input_length / 512)`` of them.
        input_length: prompt length in tokens, >= 0.

    Returns:
        ``[input_length]`` ``'<u4'`` array.

    Raises:
        BadInputError: a hash id that is not such an integer, or not ``ceil(input_length / 512)`` of them.
    """
    keys = BlockIds(TraceFormat("mooncake")).keys(hash_ids, input_length, MOONCAKE_BLOCK_TOKENS)
    return block_token_ids(keys, MOONCAKE_BLOCK_TOKENS, input_length)
