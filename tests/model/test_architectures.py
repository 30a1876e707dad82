"""Today's architectures on tiny random checkpoints written at test time: the layer pattern read as transformers
reads it, bytes per token and per cached prefix by hand, FLOPs against FlopCounterMode on the real forward, and
the cached path's logits against the full prefill's and against transformers' own attention."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kvcli.errors import BadInputError
from kvcli.model.checkpoint import read_checkpoint
from kvcli.model.flops import prefill_flops_breakdown, window_pairs
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tiny import tiny_config, write_tiny_checkpoint
from kvcli.model.load import load_model, resolve_spec
from kvcli.model.presets import FULL, LINEAR, NO_MIXER, SLIDING

CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
IDS = np.arange(1, 40, dtype=np.uint32)  # 39 tokens: longer than the tiny windows (8)


def _cpu_attention_flops(q_shape, k_shape, v_shape, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                         scale=None, out_shape=None) -> int:
    """The CPU flash kernel's work: 4 * batch * heads * head_dim per (query, key) pair it computes."""
    batch, heads, rows, dim = q_shape
    keys = k_shape[-2]
    pairs = sum(min(i + 1, keys) for i in range(rows)) if is_causal else rows * keys
    return 4 * batch * heads * dim * pairs


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """arch -> a tiny checkpoint folder in float32, and the MLA one in bfloat16 too."""
    out = {arch: str(write_tiny_checkpoint(tmp_path_factory.mktemp(arch), vocab=512, arch=arch))
           for arch in ("deepseek_v3", "gpt_oss", "gemma3_text", "qwen2")}
    out["deepseek_v3_bf16"] = str(write_tiny_checkpoint(tmp_path_factory.mktemp("mla-bf16"), vocab=512,
                                                        dtype="bfloat16", arch="deepseek_v3"))
    return out


def _config_folder(tmp_path, config) -> str:
    config.save_pretrained(tmp_path)
    return str(tmp_path)


# ---- the layer pattern, as transformers reads it ----

def test_qwen2_with_max_window_layers_at_the_layer_count_runs_as_full_attention(folders, tmp_path):
    """use_sliding_window with max_window_layers = layers: transformers makes every layer full attention, and so
    does kvcli; the logits equal those of the same weights with the window off."""
    shapes = read_checkpoint(folders["qwen2"]).shapes
    assert shapes.kinds == (FULL, FULL) and shapes.sliding_window == 0
    config = json.loads(open(f"{folders['qwen2']}/config.json").read())
    config.update(use_sliding_window=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(config))
    (plain / "model.safetensors").write_bytes(open(f"{folders['qwen2']}/model.safetensors", "rb").read())
    windowed, unwindowed = load_model(folders["qwen2"], device="cpu"), load_model(str(plain), device="cpu")
    full, kv = windowed.prefill(IDS, logits_for="all")
    assert torch.equal(full, unwindowed.prefill(IDS, logits_for="all")[0])
    cached, _ = windowed.prefill(IDS[20:], kv[:, :, :, :20], logits_for="all")
    assert (cached - full[20:]).abs().max().item() <= 1e-5


def test_qwen2_sliding_layers_start_at_max_window_layers(tmp_path):
    config = tiny_config("qwen2", vocab=300, layers=3, max_window_layers=1)
    shapes = read_checkpoint(_config_folder(tmp_path, config)).shapes
    assert shapes.kinds == (FULL, SLIDING, SLIDING) and shapes.sliding_window == 8


