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
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tiny import tiny_config
from kvcli.model.hfconfig import shapes_from_config
from kvcli.model.llama import LocalModel, build_model
from kvcli.model.presets import FULL, LINEAR, NO_MIXER, PRESETS, ModelConfig

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
                                                      "attention": 10_240, "linear_proj": 0, "linear_conv": 0,
                                                      "linear_scan": 0, "lm_head": 12_845_056}
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
    # the 50 cached keys where they lie, unmasked, and the token's own key: no mask, no copy of the prefix
    assert _attention_calls(tiny, tokens[50:51], past) == [(op, 1, 50, False, False), (op, 1, 1, True, False)] * \
        TINY.layers


# ---- hybrid families: transformers' own forward, randomly initialised ----

#: tiny configs (kvcli.model.hf_tiny): Qwen3-Next of 4 layers, Nemotron-H "M-*E", and its experts on a latent of 8
HYBRIDS = {"qwen3_next": lambda: tiny_config("qwen3_next", 300, 4),
           "nemotron_h": lambda: tiny_config("nemotron_h", 300),
           "nemotron_h_latent": lambda: tiny_config("nemotron_h", 300, moe_latent_size=8)}


@pytest.fixture(scope="module")
def hybrid_models():
    """name -> (transformers model in eval mode, parameters frozen, its ModelConfig), seeded random weights, float32."""
    out = {}
    for name, make in HYBRIDS.items():
        config = make()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            # frozen, as kvcli.model.hf.load_checkpoint leaves its models: under inference_mode torch's
            # ModuleTracker (inside FlopCounterMode) fails on a submodule argument that requires a gradient
            model = transformers().AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
        model.config._experts_implementation = "eager"  # each expert on its tokens: mm the counter sees
        out[name] = (model, shapes_from_config(name, config, "float32"))
    return out


def _hf_counted(model, ids, new, cached) -> dict[str, int]:
    """FLOPs FlopCounterMode counts by op in transformers' forward of ``new`` tokens after a cache of ``cached``
    (its own cache: KV, conv and recurrent states), one row of logits."""
    with torch.inference_mode():
        past = model(input_ids=ids[:, :cached], use_cache=True).past_key_values if cached else None
        with FlopCounterMode(display=False, custom_mapping={CPU_ATTENTION: _cpu_attention_flops}) as counter:
            model(input_ids=ids[:, cached:cached + new], cache=past, use_cache=past is not None,
                  logits_to_keep=1)
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_hybrid_shapes_read_from_the_configs(hybrid_models):
    _, qwen = hybrid_models["qwen3_next"]
    assert qwen.kinds == (LINEAR, LINEAR, LINEAR, FULL) and qwen.attn_output_gate and qwen.gated_mlp
    assert (qwen.linear_mixer, qwen.linear_heads, qwen.linear_head_dim, qwen.linear_key_heads, qwen.linear_key_dim,
            qwen.linear_conv_kernel, qwen.linear_chunk) == ("gated_deltanet", 4, 8, 2, 8, 4, 64)
    _, nem = hybrid_models["nemotron_h"]
    # "M-*E": the MLP and the expert block have no mixer; only block 3 has experts
    assert nem.kinds == (LINEAR, NO_MIXER, FULL, NO_MIXER) and nem.dense_layers == (0, 1, 2)
    assert not nem.gated_mlp and not nem.mixer_mlp and not nem.attn_output_gate
    assert (nem.experts, nem.shared_ffn, nem.shared_gate, nem.moe_latent) == (4, 24, False, 0)
    assert (nem.linear_mixer, nem.linear_heads, nem.linear_head_dim, nem.linear_key_heads, nem.linear_key_dim,
            nem.linear_conv_kernel, nem.linear_chunk) == ("mamba2", 4, 8, 2, 16, 4, 16)
    assert nem.layer_classes() == ((LINEAR, False, 1), (NO_MIXER, False, 1), (FULL, False, 1), (NO_MIXER, True, 1))


def test_a_nemotron_h_without_expert_blocks_has_no_experts():
    """Its config carries n_routed_experts = 8 by default; no "E" block, no experts."""
    g = shapes_from_config("t", tiny_config("nemotron_h", 300, hybrid_override_pattern="M-*-"), "float32")
    assert g.experts == 0 and g.kinds == (LINEAR, NO_MIXER, FULL, NO_MIXER)


