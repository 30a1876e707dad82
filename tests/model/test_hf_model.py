"""--model PATH: a Hugging Face checkpoint folder (kvcli.model.checkpoint, kvcli.model.hf, kvcli.model.load).

Checkpoints are written at test time by kvcli.model.hf_tiny (conftest fixtures): 2 layers, 4 query heads and 2 KV
heads of head_dim 16, fp32 weights, a 512-row vocabulary.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model import hf
from kvcli.model.checkpoint import is_checkpoint_name, read_checkpoint
from kvcli.model.load import kv_bytes_per_token, load_model, model_id_of, resolve_spec, resolve_tokenizer

# fp32: cached and full prefill run the same kernels on the same rows; observed 2.4e-7 (one ulp at |logit| ~ 2).
FP32_ATOL = 1e-5
# bf16: an ulp is 2**-7 at 1..2, the same bound as tests/model/test_model.py.
BF16_ATOL = 5e-2


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_model(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(7).integers(0, 512, 97).astype(np.uint32)


def test_kv_shape_dtype_and_bytes_per_token_come_from_the_config(tiny_checkpoint, model, prompt):
    spec = resolve_spec(tiny_checkpoint)
    assert spec.kv_shape == (2, 2, 2, 16)  # layers, K/V, num_key_value_heads (GQA: 4 query heads), head_dim
    assert spec.dtype == torch.float32  # config.json "dtype"
    assert kv_bytes_per_token(tiny_checkpoint) == 2 * 2 * 2 * 16 * 4 == 512
    assert kv_bytes_per_token(tiny_checkpoint, "bf16") == 256
    assert resolve_spec(tiny_checkpoint, "bf16").kv_shape == (2, 2, 2, 16)
    assert model.spec == spec and model.kv_bytes_per_token == 512 and model.config.vocab == 512
    logits, kv = model.prefill(prompt)
    assert logits.shape == (1, 512) and logits.dtype == torch.float32
    assert kv.shape == (2, 2, 2, 97, 16) and kv.dtype == torch.float32


def test_kv_for_new_returns_the_new_tokens_kv_only(model, prompt):
    _, past = model.prefill(prompt[:40])
    logits_all, kv_all = model.prefill(prompt[40:], past, kv_for="all")
    logits_new, kv_new = model.prefill(prompt[40:], past, kv_for="new")
    assert kv_all.shape == (2, 2, 2, 97, 16) and kv_new.shape == (2, 2, 2, 57, 16)
    assert torch.equal(logits_new, logits_all) and torch.equal(kv_new, kv_all[:, :, :, 40:])
    with pytest.raises(BadInputError, match="kv_for"):
        model.prefill(prompt, kv_for="none")


@pytest.mark.parametrize("cached", [1, 16, 64, 96])
def test_cached_prefill_equals_full_prefill(model, prompt, cached):
    full_logits, full_kv = model.prefill(prompt, logits_for="all")
    past = full_kv[:, :, :, :cached].clone()
    logits, kv = model.prefill(prompt[cached:], past, logits_for="all")
    assert torch.equal(past, full_kv[:, :, :, :cached])  # past_kv is not modified
    assert logits.shape == (97 - cached, 512)
    assert (logits - full_logits[cached:]).abs().max().item() <= FP32_ATOL
    assert (kv - full_kv).abs().max().item() <= FP32_ATOL
    last, _ = model.prefill(prompt[cached:], past)
    assert (last[0] - full_logits[-1]).abs().max().item() <= FP32_ATOL


def test_cached_prefill_equals_full_prefill_bf16(tiny_checkpoint, prompt):
    model = load_model(tiny_checkpoint, dtype="bf16", device="cpu")
    assert model.model_id.endswith(":bf16") and model.spec.dtype == torch.bfloat16
    full_logits, full_kv = model.prefill(prompt, logits_for="all")
    logits, kv = model.prefill(prompt[32:], full_kv[:, :, :, :32], logits_for="all")
    assert kv.dtype == torch.bfloat16
    assert (logits - full_logits[32:]).abs().max().item() <= BF16_ATOL


def test_the_cached_path_runs_kvcli_attention(model, prompt, monkeypatch):
    calls = []

    real = hf.prefix_attention

    def spy(query, key, value, scale=None):
        calls.append((query.shape[-2], key.shape[-2]))
        return real(query, key, value, scale)

    monkeypatch.setattr(hf, "prefix_attention", spy)
    _, kv = model.prefill(prompt[:40])
    model.prefill(prompt[40:50], kv)
    assert model.module.config._attn_implementation == hf.ATTENTION_NAME
    assert calls == [(40, 40), (40, 40), (10, 50), (10, 50)]  # one call per layer: n new queries, past + n keys


def test_prefix_attention_matches_a_masked_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 16, generator=g), torch.randn(1, 2, 12, 16, generator=g), \
        torch.randn(1, 2, 12, 16, generator=g)
    out = hf.prefix_attention(q, k, v)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ kr.transpose(-1, -2) / 4.0  # head_dim 16: scale 1/4
    allowed = torch.arange(12)[None, :] <= torch.arange(7, 12)[:, None]  # query i (position 7 + i) sees 0..7+i
    ref = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vr
    assert (out - ref).abs().max().item() <= 1e-5


def test_two_checkpoints_never_share_a_model_id(tiny_checkpoint, tiny_checkpoint_b, tmp_path):
    a, b = read_checkpoint(tiny_checkpoint), read_checkpoint(tiny_checkpoint_b)
    # Same config.json and weight file sizes (a fine-tune's situation), other weights: the sampled blocks differ.
    assert (open(f"{tiny_checkpoint}/config.json").read() == open(f"{tiny_checkpoint_b}/config.json").read())
    assert a.weight_bytes == b.weight_bytes
    assert resolve_spec(tiny_checkpoint).model_id != resolve_spec(tiny_checkpoint_b).model_id
    assert resolve_spec(tiny_checkpoint).model_id == f"hf:llama@{a.digest}:fp32"
    copy = shutil.copytree(tiny_checkpoint, tmp_path / "copy")  # the same checkpoint elsewhere shares chunks
    assert resolve_spec(str(copy)).model_id == resolve_spec(tiny_checkpoint).model_id
    assert model_id_of(tiny_checkpoint) == resolve_spec(tiny_checkpoint).model_id
    assert model_id_of("hf:llama@0123456789abcdef:fp32") == "hf:llama@0123456789abcdef:fp32"  # an id as listed
    assert model_id_of("tiny") == "kvcli/tiny@seed0:fp32"


def test_a_recorded_commit_is_part_of_the_identity(tiny_checkpoint, tmp_path):
    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / ("ab" * 20)
    shutil.copytree(tiny_checkpoint, snapshot)
    other = tmp_path / "models--acme--tiny" / "snapshots" / ("cd" * 20)
    shutil.copytree(tiny_checkpoint, other)
    assert read_checkpoint(str(snapshot)).commit == "ab" * 20
    assert resolve_spec(str(snapshot)).model_id != resolve_spec(str(other)).model_id


def test_checkpoint_folders_and_presets_are_told_apart(tiny_checkpoint, tmp_path):
    assert is_checkpoint_name(tiny_checkpoint) and is_checkpoint_name("./no/such/folder")
    assert not is_checkpoint_name("cpu") and not is_checkpoint_name("no-such-preset")
    assert resolve_tokenizer(None, tiny_checkpoint) == tiny_checkpoint  # the checkpoint's own tokenizer
    assert resolve_tokenizer("cl100k_base", tiny_checkpoint) == "cl100k_base"  # an explicit one wins
    assert resolve_tokenizer(None, "cpu") == "cl100k_base"


@pytest.mark.parametrize("setup, message", [
    (None, "no such checkpoint folder"),
    ("empty", "no config.json"),
    ("encoder-decoder", "an encoder-decoder model"),
    ("garbage", "cannot read config.json"),
])
def test_unusable_folders_are_one_line_bad_input(tmp_path, setup, message):
    folder = tmp_path / "ckpt"
    if setup:
        folder.mkdir()
    if setup == "encoder-decoder":
        (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    elif setup == "garbage":
        (folder / "config.json").write_text("{not json")
    with pytest.raises(BadInputError, match=re.escape(message)) as info:
        resolve_spec(str(folder))
    assert "\n" not in str(info.value) and str(folder) in str(info.value)


def test_wrong_past_kv_is_a_model_failure(model, prompt):
    with pytest.raises(ModelFailure, match="does not fit"):
        model.prefill(prompt[4:], torch.zeros(2, 2, 4, 4, 16))
    with pytest.raises(ModelFailure, match="dtype"):
        model.prefill(prompt[4:], torch.zeros(2, 2, 2, 4, 16, dtype=torch.bfloat16))
    with pytest.raises(BadInputError, match=r"\[0, 512\)"):
        model.prefill([5, 512])


@pytest.mark.parametrize("arch, kwargs, kv_shape", [
    # Qwen2: biases on Q/K/V, tied embeddings, one KV head for four query heads; head_dim = 64 / 4 from hidden.
    ("Qwen2Config", {"num_key_value_heads": 1, "tie_word_embeddings": True}, (2, 2, 1, 16)),
    # Qwen3: head_dim set apart from hidden / heads (32, not 16), Q/K norms.
    ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 32}, (2, 2, 2, 32)),
])
def test_other_architectures_take_shapes_from_their_config(tmp_path, arch, kwargs, kv_shape):
    from kvcli.model.hf_offline import transformers

    tf = transformers()
    config = getattr(tf, arch)(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    assert resolve_spec(str(tmp_path)).kv_shape == kv_shape
    model = load_model(str(tmp_path), device="cpu")
    ids = np.arange(1, 60, dtype=np.uint32)
    full_logits, full_kv = model.prefill(ids, logits_for="all")
    assert full_kv.shape == (2, 2, kv_shape[2], 59, kv_shape[3])
    logits, _ = model.prefill(ids[20:], full_kv[:, :, :, :20], logits_for="all")
    assert (logits - full_logits[20:]).abs().max().item() <= FP32_ATOL
