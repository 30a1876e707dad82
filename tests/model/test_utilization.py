"""The prefill utilization (MFU) per accelerator and precision: each published figure's implied share of the peak by
hand, the table the rules give from them (kvcli.model.utilization's docstring), and `kvcli hardware` showing it."""
from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.model.flops import prefill_flops_breakdown
from kvcli.model.hardware import ACCELERATORS
from kvcli.model.utilization import (
    CARRIED,
    FIGURES,
    LLAMA_2_7B,
    LLAMA_7B_LATENCIES,
    ONE_FIGURE_SPREAD,
    UTILIZATIONS,
    Figure,
    derive,
    precision_of,
    utilization,
)

# every entry: (accelerator, precision) -> (value, low, high), as docs/hardware.md lists them
TABLE = {
    ("h100-sxm", "bf16"): (0.45, 0.34, 0.58), ("h100-sxm", "fp8"): (0.39, 0.33, 0.43),
    ("h200", "bf16"): (0.45, 0.26, 0.75), ("h200", "fp8"): (0.41, 0.37, 0.50),
    ("gh200", "bf16"): (0.45, 0.26, 0.75), ("gh200", "fp8"): (0.39, 0.25, 0.55),
    ("b200", "bf16"): (0.45, 0.26, 0.75), ("b200", "fp8"): (0.39, 0.25, 0.55),
    ("a100-80gb", "bf16"): (0.61, 0.38, 0.67),
    ("l40s", "bf16"): (0.32, 0.24, 0.41), ("l40s", "fp8"): (0.52, 0.39, 0.67),
    ("mi300x", "bf16"): (0.45, 0.34, 0.58), ("mi300x", "fp8"): (0.45, 0.34, 0.58),
}


def test_llama_2_7b_at_2048_tokens_is_counted_by_hand():
    """Per layer: QKV 2 x 2,048 x 4,096 x 12,288 = 206,158,430,208; output 2 x 2,048 x 4,096^2 = 68,719,476,736;
    MLP 6 x 2,048 x 4,096 x 11,008 = 554,050,781,184; attention 2,098,176 causal pairs x 4 x 32 heads x 128 =
    34,376,515,584; x 32 layers, plus one row of LM head 2 x 4,096 x 32,000 = 262,144,000."""
    per_layer = 206_158_430_208 + 68_719_476_736 + 554_050_781_184 + 34_376_515_584
    assert float(sum(prefill_flops_breakdown(LLAMA_2_7B, 2048, 0).values())) == 32 * per_layer + 262_144_000


def test_each_published_figure_implies_its_share_of_the_peak():
    """A first-token latency: FLOPs / (seconds x devices x peak); a throughput row: the prompt's FLOPs x requests
    per second (output tokens/s over 128 output tokens) / (devices x peak); a share: as given."""
    llama7b = 27_626_028_662_784  # the test above
    by_what = {f.what: f for f in FIGURES}
    h100_fp8 = by_what["TensorRT-LLM v0.5, LLaMA 7B FP8, 2,048 input tokens, batch 1: first token in 36 ms"]
    assert h100_fp8.mfu() == pytest.approx(llama7b / 0.036 / 1978.9e12, rel=1e-12)  # 0.3878
    l40s = by_what["TensorRT-LLM v0.5, LLaMA 7B FP8, 2,048 input tokens, batch 1: first token in 73 ms"]
    assert l40s.mfu() == pytest.approx(llama7b / 0.073 / 733e12, rel=1e-12)  # 0.5163
    a100 = by_what["TensorRT-LLM v0.5, LLaMA 7B FP16, 2,048 input tokens, batch 1: first token in 133 ms"]
    assert (a100.precision, round(a100.mfu(), 4)) == ("bf16", round(llama7b / 0.133 / 312e12, 4))  # 0.6658
    h100_8b = by_what["TensorRT-LLM v1.0, Llama 3.1 8B FP8 TP1, ISL/OSL 2048/128 at full load: 3,450 output "
                      "tokens/s (a lower bound: the run also decoded)"]
    llama8b = float(sum(prefill_flops_breakdown(h100_8b.model, 2048, 0).values()))
    assert h100_8b.bound and h100_8b.mfu() == pytest.approx(3450 / 128 * llama8b / 1978.9e12, rel=1e-12)
    shares = {(f.accelerator, f.precision, f.source.split("/")[2]): f.mfu() for f in FIGURES if f.share is not None}
    assert shares == {("h100-sxm", "bf16", "github.com"): 0.45, ("a100-80gb", "bf16", "github.com"): 0.38,
                      ("l40s", "bf16", "github.com"): 0.32, ("mi300x", "bf16", "aiweekly.co"): 0.45,
                      ("mi300x", "fp8", "aiweekly.co"): 0.45}
    assert sorted(round(f.mfu(), 2) for f in FIGURES if f.share is None) == [
        0.33, 0.37, 0.37, 0.39, 0.40, 0.41, 0.43, 0.50, 0.52, 0.61, 0.67]


def test_the_one_figure_spread_is_the_llama_7b_latencies_spread():
    shares = [f.mfu() for f in LLAMA_7B_LATENCIES]  # 0.3878 (H100 FP8), 0.5163 (L40S FP8), 0.6658 (A100 FP16)
    assert ONE_FIGURE_SPREAD == (min(shares) / statistics.median(shares), max(shares) / statistics.median(shares))
    assert (round(ONE_FIGURE_SPREAD[0], 4), round(ONE_FIGURE_SPREAD[1], 4)) == (0.7511, 1.2895)


