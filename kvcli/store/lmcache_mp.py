"""LMCache's multiprocess-mode keys (its L2 adapters' ``ObjectKey`` wire format): names and parsing, no Redis calls.

Matched against LMCache **0.5.6** (PyPI wheel, git ``3e11e108``) and its main (``lmcache-cli 0.5.7rc3.dev0``, git
``bf85b41fa``), which agree: ``lmcache/v1/distributed/api.py`` (``ObjectKey``, ``ObjectKey.ComputeKVRank``,
``_lookup_kv_ranks``) and ``lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py``
(``_object_key_to_string``, the key the RESP L2 adapter hands to its native Redis client). Golden vectors made by
that code: ``tests/store/fixtures/lmcache/``.

**Key** (one per chunk, KV rank and object group; the value is the chunk's raw bytes, no header, no metadata)::

    {model_name}@{kv_rank:08x}@{object_group_id:x}@{chunk_hash hex}[@{cache_salt}]

``kv_rank`` packs four 8-bit fields, ``world_size << 24 | global_rank << 16 | local_world_size << 8 |
local_rank`` (``ComputeKVRank``; a lookup fans a key without a worker out to every rank of its world size with
``local_world_size = world_size`` and ``local_rank = global_rank``), always 8 lower-case hex digits.
``object_group_id`` is the index of the chunk's object group (a hybrid model's layer groups; 0 for one group), in
hex without padding: the field that a reader of the earlier three-field form ``{model}@{rank}@{hash}`` misreads.
``chunk_hash`` is the chunk's prefix hash as bytes (``TokenHasher``: blake3, 32 bytes, by default), in lower-case
hex. ``cache_salt`` (per-user isolation) is there only when not empty; ``ObjectKey`` refuses ``@`` in the model
name and ``@ / \\ NUL`` in a salt, and salts over 128 characters, so splitting on ``@`` is unambiguous.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MP_KEY_FORMAT = "{model_name}@{kv_rank:08x}@{object_group_id:x}@{chunk_hash hex}[@{cache_salt}]"
SALT_MAX = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")
_RANK = re.compile(r"[0-9a-f]{8}")
_GROUP = re.compile(r"[0-9a-f]+")
_HASH = re.compile(r"(?:[0-9a-f]{2})+")


def kv_rank(world_size: int, global_rank: int, local_world_size: int | None = None,
            local_rank: int | None = None) -> int:
    """``ObjectKey.ComputeKVRank``: the four fields packed 8 bits each (local ones default to the global ones, as
    LMCache's ``_lookup_kv_ranks`` sets them).

    Raises:
        ValueError: a field outside 0-255.
    """
    fields = (world_size, global_rank, world_size if local_world_size is None else local_world_size,
              global_rank if local_rank is None else local_rank)
    if any(not 0 <= f <= 255 for f in fields):
        raise ValueError(f"a KV rank packs 8-bit fields; got {fields}")
    return fields[0] << 24 | fields[1] << 16 | fields[2] << 8 | fields[3]


def split_kv_rank(rank: int) -> tuple[int, int, int, int]:
    """``(world_size, global_rank, local_world_size, local_rank)`` of a packed KV rank."""
    return rank >> 24 & 0xFF, rank >> 16 & 0xFF, rank >> 8 & 0xFF, rank & 0xFF


@dataclass(frozen=True, slots=True)
class MPKey:
    """One multiprocess-mode key, parsed: LMCache's ``ObjectKey`` fields (``chunk_hash`` as bytes)."""

    model_name: str
    kv_rank: int
    object_group_id: int
    chunk_hash: bytes
    cache_salt: str = ""

    def to_string(self) -> str:
        """The key as ``_object_key_to_string`` writes it."""
        base = f"{self.model_name}@{self.kv_rank:08x}@{self.object_group_id:x}@{self.chunk_hash.hex()}"
        return f"{base}@{self.cache_salt}" if self.cache_salt else base

    @property
    def world_size(self) -> int:
        """The world size packed in :attr:`kv_rank`."""
        return split_kv_rank(self.kv_rank)[0]


def check_salt(salt: str) -> str:
    """``salt`` when ``ObjectKey`` accepts it as a cache salt (no ``@ / \\`` or NUL, at most 128 characters).

    Raises:
        ValueError: any other.
    """
    if _SALT_FORBIDDEN & set(salt) or len(salt) > SALT_MAX:
        raise ValueError(f"not an LMCache cache salt (no '@', '/', '\\' or NUL, at most {SALT_MAX} characters): "
                         f"{salt!r}")
    return salt


def parse_mp_key(text: str) -> MPKey:
    """Parse a multiprocess-mode key (4 or 5 ``@`` fields, as in the module docstring).

    Raises:
        ValueError: not a key LMCache's L2 adapters write (a field count other than 4 or 5, an empty model name, a
            rank that is not 8 lower-case hex digits, an object group or hash that is not lower-case hex, a hash of
            an odd number of digits, an empty or forbidden salt).
    """
    parts = text.split("@")
    if len(parts) not in (4, 5):
        raise ValueError(f"not an LMCache multiprocess key (4 or 5 '@' fields): {text!r}")
    model, rank, group, chunk_hash = parts[:4]
    if not model or not _RANK.fullmatch(rank) or not _GROUP.fullmatch(group) or not _HASH.fullmatch(chunk_hash):
        raise ValueError(f"not an LMCache multiprocess key (rank, object group or hash): {text!r}")
    salt = parts[4] if len(parts) == 5 else ""
    if len(parts) == 5 and not salt:
        raise ValueError(f"not an LMCache multiprocess key (an empty salt field): {text!r}")
    check_salt(salt)
    return MPKey(model, int(rank, 16), int(group, 16), bytes.fromhex(chunk_hash), salt)
