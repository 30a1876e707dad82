"""Bytes a prefill moves per layer, by family, by hand on tiny configs; the expected experts against an exact
enumeration; a linear mixer's parameters against transformers' module; the roofline summed over layer classes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kvcli.model.hardware import Accelerator
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tiny import tiny_config
from kvcli.model.hfconfig import linear_mixer_params, shapes_from_config
from kvcli.model.presets import FULL, LINEAR, NO_MIXER, SLIDING, ModelConfig, get_preset
from kvcli.model.roofline import Roofline
from kvcli.model.traffic import attention_weight_elements, expected_experts, head_bytes, layer_bytes

FAKE = Accelerator("fake", "a test part", 1e12, None, 1e11, 1e9, "PCIe", 1e10, ("by hand",))
SLIDE = ModelConfig("slide", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=300,
                    layer_types=(SLIDING, FULL), sliding_window=8)


def _qwen3_next_config():
    return tiny_config("qwen3_next", 300, 4)


@pytest.mark.parametrize("experts, per_token, tokens", [(4, 2, 2), (4, 1, 3), (5, 2, 2), (6, 3, 2)])
def test_expected_experts_equal_the_mean_over_every_routing(experts, per_token, tokens):
    """Every way ``tokens`` tokens can each pick ``per_token`` distinct experts, equally likely: the mean number of
    distinct experts touched is the formula's (E = 4, k = 2, t = 2: (6 x 2 + 24 x 3 + 6 x 4) / 36 = 3)."""
    choices = list(itertools.combinations(range(experts), per_token))
    routings = list(itertools.product(choices, repeat=tokens))
    mean = sum(len(set().union(*r)) for r in routings) / len(routings)
    assert expected_experts(experts, per_token, tokens) == pytest.approx(mean, rel=1e-12)


def test_expected_experts_at_the_ends():
    assert expected_experts(8, 2, np.array([0, 1])).tolist() == [0.0, 2.0]
    assert expected_experts(256, 8, 4096) == pytest.approx(256, rel=1e-12)


def test_mla_and_moe_layer_bytes_by_hand():
    """The tiny DeepSeek-V3 (hf_tiny): hidden 64, 4 heads, Q LoRA 48, latent 32, RoPE key 16, nope 16, v 24;
    layer 0 dense (MLP 128), layer 1 with 8 routed experts (2 per token) of 32 and 1 shared; bf16 (2 B)."""
    g = shapes_from_config("t", tiny_config("deepseek_v3", vocab=512), "bfloat16")
    assert g.layer_classes() == ((FULL, False, 1), (FULL, True, 1))
    # Q 64 x 48 + 48 x 4 x 32 = 9,216; latent 64 x 48 = 3,072; up-projection 32 x 4 x 40 = 5,120; output
    # 4 x 24 x 64 = 6,144
    assert attention_weight_elements(g) == 23_552
    # 10 new after 5 cached: latent cache 15 x 48 = 720; dense MLP 3 x 64 x 128 = 24,576; norms 128; activations
    # 2 x 10 x 64 = 1,280: 50,256 elements
    assert layer_bytes(g, FULL, False, 10, 5, 2) == 50_256 * 2
    # the expert layer: router 64 x 8 = 512, shared 3 x 64 x 32 = 6,144, and 8 (1 - 0.75^10) = 7.5495 routed
    # experts of 6,144 touched by 10 tokens
    moe = 23_552 + 720 + 512 + 6_144 + 8 * (1 - 0.75 ** 10) * 6_144 + 128 + 1_280
    assert layer_bytes(g, FULL, True, 10, 5, 2) == pytest.approx(moe * 2, rel=1e-12)
    # one token touches exactly its 2 experts
    assert layer_bytes(g, FULL, True, 1, 0, 2) == (23_552 + 48 + 512 + 6_144 + 2 * 6_144 + 128 + 128) * 2


def test_mla_attention_weights_are_the_modules_less_its_norms():
    """The elements counted are those of transformers' DeepseekV3Attention, less its two LoRA norms (48 + 32)."""
    config = tiny_config("deepseek_v3", vocab=512)
    with torch.device("meta"):
        module = transformers().AutoModelForCausalLM.from_config(config).model.layers[0].self_attn
    g = shapes_from_config("t", config, "bfloat16")
    assert attention_weight_elements(g) == sum(p.numel() for p in module.parameters()) - 48 - 32


@pytest.mark.parametrize("kind, cached, kv_tokens", [
    (SLIDING, 20, 7 + 4),  # window 8: the 4 new queries reach back to position 20 - 7: 7 cached tokens read
    (SLIDING, 3, 3 + 4),
    (FULL, 20, 20 + 4),
])
def test_sliding_layers_read_only_their_window(kind, cached, kv_tokens):
    # weights 64 x 16 x (8 + 4) = 12,288; per token K and V 2 x 2 x 16 = 64; MLP 24,576; norms 128; activations 512
    assert layer_bytes(SLIDE, kind, False, 4, cached, 2) == (12_288 + kv_tokens * 64 + 24_576 + 128 + 512) * 2


