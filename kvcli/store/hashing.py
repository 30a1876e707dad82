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

**A prompt given by block keys** (a hash-id trace's request, :class:`BlockPrompt`) is hashed from its keys, without
its token ids. Its token ``p`` is a function of ``x[p] = keys[p // B] * B + p % B`` alone (uint64, ``B`` the block
size: :func:`kvcli.traces.synth.block_token_ids`), so a chunk's tokens are fixed by its ``x`` values, and two
chunks hold equal synthesized tokens exactly when their ``x`` sequences are equal (up to the synthesis's own
collisions, about ``100256**-chunk_size`` a pair). A chunk's *signature* is that sequence written as its maximal
runs of consecutive values, each run ``(first x, length)`` as two little-endian ``uint64`` (16 bytes): within a
block ``x`` goes up by one, and a run goes on across a block boundary exactly when the next key is the previous
one plus one. So it is a chunk's block segments ``(key, offset in block, length)`` in a canonical form: one run
for a chunk inside one block, one per key otherwise (more for a chunk larger than a block), never a token.

* ``block_root = xxh3_128(b"kvcli-block-id-hash/v1:splitmix64-lemire-100256\0" + model_id + b"\0" + tokenizer
  + b"\0" + cache_salt)``: its own root (the tag names the synthesis function), so a signature chain never meets
  a token chain.
* ``hash[k] = xxh3_128(hash[k-1] || signature[k])``, ``hash[-1] = block_root``; ``token_digest[k] =
  xxh3_64(signature[k])`` (the collision guard, as for tokens). Only full chunks, as for tokens.

The hits, objects and bytes of a replay are the token path's (tests/replay/test_hashid_chain.py), the hash
values are not: a hash-id trace's keys live in kvcli's own namespace. Engine block hashes (vLLM, SGLang,
LMCache: :mod:`kvcli.store.enginehash`) hash tokens, as the engines do.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import xxhash

HASH_NAME = "xxh3_128-chain-v1"
_ROOT_TAG = b"kvcli-chunk-hash/v1\0"
_BLOCK_ROOT_TAG = b"kvcli-block-id-hash/v1:splitmix64-lemire-100256\0"
_RUN_PACK = struct.Struct("<QQ").pack  # one run of a signature: (first x, length), little-endian uint64
_RUN_BYTES = 16
_FEW_CHUNKS = 64  # block_signatures builds fewer runs than this in Python, more with numpy
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


def block_root(model_id: str, tokenizer: str, cache_salt: str = "") -> bytes:
    """The 16-byte root a prompt given by block keys chains from (module docstring): :func:`namespace_root`'s
    arguments under a tag of its own."""
    return _xxh3_128(_BLOCK_ROOT_TAG + b"\0".join(s.encode() for s in (model_id, tokenizer, cache_salt)))


class BlockPrompt(Protocol):
    """A prompt given by block keys (:class:`kvcli.traces.request.BlockKeys` is one): token ``p`` is synthesized
    from ``keys[p // block_tokens] * block_tokens + p % block_tokens`` alone.

    Attributes:
        keys: ``[blocks]`` uint64, ``blocks == ceil(length / block_tokens)``, each < ``2**64 // block_tokens``.
        block_tokens: tokens per key, >= 1.
        length: the prompt's tokens, >= 0.
    """

    @property
    def keys(self) -> np.ndarray: ...

    @property
    def block_tokens(self) -> int: ...

    @property
    def length(self) -> int: ...


def is_block_prompt(prompt) -> bool:
    """Whether ``prompt`` is given by block keys (a :class:`BlockPrompt`), not by token ids."""
    return hasattr(prompt, "block_tokens")


def prompt_length(prompt) -> int:
    """Tokens of a prompt given as token ids ``[tokens]``, block keys (:class:`BlockPrompt`) or a
    :class:`ChunkedPrompt` (its full chunks' tokens, where its token ids stayed in another process)."""
    if isinstance(prompt, ChunkedPrompt):
        return len(prompt.tokens) if prompt.tokens is not None else prompt.full_tokens
    return prompt.length if is_block_prompt(prompt) else len(prompt)


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


class ChunkedPrompt:
    """A prompt cut into chunks, with one prefix hash per full chunk. Read-only once made.

    Held as two joined buffers (a replay passes hundreds of thousands of prompts between processes and to the
    server, where per-chunk Python objects would cost more than the work); the per-chunk lists are made on first
    use.

    Attributes:
        tokens: ``[tokens]`` uint32 token ids of the whole prompt (None where another process hashed them:
            :mod:`kvcli.replay.prefetch`).
        chunk_size: tokens per chunk.
        hash_bytes: the 16-byte prefix hashes of every *full* chunk, concatenated (``len(tokens) // chunk_size``
            of them).
        digest_bytes: the 8-byte xxh3_64 digests of each full chunk's token bytes (the collision guard),
            concatenated.
        chunks: the full chunks (hashes).
        hashes / digests / hexes: the same per chunk: 16-byte hashes, 8-byte digests, and the hashes as 32-digit
            hex strings (the store's key suffixes).
    """

    __slots__ = ("tokens", "chunk_size", "hash_bytes", "digest_bytes", "chunks", "_hashes", "_digests", "_hexes")

    def __init__(self, tokens: np.ndarray | None, chunk_size: int, hash_bytes: bytes, digest_bytes: bytes) -> None:
        self.tokens, self.chunk_size = tokens, chunk_size
        self.hash_bytes, self.digest_bytes = hash_bytes, digest_bytes
        self.chunks = len(hash_bytes) // 16
        self._hashes: list[bytes] | None = None
        self._digests: list[bytes] | None = None
        self._hexes: list[str] | None = None

    @property
    def hashes(self) -> list[bytes]:
        """16-byte prefix hashes, one per full chunk."""
        if self._hashes is None:
            self._hashes = _pieces(self.hash_bytes, 16)
        return self._hashes

    @property
    def digests(self) -> list[bytes]:
        """8-byte token digests, one per full chunk."""
        if self._digests is None:
            self._digests = _pieces(self.digest_bytes, 8)
        return self._digests

    @property
    def hexes(self) -> list[str]:
        """The hashes as 32-digit hex strings."""
        if self._hexes is None:
            self._hexes = _pieces(self.hash_bytes.hex(), 32)
        return self._hexes

    @property
    def full_tokens(self) -> int:
        """Tokens covered by full chunks, the most that can ever hit (tokens)."""
        return self.chunks * self.chunk_size

    def chunk_tokens(self, k: int) -> np.ndarray:
        """Token ids of chunk ``k``, ``[chunk_size]`` (a view)."""
        assert self.tokens is not None, "the tokens stayed in the process that hashed them"
        return self.tokens[k * self.chunk_size:(k + 1) * self.chunk_size]

    def head(self, chunks: int) -> ChunkedPrompt:
        """The first ``chunks`` full chunks alone, as a prompt of ``chunks * chunk_size`` tokens."""
        tokens = None if self.tokens is None else self.tokens[:chunks * self.chunk_size]
        return ChunkedPrompt(tokens, self.chunk_size, self.hash_bytes[:16 * chunks], self.digest_bytes[:8 * chunks])

    def token_digest(self, k: int) -> bytes:
        """The 8-byte xxh3_64 digest of chunk ``k``'s token bytes (the collision guard)."""
        return self.digest_bytes[8 * k:8 * k + 8]


def _pieces(joined, size: int) -> list:
    """``joined`` (bytes or str) cut into consecutive pieces of ``size``."""
    return [joined[i:i + size] for i in range(0, len(joined), size)]


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
    step = 4 * chunk_size
    hashes, digests = _chain(tokens.data.cast("B"), range(0, (len(tokens) // chunk_size + 1) * step, step), root)
    return tokens, hashes, digests


def _chain(buf: memoryview, offsets: range | Sequence[int], root: bytes) -> tuple[list[bytes], list[bytes]]:
    """The chain over the pieces ``buf[offsets[k]:offsets[k + 1]]`` from ``root``: ``hash[k] = xxh3_128(hash[k-1]
    || piece k)`` and ``digest[k] = xxh3_64(piece k)`` (16 and 8 bytes each); the one loop both paths hash with."""
    hashes: list[bytes] = []
    digests: list[bytes] = []
    h = root
    if isinstance(offsets, range):  # pieces of one length: the common case, without pairing the offsets
        step = offsets.step
        for off in offsets[:-1]:
            piece = buf[off:off + step]
            h = _xxh3_128(h + piece)
            hashes.append(h)
            digests.append(_xxh3_64(piece))
        return hashes, digests
    for lo, hi in zip(offsets, offsets[1:]):
        piece = buf[lo:hi]
        h = _xxh3_128(h + piece)
        hashes.append(h)
        digests.append(_xxh3_64(piece))
    return hashes, digests


def block_signatures(keys: np.ndarray, block_tokens: int, length: int, chunk_size: int
                     ) -> tuple[bytes, Sequence[int] | np.ndarray]:
    """Every full chunk's signature (module docstring) of a prompt given by block keys, without its token ids:
    16 bytes per run, one run for a chunk inside a block or over blocks whose keys follow on.

    Args:
        keys: ``[blocks]`` uint64 block keys, ``blocks >= ceil(length / block_tokens)``.
        block_tokens: tokens per key, >= 1.
        length: the prompt's tokens, >= 0.
        chunk_size: tokens per chunk, >= 1.

    Returns:
        ``(runs, offsets)``: the signatures of the ``length // chunk_size`` full chunks, in chunk order, as one
        bytes object, and ``chunks + 1`` byte offsets into it (chunk ``k``'s is ``runs[offsets[k]:offsets[k + 1]]``).

    Raises:
        ValueError: ``chunk_size`` or ``block_tokens`` < 1, or too few keys for ``length``.
    """
    if chunk_size < 1 or block_tokens < 1:
        raise ValueError(f"chunk size and block size must be >= 1, got {chunk_size} and {block_tokens}")
    if len(keys) * block_tokens < length:
        raise ValueError(f"{len(keys)} block keys of {block_tokens} tokens for a prompt of {length} tokens")
    n_full = length // chunk_size
    b, cs = block_tokens, chunk_size
    if cs <= b:  # a chunk within one block or over two: one run or two each, computed for all chunks at once
        return _short_chunk_signatures(np.asarray(keys, np.uint64), b, n_full, cs)
    ks = keys[:-(-n_full * cs // b)].tolist() if n_full else []
    pack = _RUN_PACK
    parts: list[bytes] = []
    offsets = [0]
    for start in range(0, n_full * cs, cs):
        end = start + cs
        k = start // b
        x = ks[k] * b + start - k * b
        run = min(end, (k + 1) * b) - start
        at = start + run
        while at < end:  # the blocks after the chunk's first: each goes on with the run or starts one
            k += 1
            step = min(b, end - at)
            if ks[k] == ks[k - 1] + 1:
                run += step
            else:
                parts.append(pack(x, run))
                x, run = ks[k] * b, step
            at += step
        parts.append(pack(x, run))
        offsets.append(len(parts) * _RUN_BYTES)
    return b"".join(parts), offsets


def _short_chunk_signatures(keys: np.ndarray, b: int, n_full: int, cs: int) -> tuple[bytes, range | np.ndarray]:
    """:func:`block_signatures` where ``cs <= b``, vectorized: chunk ``c`` starts in block ``k`` at offset ``o``,
    its first run is ``min(cs, b - o)`` tokens, and the rest, if any, is block ``k + 1``'s first tokens: the same
    run when that key follows on, else a second run."""
    stride = range(0, (n_full + 1) * _RUN_BYTES, _RUN_BYTES)
    if b % cs == 0:  # no chunk spills into the next block: one run each
        per = b // cs
        if n_full <= _FEW_CHUNKS:  # a Python loop beats a dozen numpy calls on few chunks
            ks, pack = keys[:-(-n_full // per)].tolist(), _RUN_PACK
            return b"".join([pack(ks[c // per] * b + c % per * cs, cs) for c in range(n_full)]), stride
        chunk = np.arange(n_full, dtype=np.uint64)
        runs = np.empty((n_full, 2), "<u8")
        np.multiply(keys[chunk // np.uint64(per)], np.uint64(b), out=runs[:, 0])
        runs[:, 0] += chunk % np.uint64(per) * np.uint64(cs)
        runs[:, 1] = cs
        return runs.tobytes(), stride
    start = np.arange(0, n_full * cs, cs, dtype=np.int64)
    block = start // b
    first = np.minimum(cs, (block + 1) * b - start)
    spill = first < cs
    runs = np.zeros((n_full, 2, 2), "<u8")  # chunk, run, (first x, length)
    runs[:, 0, 0] = keys[block] * np.uint64(b) + (start - block * b).astype(np.uint64)
    runs[:, 0, 1] = first
    if spill.any():
        nxt = np.minimum(block + 1, len(keys) - 1)
        second = spill & (keys[nxt] != keys[block] + np.uint64(1))
        runs[spill & ~second, 0, 1] = cs  # the next key follows on: one run
        if second.any():
            runs[second, 1, 0] = keys[nxt[second]] * np.uint64(b)
            runs[second, 1, 1] = cs - first[second]
            kept = np.ones((n_full, 2), bool)
            kept[:, 1] = second
            offsets = np.zeros(n_full + 1, np.int64)
            np.cumsum(kept.sum(axis=1) * _RUN_BYTES, out=offsets[1:])
            return runs[kept].tobytes(), offsets
    return runs[:, 0].tobytes(), stride


def block_hashes(keys: np.ndarray, block_tokens: int, length: int, chunk_size: int, root: bytes
                 ) -> tuple[list[bytes], list[bytes]]:
    """The chunk hashes and token digests of a prompt given by block keys (16 and 8 bytes per full chunk),
    chained from ``root`` (:func:`block_root`) over each chunk's signature (:func:`block_signatures`): no token
    id is synthesized. Arguments and errors: :func:`block_signatures`."""
    runs, offsets = block_signatures(keys, block_tokens, length, chunk_size)
    return _chain(memoryview(runs), offsets.tolist() if isinstance(offsets, np.ndarray) else offsets, root)


def chunked(tokens: np.ndarray | None, chunk_size: int, hashes: list[bytes], digests: list[bytes]) -> ChunkedPrompt:
    """A :class:`ChunkedPrompt` of hashes and digests :func:`chunk_hashes` computed (``tokens`` None where they are
    not kept)."""
    prompt = ChunkedPrompt(tokens, chunk_size, b"".join(hashes), b"".join(digests))
    prompt._hashes, prompt._digests = hashes, digests  # the lists at hand: nothing to split again
    return prompt


class PromptChunker:
    """Cuts and hashes prompts for one store: ``chunk_size`` tokens per chunk under the root of ``model_id``,
    ``tokenizer`` and each cache salt (roots cached per salt). Every store layout hashes through one of these, so
    their chunk hashes are the same. A prompt is token ids ``[tokens]`` or block keys (:class:`BlockPrompt`,
    hashed from its keys under :func:`block_root`: module docstring)."""

    def __init__(self, model_id: str, tokenizer: str, chunk_size: int) -> None:
        self.model_id, self.tokenizer, self.chunk_size = model_id, tokenizer, chunk_size
        self._roots: dict[tuple[bool, str], bytes] = {}

    def chunk(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """``tokens`` (token ids ``[tokens]`` or a :class:`BlockPrompt`) cut and hashed under the root of this
        model, tokenizer and salt (:func:`chunk_prompt`; for block keys :func:`block_hashes`, ``tokens`` None in
        the result)."""
        if is_block_prompt(tokens):
            return chunked(None, self.chunk_size, *self.hashes(tokens, cache_salt))
        return chunk_prompt(tokens, self.chunk_size, self.root(cache_salt))

    def hashes(self, tokens, cache_salt: str = "") -> tuple[list[bytes], list[bytes]]:
        """The chunk hashes and token digests of :meth:`chunk` alone (16 and 8 bytes per full chunk).

        Raises:
            ValueError: a token id outside uint32, or too few block keys for the prompt's length.
        """
        if is_block_prompt(tokens):
            return block_hashes(tokens.keys, tokens.block_tokens, tokens.length, self.chunk_size,
                                self.root(cache_salt, blocks=True))
        _, hashes, digests = chunk_hashes(tokens, self.chunk_size, self.root(cache_salt))
        return hashes, digests

    def root(self, cache_salt: str = "", blocks: bool = False) -> bytes:
        """The 16-byte root of this model and tokenizer under ``cache_salt`` (:func:`namespace_root`; with
        ``blocks`` the root of prompts given by block keys, :func:`block_root`), cached."""
        root = self._roots.get((blocks, cache_salt))
        if root is None:
            make = block_root if blocks else namespace_root
            root = self._roots[blocks, cache_salt] = make(self.model_id, self.tokenizer, cache_salt)
        return root

    def prompt(self, tokens, cache_salt: str = "") -> ChunkedPrompt:
        """``tokens`` as a :class:`ChunkedPrompt` (one already chunked is returned as is)."""
        return tokens if isinstance(tokens, ChunkedPrompt) else self.chunk(tokens, cache_salt)
