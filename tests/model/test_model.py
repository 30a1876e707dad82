"""kvcli.model: shapes, KV sizes, seeded determinism, and cached-prefix prefill == full prefill."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model import llama as model_mod
from kvcli.model.llama import build_model
from kvcli.model.presets import PRESETS

PROMPT = 150
# Chunked-vs-full tolerances. fp32: observed max |diff| about 4e-7 on logits of magnitude ~1 (GEMM blocking differs
# with the row count; the cached path merges two attention kernels' outputs, kvcli.model.attention). bf16: observed
# 5.9e-3 (the cached path rounds each attention part to bf16 before the merge: about one ulp, 2**-8 at 0.5..1);
# other kernels may round differently by an ulp or two (2**-7 at 1..2, so 1.6e-2), hence
# 5e-2.
FP32_ATOL = 1e-5
BF16_ATOL = 5e-2


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", device="cpu")


@pytest.fixture(scope="module")
def tiny_bf16():
    return build_model("tiny", dtype="bf16", device="cpu")


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(7).integers(0, 100352, PROMPT, dtype=np.uint32)


@pytest.mark.parametrize("preset, dtype, expected", [
    ("tiny", torch.float32, 1024),            # 2 * 2 layers * 2 kv heads * 32 * 4 B
    ("cpu", torch.bfloat16, 4096),            # 2 * 8 * 2 * 64 * 2 B: 1 MiB per 256-token chunk
    ("qwen2.5-0.5b", torch.bfloat16, 12288),  # 2 * 24 * 2 * 64 * 2 B
    ("llama-3.2-1b", torch.bfloat16, 32768),  # 2 * 16 * 8 * 64 * 2 B
    ("llama-3-8b", torch.bfloat16, 131072),   # 2 * 32 * 8 * 128 * 2 B
])
def test_kv_bytes_per_token_without_building(preset, dtype, expected):
    assert PRESETS[preset].kv_bytes_per_token(dtype) == expected


@pytest.mark.parametrize("preset, expected", [
    # Published 8,030,261,248 (untied, no biases): same architecture, exact.
    ("llama-3-8b", 8_030_261_248),
    # Published 494,032,768 with tied embeddings and Q/K/V biases: the same less its 27,648 biases.
    ("qwen2.5-0.5b", 494_032_768 - 27_648),
])
def test_params_match_published_counts(preset, expected):
    assert PRESETS[preset].params() == expected


def test_kv_shape():
    assert PRESETS["tiny"].kv_shape(7) == (2, 2, 2, 7, 32)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(BadInputError, match="tiny.*cpu.*llama-3-8b"):
        build_model("gpt-5")


def test_bad_dtype():
    with pytest.raises(BadInputError, match="bf16"):
        build_model("tiny", dtype="int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unusable_device_is_a_model_failure_and_a_misspelt_one_bad_input():
    with pytest.raises(ModelFailure, match="device 'cuda' cannot be used here: .*; run with --device cpu"):
        build_model("tiny", device="cuda")
    with pytest.raises(BadInputError, match="unknown device 'gpu'"):
        build_model("tiny", device="gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_replay_on_cuda_without_one_exits_4_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from kvcli.cli.app import app

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"token_ids": [1, 2, 3, 4, 5]}\n')
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", "tiny", "--device", "cuda", "--measure", "1"])
    assert out.exit_code == 4, out.output
    assert out.stderr.strip().splitlines()[-1].startswith("kvcli: error: device 'cuda' cannot be used here")


def test_too_big_raises_before_allocating(monkeypatch):
    monkeypatch.setattr(model_mod, "available_bytes", lambda device: 4 * 2**30)
    with pytest.raises(ModelFailure, match=r"llama-3-8b in bf16 needs about 15\.0 GiB"):
        build_model("llama-3-8b", device="cpu")


def test_model_id_and_attributes(tiny):
    assert tiny.model_id == "kvcli/tiny@seed0:fp32"
    assert tiny.kv_bytes_per_token == 1024
    assert tiny.dtype == torch.float32 and tiny.device == torch.device("cpu")
    assert build_model("tiny", dtype="bfloat16", seed=3, device="cpu").model_id == "kvcli/tiny@seed3:bf16"


def test_shapes_and_last_equals_all(tiny, prompt):
    logits_all, kv = tiny.prefill(prompt, logits_for="all")
    logits_last, kv_last = tiny.prefill(prompt)
    assert logits_all.shape == (PROMPT, 100352) and logits_all.dtype == torch.float32
    assert logits_last.shape == (1, 100352)
    assert kv.shape == (2, 2, 2, PROMPT, 32) and kv.dtype == torch.float32
    assert torch.allclose(logits_last[0], logits_all[-1], atol=FP32_ATOL)
    assert torch.equal(kv, kv_last)
    assert torch.isfinite(logits_all).all() and logits_all.std() > 0.05


def test_accepts_list_tensor_and_numpy(tiny, prompt):
    ref = tiny.prefill(prompt[:10])[0]
    assert torch.equal(tiny.prefill(prompt[:10].tolist())[0], ref)
    assert torch.equal(tiny.prefill(torch.tensor(prompt[:10].astype(np.int64)))[0], ref)


@pytest.mark.parametrize("bad", [[], [[1, 2]], [100352], [-1], [0.5]])
def test_bad_tokens(tiny, bad):
    with pytest.raises(BadInputError):
        tiny.prefill(np.array(bad))


def test_bad_logits_for(tiny):
    with pytest.raises(BadInputError, match="logits_for"):
        tiny.prefill([1, 2], logits_for="first")


def test_kv_for_new_returns_only_the_new_tokens_kv(tiny, prompt):
    # 40 cached tokens, then the rest: the same logits and the new 60 tokens' KV either way; a bad value refused
    _, full_kv = tiny.prefill(prompt[:40])
    logits_all, kv_all = tiny.prefill(prompt[40:100], full_kv, kv_for="all")
    logits_new, kv_new = tiny.prefill(prompt[40:100], full_kv, kv_for="new")
    assert kv_all.shape[3] == 100 and kv_new.shape[3] == 60
    assert torch.equal(logits_new, logits_all) and torch.equal(kv_new, kv_all[:, :, :, 40:])
    assert torch.equal(tiny.prefill(prompt[:7], kv_for="new")[1], tiny.prefill(prompt[:7])[1])  # no prefix: alike
    with pytest.raises(BadInputError, match="kv_for"):
        tiny.prefill([1, 2], kv_for="past")


@pytest.mark.parametrize("past", [torch.zeros(2, 2, 4, 3, 32), torch.zeros(2, 2, 2, 3, 32, dtype=torch.bfloat16)])
def test_bad_past_kv(tiny, past):
    with pytest.raises(ModelFailure, match="past_kv"):
        tiny.prefill([1, 2], past)


def test_seeded_determinism(tiny, prompt):
    again = build_model("tiny", device="cpu", seed=0)
    other = build_model("tiny", device="cpu", seed=1)
    ref = tiny.prefill(prompt[:32])[0]
    assert torch.equal(again.prefill(prompt[:32])[0], ref)
    assert not torch.allclose(other.prefill(prompt[:32])[0], ref, atol=1e-3)


def _reference_logits(m, tokens) -> torch.Tensor:
    """Every position's logits the textbook way: explicit softmax, repeated KV heads, full causal mask, in float64."""
    c, n = m.config, len(tokens)
    w = lambda t: t.double()  # noqa: E731
    norm = lambda x, g: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w(g)  # noqa: E731
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
    ang = torch.cat((pos * inv, pos * inv), -1)

    def rope(x):
        half = c.head_dim // 2
        return x * ang.cos() + torch.cat((-x[..., half:], x[..., :half]), -1) * ang.sin()

    x = w(m.embed)[torch.as_tensor(tokens.astype(np.int64))]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for b in m.blocks:
        q, k, v = (norm(x, b.attn_norm) @ w(b.w_qkv).T).split(
            [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], -1)
        q = rope(q.view(n, c.heads, c.head_dim).transpose(0, 1))
        k = rope(k.view(n, c.kv_heads, c.head_dim).transpose(0, 1)).repeat_interleave(c.heads // c.kv_heads, 0)
        v = v.view(n, c.kv_heads, c.head_dim).transpose(0, 1).repeat_interleave(c.heads // c.kv_heads, 0)
        scores = (q @ k.transpose(1, 2)) / c.head_dim ** 0.5
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(0, 1).reshape(n, -1) @ w(b.w_o).T
        gate, up = (norm(x, b.mlp_norm) @ w(b.w_gate_up).T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ w(b.w_down).T
    return norm(x, m.final_norm) @ w(m.lm_head).T


def test_matches_textbook_reference(tiny, prompt):
    logits, _ = tiny.prefill(prompt[:40], logits_for="all")
    ref = _reference_logits(tiny, prompt[:40])
    assert (logits.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
@pytest.mark.parametrize("dtype, atol", [("fp32", FP32_ATOL), ("bf16", BF16_ATOL)])
def test_suffix_after_cached_prefix_equals_full(tiny, tiny_bf16, prompt, chunk, dtype, atol):
    """prefill(tokens[m:], kv_full[..., :m, :]) reproduces rows m.. of the full prefill, for m = k * chunk.

    At most ~7 prefix lengths per chunk size (first, last and evenly between), to keep the test fast: each call's
    "all" logits are [PROMPT - m, 100352]. test_chunk_by_chunk_prefill_equals_full covers every boundary."""
    m_ = tiny if dtype == "fp32" else tiny_bf16
    full_logits, full_kv = m_.prefill(prompt, logits_for="all")
    prefixes = list(range(chunk, PROMPT, chunk))
    for m in sorted(set(prefixes[::max(1, len(prefixes) // 6)] + prefixes[-1:])):
        past = full_kv[:, :, :, :m].clone()
        logits, kv = m_.prefill(prompt[m:], past, logits_for="all")
        assert logits.shape == (PROMPT - m, 100352)
        assert torch.allclose(logits, full_logits[m:], atol=atol, rtol=0), (m, (logits - full_logits[m:]).abs().max())
        assert torch.allclose(kv.float(), full_kv.float(), atol=atol, rtol=0)
        assert torch.equal(kv[:, :, :, :m], past)  # the prefix is copied in unchanged
        assert torch.equal(past, full_kv[:, :, :, :m])  # and past_kv is not modified


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_chunk_by_chunk_prefill_equals_full(tiny, prompt, chunk):
    """Chaining each call's returned KV into the next (a chunked prefill) gives the full prefill's logits and KV."""
    full_logits, full_kv = tiny.prefill(prompt, logits_for="all")
    kv, rows = None, []
    for start in range(0, PROMPT, chunk):
        logits, kv = tiny.prefill(prompt[start:start + chunk], kv, logits_for="all")
        rows.append(logits)
    assert torch.allclose(torch.cat(rows), full_logits, atol=FP32_ATOL, rtol=0)
    assert torch.allclose(kv, full_kv, atol=FP32_ATOL, rtol=0)
