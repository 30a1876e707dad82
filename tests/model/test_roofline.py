"""The roofline of named accelerators: exact seconds by hand, the accelerator's published utilization at the
precision priced (or --mfu with its spread), and a replay priced with it (deterministic: the same savings and
verdict every run)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.model.hardware import ACCELERATORS, Accelerator, get_accelerator
from kvcli.model.presets import ModelConfig
from kvcli.model.roofline import MIN_MFU, Roofline
from kvcli.replay.runner import ModelOptions

SMALL = ModelConfig("small", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=1000)
FAKE = Accelerator("fake", "a test part", 1e12, None, 1e11, 1e9, "PCIe", 1e10, ("by hand",))


def test_seconds_by_hand_compute_and_memory_bound():
    r = Roofline(SMALL, FAKE, element_bytes=2, compute_dtype="bfloat16", mfu=0.5, mfu_range=(0.5, 0.5))
    # 100 new tokens: per layer QKV 1,638,400 + output 819,200 + MLP 4,915,200 + attention 256 x 5,050 pairs
    # = 8,665,600 FLOPs at 0.5e12 FLOP/s = 17.3312 us, above its 112,384 bytes at 1e11 B/s (1.12 us); the head
    # reads 128,000 bytes (1.28 us) for 128,000 FLOPs (0.256 us): 2 x 17.3312 + 1.28 = 35.9424 us
    assert r.seconds(100, 0) == pytest.approx(35.9424e-6, rel=1e-12)
    # 1 new token: memory bound, 74,368 bytes per layer (weights 73,984, KV 128, activations 256) = 0.74368 us
    assert r.seconds(1, 0) == pytest.approx(2 * 0.74368e-6 + 1.28e-6, rel=1e-12)
    # cached tokens add their KV reads (128 bytes each per layer) and attention pairs (256 FLOPs per pair)
    assert r.seconds(1, 10_000) == pytest.approx(2 * (74_368 + 10_000 * 128) / 1e11 + 1.28e-6, rel=1e-12)
    assert r.seconds(0, 500) == 0.0
    n, c = np.array([100, 1, 0]), np.array([0, 0, 5])
    assert r.total([(1, n, c), (-1, n[:1], c[:1])]) == pytest.approx(r.seconds(1, 0))


def test_fp8_kv_reads_and_writes_one_byte_per_kv_element():
    """--kv-dtype fp8: the weights and activations stay 2 bytes, the KV is 1 byte (64 elements per token and layer:
    2 x 2 KV heads x 16); 1 new token after 10,000: per layer 73,984 + 256 bytes and 10,001 x 64 of KV."""
    fp8 = Roofline(SMALL, FAKE, element_bytes=2, mfu=0.5, mfu_range=(0.5, 0.5), kv_element_bytes=1)
    assert fp8.seconds(1, 10_000) == pytest.approx(2 * (73_984 + 256 + 10_001 * 64) / 1e11 + 1.28e-6, rel=1e-12)
    bf16 = Roofline(SMALL, FAKE, element_bytes=2, mfu=0.5, mfu_range=(0.5, 0.5))
    assert bf16.seconds(1, 10_000) - fp8.seconds(1, 10_000) == pytest.approx(2 * 10_001 * 64 / 1e11, rel=1e-9)
    assert (fp8.to_dict()["kv_element_bytes"], bf16.to_dict()["kv_element_bytes"]) == (1, 2)
    # compute bound (100 new tokens): the KV's size does not show
    assert fp8.seconds(100, 0) == bf16.seconds(100, 0)


def test_draws_span_the_utilization_interval_and_price_each():
    r = Roofline(SMALL, FAKE, mfu=0.5, mfu_range=(0.25, 1.0))
    draws = r.draws(400, seed=3)
    assert draws.min() >= 0.25 and draws.max() <= 1.0 and np.array_equal(draws, r.draws(400, seed=3))
    n = np.array([100, 200])
    totals = r.totals(draws[:2], [(1, n, np.zeros(2, dtype=np.int64))])
    assert totals[0] == pytest.approx(float(np.sum(r.predict(n, 0, mfu=float(draws[0])))))


def test_the_utilization_is_the_accelerators_published_one_at_the_precision():
    """No mfu: kvcli.model.utilization's entry for the accelerator and the compute dtype's precision (float16
    prices as bf16: the same tensor-core rate); an mfu alone keeps that entry's relative spread around it."""
    h100 = ACCELERATORS["h100-sxm"]
    bf16 = Roofline(SMALL, h100)
    assert (bf16.mfu, bf16.mfu_range, bf16.mfu_source) == (0.45, (0.34, 0.58), "h100-sxm bf16, published")
    assert Roofline(SMALL, h100, compute_dtype="float16").mfu_range == (0.34, 0.58)
    fp8 = Roofline(SMALL, h100, element_bytes=1, compute_dtype="float8")
    assert (fp8.mfu, fp8.mfu_range, fp8.mfu_source) == (0.39, (0.33, 0.43), "h100-sxm fp8, published")
    given = Roofline(SMALL, h100, mfu=0.5)
    # 0.34 x 0.5 / 0.45 and 0.58 x 0.5 / 0.45
    assert given.mfu_range == pytest.approx((0.377778, 0.644444), abs=1e-6)
    assert given.mfu_source == "--mfu, h100-sxm bf16's spread"
    assert Roofline(SMALL, h100, mfu=0.9).mfu_range[1] == 1.0  # 0.58 x 2: capped at the peak
    doc = fp8.to_dict()
    assert (doc["mfu"], doc["mfu_interval"], doc["compute_dtype"], doc["element_bytes"]) == (
        0.39, [0.33, 0.43], "float8", 1)
    assert doc["mfu_basis"]["rule"] == "the median of 5 figures; the interval their span"
    assert Roofline(SMALL, FAKE, mfu=0.5, mfu_range=(0.5, 0.5)).to_dict()["mfu_basis"] is None
    # FP8: matmuls at the FP8 peak x 0.39, every element 1 byte. 100 new tokens of SMALL on an H100: per layer
    # 8,665,600 FLOPs (test_seconds_by_hand_compute_and_memory_bound's count) = 11.2 ns, under its bytes: 36,992
    # weights + 12,800 activations + 6,400 KV = 56,192 at 3.35 TB/s = 16.8 ns; the head's 64,000 weights, 19.1 ns
    per_layer = 8_665_600 / (1978.9e12 * 0.39)
    head = max(128_000 / (1978.9e12 * 0.39), 64_000 / 3.35e12)
    layer_bytes = (36_992 + 12_800 + 100 * 64) / 3.35e12
    assert layer_bytes > per_layer
    assert fp8.seconds(100, 0) == pytest.approx(2 * max(per_layer, layer_bytes) + head, rel=1e-12)


