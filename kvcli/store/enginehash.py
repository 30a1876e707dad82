"""Engine block hashes: the prefix-hash chain a serving engine computes for a prompt's full blocks.

``kvcli explain`` prints these beside kvcli's own chunk hashes so its output joins an engine's logs, metrics and KV
events. :func:`block_hashes` is the one entry point; ``scheme`` names the engine and its hash function
(:data:`ENGINE_HASHES`). Every scheme hashes full blocks only, in prompt order; a partial last block (and so a prompt
shorter than one block) gives no hash. Sources, each matched by golden vectors from the engine's own code
(tests/store/test_enginehash.py):

* ``kvcli``: :mod:`kvcli.store.hashing` (xxh3-128 chain from :func:`~kvcli.store.hashing.namespace_root`), 32 hex
  digits per chunk, as in the store's keys.
* ``vllm-<algo>`` (vLLM 0.33.0, ``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``, ``init_none_hash``,
  ``generate_block_hash_extra_keys``; ``vllm/utils/hashing.py``): ``hash[k] = H((hash[k-1], tokens_k, extra_k))``
  over a 3-tuple of the parent ``BlockHash`` (bytes), the block's token ids as a tuple of ints and the extra keys
  (``(("cache_salt", salt),)`` on block 0 when the salt is non-empty, else None). ``H`` serializes with pickle
  (protocol 5, vLLM's ``HIGHEST_PROTOCOL`` on Python 3.8 to 3.14) or canonical CBOR (``cbor2``) and digests with
  SHA-256 (32 bytes) or xxh3-128 (16 bytes). ``hash[-1] = NONE_HASH = H(seed)``, the seed being the engine's
  ``PYTHONHASHSEED`` string, or when that is unset ``"vllm-none-hash"`` for the SHA-256 algorithms and a random
  per-process value for the xxhash ones. Printed as the digest's hex; vLLM's KV events (default
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) carry ``int(hex, 16) & (2**64 - 1)``. ``vllm`` is ``vllm-sha256``,
  vLLM's default ``--prefix-caching-hash-algo``.
* ``sglang`` (SGLang 0.5.23, ``sglang/srt/mem_cache/utils.py`` ``get_storage_hash_str`` over
  ``cpp_utils/hash_binding.cpp``): HiCache's storage page keys, ``hash[k] = sha256(digest[k-1] || tokens_k as
  '<u4')`` with no prefix for page 0, or when a cache salt is given the 32-byte ``storage_namespace_seed``:
  ``sha256(b"sglang-cache-namespace-v1" || b"\\x00" || b"\\x01" || len(salt) as 8 bytes little-endian || salt)``
  (no extra key, no LoRA). 64 hex digits per page.
* ``lmcache[-<algo>]`` (LMCache 0.5.6 on vLLM 0.33.0, ``lmcache/v1/token_database.py`` ``ChunkedTokenDatabase``,
  ``save_unfull_chunk=False``, its default): ``hash[k] = fold(H((hash[k-1], tokens_k, ())))`` where ``H`` is
  LMCache's ``pre_caching_hash_algorithm``: Python's builtin ``hash`` (``lmcache``, its default ``builtin``) or
  vLLM's function of that name, and ``fold`` keeps an int and reads a digest's first 8 bytes big-endian. The root is
  vLLM's ``NONE_HASH`` for ``H``, folded; for the builtin hash that is ``hash(seed)`` of the ``PYTHONHASHSEED``
  string under that seed, random when it is unset. LMCache leaves the cache salt out. ``block_size`` is LMCache's
  ``chunk_size`` (default 256). Printed as in its Redis keys (:mod:`kvcli.store.lmcache`): lower-case hex of the
  int, a negative one with its ``-`` (``int(s, 16)`` gives the int back).
"""
from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from kvcli.store.hashing import as_token_array, chunk_hashes, namespace_root

_VLLM_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ENGINE_HASHES: tuple[str, ...] = ("kvcli", "vllm", *(f"vllm-{a}" for a in _VLLM_ALGOS), "sglang", "lmcache",
                                  *(f"lmcache-{a}" for a in _VLLM_ALGOS))
VLLM_DEFAULT_SEED = "vllm-none-hash"  # vLLM's NONE_HASH seed for SHA-256 when PYTHONHASHSEED is unset
_PICKLE_PROTOCOL = 5
_SGLANG_NAMESPACE_TAG = b"sglang-cache-namespace-v1"
_MASK64 = (1 << 64) - 1


