"""A hybrid model (attention + linear-attention layers) on a tiny random Qwen3-Next written at test time: the bytes
a stored chunk holds by hand (attention KV of its tokens plus the linear layers' states at its end), the cached
path's logits against transformers' own full forward when resuming at chunk boundaries, the one rule for where a
prefix can resume, and a replay through real Redis with exact hit tokens, objects and bytes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xxhash
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError, ModelFailure
from kvcli.live.warm import WarmConfig, warm
from kvcli.model.checkpoint import read_checkpoint
from kvcli.model.costcurve import CostCurve
from kvcli.model.flops import prefill_flops_breakdown
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tiny import write_tiny_checkpoint
from kvcli.model.load import load_model, resolve_spec
from kvcli.model.presets import FULL, LINEAR
from kvcli.prefixkv import StatefulKV, concat_kv, resumable_tokens
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.store.judge import payload_ok
from kvcli.store.kvstore import make_store
from kvcli.store.records import StoreConfig
from kvcli.store.serde import PayloadError, decode_kv, encode_kv, payload_layout
from kvcli.traces.request import Request

CHUNK = 16
IDS = (np.arange(60, dtype=np.uint32) * 37 + 5) % 500  # 60 tokens: three full chunks of 16 and 12 more


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """dtype -> a tiny Qwen3-Next checkpoint folder (three Gated DeltaNet layers, then a full-attention layer)."""
    return {dtype: str(write_tiny_checkpoint(tmp_path_factory.mktemp(f"qwen3-next-{dtype}"), vocab=512,
                                             dtype=dtype, layers=4, arch="qwen3_next"))
            for dtype in ("float32", "bfloat16")}


def _reference_logits(folder: str) -> torch.Tensor:
    """transformers' own forward of IDS: its attention, one forward, no cache; float32 ``[60, vocab]``."""
    module = transformers().AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.inference_mode():
        return module(input_ids=torch.from_numpy(IDS.astype(np.int64))[None], use_cache=False).logits[0].float()


# ---- bytes, by hand ----

def stored_chunk(folder: str, chunk_bytes: int):
    """``(spec, kv, value)``: the checkpoint's spec, its prefill of ``IDS[:40]`` with states at every multiple of
    CHUNK, and the payload of its second chunk (tokens 16..31), checked: the store expects ``chunk_bytes`` of
    payload per chunk and the value is exactly that plus its header."""
    spec = resolve_spec(folder)
    config = StoreConfig("hybrid", CHUNK, spec.model_id, "t", spec.kv_shape, spec.dtype, state_shape=spec.state_shape)
    assert config.payload_bytes == chunk_bytes
    model = load_model(folder, device="cpu")
    model.state_chunk_sizes = (CHUNK,)
    _, kv = model.prefill(IDS[:40])
    assert sorted(kv.states) == [16, 32, 40]
    value = encode_kv(kv[:, :, :, 16:32], config.payload_metadata)
    assert len(value) == config.value_bytes and len(value) - config.header_bytes == chunk_bytes
    return spec, kv, value