def test_a_utilization_outside_its_bounds_or_missing_is_refused():
    with pytest.raises(BadInputError, match="--hardware fake has no bf16 tensor cores or no published prefill "
                                            "utilization at bf16: give --mfu"):
        Roofline(SMALL, FAKE, compute_dtype="bfloat16")  # no published figure for a part built here
    with pytest.raises(BadInputError, match=r"--mfu must be in \[0.01, 1\] and within its interval"):
        Roofline(SMALL, FAKE, mfu=0.5, mfu_range=(0.6, 0.7))


def test_unknown_accelerator_and_a_dtype_without_tensor_cores_are_refused():
    with pytest.raises(BadInputError, match="unknown --hardware 'h100'; known: h100-sxm, h200"):
        get_accelerator("h100")
    with pytest.raises(BadInputError, match="no dense tensor FLOP/s for float32"):
        Roofline(SMALL, ACCELERATORS["h100-sxm"], element_bytes=4, compute_dtype="float32")
    with pytest.raises(BadInputError, match="float8"):
        Roofline(SMALL, ACCELERATORS["a100-80gb"], compute_dtype="float8")


TRACE = "".join(json.dumps({"token_ids": list(range(1, n)), "timestamp": t}) + "\n"
                for n, t in ((600, 0), (900, 1), (700, 2), (1200, 3)))


def _priced(tmp_path, *extra):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", "llama-3-8b", "--hardware", "h100-sxm",
                                   "--payload", "accounted", "--chunk-sizes", "16,256", "--json",
                                   "--jobs", "1", *extra])  # this process alone: worker processes report the same
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


_PRICED: dict[str, dict] = {}  # server kind -> the JSON report of _priced(link) (its KV dtype the model's own)


def _priced_on_the_link(tmp_path, redis_url, server_kind) -> dict:
    """:func:`_priced` over a 100 Gb/s link with a 0.1 ms round trip; the first run per kind of server is kept
    for the other test that reads it."""
    doc = _priced(tmp_path, "--link-gbps", "100", "--rtt-ms", "0.1", "--redis-url", redis_url)
    _PRICED.setdefault(server_kind, doc)
    return doc


