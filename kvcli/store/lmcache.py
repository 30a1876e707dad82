"""LMCache's Redis layouts: key names, the metadata record, the KV bytes, and which layout a key is in.

Matched against LMCache **0.5.6** (PyPI wheel, git ``3e11e108``, the newest release) and its main
(``lmcache-cli 0.5.7rc3.dev0``, git ``bf85b41fa``), which agree on all of it: ``lmcache/utils.py``
(``CacheEngineKey``, ``LayerCacheEngineKey``, ``parse_cache_key``), ``lmcache/v1/protocol.py`` (``RemoteMetadata``;
``lmcache/inprocess/v1/protocol.py`` on main), ``lmcache/v1/memory_management.py`` (``MemoryFormat``) and
``lmcache/v1/storage_backend/connector/redis_connector.py`` (``RedisConnector``, ``RESPConnector``). Golden vectors
made by that code: ``tests/store/fixtures/lmcache/``. Names and parsing only; no Redis calls (the stores are
:mod:`kvcli.store.lmcache_store`, the inspection :mod:`kvcli.live.inspect_lmcache`). Three layouts share a server:

* ``redis://`` (``RedisConnector``): two keys per chunk, below;
* ``resp://`` (``RESPConnector``, LMCache's native client): one key per chunk, the bare key string below with no
  suffix, whose value is the chunk's raw bytes (what ``kv_bytes`` holds), no metadata record (the reader allocates
  the full chunk from its own config; the connector refuses ``save_unfull_chunk``, so every chunk is full);
* multiprocess mode's L2 adapters (``{model}@{kv_rank}@{object_group_id}@{hash}[@{salt}]``, raw bytes):
  :mod:`kvcli.store.lmcache_mp`.

**Keys.** One chunk is two plain string keys, the chunk's key string followed directly (no separator) by a
suffix::

    {model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}[@{layer_id}][@{tag}%{value}...]metadata
    {model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}[@{layer_id}][@{tag}%{value}...]kv_bytes

``model_name`` is the serving engine's model name (``meta-llama/Llama-3.1-8B-Instruct``), ``world_size`` and
``worker_id`` the tensor-parallel size and rank, ``chunk_hash`` the prefix hash of the chunk as a Python int in
lower-case hex without padding (a negative one, from Python's ``hash()``, keeps its ``-``), ``dtype`` the KV dtype
by LMCache's name (``half``, ``bfloat16``, ``float``, ...), ``layer_id`` present only for layer-wise keys, and tags
the request's ``lmcache.tag.*`` configs. A hash folded from a digest is its first 8 bytes big-endian (LMCache's
``_normalize_hash_to_int``), at most 16 hex digits.

**Metadata record** (the ``metadata`` key's value): ``struct`` ``"i" * (2 + 5 * groups)``, native order (little
endian on every platform LMCache ships for), 4 bytes each: ``length`` (bytes of the ``kv_bytes`` value), ``fmt``
(``MemoryFormat``), then per KV group ``dtype code`` and the shape padded to 4 dimensions with trailing zeros.
One group (every non-hybrid model) is 28 bytes. LMCache sets ``kv_bytes`` first, then ``metadata``; a lookup is
one ``EXISTS <key>metadata`` per chunk, in order, stopping at the first miss; a get reads ``metadata`` then
``kv_bytes``.

**KV bytes** (the ``kv_bytes`` key's value): the chunk's tensor bytes, no header. Format ``KV_2LTD`` (the default
for a non-MLA model) is ``[2, layers, tokens, kv_heads * head_dim]``: K and V first, then layers.

**The older layout** (LMCache 0.3.1 to 0.3.12; 0.3.13 dropped the leading field): the same two suffixes after a key
string that starts with the serving engine's format, ``vllm`` (or ``huggingface``)::

    {fmt}@{model_name}@{world_size}@{worker_id}@{chunk_hash}[@{dtype}][@{layer_id}][@{tag}%{value}...]

where ``chunk_hash`` is a SHA-256 hex digest (0.3.1), a Python int in decimal (0.3.3) or in lower-case hex (0.3.6
on), and the ``dtype`` field is there from 0.3.10 on. kvcli recognises these keys (:func:`legacy_model`) to count
and name them; it reads neither their records nor their bytes.
"""
from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcli.store.lmcache_mp import MPKey, parse_mp_key

