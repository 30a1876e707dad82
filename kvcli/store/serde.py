"""Serialization of one chunk's KV-cache tensor to bytes, in the safetensors format.

Format (https://github.com/huggingface/safetensors, "Format" section): an 8-byte little-endian unsigned header
length ``N``, then ``N`` bytes of UTF-8 JSON ``{"kv": {"dtype": "BF16", "shape": [...], "data_offsets": [0, nbytes]},
"__metadata__": {...}}`` padded with spaces so the data starts 8-byte aligned, then the raw tensor bytes in C order,
little-endian. Any safetensors reader loads a kvcli payload (a test checks it with the ``safetensors`` package).

We write the header ourselves so the tensor is copied exactly once, straight into the value handed to redis-py
(the copy that gathers the chunk out of the model's cache), and decode without a copy (``torch.frombuffer``).
bf16 and every other dtype survive bit-exactly: the bytes are the tensor's own bytes.

**fp8 KV** (``dtype="float8_e4m3fn"``, engines' ``--kv-cache-dtype fp8``): the payload holds two tensors, ``kv``
(``F8_E4M3``, ``[layers, 2, kv_heads, tokens, head_dim]``, data offsets ``[0, n)``) and ``kv_scale`` (``F32``,
``[layers, 2]``, offsets ``[n, n + 8 * layers]``): one scale for the K and one for the V of each layer, the
granularity of vLLM's ``k_scale`` / ``v_scale`` (one scalar per attention layer, which its fp8 attention kernels
take), computed per chunk from the chunk's own absolute maximum (``scale = amax / 448``, 448 the largest finite
e4m3 value) so a stored chunk decodes alone, with no calibration pass. ``q = clamp(x / scale, -448, 448)`` in
float32, cast to e4m3 (round to nearest even); decoding is ``q * scale``. MLA's ``[layers, 1, 1, tokens, dim]``
gets ``[layers, 1]``.

**Linear layers' state** (a hybrid model: Gated DeltaNet or Mamba-2 layers beside its attention layers): the
payload of a chunk also holds ``state``, every linear layer's state at the chunk's END (after its last token), so a
hit run resumes from its deepest chunk (:mod:`kvcli.prefixkv`). It is the last tensor: dtype the model's (never
quantized), shape ``[linear_layers, state_elements]``, data offsets ``[m, m + linear_layers * state_elements *
element_size)`` with ``m`` the end of ``kv`` (and of ``kv_scale`` for fp8). Row ``i`` is linear layer ``i``'s state
flattened, its layout the model's (:mod:`kvcli.model.hf`: the convolution state's ``kernel - 1`` columns, then the
recurrent state). The checksum covers it with the KV. A chunk's payload bytes are then the attention layers' KV of
its tokens plus ``linear_layers * state_elements * element_size``: ``ModelConfig.kv_bytes_per_token * tokens +
ModelConfig.state_bytes``.
"""
from __future__ import annotations

import json
import struct
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvcli.errors import BadInputError, KvcliError
from kvcli.prefixkv import StatefulKV
from kvcli.units import DTYPE_BYTES, dtype_key, torch_dtype

if TYPE_CHECKING:
    import torch