def test_linear_layers_move_their_state_and_mixer_weights_instead_of_kv():
    """Qwen3-Next, tiny: a Gated DeltaNet of 8,976 parameters and a state of 448 elements; experts in every layer
    (4 routed of 16, 2 per token, one shared of 16 behind a gate)."""
    g = shapes_from_config("t", _qwen3_next_config(), "bfloat16")
    assert (g.linear_params, g.state_elements) == (8_976, 448)
    # router 64 x 4 = 256, shared 3 x 64 x 16 = 3,072 and its gate 64, 2 routed experts of 3,072; norms 128;
    # activations 2 x 64 = 128
    rest = 256 + 3_072 + 64 + 2 * 3_072 + 128 + 128
    assert layer_bytes(g, LINEAR, True, 1, 100, 2) == (8_976 + 2 * 448 + rest) * 2  # state read and written
    assert layer_bytes(g, LINEAR, True, 1, 0, 2) == (8_976 + 448 + rest) * 2  # nothing to resume from
    assert layer_bytes(g, LINEAR, True, 1, 10_000, 2) == layer_bytes(g, LINEAR, True, 1, 100, 2)  # no KV


@pytest.mark.parametrize("make, mixer", [
    (_qwen3_next_config, "GatedDeltaNet"),
    (lambda: transformers().NemotronHConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=16, n_groups=2,
        conv_kernel=4), "Mixer"),
    (lambda: transformers().JambaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, num_experts=4,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1), "Mixer"),
    (lambda: transformers().GraniteMoeHybridConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1,
        mamba_d_conv=4, layer_types=["mamba", "attention", "mamba", "attention"]), "MambaLayer"),
])
def test_linear_mixer_params_equal_the_modules(make, mixer):
    config = make()
    with torch.device("meta"):
        model = transformers().AutoModelForCausalLM.from_config(config)
    module = next(m for m in model.modules() if type(m).__name__.endswith(mixer))
    assert linear_mixer_params(config) == sum(p.numel() for p in module.parameters())


def test_the_roofline_sums_its_layer_classes():
    """One token of the tiny Qwen3-Next after 100 cached, memory bound on the test part (1e11 B/s): three linear
    layers and one attention layer, each its bytes / 1e11, plus the head's 300 x 64 x 2 B."""
    g = shapes_from_config("t", _qwen3_next_config(), "bfloat16")
    r = Roofline(g, FAKE, element_bytes=2, mfu=0.5, mfu_range=(0.5, 0.5))
    linear = (8_976 + 2 * 448 + 9_792) * 2
    # attention: weights 64 x 16 x (12 + 4) = 16,384 (Q, its output gate, K, V, output), KV 101 x 64 = 6,464, the
    # same MLP and norms
    attention = (16_384 + 101 * 64 + 9_792) * 2
    assert r.seconds(1, 100) == pytest.approx((3 * linear + attention + head_bytes(g, 2)) / 1e11, rel=1e-12)


def test_a_dense_llama_moves_what_the_llama_formula_says():
    """llama-3-8b: per layer weights 4096 x 128 x (64 + 16) + 3 x 4096 x 14336 + 2 x 4096, KV (c + n) x 2,048,
    activations 2 n x 4,096 (bf16)."""
    g = get_preset("llama-3-8b")
    assert g.layer_classes() == ((FULL, False, 32),)
    weights = 4096 * 128 * 80 + 3 * 4096 * 14336 + 2 * 4096
    assert layer_bytes(g, FULL, False, 512, 1024, 2) == (weights + 1536 * 2048 + 1024 * 4096) * 2


def test_nemotron_h_blocks_move_one_mixer_or_one_mlp():
    """Blocks "M-*E" (bf16): the Mamba-2 and attention blocks move no MLP and one norm; the MLP block moves up and
    down only (2 x 64 x 128 = 16,384) and one norm; the expert block its router, shared and touched experts."""
    g = shapes_from_config("t", tiny_config("nemotron_h", 300), "bfloat16")
    # activations 2 x 64, norm 64
    assert layer_bytes(g, LINEAR, False, 1, 0, 2) == (g.linear_params + g.state_elements + 64 + 128) * 2
    assert layer_bytes(g, NO_MIXER, False, 1, 0, 2) == (16_384 + 64 + 128) * 2
    # attention: weights 64 x 16 x (8 + 4) = 12,288, KV of 1 + 9 tokens x 64
    assert layer_bytes(g, FULL, False, 1, 9, 2) == (12_288 + 10 * 64 + 64 + 128) * 2
    # one token: router 64 x 4 = 256, shared 2 x 64 x 24 = 3,072, its 2 experts 2 x 2 x 64 x 16 = 4,096
    assert layer_bytes(g, NO_MIXER, True, 1, 0, 2) == (256 + 3_072 + 4_096 + 64 + 128) * 2