def test_an_unknown_layer_type_is_one_line_bad_input(tmp_path):
    config = tiny_config("gemma3_text", vocab=300)
    folder = _config_folder(tmp_path, config)
    data = json.loads((tmp_path / "config.json").read_text())
    data["layer_types"] = ["sliding_attention", "chunked_attention"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    read_checkpoint.cache_clear()
    with pytest.raises(BadInputError, match=re.escape("layer types chunked_attention are not supported")) as info:
        resolve_spec(folder)
    assert "\n" not in str(info.value) and folder in str(info.value)


# ---- bytes, by hand ----

def test_mla_bytes_per_token_are_the_latent_and_the_rope_key(folders):
    spec = resolve_spec(folders["deepseek_v3_bf16"])
    # 2 layers x (kv_lora_rank 32 + qk_rope_head_dim 16) x 2 bytes
    assert spec.kv_shape == (2, 1, 1, 48)
    assert read_checkpoint(folders["deepseek_v3_bf16"]).shapes.kv_bytes_per_token("bfloat16") == 192
    assert load_model(folders["deepseek_v3_bf16"], device="cpu").kv_bytes_per_token == 192


@pytest.mark.parametrize("arch, layers, kinds, prefix_bytes", [
    # gpt-oss: alternating sliding (window 8) and full; 4 layers; per layer-token 2 x 2 KV heads x 16 x 2 B = 128 B.
    # 100 tokens: 2 full x 100 + 2 sliding x 8 = 216 layer-tokens; 5 tokens: 4 x 5 = 20.
    ("gpt_oss", 4, (SLIDING, FULL, SLIDING, FULL), {100: 216 * 128, 5: 20 * 128}),
    # Gemma 3: five local layers to one global (sliding_window_pattern 6): 5 x min(h, 8) + 1 x h.
    ("gemma3_text", 6, (SLIDING,) * 5 + (FULL,), {100: 140 * 128, 5: 30 * 128}),
])
def test_sliding_and_full_layers_bytes_per_cached_prefix(tmp_path, arch, layers, kinds, prefix_bytes):
    extra = {"sliding_window_pattern": 6} if arch == "gemma3_text" else {}
    shapes = read_checkpoint(_config_folder(tmp_path, tiny_config(arch, 300, layers, **extra))).shapes
    assert shapes.kinds == kinds
    assert shapes.kv_bytes_per_token("bfloat16") == layers * 128  # what a stored chunk holds per token
    assert {h: shapes.cached_prefix_bytes(h, "bfloat16") for h in prefix_bytes} == prefix_bytes


def test_hybrid_linear_layers_add_a_state_per_boundary(tmp_path):
    config = transformers().Qwen3NextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
    folder = _config_folder(tmp_path, config)
    shapes = read_checkpoint(folder).shapes
    assert shapes.kinds == (LINEAR, LINEAR, LINEAR, FULL)
    # Gated DeltaNet state: conv (2 x 2 x 8 + 4 x 8 = 64 channels) x (4 - 1) + recurrent 4 x 8 x 8 = 448 elements
    assert shapes.state_elements == 448 and shapes.state_bytes("bfloat16") == 3 * 448 * 2
    # one attention layer: 100 tokens x 2 x 2 x 16 x 2 B = 12,800, plus the three states
    assert shapes.cached_prefix_bytes(100, "bfloat16") == 12_800 + 2_688
    assert resolve_spec(folder).kv_shape == (1, 2, 2, 16) and resolve_spec(folder).state_shape == (3, 448)
    with pytest.raises(BadInputError, match="no weights"):  # Qwen3-Next runs (tests/model/test_hybrid.py)
        load_model(folder, device="cpu")


def test_hybrid_models_kvcli_cannot_resume_are_refused_in_one_line(tmp_path):
    """Jamba's Mamba layers: transformers' scan restarts every multi-token forward from a zero SSM state, so a
    suffix after a cached prefix cannot resume from the stored one; loading one is refused before its weights are
    read, in one line that says why."""
    config = transformers().JambaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=8)
    folder = _config_folder(tmp_path, config)
    assert read_checkpoint(folder).shapes.kinds == (LINEAR, FULL)
    with pytest.raises(BadInputError) as info:
        load_model(folder, device="cpu")
    message = str(info.value)
    assert message.startswith(f"{folder}: cannot run a checkpoint with 1 of its 2 layers linear-attention / Mamba: ")
    # Mamba state: I = 2 x 64 = 128 channels; conv 128 x (4 - 1) + SSM 128 x 8 = 1,408 elements
    assert "(1,408 elements per layer)" in message
    assert "for bamba, granitemoehybrid, nemotron_h, qwen3_next only, not jamba (transformers' Mamba scan" in message
    assert "starts every forward of more than one token from a zero SSM state" in message
    assert "--measure 0 --payload accounted" in message and "\n" not in message


def test_nemotron_h_counts_only_its_mamba_layers(tmp_path):
    # "M-*E": a Mamba-2 block, an MLP block, an attention block, an expert block: one layer has a state, one a KV
    folder = _config_folder(tmp_path, tiny_config("nemotron_h", 300, 4))
    shapes = read_checkpoint(folder).shapes
    assert shapes.kinds == (LINEAR, NO_MIXER, FULL, NO_MIXER)
    # Mamba-2: conv (4 heads x 8 + 2 groups x 2 x 16 = 96) x (4 - 1) + SSM 4 x 8 x 16 = 800 elements
    assert shapes.state_shape == (1, 800) and resolve_spec(folder).kv_shape == (1, 2, 2, 16)
    with pytest.raises(BadInputError, match="no weights"):  # Nemotron-H runs (tests/model/test_mamba_hybrid.py)
        load_model(folder, device="cpu")