if TYPE_CHECKING:
    import torch

LMCACHE_VERSION = "0.5.6"
LMCACHE_COMMIT = "3e11e108"
LMCACHE_MAIN = "lmcache-cli 0.5.7rc3.dev0 (git bf85b41fa)"
METADATA_SUFFIX = "metadata"
KV_SUFFIX = "kv_bytes"
RESP_KEY_FORMAT = "{model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}[@{layer_id}][@{tag}%{value}...]"
KEY_FORMAT = RESP_KEY_FORMAT + "{metadata|kv_bytes}"
# the layouts' names (classify_key), as kvcli's --layout names them
REDIS, RESP, MP, LEGACY, UNKNOWN = "lmcache", "lmcache-resp", "lmcache-mp", "legacy", "unknown"
LMCACHE_LAYOUTS = (REDIS, RESP, MP)  # the ones kvcli writes (replay, warm) and purges by namespace


def lmcache_layouts(layouts) -> tuple[str, ...]:
    """The LMCache layouts among ``layouts`` (an iterable of layout names), in order."""
    return tuple(x for x in layouts if x in LMCACHE_LAYOUTS)

# KEY_DTYPES, DTYPE_CODES and CODE_DTYPES are keyed by torch dtypes: built on first use (module __getattr__), so
# importing this module (its key format, for a report) does not load torch.
_KEY_DTYPE_NAMES = frozenset(("half", "bfloat16", "float", "double", "int8", "uint8", "int16", "int32", "int64",
                              "bool", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz"))


@functools.cache
def _dtype_tables() -> dict[str, dict]:
    import torch

    # CacheEngineKey's dtype names (lmcache/utils.py TORCH_DTYPE_TO_STR_DTYPE; float16 and half are one dtype).
    key_dtypes = {
        torch.float16: "half", torch.bfloat16: "bfloat16", torch.float32: "float", torch.float64: "double",
        torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
        torch.bool: "bool", torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz",
        torch.float8_e5m2: "fp8_e5m2", torch.float8_e5m2fnuz: "fp8_e5m2fnuz",
    }
    # The metadata record's dtype codes (protocol.py DTYPE_TO_INT). torch.half is torch.float16, so LMCache's two
    # entries collapse and float16 is written as 2; 1 is read as float16 too.
    codes = {
        torch.float16: 2, torch.bfloat16: 3, torch.float32: 4, torch.float64: 5, torch.uint8: 6,
        torch.float8_e4m3fn: 7, torch.float8_e5m2: 8,
    }
    return {"KEY_DTYPES": key_dtypes, "DTYPE_CODES": codes,
            "CODE_DTYPES": {0: None, 1: torch.float16, **{v: k for k, v in codes.items()}}}


def __getattr__(name: str):
    """``KEY_DTYPES`` (torch dtype -> LMCache key name), ``DTYPE_CODES`` (torch dtype -> record code) and
    ``CODE_DTYPES`` (code -> torch dtype or None), built with torch on first use."""
    tables = _dtype_tables() if name in ("KEY_DTYPES", "DTYPE_CODES", "CODE_DTYPES") else {}
    if name in tables:
        return tables[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# MemoryFormat values (memory_management.py) and, for the KV formats, the axis that counts tokens.
FORMATS = {0: "UNDEFINED", 1: "KV_2LTD", 2: "KV_T2D", 3: "KV_2TD", 4: "BINARY", 5: "BINARY_BUFFER",
           6: "KV_MLA_FMT", 7: "EC_TD", 8: "HS_TD"}
KV_2LTD = 1
_TOKEN_AXIS = {1: 2, 2: 0, 3: 1, 6: 2, 7: 0, 8: 0}
_UNPADDED = (4, 5)  # BINARY, BINARY_BUFFER: zeros in their shape are real, never stripped

LEGACY_VERSIONS = "0.3.1-0.3.12"
LEGACY_KEY_FORMAT = ("{fmt}@{model_name}@{world_size}@{worker_id}@{chunk_hash}[@{dtype}][@{layer_id}]"
                     "[@{tag}%{value}...]{metadata|kv_bytes}")
_LEGACY_DTYPE_NAMES = _KEY_DTYPE_NAMES | {"fp8", "fp8_e4m3"}  # 0.3.x's names beside today's
_ENGINE_FORMAT = re.compile(r"[a-z][a-z0-9_]*")

_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")  # an int as f"{n}" writes it (no leading zero)
_HASH_LIKE = re.compile(r"-?[0-9a-f]{8,}")
_HEX = re.compile(r"-?[0-9a-f]+")


@dataclass(frozen=True, slots=True)
class LMCacheKey:
    """One chunk's key string, parsed: ``CacheEngineKey`` (``layer_id`` None) or ``LayerCacheEngineKey``.

    ``chunk_hash`` is an int (printed in hex); ``dtype`` is LMCache's dtype name (``KEY_DTYPES``); ``tags`` are
    ``(name, value)`` pairs without the ``lmcache.tag.`` prefix, in key order.
    """

    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: str
    layer_id: int | None = None
    tags: tuple[tuple[str, str], ...] = ()

    def to_string(self) -> str:
        """The key string as ``CacheEngineKey.to_string()`` writes it (without the Redis suffix)."""
        head, tail = key_affixes(self.model_name, self.world_size, self.worker_id, self.dtype, self.layer_id,
                                 self.tags)
        return f"{head}{self.chunk_hash:x}{tail}"

    def redis_keys(self) -> tuple[str, str]:
        """``(metadata key, kv_bytes key)`` of this chunk."""
        base = self.to_string()
        return base + METADATA_SUFFIX, base + KV_SUFFIX


def key_affixes(model_name: str, world_size: int, worker_id: int, dtype: str, layer_id: int | None = None,
                tags: tuple[tuple[str, str], ...] = ()) -> tuple[str, str]:
    """``(head, tail)``: the key string of a chunk with these fields is ``head + f"{chunk_hash:x}" + tail`` (so a
    store formats one key per chunk without building an :class:`LMCacheKey`)."""
    tail = f"@{dtype}" + ("" if layer_id is None else f"@{layer_id}")
    if tags:
        tail += "@" + "@".join(f"{k}%{v}" for k, v in tags)
    return f"{model_name}@{world_size}@{worker_id}@", tail


def parse_key(text: str) -> LMCacheKey:
    """Parse a key string (no Redis suffix) by ``parse_cache_key``'s rules: at least 5 ``@`` fields; a 6th field
    of digits is a layer id; every later field is ``tag%value``.

    Raises:
        ValueError: not a key LMCache writes (too few fields, a non-integer size or rank, a hash that is not
            lower-case hex, an unknown dtype name, a tag without ``%``).
    """
    parts = text.split("@")
    if len(parts) < 5:
        raise ValueError(f"not an LMCache key (fewer than 5 '@' fields): {text!r}")
    model, world, worker, chunk_hash, dtype = parts[:5]
    if not (_INT.fullmatch(world) and _INT.fullmatch(worker) and _HEX.fullmatch(chunk_hash)):
        raise ValueError(f"not an LMCache key (world size, worker id or hash): {text!r}")
    if dtype not in _KEY_DTYPE_NAMES:
        raise ValueError(f"not an LMCache key (unknown dtype {dtype!r}): {text!r}")
    rest, layer = parts[5:], None
    if rest and rest[0].isdigit():
        layer, rest = int(rest[0]), rest[1:]
    pairs = [t.split("%", 1) for t in rest]
    if any(len(t) != 2 for t in pairs):
        raise ValueError(f"not an LMCache key (a tag without '%'): {text!r}")
    tags = tuple((name, value) for name, value in pairs)
    return LMCacheKey(model, int(world), int(worker), int(chunk_hash, 16), dtype, layer, tags)


def split_redis_key(key: bytes) -> tuple[LMCacheKey, str] | None:
    """``(parsed key, "metadata" | "kv_bytes")`` of a Redis key LMCache's connector writes; None for any other."""
    for suffix in (METADATA_SUFFIX, KV_SUFFIX):
        if key.endswith(suffix.encode()):
            try:
                return parse_key(key[:-len(suffix)].decode()), suffix
            except (ValueError, UnicodeDecodeError):
                return None
    return None


def legacy_model(key: bytes) -> str | None:
    """The model name of a Redis key in LMCache 0.3.x's older layout (module docstring), else None; a key of
    today's layout (:func:`split_redis_key`) is not one."""
    suffix = next((x for x in (METADATA_SUFFIX, KV_SUFFIX) if key.endswith(x.encode())), None)
    if suffix is None or split_redis_key(key) is not None:
        return None
    try:
        parts = key[:-len(suffix)].decode().split("@")
    except UnicodeDecodeError:
        return None
    if len(parts) < 5 or not _ENGINE_FORMAT.fullmatch(parts[0]) or not parts[1]:
        return None
    if not (_INT.fullmatch(parts[2]) and _INT.fullmatch(parts[3]) and _HEX.fullmatch(parts[4])):
        return None
    rest = parts[5:]
    if rest and rest[0] in _LEGACY_DTYPE_NAMES:
        rest = rest[1:]
    if rest and rest[0].isdigit():
        rest = rest[1:]
    return parts[1] if all("%" in tag for tag in rest) else None


def parse_resp_key(key: bytes) -> LMCacheKey | None:
    """The parsed key of a ``resp://`` key (the bare key string, no suffix), else None."""
    try:
        return parse_key(key.decode())
    except (ValueError, UnicodeDecodeError):
        return None


def _parse_mp(key: bytes) -> MPKey | None:
    try:
        return parse_mp_key(key.decode())
    except (ValueError, UnicodeDecodeError):
        return None


def unknown_model(key: bytes) -> str | None:
    """The first ``@`` field of a key that looks like an LMCache key but is in none of its known layouts (module
    docstring: 3 or more ``@`` fields, the first not empty, one after it a hex hash of 8 or more digits, not a
    kvcli key), else None. Call it on a key :func:`classify_key` found in no known layout."""
    if key.startswith(b"kvcli:"):
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    for suffix in (METADATA_SUFFIX, KV_SUFFIX):
        text = text.removesuffix(suffix)
    parts = text.split("@")
    if len(parts) < 3 or not parts[0] or not any(_HASH_LIKE.fullmatch(p) for p in parts[1:]):
        return None
    return parts[0]


def classify_key(key: bytes) -> tuple[str, object] | None:
    """Which LMCache layout a Redis key is in (module docstring), with what it parses to, or None (not LMCache's):

    * ``(REDIS, (LMCacheKey, "metadata" | "kv_bytes"))``, ``(RESP, LMCacheKey)``, ``(MP, MPKey)``;
    * ``(LEGACY, model name)`` (LMCache 0.3.x), ``(UNKNOWN, first field)`` (:func:`unknown_model`).
    """
    if (redis_key := split_redis_key(key)) is not None:
        return REDIS, redis_key
    if (model := legacy_model(key)) is not None:
        return LEGACY, model
    if (mp := _parse_mp(key)) is not None:
        return MP, mp
    if (resp := parse_resp_key(key)) is not None:
        return RESP, resp
    if (model := unknown_model(key)) is not None:
        return UNKNOWN, model
    return None


def fold_hash(digest: bytes) -> int:
    """A digest as LMCache's int chunk hash: its first 8 bytes, big-endian (``_normalize_hash_to_int``)."""
    return int.from_bytes(digest[:8], "big")


# -- the metadata record ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV group of a chunk: its dtype code (``CODE_DTYPES``) and shape (trailing padding stripped)."""

    dtype_code: int
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype of the code (None for code 0 or an unknown code)."""
        return _dtype_tables()["CODE_DTYPES"].get(self.dtype_code)


@dataclass(frozen=True, slots=True)
class RemoteRecord:
    """The metadata record (``RemoteMetadata``): ``length`` bytes of KV, memory format ``fmt``, KV groups."""

    length: int
    fmt: int
    groups: tuple[KVGroup, ...]

    @property
    def fmt_name(self) -> str:
        """The ``MemoryFormat`` name (``"?<n>"`` for a value LMCache 0.5.6 does not define)."""
        return FORMATS.get(self.fmt, f"?{self.fmt}")

    @property
    def tokens(self) -> int | None:
        """Tokens in the chunk, from the first group's shape and the format's token axis (None: not a KV format)."""
        axis = _TOKEN_AXIS.get(self.fmt)
        shape = self.groups[0].shape if self.groups else ()
        return shape[axis] if axis is not None and axis < len(shape) else None

    @property
    def expected_length(self) -> int | None:
        """Bytes the groups' shapes and dtypes add up to (None when a dtype is unknown)."""
        total = 0
        for g in self.groups:
            if g.dtype is None:
                return None
            n = g.dtype.itemsize
            for d in g.shape:
                n *= d
            total += n
        return total


def pack_record(record: RemoteRecord) -> bytes:
    """The metadata value as ``RemoteMetadata.serialize()`` writes it: ``8 + 20 * groups`` bytes.

    Raises:
        ValueError: a shape with more than 4 dimensions, or no group.
    """
    if not record.groups:
        raise ValueError("a metadata record needs at least one KV group")
    values = [record.length, record.fmt]
    for g in record.groups:
        if len(g.shape) > 4:
            raise ValueError(f"shape {g.shape} has more than 4 dimensions")
        values += [g.dtype_code, *g.shape, *[0] * (4 - len(g.shape))]
    return struct.pack(f"<{len(values)}i", *values)


def unpack_record(raw: bytes) -> RemoteRecord:
    """Parse a metadata value (the number of groups from its length, as LMCache sizes it from its config).

    Raises:
        ValueError: the length is not ``8 + 20 * groups`` with groups >= 1, or ``length`` is negative.
    """
    groups, rest = divmod(len(raw) - 8, 20)
    if len(raw) < 28 or rest:
        raise ValueError(f"not an LMCache metadata record ({len(raw)} bytes; expected 8 + 20 x groups)")
    values = struct.unpack(f"<{2 + 5 * groups}i", raw)
    if values[0] < 0:
        raise ValueError(f"not an LMCache metadata record (length {values[0]})")
    fmt, out = values[1], []
    for i in range(2, len(values), 5):
        dims = list(values[i + 1:i + 5])
        if fmt not in _UNPADDED:
            while len(dims) > 1 and dims[-1] == 0:
                dims.pop()
        out.append(KVGroup(values[i], tuple(dims)))
    return RemoteRecord(values[0], fmt, tuple(out))


# -- KV bytes ----------------------------------------------------------------------------------------------------------
def kv_record(kv_shape: tuple[int, int, int, int], chunk_tokens: int, dtype: torch.dtype) -> RemoteRecord:
    """The record of one full chunk in ``KV_2LTD``: shape ``[2, layers, chunk_tokens, kv_heads * head_dim]``.

    Args:
        kv_shape: per-token KV shape ``(layers, 2, kv_heads, head_dim)`` (kvcli's model spec).

    Raises:
        ValueError: a dtype LMCache's record has no code for.
    """
    codes = _dtype_tables()["DTYPE_CODES"]
    if dtype not in codes:
        raise ValueError(f"LMCache's metadata record has no code for {dtype}")
    layers, two, heads, dim = kv_shape
    shape = (two, layers, chunk_tokens, heads * dim)
    return RemoteRecord(two * layers * chunk_tokens * heads * dim * dtype.itemsize, KV_2LTD,
                        (KVGroup(codes[dtype], shape),))


def to_kv_2ltd(chunk_kv: torch.Tensor) -> torch.Tensor:
    """kvcli's ``[layers, 2, kv_heads, tokens, head_dim]`` as LMCache's ``[2, layers, tokens, kv_heads*head_dim]``
    (contiguous, on the CPU: its bytes are the ``kv_bytes`` value)."""
    layers, two, heads, tokens, dim = chunk_kv.shape
    return chunk_kv.permute(1, 0, 3, 2, 4).reshape(two, layers, tokens, heads * dim).contiguous().cpu()


def from_kv_2ltd(flat: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """LMCache's ``[2, layers, tokens, kv_heads*head_dim]`` as kvcli's ``[layers, 2, kv_heads, tokens, head_dim]``
    (a view)."""
    two, layers, tokens, width = flat.shape
    return flat.view(two, layers, tokens, kv_heads, width // kv_heads).permute(1, 0, 3, 2, 4)