def block_hashes(scheme: str, token_ids, block_size: int, *, cache_salt: str = "", hash_seed: str | None = None,
                 model_id: str = "", tokenizer: str = "") -> list[str]:
    """The block hash chain ``scheme`` computes for a prompt: one string per full block, in prompt order.

    Args:
        scheme: one of :data:`ENGINE_HASHES` (the module docstring says what each computes and prints).
        token_ids: the prompt's token ids, ``[tokens]`` (a little-endian uint32 array, or anything
            :func:`~kvcli.store.hashing.as_token_array` takes).
        block_size: tokens per block: vLLM's ``--block-size``, SGLang's ``--page-size``, LMCache's ``chunk_size``,
            kvcli's ``--chunk-size``.
        cache_salt: the request's cache salt; "" for none (SGLang's ``None``). LMCache ignores it.
        hash_seed: the ``PYTHONHASHSEED`` the engine ran with (a string, as in the environment); None where it was
            unset. vLLM and LMCache root their chains in it; kvcli and SGLang ignore it.
        model_id: kvcli's model id (``kvcli`` scheme only): the one the store hashed under.
        tokenizer: kvcli's tokenizer name (``kvcli`` scheme only).

    Returns:
        ``len(token_ids) // block_size`` strings: hex digests, or for LMCache its key's hex of an int.

    Raises:
        ValueError: an unknown scheme, ``block_size`` < 1, a token id outside uint32, or a scheme whose root is
            random without ``hash_seed`` (``vllm-xxhash*``, ``lmcache``, ``lmcache-xxhash*``) or, for ``lmcache``,
            a seed that is not an integer in [0, 2**32).
    """
    if scheme not in ENGINE_HASHES:
        raise ValueError(f"unknown hash scheme {scheme!r}; choose one of: {', '.join(ENGINE_HASHES)}")
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    tokens = as_token_array(token_ids)
    if scheme == "kvcli":
        return [h.hex() for h in chunk_hashes(tokens, block_size, namespace_root(model_id, tokenizer, cache_salt))[1]]
    blocks = tokens[:len(tokens) // block_size * block_size].reshape(-1, block_size)
    if scheme == "sglang":
        return _sglang_chain(blocks, cache_salt)
    engine, _, algo = scheme.partition("-")
    if engine == "vllm":
        return _vllm_chain(blocks, algo or "sha256", cache_salt, hash_seed)
    return _lmcache_chain(blocks, algo or "builtin", scheme, hash_seed)


def _vllm_chain(blocks: np.ndarray, algo: str, cache_salt: str, hash_seed: str | None) -> list[str]:
    """vLLM's ``hash_block_tokens`` chain over ``blocks`` ``[blocks, block_size]``, as hex digests."""
    hash_fn = _vllm_hash_fn(algo)
    parent = hash_fn(_vllm_seed(algo, hash_seed, f"vllm-{algo}"))
    out = []
    for k, block in enumerate(blocks):
        extra = (("cache_salt", cache_salt),) if k == 0 and cache_salt else None
        parent = hash_fn((parent, tuple(block.tolist()), extra))
        out.append(parent.hex())
    return out


def _lmcache_chain(blocks: np.ndarray, algo: str, scheme: str, hash_seed: str | None) -> list[str]:
    """LMCache's ``ChunkedTokenDatabase`` prefix hashes over ``blocks`` ``[chunks, chunk_size]``, as key hex."""
    if algo == "builtin":
        prefix = _python_str_hash(_pythonhashseed(hash_seed, scheme))
        hash_fn: Callable[[Any], Any] = hash  # an int tuple's hash is the same in every process (no str in it)
    else:
        hash_fn = _vllm_hash_fn(algo)
        prefix = _fold(hash_fn(_vllm_seed(algo, hash_seed, scheme)))
    out = []
    for block in blocks:
        prefix = _fold(hash_fn((prefix, tuple(block.tolist()), ())))
        out.append(format(prefix, "x"))
    return out


def _sglang_chain(blocks: np.ndarray, cache_salt: str) -> list[str]:
    """SGLang's HiCache storage page hashes over ``blocks`` ``[pages, page_size]``, as hex digests."""
    prior = b""
    if cache_salt:
        salt = cache_salt.encode()
        prior = hashlib.sha256(_SGLANG_NAMESPACE_TAG + b"\x00\x01" + len(salt).to_bytes(8, "little") + salt).digest()
    out = []
    for block in blocks:
        prior = hashlib.sha256(prior + block.astype("<u4").tobytes()).digest()
        out.append(prior.hex())
    return out


def _vllm_hash_fn(algo: str) -> Callable[[Any], bytes]:
    """vLLM's ``get_hash_fn_by_name(algo)``: serialize (pickle or canonical CBOR), then digest (SHA-256 or
    xxh3-128)."""
    if algo.endswith("_cbor"):
        import cbor2  # only the CBOR schemes need it

        def serialize(obj: Any) -> bytes:
            return cbor2.dumps(obj, canonical=True)
    else:
        def serialize(obj: Any) -> bytes:
            return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)
    digest = xxhash.xxh3_128_digest if algo.startswith("xxhash") else (lambda b: hashlib.sha256(b).digest())
    return lambda obj: digest(serialize(obj))


