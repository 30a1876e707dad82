"""kvcli.model.attention: prefix_attention equals textbook lower-right causal attention, with GQA, batches, bf16."""
from __future__ import annotations

import pytest
import torch

from kvcli.model.attention import cached_prefix_attention, prefix_attention


def _reference(q, k, v, past):
    """Explicit softmax in float64 with repeated K/V heads and a lower-right causal mask: query i sees keys
    0 .. past + i. ``q`` ``[..., heads, new, dim]``, ``k``/``v`` ``[..., kv_heads, past + new, dim]``."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    total = k.shape[-2]
    visible = torch.arange(total)[None, :] <= torch.arange(past, total)[:, None]
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v


def _qkv(heads, kv_heads, new, past, dim=32, batch=(), dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, heads, new, dim, generator=gen)
    k = torch.randn(*batch, kv_heads, past + new, dim, generator=gen)
    v = torch.randn(*batch, kv_heads, past + new, dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("past, new", [(0, 1), (0, 7), (5, 1), (1, 1), (1, 9), (37, 5), (64, 64), (100, 300),
                                       (513, 255)])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (8, 1)])
def test_equals_textbook_attention_fp32(past, new, heads, kv_heads):
    q, k, v = _qkv(heads, kv_heads, new, past)
    out = prefix_attention(q, k, v, past)
    assert out.shape == (heads, new, 32) and out.dtype == torch.float32
    assert (out.double() - _reference(q, k, v, past)).abs().max().item() < 1e-5


def test_masked_path_gives_the_same_answer():
    q, k, v = _qkv(4, 2, 50, 70)
    fast, masked = prefix_attention(q, k, v, 70), prefix_attention(q, k, v, 70, _masked=True)
    assert (fast - masked).abs().max().item() < 1e-5


def test_batched_and_past_inferred_from_key_length():
    q, k, v = _qkv(4, 2, 20, 30, batch=(3,))
    out = prefix_attention(q, k, v)  # past = 50 - 20
    assert out.shape == (3, 4, 20, 32)
    assert (out.double() - _reference(q, k, v, 30)).abs().max().item() < 1e-5
    assert torch.allclose(out[1], prefix_attention(q[1], k[1], v[1], 30), atol=1e-6, rtol=0)


def test_bf16_within_two_ulps():
    # The two parts are each rounded to bf16 by the kernel before the merge: outputs of magnitude < 1 can differ
    # from the exact value by about two bf16 ulps (2**-8 each below 1), 1.6e-2 with headroom.
    q, k, v = _qkv(4, 2, 96, 160, dtype=torch.bfloat16)
    out = prefix_attention(q, k, v, 160)
    assert out.dtype == torch.bfloat16
    assert (out.double() - _reference(q, k, v, 160)).abs().max().item() < 1.6e-2


def test_custom_scale():
    q, k, v = _qkv(2, 2, 6, 10)
    # Scaling the scores by 2 / sqrt(dim) equals the default scale on 2 q.
    assert torch.allclose(prefix_attention(q, k, v, 10, scale=2 / 32 ** 0.5), prefix_attention(2 * q, k, v, 10),
                          atol=1e-5, rtol=0)


def test_inputs_not_modified():
    q, k, v = _qkv(4, 2, 12, 20)
    copies = [t.clone() for t in (q, k, v)]
    prefix_attention(q, k, v, 20)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), copies))


@pytest.mark.parametrize("q_shape, k_shape, past, match", [
    ((4, 5, 32), (2, 12, 32), 6, "must equal the key length"),     # 6 + 5 != 12
    ((4, 5, 32), (2, 4, 32), None, "must equal the key length"),   # fewer keys than queries
    ((3, 5, 32), (2, 10, 32), 5, "multiple of kv_heads"),
    ((4, 5, 16), (2, 10, 32), 5, "head_dim must match"),
    ((4, 0, 32), (2, 10, 32), 10, "no rows"),
    ((5, 32), (10, 32), 5, "expected q"),
])
def test_bad_shapes(q_shape, k_shape, past, match):
    with pytest.raises(ValueError, match=match):
        prefix_attention(torch.zeros(q_shape), torch.zeros(k_shape), torch.zeros(k_shape), past)


@pytest.mark.parametrize("past, new", [(1, 1), (5, 1), (37, 5), (513, 255)])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 1)])
def test_cached_prefix_apart_equals_textbook_attention(past, new, heads, kv_heads):
    q, k, v = _qkv(heads, kv_heads, new, past)
    out = cached_prefix_attention(q, k[:, :past], v[:, :past], k[:, past:], v[:, past:])
    assert out.shape == (heads, new, 32)
    assert (out.double() - _reference(q, k, v, past)).abs().max().item() < 1e-5
    batched = cached_prefix_attention(q[None], k[None, :, :past], v[None, :, :past], k[None, :, past:],
                                      v[None, :, past:])
    assert torch.equal(batched[0], out)


def test_cached_prefix_apart_needs_a_prefix_and_a_key_per_query():
    q, k, v = _qkv(4, 2, 3, 5)
    with pytest.raises(ValueError, match="0 past and 3 new keys"):
        cached_prefix_attention(q, k[:, :0], v[:, :0], k[:, 5:], v[:, 5:])
    with pytest.raises(ValueError, match="5 past and 2 new keys for 3 queries"):
        cached_prefix_attention(q, k[:, :5], v[:, :5], k[:, 6:], v[:, 6:])