def test_mlp_only_blocks_without_a_mamba_layer_are_refused_in_one_line(tmp_path):
    # "*-": attention and an MLP block, no Mamba-2 block: kvcli skips MLP-only blocks in a hybrid cache only
    folder = _config_folder(tmp_path, tiny_config("nemotron_h", 300, hybrid_override_pattern="*-"))
    assert read_checkpoint(folder).shapes.kinds == (FULL, NO_MIXER)
    with pytest.raises(BadInputError) as info:
        load_model(folder, device="cpu")
    assert str(info.value).startswith(f"{folder}: cannot run a checkpoint with 1 blocks of its 2 that have no token "
                                      "mixer (MLP-only) and no linear-attention / Mamba layer")
    assert "\n" not in str(info.value)


# ---- FLOPs against the counter on the real forward ----

@pytest.mark.parametrize("new, cached", [(39, 0), (24, 15), (1, 38)])
def test_mla_and_moe_flops_equal_the_counter(folders, new, cached):
    model = load_model(folders["deepseek_v3"], device="cpu")
    model.module.config._experts_implementation = "eager"  # each expert on its tokens: mm the counter sees
    past = model.prefill(IDS[:cached])[1] if cached else None
    with FlopCounterMode(display=False, custom_mapping={CPU_ATTENTION: _cpu_attention_flops}) as counter:
        model.prefill(IDS[cached:cached + new], past)
    counted = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    parts = prefill_flops_breakdown(model.config, new, cached)
    assert counted["aten.mm"] == parts["qkv"] + parts["out_proj"] + parts["mlp"] + parts["lm_head"]
    # The kernel pads the 24 value dims to the 32 query/key dims: 2 x 4 heads x 8 more per pair and layer.
    g, pairs = model.config, new * cached + new * (new + 1) // 2
    padding = 2 * g.heads * (g.qk_head_dim - g.value_dim) * pairs * g.layers
    assert counted.get("aten._scaled_dot_product_flash_attention_for_cpu", 0) == parts["attention"] + padding


def test_mla_moe_flops_by_hand(folders):
    g = read_checkpoint(folders["deepseek_v3"]).shapes
    assert (g.experts, g.experts_per_token, g.moe_ffn, g.shared_ffn, g.dense_layers) == (8, 2, 32, 32, (0,))
    parts = prefill_flops_breakdown(g, 10, 5)
    # per layer: Q 2*64*48*10 + 2*48*4*32*10 = 184,320; latent 2*64*48*10 = 61,440; up-projection of 15 tokens
    # 2*32*4*(16+24)*15 = 153,600
    assert parts["qkv"] == 2 * (184_320 + 61_440 + 153_600)
    # layer 0 dense 2*3*64*128*10 = 491,520; layer 1: router 2*64*8*10 = 10,240, 2 routed + 1 shared expert
    # 3 x 2*3*64*32*10 = 368,640
    assert parts["mlp"] == 491_520 + 10_240 + 368_640
    # pairs 10*5 + 10*11/2 = 105; 2 * 4 heads * (32 + 24) per pair
    assert parts["attention"] == 2 * 2 * 4 * 56 * 105


def test_shared_expert_gate_flops_equal_the_counter(tmp_path):
    tf = transformers()
    config = tf.Qwen2MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = load_model(str(tmp_path), device="cpu")
    assert model.config.dense_layers == (0,) and model.config.shared_gate
    model.module.config._experts_implementation = "eager"
    with FlopCounterMode(display=False, custom_mapping={CPU_ATTENTION: _cpu_attention_flops}) as counter:
        model.prefill(IDS)
    parts = prefill_flops_breakdown(model.config, len(IDS))
    assert counter.get_total_flops() == sum(parts.values())


@pytest.mark.parametrize("new, cached, window, pairs", [
    (5, 0, 8, 15),            # all inside the window: 1 + 2 + 3 + 4 + 5
    (10, 0, 8, 36 + 16),      # 1..8, then 8, 8
    (3, 20, 8, 24),           # every new token sees 8
    (4, 5, 8, 6 + 7 + 8 + 8),  # positions 5..8 see 6, 7, 8, 8
])
def test_window_pairs_by_hand(new, cached, window, pairs):
    assert window_pairs(new, cached, window) == pairs
    assert window_pairs(new, cached, window) == sum(min(cached + i + 1, window) for i in range(new))


# ---- the cached path ----

@pytest.mark.parametrize("arch, bound", [("deepseek_v3", 1e-5), ("deepseek_v3_bf16", 5e-2), ("gpt_oss", 1e-5),
                                         ("gemma3_text", 1e-5)])
