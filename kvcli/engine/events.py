"""KV events as serving engines publish them, decoded into typed records.

An engine publishes each batch as ZMQ frames ``[topic, sequence (8 bytes, big-endian), payload]``; the payload is
a msgpack ``EventBatch``, an array ``[ts, [event, ...], dp_rank]`` (``dp_rank`` absent in older vLLM, SGLang and
Mooncake Store). One event is, by engine and version:

* **vLLM map encoding** (vllm/distributed/kv_events.py in vLLM 0.32.0, msgspec ``tag=True`` without
  ``array_like``): a map with ``"type"`` (``"BlockStored"``, ``"BlockRemoved"``, ``"AllBlocksCleared"``) and the
  fields by name, e.g. ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": None, "token_ids":
  [...], "block_size": 16, "lora_id": None, "medium": "GPU", ...}``.
* **vLLM array encoding** (the same file before the events became maps; SGLang's
  python/sglang/srt/disaggregation/kv_events.py still uses it): a tagged tuple, the tag first and the fields in
  declaration order: ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  ...]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``. SGLang stops after ``lora_id``
  (``BlockRemoved``: after ``block_hashes``).
* **Mooncake Store** (mooncake-store/include/kv_event.h): ``["BlockStoreEvent", key, replicas, model_name,
  block_size, block_hash, parent_block_hash, token_ids]``, ``["RemoveAllEvent"]``, and ``["BlockUpdateEvent", key,
  replicas]`` (a replica moved: no change to what is cached, so it is counted in ``unknown``). Its hashes are
  strings, ``""`` when unset.

Fields a record does not name (vLLM's ``lora_name``, ``extra_keys``, ``group_idx``, ...) are ignored; an event of
a type not listed here is skipped and its tag kept in :attr:`EventBatch.unknown`.

**Block hashes** are normalized to ``bytes``: vLLM's default sha256 digests (32 bytes) as they are; an integer
(vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, SGLang, older vLLM), signed or unsigned 64-bit, as its 8
bytes big-endian, two's complement (so ``-1`` and ``2**64 - 1`` are the same hash, and vLLM's integer form of a
digest, its low 64 bits, is the digest's last 8 bytes); a string as hex when it is hex (an optional ``0x``, an even
number of digits), else as base64 where the text came from JSON, else (Mooncake) as its UTF-8 bytes.
"""
from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import msgpack

from kvcli.errors import BadInputError