_DTYPES = {  # torch's name -> safetensors' (a dtype is a name until a tensor is made: torch loads only then)
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64", "float8_e4m3fn": "F8_E4M3",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}
TENSOR_NAME = "kv"
SCALE_NAME = "kv_scale"
STATE_NAME = "state"
FP8 = "float8_e4m3fn"
FP8_MAX = 448.0  # the largest finite float8_e4m3fn value (torch.finfo(torch.float8_e4m3fn).max)
SCALED = frozenset({FP8})  # payload dtypes stored with a kv_scale tensor
SCALE_BYTES = 4  # float32
#: ``--kv-dtype`` values -> the payload's dtype (torch's name); None: the model's own dtype, bit-exact
KV_DTYPES = {"auto": None, "fp8": FP8, "fp8_e4m3": FP8, FP8: FP8}


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


def check_kv_dtype(name: str | None) -> str | None:
    """The payload dtype ``--kv-dtype`` names (:data:`KV_DTYPES`): None for ``auto`` (or None: the model's dtype),
    ``"float8_e4m3fn"`` for ``fp8`` / ``fp8_e4m3``.

    Raises:
        BadInputError: any other name (fp8_e5m2 and the int8/uint8 formats are not implemented).
    """
    if name is None:
        return None
    try:
        return KV_DTYPES[name.strip().lower()]
    except KeyError:
        raise BadInputError(f"--kv-dtype must be auto or fp8 (fp8_e4m3: float8_e4m3fn with per-layer K and V "
                           f"scales), got {name!r}") from None


def scale_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The ``kv_scale`` tensor's shape for KV of ``shape``: ``[layers, 2]`` (one K and one V scale per layer)."""
    return tuple(shape[:2])


def state_bytes(state_shape: tuple[int, ...], state_dtype) -> int:
    """Bytes of a ``state`` tensor of ``state_shape`` (``[linear_layers, state_elements]``; ``()``: no state, 0)
    in ``state_dtype``."""
    if not state_shape:
        return 0
    return int(np.prod(state_shape, dtype=np.int64)) * DTYPE_BYTES[_BY_NAME[dtype_name(state_dtype)]]


def data_bytes(shape: tuple[int, ...], dtype, state_shape: tuple[int, ...] = (), state_dtype=None) -> int:
    """Tensor bytes of a payload of KV ``shape`` stored in ``dtype``: the KV's, plus the ``kv_scale`` tensor's
    (4 bytes per layer and K/V) for a scaled dtype (:data:`SCALED`), plus the ``state`` tensor's of
    ``state_shape`` in ``state_dtype`` (module docstring; ``()``: none)."""
    name = _BY_NAME[dtype_name(dtype)]
    nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[name]
    if name in SCALED:
        nbytes += int(np.prod(scale_shape(shape), dtype=np.int64)) * SCALE_BYTES
    return nbytes + state_bytes(state_shape, state_dtype)


def _header(shape: tuple[int, ...], dtype, metadata: dict[str, str] | None, state_shape: tuple[int, ...] = (),
            state_dtype=None) -> bytes:
    name = dtype_name(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[_BY_NAME[name]]
    head: dict = {TENSOR_NAME: {"dtype": name, "shape": list(shape), "data_offsets": [0, nbytes]}}
    before_state = data_bytes(shape, dtype)
    if _BY_NAME[name] in SCALED:
        head[SCALE_NAME] = {"dtype": "F32", "shape": list(scale_shape(shape)),
                            "data_offsets": [nbytes, before_state]}
    if state_shape:
        head[STATE_NAME] = {"dtype": dtype_name(state_dtype), "shape": list(state_shape),
                            "data_offsets": [before_state, before_state + state_bytes(state_shape, state_dtype)]}
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def flat_bytes(value) -> bytes | bytearray | memoryview:
    """``value`` as the one kind of buffer kvcli hands to redis-py: ``bytes``, a ``bytearray``, or a 1-D
    C-contiguous memoryview of format ``"B"``, whose ``len()`` is its size in bytes.

    redis-py writes ``len(arg)`` as a value's RESP bulk length (redis/connection.py, ``PythonRespSerializer.pack``),
    and a memoryview's ``len()`` is its first dimension: a ``[2, 3, 4]`` uint8 buffer would be announced as 2 bytes
    and its other 22 sent as further commands. Every payload and record kvcli writes passes through here.

    Args:
        value: ``bytes`` or ``bytearray`` (returned as they are); a memoryview of any shape and format (a C-contiguous
            one cast to ``"B"`` without a copy, any other copied into ``bytes`` in C order); a NumPy array or a torch
            tensor of any shape, dtype, strides or device (its bytes in C order: no copy when it is a C-contiguous
            CPU tensor, else one).

    Raises:
        TypeError: ``value`` is none of these (a ``str`` included: text is encoded by the caller).
    """
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        if value.c_contiguous:
            return value.cast("B") if value.ndim != 1 or value.format != "B" else value
        return value.tobytes()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).reshape(-1).view(np.uint8).data.cast("B")
    import torch

    if isinstance(value, torch.Tensor):
        return tensor_bytes(value)
    raise TypeError(f"not a byte buffer: {type(value).__name__}")


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes in C order as a 1-D memoryview of format ``"B"`` (:func:`flat_bytes`' rule for tensors):
    ``tensor.nbytes`` long, whatever its shape, dtype, strides or device; no copy for a C-contiguous CPU tensor."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


def header_size(shape: tuple[int, ...], dtype, metadata: dict[str, str] | None = None,
                state_shape: tuple[int, ...] = (), state_dtype=None) -> int:
    """Bytes of serialization header (length prefix + JSON + padding) for a tensor of this shape and dtype, and a
    ``state`` tensor of ``state_shape`` in ``state_dtype`` (``()``: none)."""
    return len(_header(tuple(shape), dtype, metadata, tuple(state_shape), state_dtype))


def encode_kv(kv, metadata: dict[str, str] | None = None, dtype: str | None = None) -> memoryview:
    """Serialize one tensor (typically a chunk's KV, ``[layers, 2, kv_heads, chunk_tokens, head_dim]``), or a
    :class:`~kvcli.prefixkv.StatefulKV` chunk: its KV and, as the ``state`` tensor, its state at the chunk's end
    (``[linear_layers, state_elements]``, in its own dtype; module docstring).

    The tensor may be a strided view (a slice of a longer cache): it is gathered straight into the output buffer,
    which is the only copy. ``dtype`` None stores it as it is (bit-exact); ``"float8_e4m3fn"`` quantizes it with
    per-layer K and V scales (module docstring; ``kv`` then needs at least 2 dimensions). Returns a read-write
    memoryview of ``header + data`` bytes, 1-D and of format ``"B"`` (:func:`flat_bytes`), ready for redis-py.

    Raises:
        PayloadError: the dtype cannot be serialized, or is not one a payload is quantized to; a StatefulKV chunk
            without the state at its end.
    """
    import torch

    state = None
    if isinstance(kv, StatefulKV):
        kv, state = kv.kv, kv.end_state
        if state is None:
            raise PayloadError(f"a chunk of a hybrid model's KV without its linear layers' state at its end "
                               f"(token {kv.shape[3]})")
    stored = kv.dtype if dtype is None else dtype
    if dtype is not None and dtype not in SCALED:
        raise PayloadError(f"cannot quantize KV to {dtype}; known: {', '.join(sorted(SCALED))}")
    shape = tuple(kv.shape)
    state_shape, state_dtype = (tuple(state.shape), state.dtype) if state is not None else ((), None)
    head = _header(shape, stored, metadata, state_shape, state_dtype)
    kv_end = len(head) + data_bytes(shape, stored)
    out = torch.empty(kv_end + state_bytes(state_shape, state_dtype), dtype=torch.uint8)
    out[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    if dtype is None:
        if kv.numel():
            out[len(head):kv_end].view(kv.dtype).view(kv.shape).copy_(kv)
    elif kv.numel():
        q, scales = quantize_fp8(kv)
        n = q.numel()
        out[len(head):len(head) + n].view(q.dtype).view(q.shape).copy_(q)
        out[len(head) + n:kv_end].view(torch.float32).copy_(scales.reshape(-1))
    if state is not None and state.numel():
        out[kv_end:].view(state.dtype).view(state.shape).copy_(state)
    return tensor_bytes(out)


def quantize_fp8(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: ``kv`` ``[layers, 2, ...]`` as float8_e4m3fn (same shape, on the CPU) and its float32
    scales ``[layers, 2]``, ``scale = amax / 448`` over each layer's K (and V) in the chunk (1 where it is all 0),
    ``q = clamp(kv / scale, -448, 448)`` rounded to e4m3 (module docstring)."""
    import torch

    x = kv.detach().to("cpu", torch.float32)
    amax = x.abs().amax(dim=tuple(range(2, x.dim()))) if x.dim() > 2 else x.abs()
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    expand = scales.view(*scales.shape, *(1,) * (x.dim() - 2))
    return (x / expand).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales


def stored_as(kv: torch.Tensor | StatefulKV, dtype: str | None) -> torch.Tensor | StatefulKV:
    """``kv`` as a retrieve hands it back after storing it in payload ``dtype``: quantized and dequantized to
    ``kv.dtype`` (the same :func:`encode_kv` and :func:`decode_kv`; a StatefulKV keeps its end state, as stored),
    or ``kv`` itself for None."""
    if dtype is None:
        return kv
    return decode_kv(encode_kv(kv, dtype=dtype), kv.dtype)[0]


@dataclass(frozen=True, slots=True)
class PayloadLayout:
    """Where a payload's tensors are, read from its header alone (no torch): ``dtype`` (torch's name,
    "bfloat16"), ``shape``, the KV tensor's bytes ``[start, end)`` of the value, the header's ``__metadata__``,
    and ``data_end``: the end of all tensor bytes (``end`` plus the ``kv_scale`` tensor of a scaled dtype and the
    ``state`` tensor of a hybrid model; the checksum covers ``[start, data_end)``); a ``state`` tensor's
    ``state_shape`` (``()``: none), ``state_dtype`` (torch's name) and first byte ``state_start``."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    metadata: dict[str, str]
    data_end: int
    state_shape: tuple[int, ...] = ()
    state_dtype: str = ""
    state_start: int = 0

    @property
    def scaled(self) -> bool:
        """Whether the KV is quantized, with a ``kv_scale`` tensor after it."""
        return self.dtype in SCALED

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
        state = head.pop(STATE_NAME, None) if len(head) >= 2 else None
        scale = head.pop(SCALE_NAME, None) if len(head) == 2 else None
        (spec,) = head.values()
        name = _BY_NAME[spec["dtype"]]
        shape = tuple(int(d) for d in spec["shape"])
        start, end = (int(x) for x in spec["data_offsets"])
        data_end = end
        if (scale is not None) != (name in SCALED):
            raise ValueError(f"{spec['dtype']} with{'' if scale is not None else 'out'} a {SCALE_NAME} tensor")
        if scale is not None:
            scale_start, data_end = (int(x) for x in scale["data_offsets"])
            if (scale["dtype"] != "F32" or tuple(int(d) for d in scale["shape"]) != scale_shape(shape)
                    or scale_start != end):
                raise ValueError(f"{SCALE_NAME} is not F32 {list(scale_shape(shape))} right after the KV")
        state_shape: tuple[int, ...] = ()
        state_dtype, state_start = "", 0
        if state is not None:
            state_dtype, state_shape = _BY_NAME[state["dtype"]], tuple(int(d) for d in state["shape"])
            state_start, state_end = (int(x) for x in state["data_offsets"])
            if (len(shape) != 5 or len(state_shape) != 2 or state_start != data_end
                    or state_end - state_start != state_bytes(state_shape, state_dtype)):
                raise ValueError(f"{STATE_NAME} is not [linear_layers, state_elements] right after the KV of a "
                                 "[layers, 2, kv_heads, tokens, head_dim] chunk")
            data_end = state_end
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not a KV payload: {exc}") from None
    expect = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[name]
    total = data_bytes(shape, name, state_shape, state_dtype or None)
    if end - start != expect or data_end - end != total - expect or 8 + n + data_end > len(view):
        raise PayloadError(f"KV payload data is {len(view) - 8 - n} bytes, header says {total}")
    if scale is not None:
        scales = np.frombuffer(view[8 + n + end:8 + n + end + SCALE_BYTES * int(np.prod(scale_shape(shape)))],
                               dtype="<f4")
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            raise PayloadError(f"KV payload's {SCALE_NAME} holds a scale that is not a positive finite number")
    return PayloadLayout(name, shape, 8 + n + start, 8 + n + end, meta, 8 + n + data_end, state_shape, state_dtype,
                         8 + n + state_start if state_shape else 0)


def decode_kv(payload, dtype=None) -> tuple[torch.Tensor | StatefulKV, dict[str, str]]:
    """Deserialize a payload made by :func:`encode_kv` (or any one-tensor safetensors file).

    Args:
        payload: the value's bytes.
        dtype: what a scaled (fp8) payload is dequantized to (``q * scale``; a torch dtype or its name; None:
            float32). An unscaled payload's tensor is returned as stored, whatever ``dtype`` says.

    Returns:
        ``(tensor, metadata)``; an unscaled tensor shares memory with ``payload`` (read-only when ``payload`` is
        bytes, no copy); a dequantized one is new. A payload with a ``state`` tensor gives a
        :class:`~kvcli.prefixkv.StatefulKV` instead of the tensor: its KV and ``{tokens: state}`` (the state after
        the chunk's ``tokens``, ``[linear_layers, state_elements]``, sharing memory with ``payload``).

    Raises:
        PayloadError: as :func:`payload_layout`.
    """
    import torch

    layout = payload_layout(payload)
    stored = getattr(torch, layout.dtype)
    count = layout.end - layout.start
    out = torch_dtype(dtype if dtype is not None else "float32") if layout.scaled else stored
    if layout.data_end == layout.start:  # no tensor bytes at all (a model with only linear layers keeps a state)
        return torch.empty(layout.shape, dtype=out), layout.metadata
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we never write into it
        flat = torch.frombuffer(memoryview(payload).cast("B"), dtype=torch.uint8, count=layout.data_end - layout.start,
                                offset=layout.start)
    kv = flat[:count].view(stored).view(layout.shape)
    if layout.scaled:
        scales = flat[count:layout.state_start - layout.start if layout.state_shape else None]
        kv = (kv.to(torch.float32) * scales.view(torch.float32).view(*scale_shape(layout.shape),
                                                                     *(1,) * (kv.dim() - 2))).to(out)
    if not layout.state_shape:
        return kv, layout.metadata
    state = flat[layout.state_start - layout.start:].view(getattr(torch, layout.state_dtype)).view(layout.state_shape)
    return StatefulKV(kv, {layout.shape[3]: state}), layout.metadata
