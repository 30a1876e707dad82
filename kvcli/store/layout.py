"""kvcli's key layout and chunk metadata format (version 1): names and parsing, no Redis calls.

Key layout (format version 1), all under kvcli's own prefix so nothing else on the server is ever touched::

    kvcli:v1:{namespace}:{chunk_size}:m:{hash hex}   metadata of one chunk (small)
    kvcli:v1:{namespace}:{chunk_size}:p:{hash hex}   payload: the chunk's KV in the safetensors layout (serde.py)

``hash hex`` is the 32-hex-digit prefix hash of the chunk (hashing.py), so a key names the namespace, the chunk
size, the model, tokenizer and cache salt (through the hash root) and every token before and in the chunk.

Metadata sits *beside* the payload (its own key), so a lookup reads only small values, and an orphan (metadata
without payload or the reverse, left by eviction or a crash) is visible to ``kvcli inspect``. Its value is
``token_digest (8 bytes) || payload_checksum (8 bytes) || JSON`` where the JSON holds ``tokens``, ``dtype``,
``shape`` (``[layers, 2, kv_heads, chunk_tokens, head_dim]``), ``model``, ``parent`` (the previous chunk's hash hex,
"" for chunk 0), ``payload`` (data bytes), ``header`` (serialization header bytes), ``stored`` ("real", or
"accounted" when the payload's bytes are counted but not written) and ``created`` (unix seconds). The token digest
is the collision guard; the checksum (xxh3_64 of the tensor bytes) catches a corrupted payload on retrieve.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

from kvcli.store.serde import PayloadError

KEY_VERSION = "v1"
KEY_ROOT = "kvcli"
_DIGEST = 16  # token digest (8) + payload checksum (8) ahead of the metadata JSON


_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._@+=-]{1,200}")


def key_prefix(namespace: str, chunk_size: int) -> str:
    """``kvcli:v1:{namespace}:{chunk_size}:`` — the prefix of every key of one namespace and chunk size."""
    return f"{KEY_ROOT}:{KEY_VERSION}:{namespace}:{chunk_size}:"


class ChunkMeta(NamedTuple):
    """One chunk's metadata value, parsed (layout in the module docstring). A tuple: inspect parses millions.

    ``token_digest`` and ``checksum`` are 8 bytes each; ``shape`` is ``[layers, 2, kv_heads, tokens, head_dim]``;
    ``payload`` and ``header`` are bytes; ``parent`` is the previous chunk's hash hex ("" for chunk 0);
    ``created`` is unix seconds (None when not recorded).
    """

    token_digest: bytes
    checksum: bytes
    tokens: int
    dtype: str
    shape: tuple[int, ...]
    model: str
    parent: str
    payload: int
    header: int
    stored: str
    created: int | None


_JSON = json.JSONDecoder()


def parse_metadata(raw: bytes) -> ChunkMeta:
    """Parse a metadata value written by :meth:`kvcli.store.ChunkStore.store`.

    Raises:
        PayloadError: the value is truncated or its JSON is not kvcli's.
    """
    try:
        info = _JSON.decode(raw[_DIGEST:].decode())
        return ChunkMeta(raw[:8], raw[8:16], int(info["tokens"]), str(info["dtype"]),
                         tuple(map(int, info["shape"])), str(info["model"]), str(info["parent"]),
                         int(info["payload"]), int(info["header"]), str(info.get("stored", "real")),
                         None if info.get("created") is None else int(info["created"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not kvcli chunk metadata: {exc}") from None


@dataclass(frozen=True, slots=True)
class KeyParts:
    """A kvcli key, split: ``kvcli:v1:{namespace}:{chunk_size}:{kind}:{hash_hex}`` with kind "m" or "p"."""

    namespace: str
    chunk_size: int
    kind: str
    hash_hex: str


# chunk sizes as kvcli writes them: decimal, >= 1, no leading zero ("0" and "04" are look-alikes, never kvcli's)
_KEY_RE = re.compile(rf"{KEY_ROOT}:{KEY_VERSION}:(.+):([1-9][0-9]*):([mp]):([0-9a-f]{{32}})".encode(), re.DOTALL)


def parse_key(key: bytes) -> KeyParts | None:
    """Split a kvcli chunk key (a namespace may hold ":"; the fields after it are fixed); None for any other key."""
    match = _KEY_RE.fullmatch(key)
    if match is None:
        return None
    namespace, chunk_size, kind, hash_hex = match.groups()
    try:
        return KeyParts(namespace.decode(), int(chunk_size), kind.decode(), hash_hex.decode())
    except UnicodeDecodeError:
        return None