@pytest.mark.parametrize("dtype, per_token, state, chunk_bytes", [
    # 1 attention layer x 2 (K, V) x 2 KV heads x head_dim 16 x 4 B = 256 B per token; each of the 3 linear layers'
    # state: conv (2 x 2 x 8 + 4 x 8 = 64 channels) x (4 - 1) + recurrent 4 x 8 x 8 = 448 elements x 4 B = 1,792 B;
    # a chunk of 16 tokens: 16 x 256 + 3 x 1,792 = 9,472 B
    ("float32", 256, 5_376, 9_472),
    # the same in 2-byte elements: 16 x 128 + 3 x 896 = 4,736 B
    ("bfloat16", 128, 2_688, 4_736),
])
def test_a_stored_chunk_holds_its_tokens_kv_and_the_state_at_its_end(folders, dtype, per_token, state,
                                                                     chunk_bytes):
    shapes = read_checkpoint(folders[dtype]).shapes
    assert shapes.kinds == (LINEAR,) * 3 + (FULL,) and shapes.state_elements == 448 and shapes.state_shape == (3, 448)
    assert shapes.kv_bytes_per_token(dtype) == per_token and shapes.state_bytes(dtype) == state
    assert shapes.cached_prefix_bytes(CHUNK, dtype) == chunk_bytes  # the engine's bytes to resume after a chunk
    spec, kv, value = stored_chunk(folders[dtype], chunk_bytes)
    assert spec.kv_shape == (1, 2, 2, 16) and spec.state_shape == (3, 448)
    layout = payload_layout(value)
    assert (layout.shape, layout.state_shape) == ((1, 2, 2, 16, 16), (3, 448))
    assert layout.data_end - layout.state_start == state  # the state is the payload's last tensor
    # any safetensors reader sees both tensors; the state is the one after token 32 (the chunk's end)
    tensors = pytest.importorskip("safetensors.torch").load(bytes(value))
    assert torch.equal(tensors["kv"], kv.kv[:, :, :, 16:32]) and torch.equal(tensors["state"], kv.states[32])
    chunk, _ = decode_kv(value)
    assert isinstance(chunk, StatefulKV) and sorted(chunk.states) == [16]
    assert torch.equal(chunk.states[16], kv.states[32])


def test_the_judge_checks_the_state_with_the_kv():
    kv = torch.arange(2 * 2 * 4 * 3, dtype=torch.float32).view(1, 2, 2, 4, 3)
    state = torch.arange(10, dtype=torch.float32).view(1, 10) - 5
    value = encode_kv(StatefulKV(kv, {4: state}))
    head = len(value) - (48 + 10) * 4  # 48 KV and 10 state elements of 4 bytes
    checksum = xxhash.xxh3_64_digest(value[head:])
    assert payload_ok(value, checksum, (1, 2, 2, 4, 3), "F32", (1, 10))
    assert not payload_ok(value, checksum, (1, 2, 2, 4, 3), "F32", (2, 5))  # another state shape
    assert not payload_ok(value, checksum, (1, 2, 2, 4, 3), "F32", ())  # a store of a model without linear layers
    flipped = bytearray(value)
    flipped[-1] ^= 1  # one bit of the state
    assert not payload_ok(flipped, checksum, (1, 2, 2, 4, 3), "F32", (1, 10))
    with pytest.raises(PayloadError, match="KV payload data is"):
        payload_layout(bytes(value)[:-4])  # the state truncated
    with pytest.raises(PayloadError, match="without its linear layers' state at its end"):
        encode_kv(StatefulKV(kv, {})[:, :, :, 1:3])
    # fp8 KV: kv, then its 2 scales, then the state, unquantized (48 + 2 x 4 + 40 bytes)
    fp8 = encode_kv(StatefulKV(kv, {4: state}), dtype="float8_e4m3fn")
    layout = payload_layout(fp8)
    assert (layout.end - layout.start, layout.state_start - layout.end, layout.data_end - layout.state_start) == (
        48, 8, 40)
    assert payload_ok(fp8, xxhash.xxh3_64_digest(fp8[layout.start:]), (1, 2, 2, 4, 3), "F8_E4M3", (1, 10))
    chunk, _ = decode_kv(fp8, torch.float32)
    # e4m3 keeps 3 mantissa bits: each value within half a step, 2^-4 of itself
    assert torch.equal(chunk.states[4], state) and bool(((chunk.kv - kv).abs() <= kv.abs() * 2 ** -4).all())


# ---- the cached path against the full forward ----