def _vllm_seed(algo: str, hash_seed: str | None, scheme: str) -> str:
    """The string vLLM's ``init_none_hash`` hashes into ``NONE_HASH``.

    Raises:
        ValueError: no ``hash_seed`` for an xxhash algorithm (vLLM's root is then random per process), or one
            Python would refuse as PYTHONHASHSEED.
    """
    if hash_seed is not None:
        if hash_seed != "random" and (not hash_seed.isdigit() or int(hash_seed) > 0xFFFFFFFF):
            raise ValueError(f"PYTHONHASHSEED must be 'random' or an integer in [0, 4294967295] (Python starts with "
                             f"no other), got {hash_seed!r}")
        return hash_seed
    if algo.startswith("xxhash"):
        raise ValueError(f"{scheme} roots its hashes in a random seed unless PYTHONHASHSEED is set: "
                         "pass the PYTHONHASHSEED the engine ran with (hash_seed / --hash-seed)")
    return VLLM_DEFAULT_SEED


def _pythonhashseed(hash_seed: str | None, scheme: str) -> int:
    """``hash_seed`` as the integer CPython takes from PYTHONHASHSEED.

    Raises:
        ValueError: None or "random" (the engine's str hashes were random), or not an integer in [0, 2**32).
    """
    if hash_seed is None or hash_seed == "random":
        raise ValueError(f"{scheme} hashes with Python's hash(), random unless PYTHONHASHSEED is set: "
                         "pass the PYTHONHASHSEED the engine ran with (hash_seed / --hash-seed)")
    if not hash_seed.isdigit() or int(hash_seed) > 0xFFFFFFFF:
        raise ValueError(f"PYTHONHASHSEED must be an integer in [0, 4294967295], got {hash_seed!r}")
    return int(hash_seed)


def _python_str_hash(seed: int) -> int:
    """``hash(str(seed))`` in a CPython >= 3.11 process run with ``PYTHONHASHSEED=seed`` (64-bit build).

    CPython (Python/bootstrap_hash.c, Python/pyhash.c) keys SipHash-1-3 with the first 16 bytes of a secret filled
    by an LCG from the seed (all zeros for seed 0) and hashes the string's bytes (ASCII: one byte per character);
    -1 becomes -2. Python 3.10 used SipHash-2-4 and is not matched.
    """
    secret = bytearray(16)
    x = seed
    for i in range(16 if seed else 0):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        secret[i] = (x >> 16) & 0xFF
    k0, k1 = struct.unpack("<QQ", secret)
    h = _siphash13(k0, k1, str(seed).encode("ascii"))
    h = h - (1 << 64) if h >= 1 << 63 else h
    return -2 if h == -1 else h


def _siphash13(k0: int, k1: int, data: bytes) -> int:
    """SipHash-1-3 of ``data`` under key ``(k0, k1)``, as an unsigned 64-bit int."""
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    tail = len(data) % 8
    words = list(struct.unpack(f"<{len(data) // 8}Q", data[:len(data) - tail]))
    words.append(((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail:], "little"))
    for m in words:
        v[3] ^= m
        _sip_round(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(3):
        _sip_round(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def _sip_round(v: list[int]) -> None:
    """One SipRound on the state ``v`` (four uint64), in place."""
    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & _MASK64

    v[0] = (v[0] + v[1]) & _MASK64
    v[1] = rotl(v[1], 13) ^ v[0]
    v[0] = rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & _MASK64
    v[3] = rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & _MASK64
    v[3] = rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & _MASK64
    v[1] = rotl(v[1], 17) ^ v[2]
    v[2] = rotl(v[2], 32)


def _fold(value: int | bytes) -> int:
    """LMCache's ``_normalize_hash_to_int``: an int as is, a digest's first 8 bytes as a big-endian int."""
    return int.from_bytes(value[:8], "big") if isinstance(value, bytes) else value
