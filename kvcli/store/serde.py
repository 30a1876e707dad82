"""Serialization of one chunk's KV-cache tensor to bytes, in the safetensors format.

Format (https://github.com/huggingface/safetensors, "Format" section): an 8-byte little-endian unsigned header
length ``N``, then ``N`` bytes of UTF-8 JSON ``{"kv": {"dtype": "BF16", "shape": [...], "data_offsets": [0, nbytes]},
"__metadata__": {...}}`` padded with spaces so the data starts 8-byte aligned, then the raw tensor bytes in C order,
little-endian. Any safetensors reader loads a kvcli payload (a test checks it with the ``safetensors`` package).

We write the header ourselves so the tensor is copied exactly once, straight into the value handed to redis-py
(the copy that gathers the chunk out of the model's cache), and decode without a copy (``torch.frombuffer``).
bf16 and every other dtype survive bit-exactly: the bytes are the tensor's own bytes.
"""
from __future__ import annotations

import json
import struct
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvcli.errors import KvcliError
from kvcli.units import DTYPE_BYTES, dtype_key

if TYPE_CHECKING:
    import torch

_DTYPES = {  # torch's name -> safetensors' (a dtype is a name until a tensor is made: torch loads only then)
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}
TENSOR_NAME = "kv"


class PayloadError(KvcliError):
    """A stored payload is not a valid kvcli/safetensors KV payload (truncated, corrupted, wrong dtype)."""


def dtype_name(dtype) -> str:
    """The safetensors name of a torch dtype or of torch's name for it (``torch.bfloat16``, ``"bfloat16"`` ->
    ``"BF16"``).

    Raises:
        PayloadError: the dtype has no safetensors name here.
    """
    try:
        return _DTYPES[dtype_key(dtype)]
    except KeyError:
        raise PayloadError(f"dtype {dtype} cannot be serialized") from None


def _header(shape: tuple[int, ...], dtype, metadata: dict[str, str] | None) -> bytes:
    name = dtype_name(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[_BY_NAME[name]]
    head: dict = {TENSOR_NAME: {"dtype": name, "shape": list(shape), "data_offsets": [0, nbytes]}}
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def header_size(shape: tuple[int, ...], dtype, metadata: dict[str, str] | None = None) -> int:
    """Bytes of serialization header (length prefix + JSON + padding) for a tensor of this shape and dtype."""
    return len(_header(tuple(shape), dtype, metadata))


def encode_kv(kv: torch.Tensor, metadata: dict[str, str] | None = None) -> memoryview:
    """Serialize one tensor (typically a chunk's KV, ``[layers, 2, kv_heads, chunk_tokens, head_dim]``).

    The tensor may be a strided view (a slice of a longer cache): it is gathered straight into the output buffer,
    which is the only copy. Returns a read-write memoryview of ``header + data`` bytes, ready for redis-py.

    Raises:
        PayloadError: the dtype cannot be serialized.
    """
    import torch

    head = _header(tuple(kv.shape), kv.dtype, metadata)
    out = torch.empty(len(head) + kv.numel() * kv.element_size(), dtype=torch.uint8)
    out[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    if kv.numel():
        out[len(head):].view(kv.dtype).view(kv.shape).copy_(kv)
    return out.numpy().data


@dataclass(frozen=True, slots=True)
class PayloadLayout:
    """Where a payload's tensor is, read from its header alone (no torch): ``dtype`` (torch's name,
    "bfloat16"), ``shape``, the tensor bytes ``[start, end)`` of the value, and the header's ``__metadata__``."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    metadata: dict[str, str]

    @property
    def safetensors_dtype(self) -> str:
        """The dtype as safetensors names it ("BF16")."""
        return _DTYPES[self.dtype]


def payload_layout(payload) -> PayloadLayout:
    """Parse a payload's header (:func:`encode_kv`'s format) and check it against the bytes, without torch.

    Raises:
        PayloadError: the bytes are not a valid one-tensor safetensors payload (truncated or corrupted header,
            unknown dtype, data size not matching the shape).
    """
    view = memoryview(payload).cast("B")
    try:
        (n,) = struct.unpack_from("<Q", view, 0)
        if n > len(view) - 8:
            raise ValueError("header longer than payload")
        head = json.loads(bytes(view[8:8 + n]))
        meta = head.pop("__metadata__", {}) or {}
        (spec,) = head.values()
        name = _BY_NAME[spec["dtype"]]
        shape = tuple(int(d) for d in spec["shape"])
        start, end = (int(x) for x in spec["data_offsets"])
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not a KV payload: {exc}") from None
    expect = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[name]
    if end - start != expect or 8 + n + end > len(view):
        raise PayloadError(f"KV payload data is {len(view) - 8 - n} bytes, header says {expect}")
    return PayloadLayout(name, shape, 8 + n + start, 8 + n + end, meta)


def decode_kv(payload) -> tuple[torch.Tensor, dict[str, str]]:
    """Deserialize a payload made by :func:`encode_kv` (or any one-tensor safetensors file) without a copy.

    Returns:
        ``(tensor, metadata)``; the tensor shares memory with ``payload`` (read-only when ``payload`` is bytes).

    Raises:
        PayloadError: as :func:`payload_layout`.
    """
    import torch

    layout = payload_layout(payload)
    dtype = getattr(torch, layout.dtype)
    count = layout.end - layout.start
    if count == 0:
        return torch.empty(layout.shape, dtype=dtype), layout.metadata
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we never write into it
        flat = torch.frombuffer(memoryview(payload).cast("B"), dtype=torch.uint8, count=count, offset=layout.start)
    return flat.view(dtype).view(layout.shape), layout.metadata