def test_a_replay_priced_on_named_hardware_is_deterministic(tmp_path, redis_url, server_kind):
    """No model runs (--measure auto: 0 when priced), nothing is extrapolated, and two runs give the same savings,
    overheads and verdict to the last digit (the network model prices the Redis side: nothing is timed)."""
    first, second = (_priced_on_the_link(tmp_path, redis_url, server_kind) for _ in range(2))
    for doc in (first, second):
        assert doc["context"]["device"] == "no device (model not run)"
        assert doc["context"]["cost_curve"]["kind"] == "roofline"
    rows = [[(r["hit_tokens"], r["savings"], r["overheads"]) for r in d["traces"][0]["per_chunk_size"]]
            for d in (first, second)]
    assert rows[0] == rows[1]
    assert first["traces"][0]["verdict"] == second["traces"][0]["verdict"]
    (t,) = first["traces"]
    assert t["measured_requests"] == 0
    for r in t["per_chunk_size"]:
        assert r["savings"]["saved_beyond_calibration_share"] in (0.0, None)
    # R2 reuses R1's 599 tokens' full chunks: 592 at chunk size 16, 512 at 256; R3, R4 likewise of the longest before
    assert [r["hit_tokens"] for r in t["per_chunk_size"]] == [592 + 688 + 896, 512 + 512 + 768]


def test_the_priced_report_names_the_utilization_it_used(tmp_path, redis_url, server_kind):
    """The published bf16 utilization of an H100 by default; --precision fp8 prices FP8 matmuls at the FP8 peak
    and the fp8 utilization with 1-byte weights (the GPU tier holds the 8.03 G weights in 1 byte each); --mfu keeps
    the published interval's relative spread; each says so."""
    auto = _PRICED.get(server_kind) or _priced_on_the_link(tmp_path, redis_url, server_kind)
    link = ["--link-gbps", "100", "--rtt-ms", "0.1", "--redis-url", redis_url]
    fp8 = _priced(tmp_path, *link, "--precision", "fp8")
    given = _priced(tmp_path, *link, "--mfu", "0.5")
    curves = [d["context"]["cost_curve"] for d in (auto, fp8, given)]
    assert [(c["compute_dtype"], c["element_bytes"], c["mfu"], c["mfu_source"]) for c in curves] == [
        ("bfloat16", 2, 0.45, "h100-sxm bf16, published"), ("float8", 1, 0.39, "h100-sxm fp8, published"),
        ("bfloat16", 2, 0.5, "--mfu, h100-sxm bf16's spread")]
    assert (curves[0]["mfu_interval"], curves[1]["mfu_interval"]) == ([0.34, 0.58], [0.33, 0.43])
    assert curves[2]["mfu_interval"] == pytest.approx([0.34 * 0.5 / 0.45, 0.58 * 0.5 / 0.45], rel=1e-12)
    assert [d["context"]["cost_curve_source"] for d in (auto, fp8)] == [
        "roofline: NVIDIA H100 SXM5 80GB, bf16 at MFU 0.45", "roofline: NVIDIA H100 SXM5 80GB, fp8 at MFU 0.39"]
    assert fp8["traces"][0]["pricing"]["prefill"] == "roofline: NVIDIA H100 SXM5 80GB, fp8 at MFU 0.39"
    # weights in the GPU tier: 8,030,261,248 x 2 bytes in bf16, x 1 in fp8: the fp8 tier is 7.48 GiB larger
    tiers = [d["traces"][0]["capacity"]["gpu_tier"]["kv_bytes"] for d in (auto, fp8)]
    assert tiers[1] - tiers[0] == 8_030_261_248
    # the same trace: fp8's prefill is faster (it saves less) and its interval is fp8's
    saved = [d["traces"][0]["per_chunk_size"][1]["savings"]["saved_prefill_seconds"]["value_seconds"]
             for d in (auto, fp8)]
    assert saved[1] < saved[0]


def test_replay_kv_dtype_fp8_prices_one_byte_kv_on_named_hardware(tmp_path, redis_url, server_kind):
    """The CLI's --kv-dtype reaches the roofline: its KV element is 1 byte (llama-3-8b's weights stay bf16)."""
    link = ["--link-gbps", "100", "--rtt-ms", "0.1", "--redis-url", redis_url]
    fp8 = _priced(tmp_path, *link, "--kv-dtype", "fp8")
    auto = _PRICED.get(server_kind) or _priced_on_the_link(tmp_path, redis_url, server_kind)
    assert [(d["context"]["cost_curve"]["element_bytes"], d["context"]["cost_curve"]["kv_element_bytes"])
            for d in (fp8, auto)] == [(2, 1), (2, 2)]
    # 32 layers x 2 x 8 KV heads x 128 x 1 byte
    assert fp8["context"]["kv_bytes_per_token"] == 65_536 == auto["context"]["kv_bytes_per_token"] // 2


