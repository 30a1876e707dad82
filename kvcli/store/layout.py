"""kvcli's key layout and chunk metadata format (version 1): names and parsing, no Redis calls.

Key layout (format version 1), all under kvcli's own prefix so nothing else on the server is ever touched::

    kvcli:v1:{namespace}:{chunk_size}:m:{hash hex}   metadata of one chunk (small)
    kvcli:v1:{namespace}:{chunk_size}:p:{hash hex}   payload: the chunk's KV in the safetensors layout (serde.py)

``hash hex`` is the 32-hex-digit prefix hash of the chunk (hashing.py), so a key names the namespace, the chunk
size, the model, tokenizer and cache salt (through the hash root) and every token before and in the chunk.

``kvcli route``'s cache-manager index (``kvcli/route/cachemanager.py``) lives in the namespace
:data:`ROUTE_NAMESPACE`, one set per chunk, each with a TTL of :data:`ROUTE_INDEX_TTL_SECONDS`::

    kvcli:v1:kvcli-route:route:{run}:{hash hex}   the nodes holding one chunk (a set; ``{run}``: 12 hex digits)

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

from kvcli.errors import BadInputError
from kvcli.store.serde import PayloadError

KEY_VERSION = "v1"
KEY_ROOT = "kvcli"
META_HEAD = 16  # bytes ahead of the metadata JSON: token digest (8) + payload checksum (8)
NO_CHECKSUM = b"\0" * 8  # the checksum field of a chunk whose payload is accounted, not written
PAYLOAD_FORMAT = "kvcli-kv/1"  # the ``format`` entry of each payload's safetensors ``__metadata__``
REAL, ACCOUNTED = b'"stored":"real"', b'"stored":"accounted"'  # the ``stored`` field as it appears in the JSON

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._@+=-]{1,200}")

ROUTE_NAMESPACE = "kvcli-route"  # route's cache-manager indexes: kvcli purge --namespace kvcli-route deletes them
ROUTE_KIND = "route"  # the field after the namespace in a route index key (where a chunk key has its chunk size)
ROUTE_INDEX_TTL_SECONDS = 3600  # a route index key's TTL, set again whenever route writes it


def check_namespace(name: str) -> str:
    """``name`` when kvcli can own it as a namespace: 1-200 of letters, digits and ``. _ - @ + =`` (no ``:`` and no
    glob character, so one namespace's keys never match another's SCAN pattern).

    Raises:
        BadInputError: any other name.
    """
    if not _NAMESPACE_RE.fullmatch(name):
        raise BadInputError(f"namespace {name!r}: use letters, digits and . _ - @ + = (no ':' or glob "
                            f"characters, so one namespace's keys never match another's)")
    return name


def key_prefix(namespace: str, chunk_size: int) -> str:
    """``kvcli:v1:{namespace}:{chunk_size}:`` — the prefix of every key of one namespace and chunk size."""
    return f"{KEY_ROOT}:{KEY_VERSION}:{namespace}:{chunk_size}:"


def payload_header_metadata(model_id: str, chunk_size: int) -> dict[str, str]:
    """The ``__metadata__`` of a payload's safetensors header (:mod:`kvcli.store.serde`): format, model, tokens."""
    return {"format": PAYLOAD_FORMAT, "model": model_id, "tokens": str(chunk_size)}


def is_real(meta: bytes) -> bool:
    """Whether a metadata value records a written payload (``"stored":"real"``), read without parsing the JSON (the
    lookup's hot path; the Lua scripts test the same bytes from offset :data:`META_HEAD` on)."""
    return meta.find(REAL, META_HEAD) >= 0


def is_accounted(meta: bytes) -> bool:
    """Whether a metadata value records an accounted payload (counted, never written), read without parsing."""
    return meta.find(ACCOUNTED, META_HEAD) >= 0


