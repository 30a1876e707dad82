"""fp8 KV (``--kv-dtype fp8``): a cached prefill on KV stored as float8_e4m3fn with per-layer K and V scales
(:func:`kvcli.store.serde.stored_as`, the store's own encode and decode) against a full prefill, on a tiny Hugging
Face checkpoint and on the ``tiny`` preset.

The bound: e4m3 keeps 3 mantissa bits, so each dequantized K and V element is off by up to 2^-4 of its value
(2^-5 after rounding to nearest), and every logit downstream moves with that. Measured over 8 random 97-token
prompts x cached prefixes of 16, 32, 64 and 96 tokens (one scale per layer for K and V over the whole prefix, the
coarsest a chunk store uses): the largest |cached - full| logit difference was 5.9e-3 on the fp32 checkpoint,
7.8e-3 in bf16 and 1.3e-2 on ``tiny`` (logits of magnitude up to 0.7-0.9). ``FP8_ATOL`` = 0.05 is about 4x the
worst of them; the fp32 path without quantization agrees to 1e-5 (tests/model/test_hf_model.py), so
``FP8_FLOOR`` = 1e-4 shows the cached prefill really ran on quantized KV.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kvcli.model.load import kv_bytes_per_token, load_model
from kvcli.store.records import StoreConfig
from kvcli.store.serde import stored_as

FP8_ATOL = 0.05
FP8_FLOOR = 1e-4


def _worst_fp8_diff(model, vocab: int) -> float:
    worst = 0.0
    for seed in range(4):
        prompt = np.random.default_rng(seed).integers(0, vocab, 97).astype(np.uint32)
        full, kv = model.prefill(prompt, logits_for="all")
        for cached in (16, 64, 96):
            past = stored_as(kv[:, :, :, :cached], "float8_e4m3fn")
            assert past.dtype == kv.dtype and past.shape == kv[:, :, :, :cached].shape
            logits, _ = model.prefill(prompt[cached:], past, logits_for="all")
            worst = max(worst, float((logits.float() - full[cached:].float()).abs().max()))
    return worst


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_fp8_kv_logits_stay_within_the_bound_on_a_tiny_checkpoint(tiny_checkpoint, dtype):
    model = load_model(tiny_checkpoint, dtype=dtype, device="cpu")
    assert FP8_FLOOR < _worst_fp8_diff(model, 512) <= FP8_ATOL


def test_fp8_kv_logits_stay_within_the_bound_on_the_tiny_preset():
    model = load_model("tiny", device="cpu")
    assert FP8_FLOOR < _worst_fp8_diff(model, 100352) <= FP8_ATOL


def test_fp8_bytes_per_token_and_per_chunk(tiny_checkpoint):
    """The checkpoint: 2 layers x 2 (K, V) x 2 KV heads x 16 = 128 values per token: 512 B in fp32, 256 in bf16,
    128 in fp8, plus 2 x 2 float32 scales = 16 B per chunk: a 64-token chunk is 64 x 128 + 16 = 8,208 B."""
    assert (kv_bytes_per_token(tiny_checkpoint), kv_bytes_per_token(tiny_checkpoint, "bf16")) == (512, 256)
    config = StoreConfig("n", 64, "m", "raw", (2, 2, 2, 16), torch.bfloat16, kv_dtype="fp8")
    assert (config.kv_dtype, config.payload_bytes) == ("float8_e4m3fn", 64 * 128 + 16)
    assert StoreConfig("n", 64, "m", "raw", (2, 2, 2, 16), torch.bfloat16).payload_bytes == 64 * 256


def test_replay_kv_dtype_fp8_on_a_checkpoint(tmp_path, redis_url, tiny_checkpoint):
    """``kvcli replay --kv-dtype fp8``: the context's bytes per token are fp8's (128, with 16 scale bytes per
    chunk), every chunk written costs 8 x 128 + 16 B, R2's cached prefill on R1's dequantized chunks is within the
    bound, and the report names the dtype; ``--kv-dtype fp4`` is one line, exit 2."""
    from typer.testing import CliRunner

    from kvcli.cli.app import app

    trace = tmp_path / "t.jsonl"
    text = "The quick brown fox jumps over the lazy dog. " * 4
    trace.write_text(f'{{"prompt": "{text}"}}\n{{"prompt": "{text}And then?"}}\n')
    args = ["replay", str(trace), "--model", tiny_checkpoint, "--chunk-sizes", "8", "--measure", "all",
            "--prefill-tps", "1000", "--redis-url", redis_url, "--kv-dtype", "fp8"]
    out = CliRunner().invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    context, row = doc["context"], doc["traces"][0]["per_chunk_size"][0]
    assert (context["kv_dtype"], context["kv_bytes_per_token"], context["kv_scale_bytes_per_chunk"]) == (
        "float8_e4m3fn", 128, 16)
    assert row["chunks_written"] > 0 and row["payload_bytes_written"] == row["chunks_written"] * (8 * 128 + 16)
    assert FP8_FLOOR < row["max_logit_diff"] <= FP8_ATOL
    text_out = CliRunner().invoke(app, args)  # the notes wrap: compared with their spaces joined
    assert "KV float8_e4m3fn (+ 16 scale bytes per chunk) 128 bytes/token" in " ".join(text_out.stdout.split())
    bad = CliRunner().invoke(app, args[:-1] + ["fp4"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "--kv-dtype must be auto or fp8" in bad.output
