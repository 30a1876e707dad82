"""KV serialization: bit-exact bf16, safetensors compatibility, corrupted input."""
from __future__ import annotations

import pytest
import torch

from kvcli.errors import BadInputError
from kvcli.store.serde import PayloadError, check_kv_dtype, data_bytes, decode_kv, encode_kv, payload_layout, stored_as


def test_bf16_round_trip_is_bit_exact_in_12_payload_bytes():
    t = torch.tensor([1, -2.5, 70000, 1e-8, 3e38, 0.1], dtype=torch.bfloat16)
    buf = encode_kv(t)
    back, _ = decode_kv(bytes(buf))
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.view(torch.int16), t.view(torch.int16))
    head = len(buf) - 12
    assert head % 8 == 0 and bytes(buf[head:]) == t.view(torch.uint8).numpy().tobytes()


def test_payload_is_a_safetensors_file():
    safetensors_torch = pytest.importorskip("safetensors.torch")
    kv = torch.randn(2, 2, 1, 5, 4).to(torch.bfloat16)
    loaded = safetensors_torch.load(bytes(encode_kv(kv[:, :, :, 1:4, :], {"model": "m"})))
    assert torch.equal(loaded["kv"], kv[:, :, :, 1:4, :])


@pytest.mark.parametrize("damage", [lambda b: b[:20], lambda b: b"\xff" * 8 + b[8:], lambda b: b[:-1]])
def test_damaged_payload_is_refused(damage):
    buf = bytes(encode_kv(torch.ones(3, 4)))
    with pytest.raises(PayloadError):
        decode_kv(damage(buf))


def _fp8_chunk() -> torch.Tensor:
    """``[layers 1, K|V, kv_heads 1, tokens 2, head_dim 2]``: K's amax 4, V's 3."""
    return torch.tensor([[[[[1.0, -2.0], [0.5, 4.0]]], [[[3.0, 0.0], [1.0, -1.5]]]]])


def test_fp8_payload_holds_e4m3_bytes_and_one_scale_per_layer_for_k_and_v():
    """scale = amax / 448: K 4/448, V 3/448. K / scale = 112, -224, 56, 448 and V's 448, 0, -224 are e4m3 values
    (1.75 x 2^k), so they come back exactly; V's 1.0 / (3/448) = 149.33 rounds to 144 (e4m3 steps by 16 in
    [128, 256)), which decodes to 144 x 3/448 = 0.9642857."""
    kv = _fp8_chunk()
    buf = bytes(encode_kv(kv, {"model": "m"}, dtype="float8_e4m3fn"))
    layout = payload_layout(buf)
    assert (layout.dtype, layout.shape, layout.end - layout.start, layout.data_end - layout.end) == (
        "float8_e4m3fn", (1, 2, 1, 2, 2), 8, 8)
    assert data_bytes((1, 2, 1, 2, 2), "float8_e4m3fn") == 16 and len(buf) == layout.data_end
    scales = torch.frombuffer(bytearray(buf[layout.end:]), dtype=torch.float32)
    assert scales.tolist() == [torch.tensor(4 / 448).item(), torch.tensor(3 / 448).item()]
    q = torch.frombuffer(bytearray(buf[layout.start:layout.end]), dtype=torch.float8_e4m3fn).float()
    assert q.tolist() == [112, -224, 56, 448, 448, 0, 144, -224]
    back, meta = decode_kv(buf, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and meta == {"model": "m"}
    expect = kv.clone()
    expect[0, 1, 0, 1, 0] = 144 * torch.tensor(3 / 448).item()
    assert torch.equal(decode_kv(buf)[0], expect)  # float32 by default
    assert torch.equal(stored_as(kv, "float8_e4m3fn"), expect)


def test_fp8_payload_is_a_safetensors_file_of_two_tensors():
    safetensors_torch = pytest.importorskip("safetensors.torch")
    loaded = safetensors_torch.load(bytes(encode_kv(_fp8_chunk(), dtype="float8_e4m3fn")))
    assert loaded["kv"].dtype == torch.float8_e4m3fn and loaded["kv_scale"].shape == (1, 2)


def _relabel(buf: bytes, old: bytes, new: bytes) -> bytes:
    """``old`` replaced by ``new`` padded with spaces to its length (JSON allows them): the same offsets."""
    assert old in buf and len(new) <= len(old)
    return buf.replace(old, new + b" " * (len(old) - len(new)), 1)


@pytest.mark.parametrize("lie", [
    lambda b: _relabel(b, b'"dtype":"F8_E4M3"', b'"dtype":"U8"'),  # one-byte ints "with" scales
    lambda b: _relabel(b, b'"dtype":"F32","shape":[1,2]', b'"dtype":"I32","shape":[1,2]'),  # scales of another dtype
    lambda b: _relabel(b, b'"kv_scale"', b'"kv_other"'),  # fp8 without its scales
    lambda b: b[:-4] + b"\0\0\0\0",  # a scale of 0: nothing dequantizes
    lambda b: b[:-4] + b"\0\0\xc0\x7f",  # a NaN scale
], ids=["int8-with-scales", "scales-not-f32", "no-scales", "zero-scale", "nan-scale"])
def test_an_fp8_payload_whose_header_or_scales_lie_is_refused(lie):
    buf = bytes(encode_kv(_fp8_chunk(), dtype="float8_e4m3fn"))
    with pytest.raises(PayloadError):
        decode_kv(lie(buf))


def test_kv_dtype_names():
    assert [check_kv_dtype(x) for x in (None, "auto", "fp8", "FP8_E4M3")] == [None, None] + ["float8_e4m3fn"] * 2
    with pytest.raises(BadInputError, match="--kv-dtype must be auto or fp8"):
        check_kv_dtype("fp8_e5m2")