_HEX = re.compile(r"(?:0[xX])?((?:[0-9a-fA-F]{2})+)")
_U64 = 1 << 64


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine put in its cache: ``block_hashes`` (bytes each, module docstring), in prompt order, the
    first one's parent ``parent_block_hash`` (None: the chain starts at block 0), their ``token_ids`` (``block_size``
    per block, so ``len(block_hashes) * block_size`` ids for vLLM and SGLang), the LoRA adapter id, the storage
    medium (vLLM: ``"GPU"``, ``"CPU"``, ...; None when not sent) and each block's extra hash keys (vLLM: the cache
    salt on block 0, LoRA names, multimodal hashes; None per block without, None when not sent), JSON values as
    tuples."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted (or whose hash it replaced): ``block_hashes`` (bytes each) on ``medium``."""

    block_hashes: tuple[bytes, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine emptied its cache (vLLM's ``reset_prefix_cache``, Mooncake's ``RemoveAllEvent``)."""


KvEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: its timestamp ``ts`` (seconds since the epoch, the engine's clock), its events in order,
    the data-parallel rank that sent it (None when not sent), and the tags of events skipped as unknown."""

    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None
    unknown: tuple[str, ...] = ()


class _Bad(ValueError):
    """A malformed batch; the public entry points locate it as a :class:`BadInputError`."""


def decode_payload(payload: bytes, path: str | None = None, line: int | None = None) -> EventBatch:
    """One msgpack payload (the third ZMQ frame) as an :class:`EventBatch`.

    Args:
        payload: the frame's bytes.
        path, line: where the payload came from (a file and its 1-based line or frame number), for errors.

    Raises:
        BadInputError: at ``path:line``, not msgpack, not one batch, or an event malformed (the message says which
            and where).
    """
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors; an unhashable map key a TypeError
        raise BadInputError(f"not a msgpack KV event batch ({type(exc).__name__}: {exc})", path, line) from None
    return decode_batch(value, path=path, line=line)


def decode_batch(value: Any, text_hashes: bool = False, path: str | None = None,
                 line: int | None = None) -> EventBatch:
    """A batch already parsed from msgpack or JSON (``[ts, [event, ...], dp_rank]``) as an :class:`EventBatch`.

    Args:
        value: lists, maps, numbers, strings and bytes, as msgpack or ``json.loads`` gives them.
        text_hashes: the value came from JSON, where a bytes hash is text: hex, else base64.
        path, line: where it came from, for errors.

    Raises:
        BadInputError: at ``path:line``, not a batch or an event malformed.
    """
    try:
        return _batch(value, text_hashes)
    except _Bad as exc:
        raise BadInputError(str(exc), path, line) from None


def _batch(value: Any, text_hashes: bool) -> EventBatch:
    if not isinstance(value, (list, tuple)) or not 2 <= len(value) <= 3:
        raise _Bad(f"a KV event batch is an array [ts, events] or [ts, events, dp_rank], got {_kind(value)}")
    ts, events = value[0], value[1]
    if not _is_number(ts):
        raise _Bad(f"batch ts must be a number (seconds), got {_kind(ts)}")
    if not isinstance(events, (list, tuple)):
        raise _Bad(f"batch events must be an array, got {_kind(events)}")
    dp_rank = _optional_int(value[2] if len(value) == 3 else None, "dp_rank")
    decoded: list[KvEvent] = []
    unknown: list[str] = []
    for i, event in enumerate(events):
        try:
            record = _event(event, text_hashes)
        except _Bad as exc:
            raise _Bad(f"event {i}: {exc}") from None
        if isinstance(record, str):
            unknown.append(record)
        else:
            decoded.append(record)
    return EventBatch(float(ts), tuple(decoded), dp_rank, tuple(unknown))


def _event(event: Any, text_hashes: bool) -> KvEvent | str:
    """One event as a record, or its tag when its type is unknown (skipped)."""
    if isinstance(event, dict):
        return _map_event(event, text_hashes)
    if isinstance(event, (list, tuple)) and event:
        tag = event[0]
        if not isinstance(tag, str):
            raise _Bad(f"an array event starts with its type name, got {_kind(tag)}")
        if tag in _MOONCAKE:
            return _MOONCAKE[tag](event, text_hashes)
        return _array_event(tag, event[1:], text_hashes)
    raise _Bad(f"an event is a map or a tagged array, got {_kind(event)}")


def _map_event(event: dict, text_hashes: bool) -> KvEvent | str:
    tag = event.get("type")
    if not isinstance(tag, str):
        raise _Bad(f"a map event names its type in \"type\", got {_kind(tag)}")
    fields = _FIELDS.get(tag)
    if fields is None:
        return tag
    missing = [f for f in fields[:_REQUIRED[tag]] if f not in event]
    if missing:
        raise _Bad(f"{tag} lacks {', '.join(missing)}")
    return _build(tag, [event.get(f) for f in fields], text_hashes)


def _array_event(tag: str, values: Sequence[Any], text_hashes: bool) -> KvEvent | str:
    fields = _FIELDS.get(tag)
    if fields is None:
        return tag
    if len(values) < _REQUIRED[tag]:
        raise _Bad(f"{tag} has {len(values)} fields, needs {', '.join(fields[:_REQUIRED[tag]])}")
    values = list(values[:len(fields)])
    return _build(tag, values + [None] * (len(fields) - len(values)), text_hashes)


#: Each record's fields in vLLM's declaration order (the array encoding's positions), and how many are required.
_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                    "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}


def _build(tag: str, values: list[Any], text_hashes: bool) -> KvEvent:
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(values[0], text_hashes), _optional_str(values[1], "medium"))
    hashes, parent, tokens, block_size, lora_id, medium, _, extra = values
    return BlockStored(_hashes(hashes, text_hashes), _optional_hash(parent, text_hashes), _token_ids(tokens),
                       _count(block_size, "block_size"), _optional_int(lora_id, "lora_id"),
                       _optional_str(medium, "medium"), _extra_keys(extra))