def test_cached_prefill_equals_full_prefill(folders, arch, bound):
    model = load_model(folders[arch], device="cpu")
    full, kv = model.prefill(IDS, logits_for="all")
    assert tuple(kv.shape) == model.config.kv_shape(len(IDS))
    for cached in (1, 8, 20, 38):
        logits, _ = model.prefill(IDS[cached:], kv[:, :, :, :cached], logits_for="all")
        assert (logits - full[cached:]).abs().max().item() <= bound


@pytest.mark.parametrize("arch", ["deepseek_v3", "gpt_oss", "gemma3_text"])
def test_kvcli_attention_equals_transformers_eager_attention(folders, arch):
    """Windows, sinks and latent expansion as transformers computes them (its eager attention, its masks)."""
    model = load_model(folders[arch], device="cpu")
    ref = transformers().AutoModelForCausalLM.from_pretrained(folders[arch], attn_implementation="eager").eval()
    with torch.inference_mode():
        expected = ref(input_ids=torch.from_numpy(IDS.astype(np.int64))[None]).logits[0]
    assert (model.prefill(IDS, logits_for="all")[0] - expected).abs().max().item() <= 1e-5


# ---- config-only models and presets ----

@pytest.mark.parametrize("name, kv_shape, bytes_per_token, prefix_8k, state", [
    # 61 layers x (512 + 64) x 2 B
    ("deepseek-v3", (61, 1, 1, 576), 70_272, 70_272 * 8192, 0),
    # 36 layers x 2 x 8 x 64 x 2 B; prefix: 18 full x 8,192 + 18 sliding x 128 layer-tokens x 2,048 B
    ("gpt-oss-120b", (36, 2, 8, 64), 73_728, (18 * 8192 + 18 * 128) * 2048, 0),
    # 62 layers (52 local of window 1,024, 10 global: sliding_window_pattern 6) x 2 x 16 x 128 x 2 B
    ("gemma-3-27b", (62, 2, 16, 128), 507_904, (10 * 8192 + 52 * 1024) * 8192, 0),
    # 12 full-attention layers of 48; 36 Gated DeltaNet states of (2*16*128 + 32*128) x 3 + 32 x 128 x 128
    ("qwen3-next-80b-a3b", (12, 2, 2, 256), 24_576, 24_576 * 8192 + 36 * 548_864 * 2, 36 * 548_864 * 2),
    ("llama-3.1-70b", (80, 2, 8, 128), 327_680, 327_680 * 8192, 0),
    ("qwen3-32b", (64, 2, 8, 128), 262_144, 262_144 * 8192, 0),
])
def test_config_presets_by_hand(name, kv_shape, bytes_per_token, prefix_8k, state):
    shapes = read_checkpoint(name).shapes
    assert resolve_spec(name).kv_shape == kv_shape
    assert shapes.kv_bytes_per_token("bfloat16") == bytes_per_token
    assert shapes.cached_prefix_bytes(8192, "bfloat16") == prefix_8k and shapes.state_bytes("bfloat16") == state


def test_deepseek_v3_active_flops_per_token():
    """One token, no cache: 2 FLOPs per active parameter (DeepSeek-V3 activates about 37B per token)."""
    g = read_checkpoint("deepseek-v3").shapes
    # per layer: Q LoRA 7168 x 1536 and 1536 x 128 heads x 192; latent 7168 x 576; up-projection 512 x 128 x 256;
    # output 128 x 128 x 7168; attention over one key: 2 x 128 heads x (192 + 128)
    layer = 2 * (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168) + 2 * 128 * 320
    # 3 dense layers; 58 expert layers: router 7168 x 256, 8 routed + 1 shared expert of 3 x 7168 x 2048
    mlp = 3 * 2 * 3 * 7168 * 18432 + 58 * 2 * (7168 * 256 + 9 * 3 * 7168 * 2048)
    total = 61 * layer + mlp + 2 * 7168 * 129280
    assert float(sum(prefill_flops_breakdown(g, 1).values())) == total
    assert 36e9 < total / 2 < 38e9


def test_a_config_only_folder_prices_but_does_not_run(folders, tmp_path):
    (tmp_path / "config.json").write_bytes(open(f"{folders['deepseek_v3_bf16']}/config.json", "rb").read())
    assert read_checkpoint(str(tmp_path)).shapes.kv_bytes_per_token("bfloat16") == 192
    with pytest.raises(BadInputError, match=r"no weights.*--measure 0") as info:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)
