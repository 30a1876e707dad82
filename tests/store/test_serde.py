"""KV serialization: bit-exact bf16, safetensors compatibility, corrupted input."""
from __future__ import annotations

import pytest
import torch

from kvcli.store.serde import PayloadError, decode_kv, encode_kv


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
