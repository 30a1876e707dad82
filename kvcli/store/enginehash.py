"""Engine block hashes: the prefix-hash chain a serving engine computes for a prompt's full blocks.

``kvcli explain`` prints these beside kvcli's own chunk hashes so its output joins an engine's logs, metrics and KV
events. :func:`block_hashes` is the one entry point; ``scheme`` names the engine and its hash function
(:data:`ENGINE_HASHES`). Every scheme hashes full blocks only, in prompt order; a partial last block (and so a prompt
shorter than one block) gives no hash. Sources, each matched by golden vectors from the engine's own code
(tests/store/test_enginehash.py):

* ``kvcli``: :mod:`kvcli.store.hashing` (xxh3-128 chain from :func:`~kvcli.store.hashing.namespace_root`), 32 hex
  digits per chunk, as in the store's keys.
* ``vllm-<algo>[@VERSION]`` (``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``, ``init_none_hash``,
  ``generate_block_hash_extra_keys``, and the hashing functions of ``vllm/utils``, at each release: :data:`VLLM_ERAS`
  says which versions hash alike; without ``@VERSION``, :data:`VLLM_VERSION`): ``hash[k] = H((hash[k-1], tokens_k,
  extra_k))`` over a 3-tuple of the parent hash, the block's token ids as a tuple of ints and the extra keys (the
  LoRA adapter's key on every block, then the cache salt on block 0; None when there are none). ``H`` serializes
  with pickle (protocol 5, vLLM's ``HIGHEST_PROTOCOL`` on Python 3.8 to 3.14) or canonical CBOR (``cbor2``) and
  digests with SHA-256 (32 bytes) or xxh3-128 (16 bytes); up to 0.10.1 the hash is an int (the SHA-256 digest read
  big-endian; ``sha256_cbor_64bit``: its low 64 bits) and the chain carries the int. ``hash[-1] = NONE_HASH``, from
  the engine's ``PYTHONHASHSEED`` string (:func:`vllm_root`): ``H(seed)`` (0.8.5 to 0.9.2: vLLM's ``sha256(seed)``
  whatever the algorithm), and when the seed is unset ``H("vllm-none-hash")`` for the SHA-256 algorithms from 0.29.0
  on, a random per-process value before 0.29.0 and for the xxhash ones (0.8.3 and 0.8.4 swapped the test: a root of
  ``sha256(None)`` unset, random set). The extra keys: the cache salt as itself up to 0.30.0 (none before 0.9.0),
  ``("cache_salt", salt)`` from 0.31.0; the adapter as its ``lora_int_id`` up to 0.11.0, its ``lora_name`` from
  0.11.1, ``("lora", lora_name, lora_path)`` from 0.31.0. Printed as the digest's hex (an int's lower-case hex up to
  0.10.1); vLLM's KV events (default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) carry ``int(hex, 16) & (2**64 -
  1)``. ``vllm`` is ``vllm-sha256``, vLLM's default ``--prefix-caching-hash-algo`` from 0.10.2 on; before it the
  default was Python's builtin ``hash()``, which kvcli does not reproduce (a tuple holding None hashes by the
  object's address before Python 3.12), so ``vllm@0.9.2`` is refused and ``vllm-sha256@0.9.2`` is not.
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
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import xxhash

from kvcli.store.hashing import as_token_array, chunk_hashes, namespace_root

_VLLM_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ENGINE_HASHES: tuple[str, ...] = ("kvcli", "vllm", *(f"vllm-{a}" for a in _VLLM_ALGOS), "sglang", "lmcache",
                                  *(f"lmcache-{a}" for a in _VLLM_ALGOS))
VLLM_VERSION = "0.33.0"  # the vLLM version ``vllm-<algo>`` without ``@VERSION`` hashes as
LMCACHE_VERSION = "0.5.6"
SGLANG_VERSION = "0.5.23"
VLLM_DEFAULT_SEED = "vllm-none-hash"  # vLLM's NONE_HASH seed for SHA-256 when PYTHONHASHSEED is unset (>= 0.29.0)
_PICKLE_PROTOCOL = 5
_SGLANG_NAMESPACE_TAG = b"sglang-cache-namespace-v1"
_MASK64 = (1 << 64) - 1


class LoraAdapter(NamedTuple):
    """A LoRA adapter as vLLM's ``LoRARequest`` names it: ``lora_name``, ``lora_int_id`` and ``lora_path``; each
    vLLM version puts one or more of them in every block's extra keys (module docstring)."""

    name: str
    int_id: int
    path: str


