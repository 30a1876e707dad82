"""kvcli.model.flops against hand-computed values and against FlopCounterMode on the real forward pass; and the
cached path's attention work, counted per kernel call (no timing)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from kvcli.errors import BadInputError
from kvcli.model.flops import attention_pairs, prefill_flops, prefill_flops_breakdown, saved_prefill_flops
from kvcli.model.llama import LocalModel, build_model
from kvcli.model.presets import PRESETS, ModelConfig

TINY = PRESETS["tiny"]  # layers 2, hidden 64, heads 4, kv_heads 2, head_dim 32, ffn 128, vocab 100352
CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _kernel_pairs(q_rows: int, k_rows: int, causal: bool) -> int:
    """(query, key) pairs a flash call computes: all of them, or for ``is_causal`` (upper-left aligned) row ``i``
    sees ``min(i + 1, k_rows)`` keys."""
    if not causal:
        return q_rows * k_rows
    return sum(min(i + 1, k_rows) for i in range(q_rows))


def _cpu_attention_flops(q_shape, k_shape, v_shape, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                         scale=None, out_shape=None) -> int:
    """FlopCounterMode formula for the CPU flash kernel (torch registers none): 4 * batch * q_heads * head_dim per
    computed pair (scores and values, 2 FLOPs per multiply-add). A mask masks, it saves no work: all pairs."""
    batch, heads, q_rows, dim = q_shape
    return 4 * batch * heads * dim * _kernel_pairs(q_rows, k_shape[-2], is_causal and attn_mask is None)


def _counted(model, tokens, past_kv=None, logits_for="last") -> dict[str, int]:
    """FLOPs FlopCounterMode counts in one prefill, by op name."""
    with FlopCounterMode(display=False, custom_mapping={CPU_ATTENTION: _cpu_attention_flops}) as counter:
        model.prefill(tokens, past_kv, logits_for=logits_for)
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


class _AttentionCalls(TorchDispatchMode):
    """Records every attention kernel the forward pass runs: (op, q rows, k rows, is_causal, has a mask). Composite
    ops are decomposed, as FlopCounterMode does, so the kernel that does the work is the one recorded."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self:  # a composite op (F.scaled_dot_product_attention): see its parts, as FlopCounterMode does
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        if "attention" in func.name():
            named = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
            self.calls.append((func.name(), named["query"].shape[-2], named["key"].shape[-2],
                               bool(named.get("is_causal", False)), named.get("attn_mask") is not None))
        return func(*args, **kwargs)


# ---- hand-computed values ----

def test_tiny_four_new_tokens_by_hand():
    parts = prefill_flops_breakdown(TINY, 4)
    # Per layer: QKV 2*64*(4+2*2)*32*4 = 131,072; output 2*(4*32)*64*4 = 65,536; MLP 2*3*64*128*4 = 196,608;
    # attention 4*4*32 per pair * (4*5/2 = 10 pairs) = 5,120. Two layers. LM head one row: 2*64*100,352.
    assert {k: int(v) for k, v in parts.items()} == {"qkv": 262_144, "out_proj": 131_072, "mlp": 393_216,
                                                      "attention": 10_240, "lm_head": 12_845_056}
    assert prefill_flops(TINY, 4) == 13_641_728


def test_tiny_after_cached_prefix_by_hand():
    # 3 new after 5 cached: pairs 3*5 + 3*4/2 = 21; per layer 98,304 + 49,152 + 147,456 + 4*4*32*21 (10,752).
    assert prefill_flops(TINY, 3, 5) == 2 * (98_304 + 49_152 + 147_456 + 10_752) + 12_845_056 == 13_456_384
    assert prefill_flops(TINY, 3, 5, logits_for="all") == 13_456_384 + 2 * 12_845_056


@pytest.mark.parametrize("new, cached, pairs", [(1, 0, 1), (4, 0, 10), (3, 5, 21), (1, 100, 101), (0, 9, 0)])
def test_attention_pairs(new, cached, pairs):
    assert attention_pairs(new, cached) == pairs


def test_vectorized_broadcasts():
    new = np.array([1, 2, 3])
    cached = np.array([[0], [5]])
    got = prefill_flops(TINY, new, cached)
    assert got.shape == (2, 3) and got.dtype == np.float64
    assert got[1, 2] == prefill_flops(TINY, 3, 5) == 13_456_384
    assert np.array_equal(got, [[prefill_flops(TINY, n, c) for n in new] for c in (0, 5)])


def test_zero_new_tokens_cost_nothing():
    assert prefill_flops(TINY, 0, 100) == 0