class MetadataWriter:
    """The one writer of kvcli's chunk metadata values (format in the module docstring) for one store's static
    fields: a value is ``digest || checksum || middle || parent hex || tail``, where ``middle`` (the JSON up to
    ``"parent":"``) is the same for every chunk of the store and ``tail`` (the fields after the parent) changes only
    with the second it is written and with real vs accounted.

    Args:
        chunk_size: tokens per chunk.
        dtype: the payload's safetensors dtype name ("BF16").
        shape: ``[layers, 2, kv_heads, chunk_size, head_dim]``.
        model_id: the model whose KV it is.
        payload_bytes: tensor bytes of one chunk.
        header_bytes: serialization header bytes of one chunk's payload (written as ``header`` for a real one).
    """

    def __init__(self, chunk_size: int, dtype: str, shape: tuple[int, ...], model_id: str, payload_bytes: int,
                 header_bytes: int) -> None:
        static = {"tokens": chunk_size, "dtype": dtype, "shape": list(shape), "model": model_id,
                  "payload": payload_bytes}
        self.middle = json.dumps(static, separators=(",", ":")).encode()[:-1] + b',"parent":"'
        self.header_bytes = header_bytes
        self._tails: dict[tuple[bool, int], bytes] = {}

    def tail(self, real: bool, now: int) -> bytes:
        """The JSON after the parent's hex of a value written at unix second ``now``."""
        tail = self._tails.get((real, now))
        if tail is None:  # one per second and kind
            head, stored = (self.header_bytes, "real") if real else (0, "accounted")
            tail = f'","header":{head},"stored":"{stored}","created":{now}}}'.encode()
            if len(self._tails) > 64:
                self._tails = {}
            self._tails[(real, now)] = tail
        return tail

    def value(self, digest: bytes, checksum: bytes, parent_hex: str, real: bool, now: int) -> bytes:
        """One chunk's metadata value.

        Args:
            digest: the chunk's 8-byte token digest.
            checksum: xxh3_64 of its tensor bytes, 8 bytes (:data:`NO_CHECKSUM` when accounted).
            parent_hex: the previous chunk's hash hex ("" for chunk 0).
            real: a written payload (else accounted).
            now: unix seconds it is written at (``created``).
        """
        return b"".join((digest, checksum, self.middle, parent_hex.encode(), self.tail(real, now)))

    def length(self, first: bool, real: bool, now: int) -> int:
        """Bytes of a value written at ``now``: chunk 0's (``first``, no parent) or any other's (32-digit parent)."""
        return META_HEAD + len(self.middle) + (0 if first else 32) + len(self.tail(real, now))


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
    """Parse a metadata value written by :meth:`kvcli.store.chunkstore.ChunkStore.store`.

    Raises:
        PayloadError: the value is truncated or its JSON is not kvcli's.
    """
    try:
        info = _JSON.decode(raw[META_HEAD:].decode())
        return ChunkMeta(raw[:8], raw[8:16], int(info["tokens"]), str(info["dtype"]),
                         tuple(map(int, info["shape"])), str(info["model"]), str(info["parent"]),
                         int(info["payload"]), int(info["header"]), str(info.get("stored", "real")),
                         None if info.get("created") is None else int(info["created"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not kvcli chunk metadata: {exc}") from None


def parse_or_none(raw: bytes) -> ChunkMeta | None:
    """:func:`parse_metadata`, or None when ``raw`` is not kvcli metadata (bad or truncated)."""
    try:
        return parse_metadata(raw)
    except PayloadError:
        return None


@dataclass(frozen=True, slots=True)
class KeyParts:
    """A kvcli key, split: ``kvcli:v1:{namespace}:{chunk_size}:{kind}:{hash_hex}`` with kind "m" or "p"."""

    namespace: str
    chunk_size: int
    kind: str
    hash_hex: str


# chunk sizes as kvcli writes them: decimal, >= 1, no leading zero ("0" and "04" are look-alikes, never kvcli's)
_KEY_RE = re.compile(rf"{KEY_ROOT}:{KEY_VERSION}:(.+):([1-9][0-9]*):([mp]):([0-9a-f]{{32}})".encode(), re.DOTALL)


_ROUTE_KEY_RE = re.compile(rf"{KEY_ROOT}:{KEY_VERSION}:{ROUTE_NAMESPACE}:{ROUTE_KIND}:"
                           r"\{[0-9a-f]{12}\}:[0-9a-f]{32}".encode())


def route_index_prefix(run: str) -> bytes:
    """The prefix of one route index's keys, ``kvcli:v1:kvcli-route:route:{<run>}:`` (``run``: 12 hex digits);
    a chunk's key is the prefix and its 16-byte hash in hex. ``{<run>}`` is a hash tag: one slot per index."""
    return f"{KEY_ROOT}:{KEY_VERSION}:{ROUTE_NAMESPACE}:{ROUTE_KIND}:{{{run}}}:".encode()


def is_route_index_key(key: bytes) -> bool:
    """Whether ``key`` is named as a key of a route index (:func:`route_index_prefix`)."""
    return _ROUTE_KEY_RE.fullmatch(key) is not None


def is_chunk_key(key: bytes) -> bool:
    """Whether ``key`` is named as a kvcli chunk key (:func:`parse_key`'s rules, without decoding it)."""
    return key.startswith(b"kvcli:v1:") and _KEY_RE.fullmatch(key) is not None


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