# The bounds: float32 1e-5 (measured 1.5e-7); bfloat16 1e-2, under 3 bf16 steps of these logits (|logit| < 1, where a
# step is 2^-8 = 0.0039; measured 0.0039). Resuming from the state of the wrong boundary misses by 4e-2 in both.
@pytest.mark.parametrize("dtype, bound", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_cached_prefill_at_chunk_boundaries_equals_the_full_forward(folders, dtype, bound):
    """Hits of 2 and 3 chunks of 16 go through the payload format (encode, decode, concatenate) and resume the
    suffix from the last hit chunk's state; the logits stay within the dtype's bound of transformers' own forward
    of the whole prompt, as do those of the prefill segmented at the chunk boundaries."""
    assert_resumes_at_chunk_boundaries(load_model(folders[dtype], device="cpu"), _reference_logits(folders[dtype]),
                                       bound)


def assert_resumes_at_chunk_boundaries(model, reference: torch.Tensor, bound: float) -> dict[int, StatefulKV]:
    """IDS through ``model`` (a hybrid HFModel) as one forward and segmented at chunks of 16, then resumed after hits
    of 2 and 3 chunks through the payload format: every logit within ``bound`` of ``reference`` (float32 ``[60,
    vocab]``). Returns ``{32: past, 48: past}``, the decoded hits."""
    single, _ = model.prefill(IDS, logits_for="all")  # no chunk sizes: one forward
    assert (single - reference).abs().max().item() <= bound
    model.state_chunk_sizes = (CHUNK,)
    full, kv = model.prefill(IDS, logits_for="all")
    assert sorted(kv.states) == [16, 32, 48, 60]
    assert (full - reference).abs().max().item() <= bound
    hits = {}
    for chunks in (2, 3):
        past = concat_kv([decode_kv(encode_kv(kv[:, :, :, k * CHUNK:(k + 1) * CHUNK]))[0] for k in range(chunks)])
        assert past.tokens == chunks * CHUNK and sorted(past.states) == [16 * (k + 1) for k in range(chunks)]
        logits, resumed = model.prefill(IDS[chunks * CHUNK:], past, logits_for="all")
        assert (logits - reference[chunks * CHUNK:]).abs().max().item() <= bound
        assert torch.equal(resumed.kv[:, :, :, :chunks * CHUNK], kv.kv[:, :, :, :chunks * CHUNK])
        hits[chunks * CHUNK] = past
    return hits


@pytest.mark.parametrize("chunk_sizes, segments", [((), [(28, 32)]), ((CHUNK,), [(16, 32), (12, 48)])])
def test_cached_prefill_flops_equal_the_counter(folders, chunk_sizes, segments):
    """28 tokens after a cached prefix of 32, as one forward or as segments ending at the chunk boundary 48 and
    at 60: FlopCounterMode on kvcli's cached path equals, op by op, the FLOPs model summed over the forwards run
    (the counter has no formula for the CPU attention kernel: its pairs are checked in tests/model/test_flops.py)."""
    model = load_model(folders["float32"], device="cpu")
    model.module.config._experts_implementation = "eager"  # each expert on its tokens: mm the counter sees
    model.state_chunk_sizes = (CHUNK,)
    _, kv = model.prefill(IDS)
    model.state_chunk_sizes = chunk_sizes
    with FlopCounterMode(display=False) as counter:
        model.prefill(IDS[32:], kv[:, :, :, :32])
    counted = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    parts = [prefill_flops_breakdown(model.config, new, cached) for new, cached in segments]

    def total(*names: str) -> int:
        return sum(int(p[name]) for p in parts for name in names)

    assert counted == {"aten.mm": total("qkv", "out_proj", "mlp", "linear_proj", "lm_head"),
                       "aten.convolution": total("linear_conv"), "aten.bmm": total("linear_scan")}
    # the chunked scan pads each forward to whole chunks of 64: 3 Gated DeltaNets x 4 value heads x 221,184 per
    # chunk (tests/model/test_flops.py), one chunk per forward
    assert total("linear_scan") == len(segments) * 3 * 4 * 221_184


def test_a_model_of_linear_layers_only_is_refused_in_one_line(tmp_path):
    folder = str(write_tiny_checkpoint(tmp_path, vocab=512, arch="qwen3_next"))  # 2 layers, both linear
    with pytest.raises(BadInputError, match="whose 2 layers are all linear attention") as info:
        load_model(folder, device="cpu")
    assert str(info.value).startswith(folder) and "\n" not in str(info.value)


def test_a_prefix_resumes_only_where_its_state_was_saved(folders):
    model = load_model(folders["float32"], device="cpu")
    model.state_chunk_sizes = (CHUNK,)
    _, kv = model.prefill(IDS[:40])
    assert [resumable_tokens(kv, t) for t in (15, 16, 31, 32, 39, 40)] == [0, 16, 16, 32, 32, 40]
    assert resumable_tokens(kv.kv, 31) == 31  # a dense model's KV resumes after any token
    # kv_for="new": the tokens after the prefix, their states numbered from it (after 32 and 40 -> 16 and 24)
    _, new = model.prefill(IDS[16:40], kv[:, :, :, :16], kv_for="new")
    assert new.tokens == 24 and sorted(new.states) == [16, 24]
    assert torch.equal(new.kv, kv.kv[:, :, :, 16:]) and torch.equal(new.states[24], kv.states[40])
    with pytest.raises(ModelFailure, match="needs the linear layers' state after its last token") as info:
        model.prefill(IDS[20:40], kv[:, :, :, :20])
    assert "\n" not in str(info.value)
    with pytest.raises(ModelFailure, match="needs the linear layers' state"):
        model.prefill(IDS[16:40], kv.kv[:, :, :, :16])


# ---- a replay through real Redis ----

def _trace(folder) -> str:
    """Five prompts of IDS' tokens: a (40 tokens); b extends a's two chunks; c repeats a; d shares one chunk; e is
    a's two chunks alone, every token a hit. Chunks of 16 stored: a's 0-1 and b's 2."""
    a = [int(t) for t in IDS[:40]]
    prompts = [a, a[:32] + [t + 1 for t in a[:20]], a, a[:16] + [7] * 10, a[:32]]
    trace = folder / "hybrid.jsonl"
    trace.write_text("".join(json.dumps({"id": f"r{i}", "token_ids": p}) + "\n" for i, p in enumerate(prompts)))
    return str(trace)


def test_replay_of_a_hybrid_checkpoint_hits_and_stores_by_hand(tmp_path, redis_url, folders):
    out = CliRunner().invoke(app, ["replay", _trace(tmp_path), "--model", folders["float32"], "--chunk-sizes",
                                   str(CHUNK), "--measure", "all", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    (result,) = doc["traces"]
    assert doc["context"]["kv_bytes_per_token"] == 256 and doc["context"]["state_bytes_per_chunk"] == 5_376
    (row,) = result["per_chunk_size"]
    # a writes chunks 0-1, b hits them and writes chunk 2, c hits 0-1, d hits 0, e hits 0-1 (32 of its 32 tokens:
    # 31 reusable, the last token is always computed)
    assert row["hit_tokens"] == 0 + 32 + 32 + 16 + 31
    assert row["chunks_written"] == 3 and row["objects_created"] == 6
    assert row["payload_bytes_written"] == 3 * 9_472
    logged = [m["per_chunk_size"][0] for m in result["measured"]]
    assert [m["hit_tokens"] for m in logged] == [0, 32, 32, 16, 32]
    # e resumes from the state after chunk 0: no state is saved after token 31
    assert [m["reused_tokens"] for m in logged] == [0, 32, 32, 16, 16]
    assert row["max_logit_diff"] <= 1e-5


def test_an_accounted_replay_of_qwen3_next_counts_the_state_per_chunk(tmp_path, redis_url):
    """The config-only Qwen3-Next-80B-A3B priced (no weights): each accounted chunk of 16 tokens counts 12
    attention layers x 2 x 2 KV heads x 256 x 2 B = 24,576 B per token, x 16 = 393,216 B, plus 36 Gated DeltaNet
    states of (2 x 16 x 128 + 32 x 128) x 3 + 32 x 128 x 128 = 548,864 elements x 2 B = 39,518,208 B."""
    out = CliRunner().invoke(app, ["replay", _trace(tmp_path), "--model", "qwen3-next-80b-a3b", "--chunk-sizes",
                                   str(CHUNK), "--measure", "0", "--payload", "accounted", "--prefill-tps", "3000",
                                   "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["context"]["state_bytes_per_chunk"] == 39_518_208
    (row,) = doc["traces"][0]["per_chunk_size"]
    assert row["hit_tokens"] == 0 + 32 + 32 + 16 + 31 and row["chunks_written"] == 3
    assert row["payload_bytes_accounted"] == 3 * (393_216 + 39_518_208)


def test_the_lmcache_layout_refuses_a_hybrid_model(redis_client, folders):
    spec = resolve_spec(folders["float32"])
    config = StoreConfig("hybrid", CHUNK, spec.model_id, "t", spec.kv_shape, spec.dtype, state_shape=spec.state_shape)
    with pytest.raises(BadInputError, match="no place for it: use --layout kvcli"):
        make_store("lmcache", redis_client, config)


def test_warm_then_replay_resumes_from_the_warmed_states(redis_client, folders):
    """Chunk sizes 16 and 24, whose boundaries interleave: warm stores each chunk with the state at its end, and
    a replay reading that namespace resumes every measured request from the deepest warmed chunk with a state."""
    model = load_model(folders["float32"], device="cpu")
    a = [int(t) for t in IDS[:48]]  # 3 chunks of 16, 2 of 24
    b = a[:32] + [t + 1 for t in a[:24]]  # 56 tokens: 16-chunks 0-1 and 24-chunk 0 are a's
    prompts = [Request(rid, np.asarray(t, dtype=np.uint32), source=f"test:{rid}") for rid, t in (("a", a), ("b", b))]
    result = warm(redis_client, prompts, model, WarmConfig("w", (16, 24)))
    # a prefills 48 tokens; b reuses a's 32 tokens of 16-chunks and prefills tokens 32..47 (its last full chunk)
    assert (result.tokens_prefilled, result.tokens_reused) == (48 + 16, 32)
    by_size = {t.chunk_size: t for t in result.per_size}
    assert (by_size[16].chunks_written, by_size[24].chunks_written) == (3 + 1, 2 + 1)
    # 16 x 256 + 5,376 = 9,472 and 24 x 256 + 5,376 = 11,520 bytes per chunk
    assert (by_size[16].payload_bytes, by_size[24].payload_bytes) == (4 * 9_472, 3 * 11_520)
    replay = Replayer(redis_client, model, CostCurve.from_tokens_per_second(1e4), "cl100k_base",
                      ReplayConfig(chunk_sizes=(16, 24), namespace="w", measure=None))
    out = replay.replay("prompts", prompts)
    # a hits all 48 of its tokens in both sizes (47 reusable), b 48 of its 56
    assert [row.hit_tokens for row in out.per_chunk_size] == [47 + 48, 47 + 48]
    assert [row.chunks_written for row in out.per_chunk_size] == [0, 0]
    # a resumes at the last boundary before its last token: 32 (16-chunks), 24 (24-chunks); b at 48 in both
    assert [[r["reused_tokens"] for r in m["per_chunk_size"]] for m in out.measured] == [[32, 24], [48, 48]]
    assert max(row.max_logit_diff for row in out.per_chunk_size) <= 1e-5


def test_warm_resumes_before_the_first_chunk_end_whose_state_is_missing(redis_client, folders):
    """a's three 16-chunks are warmed first; warming 16 and 24 then finds all 48 tokens stored in 16-chunks, whose
    states are at 16, 32 and 48, but the 24-chunk ending at 24 needs the state there: it resumes at 16."""
    model = load_model(folders["float32"], device="cpu")
    a = Request("a", IDS[:48].copy(), source="test:a")
    assert warm(redis_client, [a], model, WarmConfig("x", (16,))).tokens_prefilled == 48
    again = warm(redis_client, [a], model, WarmConfig("x", (16, 24)))
    assert (again.tokens_reused, again.tokens_prefilled) == (16, 32)
    assert [t.chunks_written for t in again.per_size] == [0, 2]
    replay = Replayer(redis_client, model, CostCurve.from_tokens_per_second(1e4), "cl100k_base",
                      ReplayConfig(chunk_sizes=(24,), namespace="x", measure=None))
    (row,) = replay.replay("prompts", [a]).per_chunk_size
    assert (row.hit_tokens, row.chunks_written, row.checksum_failures) == (47, 0, 0) and row.max_logit_diff <= 1e-5