@pytest.mark.parametrize("args, message", [
    (["--hardware", "h100"], "unknown --hardware 'h100'"),
    (["--mfu", "0.5"], "--mfu sets the roofline's utilization: it needs --hardware"),
    (["--hardware", "h100-sxm", "--prefill-tps", "1000"], "--prefill-tps and --hardware both price prefill"),
    (["--hardware", "h100-sxm", "--mfu", "1.5"], "--mfu must be in [0.01, 1] (the share of the dense peak a prefill "
                                                 "reaches), got 1.5"),
    (["--hardware", "h100-sxm", "--mfu", "1e-300"], "--mfu must be in [0.01, 1] (the share of the dense peak a "
                                                    "prefill reaches), got 1e-300"),
    (["--hardware", "h100-sxm", "--mfu", "nan"], "--mfu must be in [0.01, 1]"),
    (["--precision", "fp8"], "--precision fp8 sets the roofline's precision: it needs --hardware"),
    (["--hardware", "h100-sxm", "--precision", "int4"], "--precision must be auto or fp8, got 'int4'"),
    (["--hardware", "a100-80gb", "--precision", "fp8", "--model", "llama-3-8b"],
     "--hardware a100-80gb has no dense tensor FLOP/s for float8"),
    (["--prefill-profile", "p.json", "--prefill-tps", "1000"], "--prefill-tps and --prefill-profile both price"),
    (["--prefill-profile", "p.json", "--hardware", "h100-sxm", "--mfu", "0.5"],
     "--mfu sets the roofline's utilization or precision, but --prefill-profile prices prefill from its measured "
     "times (preferred over any MFU): give one"),
    (["--prefill-profile", "p.json", "--hardware", "h100-sxm", "--precision", "fp8"],
     "--precision fp8 sets the roofline's utilization or precision, but --prefill-profile prices prefill"),
])
def test_bad_pricing_options_are_one_line_errors(tmp_path, args, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = CliRunner().invoke(app, ["replay", str(trace), "--payload", "accounted", *args])
    assert out.exit_code == 2 and message in out.stderr, out.output


@settings(max_examples=80, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))
def test_mfu_is_taken_exactly_in_its_bounds(mfu):
    """--mfu in [MIN_MFU, 1] builds the options; anything else (1e-300 priced a saving at 2.6e300 s) is refused."""
    if MIN_MFU <= mfu <= 1:
        assert ModelOptions(hardware="h100-sxm", mfu=mfu).mfu == mfu
    else:
        with pytest.raises(BadInputError, match=r"^--mfu must be in \[0\.01, 1\]"):
            ModelOptions(hardware="h100-sxm", mfu=mfu)


def test_a_float32_model_on_named_hardware_is_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = CliRunner().invoke(app, ["replay", str(trace), "--model", "tiny", "--hardware", "h100-sxm",
                                   "--payload", "accounted"])
    assert out.exit_code == 2 and "no dense tensor FLOP/s for float32" in out.stderr, out.output


def test_kvcli_hardware_lists_every_accelerator_with_its_source():
    out = CliRunner().invoke(app, ["hardware", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [a["name"] for a in doc["accelerators"]] == list(ACCELERATORS)
    assert all(a["sources"] and a["bf16_flops_per_second"] > 0 for a in doc["accelerators"])
    table = CliRunner().invoke(app, ["hardware"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and all(name in table.stdout for name in ACCELERATORS)


def test_the_b200s_hbm_is_the_hgx_b200_figure():
    """NVIDIA's HGX B200 table: 7.7 TB/s per GPU (a 7,680-bit bus at 3,996 MHz, double data rate: 7.672 TB/s)."""
    b200 = ACCELERATORS["b200"]
    assert b200.hbm_bytes_per_second == 7.7e12
    assert 7680 / 8 * 3996e6 * 2 == pytest.approx(7.672e12, rel=1e-4)
    assert "https://www.nvidia.com/en-us/data-center/hgx/" in b200.sources


def test_the_mooncake_sample_priced_on_an_h100_extrapolates_nothing(redis_url):
    """Llama-3-8B on an H100 SXM prices every Mooncake prompt (up to 121,924 tokens here) from its FLOPs and bytes:
    no calibrated range, so 0% of any saving lies beyond one."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "sample_traces" / "mooncake_conversation_head1000.jsonl.gz"
    out = CliRunner().invoke(app, ["replay", str(trace), "--hardware", "h100-sxm", "--model", "llama-3-8b",
                                   "--payload", "accounted", "--measure", "0", "--chunk-sizes", "512", "--limit",
                                   "200", "--redis-url", redis_url, "--json"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    assert row["savings"]["saved_prefill_seconds"]["value_seconds"] > 0
    assert row["savings"]["saved_beyond_calibration_share"] == 0.0
