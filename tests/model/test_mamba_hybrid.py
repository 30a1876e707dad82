"""Mamba-2 hybrids on tiny random checkpoints written at test time: Nemotron-H (Mamba-2, attention, MLP-only and
expert blocks), Granite 4 (granitemoehybrid: Mamba-2 and RoPE attention, experts in every layer) and Bamba (Mamba-2
and partial-RoPE attention). The bytes a stored chunk holds by hand (attention KV of its tokens plus the Mamba
layers' states at its end), the stored state's layout against transformers' own cache, the cached path's logits
against transformers' own full forward when resuming at chunk boundaries, and a replay through real Redis with exact
hit tokens, objects and bytes. Jamba (Mamba-1) stays refused: tests/model/test_architectures.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_hybrid import IDS, _trace, assert_resumes_at_chunk_boundaries, stored_chunk  # IDS: 60 tokens
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.model.checkpoint import read_checkpoint
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tiny import write_tiny_checkpoint
from kvcli.model.load import load_model
from kvcli.model.presets import FULL, LINEAR, NO_MIXER
from kvcli.prefixkv import StatefulKV
from kvcli.store.serde import decode_kv, payload_layout

CHUNK = 16
ARCHS = ("nemotron_h", "granitemoehybrid", "bamba")
#: arch -> (write_tiny_checkpoint's layers and config fields, the layer kinds). Nemotron-H "M-*EM": Mamba-2, MLP,
#: attention, experts, Mamba-2 (the MLP and expert blocks hold no cache); the others: Mamba-2, attention, Mamba-2.
SHAPES = {
    "nemotron_h": ({"hybrid_override_pattern": "M-*EM"}, (LINEAR, NO_MIXER, FULL, NO_MIXER, LINEAR)),
    "granitemoehybrid": ({"layers": 3}, (LINEAR, FULL, LINEAR)),
    "bamba": ({"layers": 3}, (LINEAR, FULL, LINEAR)),
}
#: arch -> (conv channels, K, SSM state [heads, head_dim, d_state]) of each Mamba-2 layer (hf_tiny.TINY_ARCHS):
#: Nemotron-H I = 4 heads x 8 = 32, + 2 groups x 2 x state 16 = 96 channels; Granite 4 and Bamba I = 4 x 32 = 128,
#: + 64 = 192 channels
LAYOUT = {"nemotron_h": (96, 4, (4, 8, 16)), "granitemoehybrid": (192, 4, (4, 32, 16)), "bamba": (192, 4, (4, 32, 16))}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(arch, dtype) -> a tiny checkpoint folder (:data:`SHAPES`)."""
    return {(arch, dtype): str(write_tiny_checkpoint(tmp_path_factory.mktemp(f"{arch}-{dtype}"), vocab=512,
                                                     dtype=dtype, arch=arch, **SHAPES[arch][0]))
            for arch in ARCHS for dtype in ("float32", "bfloat16")}


def _reference(folder: str, tokens: int = 60):
    """transformers' own forward of ``IDS[:tokens]`` (its attention, one forward) with its own cache: float32 logits
    ``[tokens, vocab]`` and the ``DynamicCache`` it left."""
    tf = transformers()
    module = tf.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    cache = tf.DynamicCache(config=module.config)
    with torch.inference_mode():
        out = module(input_ids=torch.from_numpy(IDS[:tokens].astype(np.int64))[None], use_cache=True,
                     cache=cache)
    return out.logits[0].float(), cache


# ---- bytes, by hand ----