def test_the_table_is_what_the_rules_give():
    assert {k: (u.value, u.low, u.high) for k, u in UTILIZATIONS.items()} == TABLE
    # median and span: the H100's five fp8 figures 0.3313, 0.3716, 0.3878, 0.4044, 0.4300
    h100 = UTILIZATIONS["h100-sxm", "fp8"]
    assert sorted(round(f.mfu(), 4) for f in h100.figures) == [0.3313, 0.3716, 0.3878, 0.4044, 0.43]
    assert h100.rule == "the median of 5 figures; the interval their span"
    # one figure: 0.32 x 0.7511 = 0.2404, 0.32 x 1.2895 = 0.4126
    assert UTILIZATIONS["l40s", "bf16"].rule.startswith("one figure; its interval x0.75 to x1.29 around it")
    # carried: the H100's bf16 0.45 [0.34, 0.58]: 0.34 x 0.7511 = 0.2554, 0.58 x 1.2895 = 0.7479
    b200 = UTILIZATIONS["b200", "bf16"]
    assert (b200.carried_from, b200.figures) == ("h100-sxm bf16", ())
    assert "no published bf16 prefill figure on a B200" in b200.rule
    assert b200.sources == UTILIZATIONS["h100-sxm", "bf16"].sources == (
        "https://github.com/inference-sim/inference-sim/blob/v0.7.15/hardware_config.json",)
    # fp8 below bf16 where an accelerator has its own figures at both on NVIDIA's Hopper
    assert UTILIZATIONS["h100-sxm", "fp8"].value < UTILIZATIONS["h100-sxm", "bf16"].value
    assert set(CARRIED) == {k for k, u in UTILIZATIONS.items() if not u.figures}


def test_an_entry_with_neither_figures_nor_a_carried_one_is_an_error():
    without_mi300x = tuple(f for f in FIGURES if f.accelerator != "mi300x")
    with pytest.raises(ValueError, match="no utilization for mi300x bf16"):
        derive(without_mi300x)
    only = Figure("mi300x", "bf16", "a test share", "by hand", share=0.5)
    table = derive((*without_mi300x, only, Figure("mi300x", "fp8", "another", "by hand", share=0.8)))
    assert (table["mi300x", "bf16"].value, table["mi300x", "bf16"].low, table["mi300x", "bf16"].high) == (
        0.5, 0.38, 0.64)  # 0.5 x 0.7511 = 0.3756, 0.5 x 1.2895 = 0.6447
    assert table["mi300x", "fp8"].high == 1.0  # 0.8 x 1.2895 = 1.03: at most the peak


def test_precisions_and_entries_without_tensor_cores():
    assert [precision_of(d) for d in ("bfloat16", "float16", "float8")] == ["bf16", "bf16", "fp8"]
    with pytest.raises(BadInputError, match="no published prefill utilization for float32"):
        precision_of("float32")
    with pytest.raises(BadInputError, match="--hardware a100-80gb has no fp8 tensor cores"):
        utilization("a100-80gb", "fp8")


def test_kvcli_hardware_json_gives_each_mfu_with_its_basis():
    out = CliRunner().invoke(app, ["hardware", "--json"])
    assert out.exit_code == 0, out.output
    accelerators = {a["name"]: a for a in json.loads(out.stdout)["accelerators"]}
    assert list(accelerators) == list(ACCELERATORS)
    for (name, precision), (value, low, high) in TABLE.items():
        assert accelerators[name][f"mfu_{precision}"] == {"value": value, "low": low, "high": high}
    a100 = accelerators["a100-80gb"]
    assert a100["mfu_fp8"] is None and a100["mfu_basis"]["fp8"] is None
    basis = a100["mfu_basis"]["bf16"]
    assert basis["rule"] == "the median of 3 figures; the interval their span" and basis["carried_from"] is None
    assert [(f["mfu"], f["lower_bound"]) for f in basis["figures"]] == [(0.6658, False), (0.6076, False),
                                                                       (0.38, False)]
    assert basis["figures"][0]["source"].startswith("https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d")
    assert accelerators["h200"]["mfu_basis"]["bf16"]["carried_from"] == "h100-sxm bf16"
    assert accelerators["b200"]["hbm_bytes_per_second"] == 7.7e12


def test_kvcli_hardware_shows_each_mfu_with_where_it_comes_from():
    out = CliRunner().invoke(app, ["hardware"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    rows = [" ".join(line.strip("│ ").split()) for line in out.stdout.splitlines() if line.startswith("│")]
    assert "h100-sxm │ bf16 │ 0.45 [0.34, 0.58] │ inference-sim 0.7.15, x0.75-x1.29" in rows
    assert ("h100-sxm │ fp8 │ 0.39 [0.33, 0.43] │ median of 5: TensorRT-LLM 0.5 TTFT, TensorRT-LLM 1.0 "
            "throughput") in rows
    assert "b200 │ fp8 │ 0.39 [0.25, 0.55] │ h100-sxm fp8's, widened (none published)" in rows
    assert "a100-80gb │ fp8 │ – │ no FP8 tensor cores" in rows
    assert "mi300x │ bf16 │ 0.45 [0.34, 0.58] │ MI300X report, x0.75-x1.29" in rows
