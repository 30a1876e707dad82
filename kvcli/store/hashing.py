"""Chunk hashing: the prefix-chained keys of the chunk-hash KV-cache store.

The hash function, fully specified (so two processes, two runs or two languages agree):

* Token ids are little-endian ``uint32`` (``'<u4'``); a prompt is cut into ``chunk_size``-token chunks from
  token 0. Only *full* chunks are hashed: the partial last chunk is never stored and never hit.
* The root value names the namespace of the cache: ``root = xxh3_128(b"kvcli-chunk-hash/v1\\0" + model_id +
  b"\\0" + tokenizer + b"\\0" + cache_salt)`` (UTF-8), 16 bytes (``xxh3_128_digest``, seed 0, big-endian
  canonical digest as the ``xxhash`` package returns it).
* ``hash[k] = xxh3_128(hash[k-1] || tokens[k*cs:(k+1)*cs].astype('<u4').tobytes())`` with ``hash[-1] = root``.
  So a chunk's hash names its whole prefix, the model, the tokenizer and the cache salt.
* The collision guard (as nano-vllm and vLLM confirm tokens on a hit): ``token_digest[k] =
  xxh3_64(tokens of chunk k as '<u4')``, 8 bytes, stored beside the chunk and checked on lookup.

This is vLLM's block-hash chaining (vllm/v1/core/kv_cache_utils.py, ``hash_block_tokens``) with xxh3-128 and a
fixed, namespace-derived seed instead of a per-process random one, so a shared store can be read by any process.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

HASH_NAME = "xxh3_128-chain-v1"
_ROOT_TAG = b"kvcli-chunk-hash/v1\0"
_xxh3_128 = xxhash.xxh3_128_digest
_xxh3_64 = xxhash.xxh3_64_digest


def namespace_root(model_id: str, tokenizer: str, cache_salt: str = "") -> bytes:
    """The 16-byte root hash that chunk 0 chains from.

    Args:
        model_id: the model whose KV is stored (KV of two models never mixes).
        tokenizer: the tokenizer name (the same text under two tokenizers is two different token streams).
        cache_salt: tenant isolation (vLLM's ``cache_salt``): equal prompts with different salts share nothing.
    """
    return _xxh3_128(_ROOT_TAG + b"\0".join(s.encode() for s in (model_id, tokenizer, cache_salt)))


def as_token_array(token_ids) -> np.ndarray:
    """Token ids as a contiguous little-endian uint32 array ``[tokens]`` (no copy when already one).

    Raises:
        ValueError: a token id is negative or does not fit in uint32.
    """
    arr = np.asarray(token_ids)
    if arr.dtype != np.dtype("<u4"):
        if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
            raise ValueError("token ids must be in [0, 2**32)")
        arr = arr.astype("<u4")
    return np.ascontiguousarray(arr.reshape(-1))


@dataclass(frozen=True, slots=True)
class ChunkedPrompt:
    """A prompt cut into chunks, with one prefix hash per full chunk.

    Attributes:
        tokens: ``[tokens]`` uint32 token ids of the whole prompt (None where another process hashed them:
            :mod:`kvcli.replay.prefetch`).
        chunk_size: tokens per chunk.
        hashes: 16-byte prefix hashes, one per *full* chunk (``len(tokens) // chunk_size`` of them).
        digests: 8-byte xxh3_64 digests of each full chunk's token bytes (the collision guard).
        hexes: ``hashes`` as 32-digit hex strings (the store's key suffixes).
    """

    tokens: np.ndarray | None
    chunk_size: int
    hashes: list[bytes]
    digests: list[bytes]
    hexes: list[str]

    @property
    def full_tokens(self) -> int:
        """Tokens covered by full chunks, the most that can ever hit (tokens)."""
        return len(self.hashes) * self.chunk_size

    def chunk_tokens(self, k: int) -> np.ndarray:
        """Token ids of chunk ``k``, ``[chunk_size]`` (a view)."""
        assert self.tokens is not None, "the tokens stayed in the process that hashed them"
        return self.tokens[k * self.chunk_size:(k + 1) * self.chunk_size]

    def token_digest(self, k: int) -> bytes:
        """The 8-byte xxh3_64 digest of chunk ``k``'s token bytes (the collision guard)."""
        return self.digests[k]


def reusable_tokens(hit_tokens, prompt_tokens):
    """The one rule for a prompt whose every token is cached: the engine still computes the last token (its logits
    start the output), so a request reuses ``min(hit_tokens, prompt_tokens - 1)`` tokens (0 for an empty prompt).

    vLLM's rule (``get_computed_blocks``/LMCache's connector: "when all tokens hit, recompute the last token");
    replay's hit tokens and timings, inspect's chunk map and route's prefill all count this way. Works on ints
    and on numpy arrays (tokens).
    """
    import numpy as np

    return np.maximum(np.minimum(hit_tokens, np.asarray(prompt_tokens) - 1), 0) if isinstance(
        hit_tokens, np.ndarray) else max(0, min(int(hit_tokens), int(prompt_tokens) - 1))


def chunk_prompt(token_ids, chunk_size: int, root: bytes) -> ChunkedPrompt:
    """Cut ``token_ids`` into ``chunk_size`` chunks and chain their hashes from ``root``.

    One ``uint32`` conversion per prompt, then one xxh3_128 call (the chain) and one xxh3_64 call (the token
    digest) per chunk over a slice of that buffer (no Python loop over tokens). Cost: about 0.3 microseconds per
    chunk here, digests and key hex included (bench/bench_hashing.py).

    Raises:
        ValueError: ``chunk_size`` < 1, or a token id outside uint32.
    """
    tokens, hashes, digests = chunk_hashes(token_ids, chunk_size, root)
    return chunked(tokens, chunk_size, hashes, digests)


def chunk_hashes(token_ids, chunk_size: int, root: bytes) -> tuple[np.ndarray, list[bytes], list[bytes]]:
    """The hashing of :func:`chunk_prompt` alone: ``(tokens [tokens] '<u4', hashes, digests)`` (16 and 8 bytes per
    full chunk).

    Raises:
        ValueError: ``chunk_size`` < 1, or a token id outside uint32.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
    tokens = as_token_array(token_ids)
    n_full = len(tokens) // chunk_size
    buf = tokens.data.cast("B")
    step = 4 * chunk_size
    hashes: list[bytes] = []
    digests: list[bytes] = []
    h = root
    for off in range(0, n_full * step, step):
        chunk = buf[off:off + step]
        h = _xxh3_128(h + chunk)
        hashes.append(h)
        digests.append(_xxh3_64(chunk))
    return tokens, hashes, digests


def chunked(tokens: np.ndarray | None, chunk_size: int, hashes: list[bytes], digests: list[bytes]) -> ChunkedPrompt:
    """A :class:`ChunkedPrompt` of hashes and digests :func:`chunk_hashes` computed (here or in another process:
    ``tokens`` None where they stayed there), with its keys' hex."""
    joined = b"".join(hashes).hex()
    return ChunkedPrompt(tokens, chunk_size, hashes, digests, [joined[i:i + 32] for i in range(0, len(joined), 32)])


class PromptChunker:
    """Cuts and hashes prompts for one store: ``chunk_size`` tokens per chunk under the root of ``model_id``,
    ``tokenizer`` and each cache salt (roots cached per salt). Every store layout hashes through one of these, so
    their chunk hashes are the same."""

    def __init__(self, model_id: str, tokenizer: str, chunk_size: int) -> None:
        self.model_id, self.tokenizer, self.chunk_size = model_id, tokenizer, chunk_size
        self._roots: dict[str, bytes] = {}

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """:func:`chunk_prompt` of ``tokens`` ``[tokens]`` under the root of this model, tokenizer and salt."""
        return chunk_prompt(tokens, self.chunk_size, self.root(cache_salt))

    def root(self, cache_salt: str = "") -> bytes:
        """The 16-byte root of this model and tokenizer under ``cache_salt`` (:func:`namespace_root`, cached)."""
        root = self._roots.get(cache_salt)
        if root is None:
            root = self._roots[cache_salt] = namespace_root(self.model_id, self.tokenizer, cache_salt)
        return root

    def prompt(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """``tokens`` as a :class:`ChunkedPrompt` (one already chunked is returned as is)."""
        return tokens if isinstance(tokens, ChunkedPrompt) else self.chunk(tokens, cache_salt)