@pytest.mark.parametrize("arch, dtype, state_elements, chunk_bytes", [
    # 1 attention layer x 2 (K, V) x 2 KV heads x head_dim 16 x 4 B = 256 B per token; each of the 2 Mamba-2 layers'
    # state: conv 96 x (4 - 1) + SSM 4 x 8 x 16 = 800 elements x 4 B = 3,200 B; a chunk of 16 tokens: 16 x 256 +
    # 2 x 3,200 = 10,496 B
    ("nemotron_h", "float32", 800, 10_496),
    # 2-byte elements: 16 x 128 + 2 x 1,600 = 5,248 B
    ("nemotron_h", "bfloat16", 800, 5_248),
    # conv 192 x (4 - 1) + SSM 4 x 32 x 16 = 2,624 elements x 4 B = 10,496 B per layer: 16 x 256 + 2 x 10,496 = 25,088
    ("granitemoehybrid", "float32", 2_624, 25_088),
    ("bamba", "float32", 2_624, 25_088),
    # 16 x 128 + 2 x 5,248 = 12,544 B
    ("bamba", "bfloat16", 2_624, 12_544),
])
def test_a_stored_chunk_holds_its_tokens_kv_and_the_mamba_states_at_its_end(folders, arch, dtype, state_elements,
                                                                            chunk_bytes):
    folder = folders[arch, dtype]
    element = 4 if dtype == "float32" else 2
    shapes = read_checkpoint(folder).shapes
    assert shapes.kinds == SHAPES[arch][1]
    assert shapes.state_elements == state_elements and shapes.state_shape == (2, state_elements)
    assert shapes.kv_bytes_per_token(dtype) == 64 * element  # 1 layer x 2 x 2 KV heads x 16
    assert shapes.state_bytes(dtype) == 2 * state_elements * element
    assert shapes.cached_prefix_bytes(CHUNK, dtype) == chunk_bytes
    spec, kv, value = stored_chunk(folder, chunk_bytes)
    assert spec.kv_shape == (1, 2, 2, 16) and spec.state_shape == (2, state_elements)
    layout = payload_layout(value)
    assert (layout.shape, layout.state_shape) == ((1, 2, 2, 16, 16), (2, state_elements))
    assert layout.data_end - layout.state_start == 2 * state_elements * element
    chunk, _ = decode_kv(value)
    assert isinstance(chunk, StatefulKV) and sorted(chunk.states) == [16]
    assert torch.equal(chunk.kv, kv.kv[:, :, :, 16:32]) and torch.equal(chunk.states[16], kv.states[32])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_stored_state_is_transformers_cache_conv_columns_then_ssm_state(folders, arch):
    """After 32 tokens in one forward, each state row is transformers' own cache of the same forward: the last
    K - 1 of its K conv columns (C order), then its float32 SSM state (float32 model: the same floats). Bound 1e-6
    (measured 0: kvcli's attention and transformers' give the same floats here)."""
    folder = folders[arch, "float32"]
    channels, kernel, ssm = LAYOUT[arch]
    _, cache = _reference(folder, 32)
    model = load_model(folder, device="cpu")
    _, kv = model.prefill(IDS[:32])  # no chunk sizes: one forward, the state after token 32
    linear = [i for i, kind in enumerate(SHAPES[arch][1]) if kind == LINEAR]
    for row, layer in zip(kv.end_state, linear):
        conv, state = row[:channels * (kernel - 1)], row[channels * (kernel - 1):]
        assert tuple(cache.get_conv_state(layer).shape) == (1, channels, kernel)
        assert tuple(cache.get_recurrent_state(layer).shape) == (1, *ssm)
        assert (conv.view(channels, kernel - 1) - cache.get_conv_state(layer)[0, :, 1:]).abs().max().item() <= 1e-6
        assert (state.view(ssm) - cache.get_recurrent_state(layer)[0]).abs().max().item() <= 1e-6


# ---- the cached path against the full forward ----

# The bounds: float32 1e-5 (measured at most 2.4e-7); bfloat16 1e-2, under 3 bf16 steps of these logits (|logit| < 1,
# a step 2^-8 = 0.0039; measured at most 0.0039). Resuming from the state of the wrong boundary misses by 0.48 or more.
@pytest.mark.parametrize("arch, dtype, bound", [(arch, "float32", 1e-5) for arch in ARCHS]
                         + [(arch, "bfloat16", 1e-2) for arch in ARCHS])
def test_cached_prefill_at_chunk_boundaries_equals_the_full_forward(folders, arch, dtype, bound):
    """Hits of 2 and 3 chunks of 16 go through the payload format (encode, decode, concatenate) and resume the
    suffix from the last hit chunk's states; the logits stay within the dtype's bound of transformers' own forward
    of the whole prompt, as do those of the prefill segmented at the chunk boundaries and of a one-token suffix
    (transformers' recurrent step). The state of the wrong boundary (after 16, not 32) misses by more than 0.1."""
    reference, _ = _reference(folders[arch, dtype])
    model = load_model(folders[arch, dtype], device="cpu")
    for hit, past in assert_resumes_at_chunk_boundaries(model, reference, bound).items():
        one, _ = model.prefill(IDS[hit:hit + 1], past)
        assert (one[0] - reference[hit]).abs().max().item() <= bound
    _, kv = model.prefill(IDS[:32])
    wrong = StatefulKV(kv.kv[:, :, :, :32], {32: kv.states[16]})
    logits, _ = model.prefill(IDS[32:], wrong, logits_for="all")
    assert (logits - reference[32:]).abs().max().item() > 0.1


# ---- a replay through real Redis (test_hybrid's five-prompt trace) ----

@pytest.mark.parametrize("arch, state_bytes, chunk_bytes", [
    ("nemotron_h", 6_400, 10_496), ("granitemoehybrid", 20_992, 25_088), ("bamba", 20_992, 25_088)])
def test_replay_of_a_mamba_hybrid_checkpoint_hits_and_stores_by_hand(tmp_path, redis_url, folders, arch,
                                                                     state_bytes, chunk_bytes):
    out = CliRunner().invoke(app, ["replay", _trace(tmp_path), "--model", folders[arch, "float32"], "--chunk-sizes",
                                   str(CHUNK), "--measure", "all", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    (result,) = doc["traces"]
    assert doc["context"]["kv_bytes_per_token"] == 256 and doc["context"]["state_bytes_per_chunk"] == state_bytes
    (row,) = result["per_chunk_size"]
    # a writes chunks 0-1, b hits them and writes chunk 2, c hits 0-1, d hits 0, e hits 0-1 (32 of its 32 tokens:
    # 31 reusable, the last token is always computed)
    assert row["hit_tokens"] == 0 + 32 + 32 + 16 + 31
    assert row["chunks_written"] == 3 and row["objects_created"] == 6
    assert row["payload_bytes_written"] == 3 * chunk_bytes
    logged = [m["per_chunk_size"][0] for m in result["measured"]]
    assert [m["hit_tokens"] for m in logged] == [0, 32, 32, 16, 32]
    # e resumes from the states after chunk 0: none is saved after token 31
    assert [m["reused_tokens"] for m in logged] == [0, 32, 32, 16, 16]
    assert row["max_logit_diff"] <= 1e-5