def test_linear_part_is_two_flops_per_parameter_per_token():
    """Kaplan et al.'s 2 * N * D: without attention, all rows' logits, FLOPs = 2 * (params - embedding - norms) * n."""
    cfg = PRESETS["llama-3-8b"]
    parts = prefill_flops_breakdown(cfg, 1000, logits_for="all")
    norms = (2 * cfg.layers + 1) * cfg.hidden
    assert sum(parts.values()) - parts["attention"] == 2 * (cfg.params() - cfg.vocab * cfg.hidden - norms) * 1000


def test_saved_flops():
    # The LM head row and the linear work of the cached tokens cancel out exactly.
    full, suffix = prefill_flops(TINY, 8), prefill_flops(TINY, 3, 5)
    assert saved_prefill_flops(TINY, 8, 5) == full - suffix
    assert saved_prefill_flops(TINY, 8, 0) == 0
    assert np.array_equal(saved_prefill_flops(TINY, np.array([8, 8]), np.array([0, 5])), [0, full - suffix])


@pytest.mark.parametrize("call", [lambda: prefill_flops(TINY, -1), lambda: attention_pairs(2, -3),
                                  lambda: prefill_flops(TINY, 2, logits_for="first"),
                                  lambda: saved_prefill_flops(TINY, 4, 5)])
def test_bad_input(call):
    with pytest.raises(BadInputError):
        call()


# ---- against FlopCounterMode on the real forward pass ----

ODD = ModelConfig("odd", layers=3, hidden=48, heads=6, kv_heads=3, head_dim=16, ffn=96, vocab=1000,
                  dtype="float32")


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", device="cpu")


@pytest.fixture(scope="module")
def odd():
    return LocalModel(ODD, torch.float32, torch.device("cpu"), seed=0)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(3).integers(0, 1000, 300, dtype=np.uint32)


@pytest.mark.parametrize("model_name", ["tiny", "odd"])
@pytest.mark.parametrize("new, cached, logits_for", [(1, 0, "last"), (37, 0, "last"), (300, 0, "all"),
                                                      (1, 299, "last"), (200, 100, "last"), (13, 287, "all")])
def test_formula_equals_flop_counter(request, tokens, model_name, new, cached, logits_for):
    model = request.getfixturevalue(model_name)
    past = model.prefill(tokens[:cached])[1] if cached else None
    counted = _counted(model, tokens[cached:cached + new], past, logits_for)
    parts = prefill_flops_breakdown(model.config, new, cached, logits_for)
    assert counted.get("aten._scaled_dot_product_flash_attention_for_cpu", 0) == parts["attention"]
    assert sum(counted.values()) == prefill_flops(model.config, new, cached, logits_for)


# ---- the cached path's attention: which kernels, how much work ----

def _attention_calls(model, tokens, past_kv):
    with _AttentionCalls() as mode:
        model.prefill(tokens, past_kv)
    return mode.calls


def test_cached_path_uses_unmasked_kernels_and_exact_causal_work(tiny, tokens):
    new, cached = 200, 100
    past = tiny.prefill(tokens[:cached])[1]
    calls = _attention_calls(tiny, tokens[cached:], past)
    # Per layer: the 200 new queries over the 100 cached keys, no mask; then over the 200 new keys, is_causal.
    op = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert calls == [(op, new, cached, False, False), (op, new, new, True, False)] * TINY.layers
    counted = _counted(tiny, tokens[cached:], past)["aten._scaled_dot_product_flash_attention_for_cpu"]
    assert counted == 4 * TINY.heads * TINY.head_dim * TINY.layers * (new * cached + new * (new + 1) // 2)
    # Less attention work than a full prefill of all 300 (45,150 pairs per head and layer vs 40,100 here) ...
    assert counted < _counted(tiny, tokens)["aten._scaled_dot_product_flash_attention_for_cpu"]


def test_old_masked_path_did_more_work(tiny, tokens):
    """The explicit-mask kernel computes every new x (past + new) pair: 60,000 vs 40,100 (and vs 45,150 for the
    full prefill). This is the check above failing on the old path."""
    new, cached = 200, 100
    past = tiny.prefill(tokens[:cached])[1]
    tiny._masked_attention = True
    try:
        calls = _attention_calls(tiny, tokens[cached:], past)
        counted = _counted(tiny, tokens[cached:], past)["aten._scaled_dot_product_flash_attention_for_cpu"]
    finally:
        tiny._masked_attention = False
    assert all(has_mask for *_, has_mask in calls) and len(calls) == TINY.layers
    assert counted == 4 * TINY.heads * TINY.head_dim * TINY.layers * new * (new + cached)
    assert counted > prefill_flops_breakdown(TINY, new + cached)["attention"]


def test_one_new_token_uses_no_mask(tiny, tokens):
    past = tiny.prefill(tokens[:50])[1]
    op = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert _attention_calls(tiny, tokens[50:51], past) == [(op, 1, 51, False, False)] * TINY.layers