def _extra_keys(value: Any) -> tuple[tuple[Any, ...] | None, ...] | None:
    """vLLM's per-block extra keys (a list, one entry per block: None or a list of values), as hashable tuples."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise _Bad(f"extra_keys is a list, one entry per block, got {_kind(value)}")
    return tuple(_frozen(v) if v is not None else None for v in value)


def _frozen(value: Any) -> Any:
    """A JSON value made hashable: every list a tuple, every map its sorted ``(key, value)`` pairs."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _mooncake_store(event: Sequence[Any], text_hashes: bool) -> BlockStored:
    if len(event) < 8:
        raise _Bad(f"BlockStoreEvent has {len(event)} fields, needs 8 (type, key, replicas, model_name, block_size, "
                   "block_hash, parent_block_hash, token_ids)")
    block_hash, parent = event[5], event[6]
    listed = block_hash if isinstance(block_hash, (list, tuple)) else [] if block_hash in ("", None) else [block_hash]
    return BlockStored(_hashes(listed, text_hashes, mooncake=True),
                       None if parent in ("", None) else _hash(parent, text_hashes, mooncake=True),
                       _token_ids(event[7]), _count(event[4], "block_size"))


_MOONCAKE: dict[str, Callable[[Sequence[Any], bool], KvEvent | str]] = {
    "BlockStoreEvent": _mooncake_store,
    "RemoveAllEvent": lambda event, text_hashes: AllBlocksCleared(),
    "BlockUpdateEvent": lambda event, text_hashes: "BlockUpdateEvent",
}


def normalize_hash(value: Any, text_hashes: bool = False, mooncake: bool = False) -> bytes:
    """One block hash as bytes (the module docstring's rule).

    Args:
        value: bytes, an int in ``[-2**63, 2**64)``, or a string.
        text_hashes: a string is hex, else base64 (the hash came from JSON).
        mooncake: a string is hex, else its UTF-8 bytes (Mooncake Store's free-form hash strings).

    Raises:
        ValueError: not a hash (a bool, a float, an int out of 64-bit range, an empty value, a string that is
            neither hex nor, with ``text_hashes``, base64).
    """
    return _hash(value, text_hashes, mooncake)


def _hash(value: Any, text_hashes: bool, mooncake: bool = False) -> bytes:
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(_U64 >> 1) <= value < _U64:
            raise _Bad(f"block hash {value} is outside the signed and unsigned 64-bit ranges")
        return (value % _U64).to_bytes(8, "big")
    if isinstance(value, (bytes, bytearray)) and value:
        return bytes(value)
    if isinstance(value, str) and value:
        m = _HEX.fullmatch(value)
        if m:
            return bytes.fromhex(m[1])
        if mooncake:
            return value.encode()
        if text_hashes:
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                pass
        raise _Bad(f"block hash {value[:40]!r} is neither hex nor base64")
    raise _Bad(f"a block hash is bytes, a 64-bit integer or a hex string, got {_kind(value)}")


def _hashes(value: Any, text_hashes: bool, mooncake: bool = False) -> tuple[bytes, ...]:
    if not isinstance(value, (list, tuple)):
        raise _Bad(f"block_hashes must be an array, got {_kind(value)}")
    return tuple(_hash(h, text_hashes, mooncake) for h in value)


def _optional_hash(value: Any, text_hashes: bool) -> bytes | None:
    return None if value is None else _hash(value, text_hashes)


def _token_ids(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in value):
        raise _Bad(f"token_ids must be an array of token ids (integers >= 0), got {_kind(value)}")
    return tuple(value)


def _count(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Bad(f"{name} must be an integer >= 0, got {_kind(value)}")
    return value


def _optional_int(value: Any, name: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise _Bad(f"{name} must be an integer or nil, got {_kind(value)}")
    return value


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _Bad(f"{name} must be a string or nil, got {_kind(value)}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """A short description of a value for an error message: its type, and the value when it is short."""
    if value is None:
        return "nil"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