@dataclass(frozen=True)
class VllmEra:
    """A range of vLLM versions that hash blocks alike (module docstring; read from each release's
    ``vllm/v1/core/kv_cache_utils.py`` and hashing module, checked by tests/store/data/vllm_hashes).

    Attributes:
        first, last: the first and last release of the range, ``"X.Y.Z"``.
        algos: the ``--prefix-caching-hash-algo`` values kvcli reproduces (not ``builtin``).
        default: the algorithm vLLM uses when none is given.
        ints: hashes are ints (``BlockHashType.hash_value``), not digests.
        root: how ``NONE_HASH`` comes from PYTHONHASHSEED: ``"swapped"`` (``sha256(None)`` unset, random set),
            ``"sha256"`` (``sha256(seed)``, random unset), ``"fn"`` (``H(seed)``, random unset), ``"fixed"``
            (``H(seed)``, unset ``H("vllm-none-hash")`` for SHA-256 and random for xxhash).
        salt: the cache salt enters block 0's extra keys. tagged: extra keys are ``(name, value...)`` tuples.
        lora: what names the adapter in the extra keys: ``"int_id"``, ``"name"`` or ``"name_path"``.
    """

    first: str
    last: str
    algos: tuple[str, ...]
    default: str
    ints: bool
    root: str
    salt: bool
    tagged: bool
    lora: str

    @property
    def span(self) -> str:
        """``"first to last"``, or the one version."""
        return self.first if self.first == self.last else f"{self.first} to {self.last}"


#: Every vLLM V1 release range kvcli hashes as, oldest first (module docstring).
VLLM_ERAS: tuple[VllmEra, ...] = (
    VllmEra("0.8.3", "0.8.4", ("sha256",), "builtin", True, "swapped", False, False, "int_id"),
    VllmEra("0.8.5", "0.8.5", ("sha256",), "builtin", True, "sha256", False, False, "int_id"),
    VllmEra("0.9.0", "0.9.2", ("sha256",), "builtin", True, "sha256", True, False, "int_id"),
    VllmEra("0.10.0", "0.10.1", ("sha256", "sha256_cbor_64bit"), "builtin", True, "fn", True, False, "int_id"),
    VllmEra("0.10.2", "0.11.0", ("sha256", "sha256_cbor"), "sha256", False, "fn", True, False, "int_id"),
    VllmEra("0.11.1", "0.12.0", ("sha256", "sha256_cbor"), "sha256", False, "fn", True, False, "name"),
    VllmEra("0.13.0", "0.28.0", _VLLM_ALGOS, "sha256", False, "fn", True, False, "name"),
    VllmEra("0.29.0", "0.30.0", _VLLM_ALGOS, "sha256", False, "fixed", True, False, "name"),
    VllmEra("0.31.0", "0.34.0", _VLLM_ALGOS, "sha256", False, "fixed", True, True, "name_path"),
)