def test_qwen3_next_flops_by_hand(hybrid_models):
    _, g = hybrid_models["qwen3_next"]
    parts = {k: int(v) for k, v in prefill_flops_breakdown(g, 65, 0).items()}
    # attention: Q and its gate 2 x 64 x 4 x 16 x 2, K and V 2 x 64 x 2 x 16 x 2: 24,576 per token (16,384 without
    # the gate); output 2 x 64 x 64 = 8,192; 65 x 66 / 2 = 2,145 pairs x 4 x 4 x 16
    assert (parts["qkv"], parts["out_proj"], parts["attention"]) == (65 * 24_576, 65 * 8_192, 2_145 * 256)
    # experts in all 4 layers: router 2 x 64 x 4 = 512, 2 routed and the shared expert 3 x 2 x 3 x 64 x 16 = 18,432,
    # the shared gate 128
    assert parts["mlp"] == 4 * 65 * (512 + 18_432 + 128)
    # 3 Gated DeltaNets: Dk = 2 x 8 = 16, Dv = 4 x 8 = 32; in_proj_qkvz 2 x 64 x 96, in_proj_ba 2 x 64 x 8,
    # out_proj 2 x 32 x 64: 17,408 per token; conv 64 channels x 4 taps x 2 over 65 + 3 positions
    assert (parts["linear_proj"], parts["linear_conv"]) == (3 * 65 * 17_408, 3 * 512 * 68)
    # 2 chunks of 64 x 4 value heads x 2 x 64 x (2 x 64 x 8 + 3 x 8 x 8 + 64 x 8) = 221,184 per chunk and head
    assert parts["linear_scan"] == 3 * 2 * 4 * 221_184
    # one token after a prefix: the recurrent step, no matrix product; the conv over 4 + 1 inputs gives 2 outputs
    step = prefill_flops_breakdown(g, 1, 10)
    assert (int(step["linear_scan"]), int(step["linear_conv"])) == (0, 3 * 512 * 2)


def test_nemotron_h_flops_by_hand(hybrid_models):
    _, g = hybrid_models["nemotron_h"]
    parts = {k: int(v) for k, v in prefill_flops_breakdown(g, 5, 10).items()}
    # attention block: Q 2 x 64 x 64, K and V 2 x 2 x 64 x 32, output 2 x 64 x 64; 5 x 10 + 15 = 65 pairs x 256
    assert (parts["qkv"], parts["out_proj"], parts["attention"]) == (5 * 16_384, 5 * 8_192, 65 * 256)
    # MLP block up and down, 2 x 2 x 64 x 128 = 32,768; expert block: router 512, 2 routed up and down of 16,
    # 2 x 2 x 2 x 64 x 16 = 8,192, the shared one 2 x 2 x 64 x 24 = 6,144: 14,848; the mixer blocks no MLP
    assert parts["mlp"] == 5 * (32_768 + 14_848)
    # Mamba-2: I = 4 x 8 = 32, conv channels 32 + 2 x 2 x 16 = 96; in_proj 2 x 64 x (32 + 96 + 4), out_proj
    # 2 x 32 x 64: 20,992 per token; conv 2 x 96 x 4 over 5 + 7 positions (the 4-column state first)
    assert (parts["linear_proj"], parts["linear_conv"]) == (5 * 20_992, 768 * 12)
    # one chunk of 16: 2 x 4 heads x (16 x 16 x 16 + 16 x 16 x 8 + 2 x 16 x 8 x 16 + 2 ** 2 x 8 x 16) = 86,016
    assert parts["linear_scan"] == 86_016
    # 65 tokens: 5 chunks, 6 boundaries: 2 x 4 x (5 x 10,240 + 36 x 128); one token after a prefix: 2 x 4 x 8 x 16
    assert int(prefill_flops_breakdown(g, 65, 0)["linear_scan"]) == 8 * (5 * 10_240 + 36 * 128) == 446_464
    assert int(prefill_flops_breakdown(g, 1, 10)["linear_scan"]) == 1_024


@pytest.mark.parametrize("name", list(HYBRIDS))
@pytest.mark.parametrize("new, cached", [(1, 0), (5, 0), (65, 0), (100, 0), (5, 10), (1, 10), (70, 30)])
def test_hybrid_flops_equal_the_counter_on_transformers_forward(hybrid_models, name, new, cached):
    """Each op's FLOPs: matrix products (projections, MLPs, experts, LM head), the causal convolutions, the chunked
    scans' (or the recurrent step's) products and attention. The one leftover: after a cached prefix transformers
    hands sdpa a mask, and a masked kernel computes every new x (cached + new) pair, n (n - 1) / 2 per head more
    than the causal ones counted."""
    model, g = hybrid_models[name]
    ids = torch.from_numpy(np.random.default_rng(5).integers(0, 300, (1, 100))).long()
    counted = _hf_counted(model, ids, new, cached)
    parts = prefill_flops_breakdown(g, new, cached)
    assert counted["aten.mm"] == (parts["qkv"] + parts["out_proj"] + parts["mlp"] + parts["linear_proj"]
                                  + parts["lm_head"])
    assert counted["aten.convolution"] == parts["linear_conv"]
    assert counted.get("aten.bmm", 0) == parts["linear_scan"]
    masked = 4 * g.heads * g.head_dim * g.count(FULL) * (new * (new - 1) // 2 if cached else 0)
    assert counted["aten._scaled_dot_product_flash_attention_for_cpu"] == parts["attention"] + masked


@pytest.mark.parametrize("name, leftover", [
    ("qwen3_next", 2 * 16),  # the attention layer's per-head q_norm and k_norm (head_dim each)
    ("nemotron_h", 0), ("nemotron_h_latent", 0)])
def test_hybrid_params_equal_the_modules(hybrid_models, name, leftover):
    model, g = hybrid_models[name]
    assert g.params() == sum(p.numel() for p in model.parameters()) - leftover
