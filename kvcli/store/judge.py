"""The one chunk judge: what state one chunk is in, from what the server holds under its two keys, and its Lua twin.

Every command that asks "can this chunk be used?" asks :func:`judge`: replay's lookups (kvcli.store.chunkstore,
kvcli.store.batch), warm's plan (is it present as this store writes it?), inspect's integrity counts and its chunk
map. The lookup scripts ask :data:`JUDGE_LUA`, the same rule inside the server; ``tests/store/test_judge.py`` runs
both on a live server over one table of cases.

A store reads one payload layout (:class:`Expected`: dtype, shape, payload and header bytes, as its
``--kv-dtype`` and model make them): a chunk another store wrote in another layout is no hit for it, and a chain
whose chunks change layout breaks where they do. The lookup sees that as a payload of another length
("bad-payload"); a caller that knows the store's layout (warm, the chunk map with a model) or the layout of a
chain's chunk 0 (:meth:`Expected.of`: inspect, the chunk map without one) names it "other-layout".

States (:data:`STATES`; a Lua script returns a state's index there, its code):

========================  ==========================================================================================
``usable``                metadata with this prompt's token digest, ``"stored":"real"``, and a payload of exactly the
                          length this store writes (a hybrid model's: KV plus the state at the chunk's end) (and,
                          when its bytes were read, matching the checksum)
``accounted``             metadata with the digest and ``"stored":"accounted"``: a payload counted, never written by
                          design (an index-only replay); a lookup hit, not something warm can serve
``missing``               no metadata key (and no payload key, where the payload was read)
``no-metadata``           a payload key without metadata (an orphan payload)
``bad-metadata``          a metadata key of another type than a string, a value that is neither real nor accounted,
                          or (parsed) not kvcli's JSON, or another model or parent than the caller expects
``token-mismatch``        metadata with another token digest: a prefix-hash collision, never a hit
``no-payload``            real metadata, no payload key (evicted, expired, deleted)
``bad-payload``           real metadata and a payload of another length or type (truncated, overwritten), or whose
                          length was not read (an index-only lookup cannot vouch for a real payload)
``checksum``              the payload's bytes do not decode to the chunk's shape and dtype, or do not match its
                          checksum
``other-layout``          (parsed, with ``expect``) metadata of another payload layout than the expected one: dtype,
                          shape, tokens, payload or header bytes (another ``--kv-dtype``, a hybrid model's state)
========================  ==========================================================================================

How much is checked depends on what the caller read: a lookup reads the metadata value and the payload's STRLEN
(``payload`` an int) and knows the exact value length (``value_bytes``), so nothing is parsed (the hot path, as the
Lua twin); a caller that passes the payload's bytes gets the checksum checked; one that passes ``expect`` gets the
metadata parsed and its fields compared (warm: present exactly as this store would write it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import xxhash

from kvcli.store.layout import ChunkMeta, is_accounted, is_real, parse_or_none
from kvcli.store.serde import PayloadError, PayloadLayout, decode_kv, dtype_name, payload_layout

if TYPE_CHECKING:
    import torch

    from kvcli.prefixkv import StatefulKV
    from kvcli.store.records import StoreConfig

USABLE, ACCOUNTED, MISSING, TOKEN_MISMATCH = "usable", "accounted", "missing", "token-mismatch"
NO_PAYLOAD, BAD_PAYLOAD, BAD_METADATA, NO_METADATA, CHECKSUM, OTHER_LAYOUT = (
    "no-payload", "bad-payload", "bad-metadata", "no-metadata", "checksum", "other-layout")
#: Every state, by code (a Lua script's answer is an index here; the scripts never parse the metadata, so they
#: never answer :data:`OTHER_LAYOUT`, the last).
STATES = (USABLE, ACCOUNTED, MISSING, TOKEN_MISMATCH, NO_PAYLOAD, BAD_PAYLOAD, BAD_METADATA, NO_METADATA, CHECKSUM,
          OTHER_LAYOUT)
CODES = {state: code for code, state in enumerate(STATES)}
#: States a lookup counts as hits.
HITS = frozenset({USABLE, ACCOUNTED})
#: States the metadata alone would count as hits (its payload not looked at): ``metadata_hit_chunks``.
METADATA_HITS = HITS | {NO_PAYLOAD, BAD_PAYLOAD, CHECKSUM}

NOT_READ = -1  # ``payload``: the payload key was not read
WRONG_TYPE = -2  # ``meta`` or ``payload``: the key holds another type than a string (STRLEN's error as Lua sees it)


@dataclass(frozen=True, slots=True)
class Expected:
    """The metadata fields a store writes for each chunk (warm's "present as this store would write it"):
    ``model`` id, safetensors ``dtype`` name, ``shape`` ``[layers, 2, kv_heads, chunk_size, head_dim]``, ``tokens``
    per chunk, ``payload`` tensor bytes and ``header`` serialization bytes of a real payload (None: not known, not
    compared)."""

    model: str
    dtype: str
    shape: tuple[int, ...]
    tokens: int
    payload: int
    header: int | None

    @classmethod
    def of_store(cls, config: StoreConfig) -> Expected:
        """The fields the store of ``config`` writes for each chunk (its payload layout: the model's KV shape, the
        stored dtype, ``--kv-dtype`` and a hybrid model's state included)."""
        return cls(config.model_id, dtype_name(config.stored_dtype), config.chunk_shape, config.chunk_size,
                   config.payload_bytes, config.header_bytes)

    @classmethod
    def of(cls, meta: ChunkMeta) -> Expected:
        """The fields of the store that wrote ``meta`` (a chain's chunk 0, say): its header bytes only when its
        payload is real (an accounted entry records none)."""
        return cls(meta.model, meta.dtype, meta.shape, meta.tokens, meta.payload,
                   meta.header if meta.stored == "real" else None)

    def matches(self, meta: ChunkMeta, parent: str | None) -> bool:
        """Whether parsed metadata has this model, this payload layout (:meth:`same_layout`) and, unless ``parent``
        is None, that parent hash hex ("" for chunk 0)."""
        return meta.model == self.model and (parent is None or meta.parent == parent) and self.same_layout(meta)

    def same_layout(self, meta: ChunkMeta) -> bool:
        """Whether parsed metadata records this payload layout: dtype, shape, tokens, payload bytes and, for a real
        payload where ``header`` is known, header bytes."""
        return (meta.dtype == self.dtype and meta.shape == self.shape and meta.tokens == self.tokens
                and meta.payload == self.payload
                and (meta.stored != "real" or self.header is None or meta.header == self.header))


def judge(meta, payload=NOT_READ, digest: bytes | None = None, value_bytes: int | None = None,
          expect: Expected | None = None, parent: str | None = None) -> str:
    """The state of one chunk (module docstring).

    Args:
        meta: the metadata key's value (bytes), None (no key), :data:`WRONG_TYPE`, or already parsed
            (:class:`~kvcli.store.layout.ChunkMeta`).
        payload: what was read at the payload key: its value (bytes: length and checksum checked), its STRLEN
            (an int: 0 no key, :data:`NOT_READ`, :data:`WRONG_TYPE`), None (no key) or :data:`WRONG_TYPE`.
        digest: the prompt's 8-byte token digest of this chunk (None: not known, as when scanning keys).
        value_bytes: the exact length of a payload value this store writes (None: the metadata's header +
            payload bytes, which parses it).
        expect: the fields this store writes (parses the metadata and compares them: another model or parent is
            "bad-metadata", another payload layout "other-layout"), or None.
        parent: with ``expect``, the previous chunk's hash hex the metadata must name ("" for chunk 0).

    Returns:
        One of :data:`STATES`.
    """
    if meta is None:
        return MISSING if payload is None or payload == 0 or payload == NOT_READ else NO_METADATA
    if isinstance(meta, int):  # WRONG_TYPE
        return BAD_METADATA
    parsed = meta if isinstance(meta, ChunkMeta) else None
    if parsed is None and (expect is not None or value_bytes is None or isinstance(payload, (bytes, memoryview))):
        parsed = parse_or_none(meta)
        if parsed is None:
            return BAD_METADATA
    if digest is not None and (parsed.token_digest if parsed is not None else meta[:8]) != digest:
        return TOKEN_MISMATCH
    if parsed is not None:
        if expect is not None and (parsed.model != expect.model or (parent is not None and parsed.parent != parent)):
            return BAD_METADATA
        if expect is not None and not expect.same_layout(parsed):
            return OTHER_LAYOUT
        real, accounted = parsed.stored == "real", parsed.stored == "accounted"
    else:
        real = is_real(meta)
        accounted = not real and is_accounted(meta)
    if not real:
        return ACCOUNTED if accounted else BAD_METADATA
    if isinstance(payload, int):
        if payload == NOT_READ:
            return BAD_PAYLOAD
        length = payload
    elif payload is None:
        return NO_PAYLOAD
    else:
        length = len(payload)
    if length == 0:
        return NO_PAYLOAD
    if value_bytes is None:
        assert parsed is not None  # parsed above whenever value_bytes is None
        value_bytes = parsed.header + parsed.payload
    if length != value_bytes:
        return BAD_PAYLOAD
    if not isinstance(payload, int):
        checksum, shape, dtype = ((parsed.checksum, parsed.shape, parsed.dtype) if parsed is not None
                                  else (meta[8:16], None, None))
        if not payload_ok(payload, checksum, shape, dtype):
            return CHECKSUM
    return USABLE


def payload_ok(value, checksum: bytes, shape: tuple[int, ...] | None, dtype: str | None = None,
               state_shape: tuple[int, ...] | None = None) -> bool:
    """The one checksum verification, without torch: whether a payload value's header (:func:`~kvcli.store.serde.
    payload_layout`) says ``shape`` (``[layers, 2, kv_heads, chunk_size, head_dim]``; None: any), ``dtype`` (its
    safetensors name, "BF16", "F8_E4M3"; None: any) and ``state_shape`` (a hybrid model's ``[linear_layers,
    state_elements]``, ``()`` for no state; None: any), and the xxh3_64 of its tensor bytes (the KV's and, for fp8,
    its ``kv_scale`` tensor's, and a hybrid model's ``state`` tensor's) is ``checksum`` (8 bytes). A header that
    lies about the dtype fails here, though its bytes match; so does an fp8 payload without its scales, with scales
    of another shape or dtype, or with a scale that is not a positive finite number
    (:func:`~kvcli.store.serde.payload_layout`)."""
    try:
        layout = payload_layout(value)
    except PayloadError:
        return False
    if shape is not None and layout.shape != tuple(shape):
        return False
    if state_shape is not None and layout.state_shape != tuple(state_shape):
        return False
    if dtype is not None and layout.safetensors_dtype != dtype:
        return False
    return payload_checksum(value, layout) == checksum


def payload_checksum(value, layout: PayloadLayout | None = None) -> bytes:
    """The checksum a payload value's record holds: xxh3_64 (8 bytes) of its tensor bytes, the KV's and, for fp8,
    its ``kv_scale`` tensor's (``[layout.start, layout.data_end)``; ``layout``: :func:`~kvcli.store.serde.
    payload_layout` of ``value``, read here when None).

    Raises:
        PayloadError: ``value`` is not a payload (:func:`~kvcli.store.serde.payload_layout`).
    """
    layout = payload_layout(value) if layout is None else layout
    return xxhash.xxh3_64_digest(memoryview(value).cast("B")[layout.start:layout.data_end])


def checked_tensor(value, checksum: bytes, shape: tuple[int, ...] | None,
                   dtype: str | None = None, out_dtype=None, state_shape: tuple[int, ...] | None = None
                   ) -> torch.Tensor | StatefulKV | None:
    """The tensor of a payload value when :func:`payload_ok` holds, else None: as stored, without a copy (it shares
    ``value``'s memory), or for an fp8 payload dequantized to ``out_dtype`` (the model's dtype; None: float32;
    :func:`~kvcli.store.serde.decode_kv`); a payload with a state gives a :class:`~kvcli.prefixkv.StatefulKV`."""
    if not payload_ok(value, checksum, shape, dtype, state_shape):
        return None
    tensor, _ = decode_kv(value, out_dtype)
    return tensor


def codes_to_states(codes) -> list[str]:
    """A Lua script's state codes as states."""
    return [STATES[int(c)] for c in codes]


# -- the Lua twin ------------------------------------------------------------------------------------------------
#: :func:`judge` with the payload's STRLEN and the exact value length (the lookup's hot path), inside the server:
#: ``judge(m, len, digest, value_bytes)`` with ``m`` a GET's reply through ``redis.pcall`` (false: no key; a table:
#: an error, a key of another type), ``len`` the payload's STRLEN (-1 not read, -2 another type), ``digest`` the
#: 8-byte token digest; returns a state's code (:data:`STATES`). Lua strings are 1-based: offset 17 is byte 16,
#: where the metadata JSON starts (:data:`kvcli.store.layout.META_HEAD`).
JUDGE_LUA = """
local function judge(m, len, digest, value_bytes)
  if not m then return 2 end
  if type(m) ~= 'string' then return 6 end
  if string.sub(m, 1, 8) ~= digest then return 3 end
  if not string.find(m, '"stored":"real"', 17, true) then
    if string.find(m, '"stored":"accounted"', 17, true) then return 1 end
    return 6
  end
  if len == -1 then return 5 end
  if len == 0 then return 4 end
  if len ~= value_bytes then return 5 end
  return 0
end
"""

#: The lookup's one round trip (EVAL_RO, read-only: the server refuses any write inside it). KEYS: every metadata
#: key, then every payload key in the same order (the store's namespace, then the read-only one). ARGV[1]: the
#: chunks' 8-byte token digests, concatenated; ARGV[2]: the exact payload value length. Returns every metadata
#: value (false for no key or a key of another type), then every chunk's state code (:data:`JUDGE_LUA`); a
#: payload's STRLEN is read only where the metadata records a real payload.
LOOKUP_SCRIPT = JUDGE_LUA + """
local n = #KEYS / 2
local digests, value_bytes = ARGV[1], tonumber(ARGV[2])
local chunks = #digests / 8
local out = {}
for i = 1, n do
  local m = redis.pcall('GET', KEYS[i])
  local len = -1
  if type(m) == 'string' and string.find(m, '"stored":"real"', 17, true) then
    len = redis.pcall('STRLEN', KEYS[n + i])
    if type(len) ~= 'number' then len = -2 end
  end
  local c = (i - 1) % chunks
  out[n + i] = judge(m, len, string.sub(digests, 8 * c + 1, 8 * c + 8), value_bytes)
  if type(m) ~= 'string' then m = false end
  out[i] = m
end
return out"""
