"""Units in one place: the size parser, the capacity parser (tokens or bytes), the duration parser, the seed's
range and the counts' floor, the byte formatter, and the JSON document envelope every command's ``--json`` output
shares.

JSON field names carry their unit (``_seconds``, ``_bytes``, ``_tokens``; ratios are plain ``_ratio`` numbers in
[0, 1]); the same name means the same thing in every command (``model_id``, ``hit_token_ratio``, ...). Every
document starts with ``schema_version`` (bumped when a field changes meaning or disappears), ``command`` and
``provenance`` (which kvcli, command line, when, on what machine: :mod:`kvcli.provenance`).
"""
from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Callable

from kvcli.errors import BadInputError
from kvcli.provenance import provenance

SCHEMA_VERSION = 2  #: the JSON documents' layout: a reader checks it before it reads a field

#: Bytes per element of the dtypes kvcli handles, by torch's name: known without importing torch (~1 s, ~200 MiB),
#: so a command that never computes with tensors (an index-only replay) never loads it.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "float8_e4m3fn": 1}


def dtype_key(dtype) -> str:
    """torch's name of a dtype given as a torch dtype or as that name: ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def dtype_bytes(dtype) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name, :data:`DTYPE_BYTES`). Raises BadInputError."""
    try:
        return DTYPE_BYTES[dtype_key(dtype)]
    except KeyError:
        raise BadInputError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def torch_dtype(dtype):
    """The torch dtype ``dtype`` names (a torch dtype is returned as is); imports torch. Raises BadInputError."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    dtype_bytes(dtype)  # a known name
    return getattr(torch, dtype_key(dtype))

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_NUMBER = r"([0-9]*\.?[0-9]+(?:e\+?[0-9]+)?)"
_SIZE = re.compile(_NUMBER + r"\s*([kmgt]?i?b)?")
_CAPACITY = re.compile(_NUMBER + r"\s*([kmgt]?)\s*(ib|b|tokens|token|tok)?")
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}  # divide: 200/1e6 is the double nearest 0.0002
_DURATION = re.compile(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us|µs)?")


def _finite(value: float, text: str, what: str) -> float:
    if not math.isfinite(value):
        raise BadInputError(f"bad {what} {text!r}: not a finite number")
    return value


def parse_size(text: str | None) -> int | None:
    """Bytes from ``"512MiB"``, ``"2GB"``, ``"1e6"`` or ``"1000000"`` (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB).

    Raises:
        BadInputError: anything else, or a number that is not finite.
    """
    if text is None:
        return None
    m = _SIZE.fullmatch(text.strip().lower())
    if not m:
        if re.fullmatch(_NUMBER + r"\s*[kmgt]", text.strip().lower()):  # "64G": GB or GiB?
            shown = text.strip()
            raise BadInputError(f"size {shown!r} is ambiguous: write '{shown}B' (decimal) or '{shown}iB' (binary)")
        raise BadInputError(f"cannot read size {text!r} (e.g. 1000000, 512MiB, 2GB)")
    _finite(float(m[1]), text, "size")
    return _whole(m[1], _SIZE_UNITS[m[2] or ""])


def parse_capacity(text: str, kv_bytes_per_token: int | Callable[[], int]) -> int | None:
    """A cache capacity in tokens, from ``"3M tokens"``/``"500k tok"``/``"250000"`` (tokens; decimal k/M/G/T),
    ``"40GB"``/``"64GiB"`` (bytes, divided by ``kv_bytes_per_token``, an int or a function returning one, called
    only for bytes) or ``"unlimited"`` (None).

    A suffixed number without a unit (``"64G"``, ``"3M"``) is ambiguous (64 G tokens? 64 GB?) and refused: a
    bare number is tokens, a suffix needs ``tokens`` or a byte unit.

    Raises:
        BadInputError: any other text, an ambiguous one, or a number that is not finite.
    """
    shown = text.strip()
    text = shown.lower()
    if text in ("unlimited", "inf", "none"):
        return None
    m = _CAPACITY.fullmatch(text)
    if not m:
        raise BadInputError(f"bad capacity {text!r}; use tokens (3M tokens, 500k tok, 250000), bytes (40GB, 64GiB) "
                            "or 'unlimited'")
    value, prefix, unit = m[1], "kmgt".find(m[2]) + 1 if m[2] else 0, m[3] or ""
    _finite(float(value), text, "capacity")
    if prefix and not unit:
        raise BadInputError(f"capacity {shown!r} is ambiguous: write '{shown} tokens', or bytes as '{shown}B' "
                            f"(decimal) or '{shown}iB' (binary)")
    if unit.endswith("b"):
        per_token = kv_bytes_per_token() if callable(kv_bytes_per_token) else kv_bytes_per_token
        return _whole(value, (1024 if unit == "ib" else 1000) ** prefix) // per_token
    return _whole(value, 1000 ** prefix)


def _whole(number: str, scale: int) -> int:
    """``int(number * scale)`` computed exactly in decimal (a float loses digits past 2**53: "4611686019GB")."""
    return int(decimal.Decimal(number) * scale)


def parse_duration(text: str) -> float:
    """Seconds from ``"5ms"``, ``"200us"``, ``"1.5s"`` or a bare number (seconds). Raises BadInputError."""
    m = _DURATION.fullmatch(str(text).strip().lower())
    if not m:
        raise BadInputError(f"bad duration {text!r}; use e.g. 5ms, 200us, 0.5s")
    return _finite(float(m[1]) / _PER_SECOND[m[2] or "s"], text, "duration")


#: the largest ``--seed``: every seed is a non-negative 64-bit signed integer (numpy's and torch's generators, a
#: model id's ``@seed<N>``)
MAX_SEED = 2**63 - 1


def check_seed(seed: int) -> int:
    """``seed`` when it is an integer in ``[0, MAX_SEED]`` (the ``--seed`` of every command that takes one).

    Raises:
        BadInputError: not an integer, or outside that range.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise BadInputError(f"--seed must be an integer in [0, 2**63 - 1], got {seed}")
    return seed


def check_count(flag: str, value: int | None) -> None:
    """Raise BadInputError naming ``flag`` unless ``value`` is None or >= 1 (a count such as ``--limit``)."""
    if value is not None and value < 1:
        raise BadInputError(f"{flag} must be >= 1, got {value}")


def fmt_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units; ``"–"`` for None: not measured, null in JSON)."""
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


def fmt_count(n: int | None) -> str:
    """A count in a few digits: ``9,456`` whole below 10,000, then 3 significant digits and k, M, G or T:
    ``42,224`` -> ``"42.2k"``, ``683,082`` -> ``"683k"``, ``1,234,567`` -> ``"1.23M"`` (``"–"`` for None)."""
    if n is None:
        return "–"
    if abs(n) < 10_000:
        return f"{n:,}"
    x, unit = float(n), ""
    for unit in ("k", "M", "G", "T"):
        x /= 1000
        if abs(x) < 999.5 or unit == "T":
            break
    digits = 3 - len(str(int(abs(x))))
    return f"{x:.{max(digits, 0)}f}{unit}"


def _clean(obj):
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def json_document(command: str, body: dict, indent: int | None = 2) -> str:
    """The one JSON document a command prints: ``{"schema_version", "command", "provenance", **body}``
    (:func:`kvcli.provenance.provenance`: elapsed seconds up to this call), non-finite floats as null, anything
    else not JSON-native as its ``str``."""
    head = {"schema_version": SCHEMA_VERSION, "command": command, "provenance": provenance()}
    return json.dumps(_clean({**head, **body}), indent=indent, default=str)