@dataclass(frozen=True)
class HashScheme:
    """A ``--hash`` value resolved: which engine, version and algorithm it hashes as.

    Attributes:
        name: the canonical name, ``"vllm-sha256@0.33.0"``, ``"sglang@0.5.23"``, ``"kvcli"``.
        engine: ``"kvcli"``, ``"vllm"``, ``"sglang"`` or ``"lmcache"``. algo: the hash algorithm (``""`` for kvcli
            and SGLang). version: the engine version it follows (``""`` for kvcli).
        hashes_as: the versions that hash alike (vLLM: its era's span; the others: the version).
        era: vLLM's :class:`VllmEra` (None for the others).
    """

    name: str
    engine: str
    algo: str
    version: str
    hashes_as: str
    era: VllmEra | None = None

    @property
    def label(self) -> str:
        """How reports name it: ``"vllm-sha256@0.33.0 (vLLM 0.31.0 to 0.34.0 hash alike)"``."""
        if self.engine == "vllm" and self.hashes_as != self.version:
            return f"{self.name} (vLLM {self.hashes_as} hash alike)"
        if self.engine == "lmcache":
            return f"{self.name} (on vLLM {VLLM_VERSION})"
        return self.name

    def as_json(self) -> dict:
        """``{"scheme", "engine", "algorithm", "version", "hashes_as"}``."""
        return {"scheme": self.name, "engine": self.engine, "algorithm": self.algo, "version": self.version,
                "hashes_as": self.hashes_as}


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; ``"0.9"`` -> ``(0, 9, 0)``; a ``.postN`` tail is dropped.

    Raises:
        ValueError: not ``X.Y`` or ``X.Y.Z`` of integers.
    """
    parts = version.split(".post")[0].split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"a vLLM version is X.Y.Z, e.g. {VLLM_VERSION}; got {version!r}")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def vllm_era(version: str) -> VllmEra:
    """The :class:`VllmEra` vLLM ``version`` (``"X.Y.Z"``) belongs to.

    Raises:
        ValueError: a malformed version, one before 0.8.3 (only Python's builtin hash) or after the newest era.
    """
    v = _version_tuple(version)
    for era in VLLM_ERAS:
        if _version_tuple(era.first) <= v <= _version_tuple(era.last):
            return era
    if v > _version_tuple(VLLM_ERAS[-1].last):
        raise ValueError(f"vLLM {version} is newer than the newest version kvcli checked ({VLLM_ERAS[-1].last}): "
                         f"its hashes may differ; --hash vllm@{VLLM_ERAS[-1].last} hashes as that one")
    raise ValueError(f"vLLM {version} hashes blocks with Python's builtin hash() only (sha256 came in 0.8.3): "
                     "kvcli does not reproduce it")


def hash_scheme(scheme: str) -> HashScheme:
    """``scheme`` (one of :data:`ENGINE_HASHES`, a vLLM one with an optional ``@VERSION``) resolved.

    Raises:
        ValueError: an unknown scheme, ``@VERSION`` on another engine's, a version :func:`vllm_era` refuses, or an
            algorithm that version has not (``builtin``, vLLM's default up to 0.10.1, included).
    """
    base, at, version = scheme.partition("@")
    engine, _, algo = base.partition("-")
    known = base in ENGINE_HASHES or (engine == "vllm" and algo == "sha256_cbor_64bit")
    if not known or (at and (engine != "vllm" or not version)):
        raise ValueError(f"unknown hash scheme {scheme!r}; choose one of: {', '.join(ENGINE_HASHES)} (a vllm one "
                         f"with @VERSION for another vLLM release, e.g. vllm@0.28.0)")
    if engine == "kvcli":
        return HashScheme("kvcli", "kvcli", "xxh3_128", "", "")
    if engine == "sglang":
        return HashScheme(f"sglang@{SGLANG_VERSION}", "sglang", "sha256", SGLANG_VERSION, SGLANG_VERSION)
    if engine == "lmcache":
        algo = algo or "builtin"
        return HashScheme(f"{base}@{LMCACHE_VERSION}", "lmcache", algo, LMCACHE_VERSION, LMCACHE_VERSION)
    version = version or VLLM_VERSION
    era = vllm_era(version)
    algo = algo or era.default
    if algo not in era.algos:
        if algo == "builtin":
            raise ValueError(f"vLLM {version} hashes blocks with Python's builtin hash() unless it ran with "
                             "--prefix-caching-hash-algo sha256; kvcli does not reproduce builtin hash() (a tuple "
                             f"holding None hashes by the object's address before Python 3.12): --hash "
                             f"vllm-sha256@{version} if it ran with sha256")
        raise ValueError(f"vLLM {version} has no {algo} hash (it has {', '.join(era.algos)})")
    return HashScheme(f"vllm-{algo}@{version}", "vllm", algo, version, era.span, era)


def block_hashes(scheme: str, token_ids, block_size: int, *, cache_salt: str = "", hash_seed: str | None = None,
                 model_id: str = "", tokenizer: str = "", lora: LoraAdapter | None = None) -> list[str]:
    """The block hash chain ``scheme`` computes for a prompt: one string per full block, in prompt order.

    Args:
        scheme: one of :data:`ENGINE_HASHES`, a vLLM one optionally with ``@VERSION`` (:func:`hash_scheme`; the
            module docstring says what each computes and prints).
        token_ids: the prompt's token ids, ``[tokens]`` (a little-endian uint32 array, or anything
            :func:`~kvcli.store.hashing.as_token_array` takes).
        block_size: tokens per block: vLLM's ``--block-size``, SGLang's ``--page-size``, LMCache's ``chunk_size``,
            kvcli's ``--chunk-size``.
        cache_salt: the request's cache salt; "" for none (SGLang's ``None``). LMCache and vLLM before 0.9.0
            ignore it.
        hash_seed: the ``PYTHONHASHSEED`` the engine ran with (a string, as in the environment); None where it was
            unset. vLLM and LMCache root their chains in it; kvcli and SGLang ignore it.
        model_id: kvcli's model id (``kvcli`` scheme only): the one the store hashed under.
        tokenizer: kvcli's tokenizer name (``kvcli`` scheme only).
        lora: the request's LoRA adapter (vLLM schemes only; None: the base model).

    Returns:
        ``len(token_ids) // block_size`` strings: hex digests, or for LMCache and vLLM up to 0.10.1 an int's hex.

    Raises:
        ValueError: what :func:`hash_scheme` raises, ``block_size`` < 1, a token id outside uint32, a ``lora`` for
            a scheme other than vLLM's, or a scheme whose root is random without ``hash_seed`` (or, for vLLM
            0.8.3 and 0.8.4, with it; :func:`vllm_root`) or, for ``lmcache``, a seed that is not an integer in
            [0, 2**32).
    """
    resolved = hash_scheme(scheme)
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    if lora is not None and resolved.engine != "vllm":
        raise ValueError(f"{resolved.name} puts no LoRA adapter in its block hashes")
    tokens = as_token_array(token_ids)
    if resolved.engine == "kvcli":
        return [h.hex() for h in chunk_hashes(tokens, block_size, namespace_root(model_id, tokenizer, cache_salt))[1]]
    blocks = tokens[:len(tokens) // block_size * block_size].reshape(-1, block_size)
    if resolved.engine == "sglang":
        return _sglang_chain(blocks, cache_salt)
    if resolved.era is not None:
        return _vllm_chain(blocks, resolved, cache_salt, hash_seed, lora)
    return _lmcache_chain(blocks, resolved.algo, scheme, hash_seed)


def _vllm_chain(blocks: np.ndarray, scheme: HashScheme, cache_salt: str, hash_seed: str | None,
                lora: LoraAdapter | None) -> list[str]:
    """vLLM's ``hash_block_tokens`` chain over ``blocks`` ``[blocks, block_size]`` as ``scheme``'s version hashes
    it, as hex (a digest's, or an int's)."""
    era = scheme.era
    assert era is not None
    hash_fn = _vllm_hash_fn(_vllm_fn_name(scheme))
    parent = vllm_root(scheme, hash_seed)
    lora_keys: list[Any] = []
    if lora is not None:
        lora_keys = [{"int_id": lora.int_id, "name": lora.name, "name_path": ("lora", lora.name, lora.path)}[era.lora]]
    salt_key: Any = ("cache_salt", cache_salt) if era.tagged else cache_salt
    out = []
    for k, block in enumerate(blocks):
        keys = lora_keys + ([salt_key] if k == 0 and cache_salt and era.salt else [])
        parent = hash_fn((parent, tuple(block.tolist()), tuple(keys) if keys else None))
        out.append(parent.hex() if isinstance(parent, bytes) else format(parent, "x"))
    return out


def vllm_root(scheme: HashScheme, hash_seed: str | None) -> bytes | int:
    """vLLM's ``NONE_HASH`` for ``scheme`` (a vLLM one) under PYTHONHASHSEED ``hash_seed`` (None: unset): the parent
    of block 0 (module docstring; :class:`VllmEra` ``root``).

    Raises:
        ValueError: the root is random in that case (the message says which seed would fix it), or a seed Python
            would refuse as PYTHONHASHSEED.
    """
    era = scheme.era
    assert era is not None
    hash_fn = _vllm_hash_fn(_vllm_fn_name(scheme))
    _check_seed(hash_seed)
    if era.root == "swapped":
        if hash_seed is not None:
            raise ValueError(f"vLLM {era.span} roots its hashes in a random value when PYTHONHASHSEED is set "
                             "(and in sha256(None) when it is unset): only an engine run without it can be matched")
        return hash_fn(None)
    if hash_seed is not None:
        return _vllm_hash_fn("sha256_int")(hash_seed) if era.root == "sha256" else hash_fn(hash_seed)
    if era.root == "fixed" and not scheme.algo.startswith("xxhash"):
        return hash_fn(VLLM_DEFAULT_SEED)
    raise ValueError(f"{scheme.name} roots its hashes in a random seed unless PYTHONHASHSEED is set: pass the "
                     "PYTHONHASHSEED the engine ran with (hash_seed / --hash-seed)")


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


def _vllm_hash_fn(algo: str) -> Callable[[Any], Any]:
    """vLLM's hash function of that name (``get_hash_fn_by_name``): serialize (pickle or canonical CBOR), then digest
    (SHA-256 or xxh3-128); ``sha256_int`` and ``sha256_cbor_64bit`` are vLLM 0.8.3-0.10.1's int-valued ones (the
    SHA-256 digest read big-endian, and its low 64 bits)."""
    if algo.endswith("_cbor") or algo == "sha256_cbor_64bit":
        import cbor2  # only the CBOR schemes need it

        def serialize(obj: Any) -> bytes:
            return cbor2.dumps(obj, canonical=True)
    else:
        def serialize(obj: Any) -> bytes:
            return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)
    if algo == "sha256_cbor_64bit":
        return lambda obj: int.from_bytes(hashlib.sha256(serialize(obj)).digest(), "big") & _MASK64
    if algo == "sha256_int":
        return lambda obj: int.from_bytes(hashlib.sha256(serialize(obj)).digest(), "big")
    digest = xxhash.xxh3_128_digest if algo.startswith("xxhash") else (lambda b: hashlib.sha256(b).digest())
    return lambda obj: digest(serialize(obj))


def _vllm_fn_name(scheme: HashScheme) -> str:
    """The :func:`_vllm_hash_fn` name of a vLLM scheme's algorithm: its int-valued ``sha256`` up to 0.10.1."""
    return "sha256_int" if scheme.era is not None and scheme.era.ints and scheme.algo == "sha256" else scheme.algo


def _check_seed(hash_seed: str | None) -> None:
    """Raises ValueError for a PYTHONHASHSEED Python would refuse (None, unset, passes)."""
    if hash_seed is not None and hash_seed != "random" and (not hash_seed.isdigit() or int(hash_seed) > 0xFFFFFFFF):
        raise ValueError(f"PYTHONHASHSEED must be 'random' or an integer in [0, 4294967295] (Python starts with "
                         f"no other), got {hash_seed!r}")


def _vllm_seed(algo: str, hash_seed: str | None, scheme: str) -> str:
    """The string vLLM 0.33.0's ``init_none_hash`` hashes into ``NONE_HASH`` (LMCache's root on it).

    Raises:
        ValueError: no ``hash_seed`` for an xxhash algorithm (vLLM's root is then random per process), or one
            Python would refuse as PYTHONHASHSEED.
    """
    if hash_seed is not None:
        _check_seed(hash_seed)
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
