"""What share of an accelerator's dense peak a prefill reaches (model FLOPs utilization, MFU), per accelerator and
precision, from published figures: the utilization :mod:`kvcli.model.roofline` prices prefill at.

A published figure implies a utilization one of four ways (:class:`Figure`):

- a first-token latency at batch 1: the prompt's FLOPs (:func:`kvcli.model.flops.prefill_flops_breakdown`, kvcli's
  own count) over the latency times the dense peak of the devices that ran it;
- a throughput at full load: the prefill FLOPs of the requests served per second over the devices' dense peak, a
  lower bound (the same seconds also decoded every request's output tokens);
- a simulator's calibrated prefill MFU, taken as it is;
- a reported share of the peak, taken as it is.

An accelerator's entry at one precision (:func:`derive`):

- with two or more figures: their median, the interval their span (low to high);
- with one figure: that figure, the interval :data:`ONE_FIGURE_SPREAD` around it (the relative spread of
  TensorRT-LLM's three LLaMA-7B first-token latencies, 0.75x to 1.29x: how far one model's utilization at one batch
  size moves between accelerators and precisions);
- with none: another entry's (:data:`CARRIED`: an accelerator with the same tensor cores, or the nearest one with
  figures), its value kept and its interval widened by that spread again (its low x 0.75, its high x 1.29, at
  most 1), the reason said.

Every value and bound is rounded to two decimals, as the figures are known to no better. docs/hardware.md lists
every figure, its source and the table they give.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvcli.errors import BadInputError
from kvcli.model.flops import prefill_flops_breakdown
from kvcli.model.hardware import ACCELERATORS, Accelerator
from kvcli.model.presets import ModelConfig

PRECISIONS = ("bf16", "fp8")
"""The precisions priced: bf16 (also float16: the same tensor-core rate) and fp8."""
COMPUTE_DTYPES = {"bf16": "bfloat16", "fp8": "float8"}
"""Each precision's compute dtype, as :meth:`kvcli.model.hardware.Accelerator.peak_flops` names it."""

#: Shapes of the models the published figures ran, from each model's config.json on Hugging Face
#: (meta-llama/Llama-2-7b-hf, Llama-2-70b-hf, Llama-3.1-8B, Llama-3.3-70B-Instruct, Llama-3.1-405B).
LLAMA_2_7B = ModelConfig("llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008,
                         vocab=32000, rope_theta=10000.0, dtype="float16")
LLAMA_2_70B = ModelConfig("llama-2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                          vocab=32000, rope_theta=10000.0, dtype="float16")
LLAMA_3_8B = ModelConfig("llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                         vocab=128256, rope_theta=500000.0)
LLAMA_3_70B = ModelConfig("llama-3.3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                          vocab=128256, rope_theta=500000.0)
LLAMA_3_405B = ModelConfig("llama-3.1-405b", layers=126, hidden=16384, heads=128, kv_heads=8, head_dim=128,
                           ffn=53248, vocab=128256, rope_theta=500000.0)

TRTLLM_LATENCY = ("https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c47297d8c06bafac73/docs/source/"
                  "performance.md")
"""TensorRT-LLM's first-token latencies at batch 1 ("Low Latency": the TensorRT-LLM v0.5 data)."""
TRTLLM_THROUGHPUT = ("https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/docs/"
                     "source/performance/perf-overview.md")
"""TensorRT-LLM's throughput tables (trtllm-bench at full load, v1.0: total output tokens/s, FP8 checkpoints)."""
INFERENCE_SIM = "https://github.com/inference-sim/inference-sim/blob/v0.7.15/hardware_config.json"
"""inference-sim (BLIS) v0.7.15: its roofline's calibrated prefill MFU per GPU (``mfuPrefill``, at the dense BF16
peak; docs/reference/models.md: "recalibrated based on empirical measurements", its Discussion #589)."""
MI300X_REPORT = "https://aiweekly.co/alerts/amd-mi300x-hits-only-45-of-peak-flops-in-practice"
"""A report (of Yahoo Finance's) that the MI300X reaches about 45% of its peak FLOPs in FP8, BF16 and FP16 on AI
workloads: a share of the peak, not a prefill measurement."""

SOURCE_NAMES = {TRTLLM_LATENCY: "TensorRT-LLM 0.5 TTFT", TRTLLM_THROUGHPUT: "TensorRT-LLM 1.0 throughput",
                INFERENCE_SIM: "inference-sim 0.7.15", MI300X_REPORT: "MI300X report"}
"""Each source's short name, for tables."""


@dataclass(frozen=True)
class Figure:
    """One published figure and the utilization it implies (module docstring).

    Attributes:
        accelerator: the ``--hardware`` name it ran on. precision: "bf16" or "fp8".
        what: the figure in words, as published ("LLaMA 7B, 2,048 tokens, batch 1: first token in 36 ms").
        source: where it is published (a URL, at a commit or tag where one exists).
        share: a utilization given as such (a simulator's calibration, a reported share of the peak); else:
        model: the model's shapes; tokens: its prompt, tokens; devices: how many ran it (tensor parallelism);
        seconds: the time per prompt (a first-token latency, or the output length over the output throughput);
        bound: whether the utilization is a lower bound (a throughput's: the seconds decoded too).
    """

    accelerator: str
    precision: str
    what: str
    source: str
    share: float | None = None
    model: ModelConfig | None = None
    tokens: int = 0
    devices: int = 1
    seconds: float = 0.0
    bound: bool = False

    def mfu(self) -> float:
        """The utilization: ``share``, or the prompt's FLOPs over ``seconds x devices x`` the dense peak."""
        if self.share is not None:
            return self.share
        assert self.model is not None
        flops = float(sum(prefill_flops_breakdown(self.model, self.tokens, 0).values()))
        peak = ACCELERATORS[self.accelerator].peak_flops(COMPUTE_DTYPES[self.precision])
        return flops / self.seconds / (self.devices * peak)

    def to_dict(self) -> dict:
        """JSON-ready: the figure, its source and the utilization it implies."""
        return {"what": self.what, "source": self.source, "mfu": round(self.mfu(), 4), "lower_bound": self.bound}


def _latency(accelerator: str, dtype: str, model: ModelConfig, label: str, devices: int, ms: int) -> Figure:
    """A TensorRT-LLM first-token latency at batch 1, 2,048 input tokens, in ``dtype`` as published ("FP8",
    "FP16": priced as bf16, the same tensor-core rate)."""
    tp = f" TP{devices}" if devices > 1 else ""
    precision = "fp8" if dtype == "FP8" else "bf16"
    return Figure(accelerator, precision, f"TensorRT-LLM v0.5, {label} {dtype}{tp}, 2,048 input tokens, "
                  f"batch 1: first token in {ms} ms", TRTLLM_LATENCY, model=model, tokens=2048, devices=devices,
                  seconds=ms / 1000)


def _throughput(accelerator: str, model: ModelConfig, label: str, devices: int, tokens_per_second: int) -> Figure:
    """A TensorRT-LLM v1.0 throughput row at input 2,048 / output 128 tokens, FP8: the rows where prefill is most
    of the work."""
    tp = f"TP{devices}"
    return Figure(accelerator, "fp8", f"TensorRT-LLM v1.0, {label} FP8 {tp}, ISL/OSL 2048/128 at full load: "
                  f"{tokens_per_second:,} output tokens/s (a lower bound: the run also decoded)", TRTLLM_THROUGHPUT,
                  model=model, tokens=2048, devices=devices, seconds=128 / tokens_per_second, bound=True)


def _calibrated(accelerator: str, share: float) -> Figure:
    """inference-sim's calibrated prefill MFU of one GPU (at its dense BF16 peak)."""
    return Figure(accelerator, "bf16", f"inference-sim v0.7.15's calibrated prefill MFU (mfuPrefill {share})",
                  INFERENCE_SIM, share=share)


LLAMA_7B_LATENCIES = (_latency("h100-sxm", "FP8", LLAMA_2_7B, "LLaMA 7B", 1, 36),
                      _latency("l40s", "FP8", LLAMA_2_7B, "LLaMA 7B", 1, 73),
                      _latency("a100-80gb", "FP16", LLAMA_2_7B, "LLaMA 7B", 1, 133))
"""TensorRT-LLM's three LLaMA-7B first-token latencies (H100 FP8, L40S FP8, A100 FP16): the spread of one model's
utilization across accelerators and precisions (:data:`ONE_FIGURE_SPREAD`)."""

FIGURES: tuple[Figure, ...] = (
    *LLAMA_7B_LATENCIES,
    _latency("h100-sxm", "FP8", LLAMA_2_70B, "LLaMA 70B", 4, 109),
    _latency("a100-80gb", "FP16", LLAMA_2_70B, "LLaMA 70B", 4, 377),
    _throughput("h100-sxm", LLAMA_3_8B, "Llama 3.1 8B", 1, 3450),
    _throughput("h200", LLAMA_3_8B, "Llama 3.1 8B", 1, 3538),
    _throughput("h100-sxm", LLAMA_3_70B, "Llama 3.3 70B", 2, 762),
    _throughput("h200", LLAMA_3_70B, "Llama 3.3 70B", 1, 442),
    _throughput("h100-sxm", LLAMA_3_405B, "Llama 3.1 405B", 8, 453),
    _throughput("h200", LLAMA_3_405B, "Llama 3.1 405B", 8, 456),
    _calibrated("h100-sxm", 0.45),
    _calibrated("a100-80gb", 0.38),
    _calibrated("l40s", 0.32),
    *(Figure("mi300x", p, "about 45% of the peak FLOPs in FP8, BF16 and FP16 on AI workloads (a reported share of "
             "the peak, not a prefill measurement)", MI300X_REPORT, share=0.45) for p in PRECISIONS),
)
"""Every published figure an entry rests on (docs/hardware.md lists them)."""

_SAME_DIE = "the same GH100 tensor cores at the same clocks (989.4 TFLOP/s dense BF16) as the H100 SXM"
CARRIED: dict[tuple[str, str], tuple[tuple[str, str], str]] = {
    ("h200", "bf16"): (("h100-sxm", "bf16"), f"no published bf16 prefill figure on an H200; {_SAME_DIE}"),
    ("gh200", "bf16"): (("h100-sxm", "bf16"), f"no published bf16 prefill figure on a GH200; {_SAME_DIE}"),
    ("gh200", "fp8"): (("h100-sxm", "fp8"), f"no published fp8 prefill figure on a GH200; {_SAME_DIE}"),
    ("b200", "bf16"): (("h100-sxm", "bf16"), "no published bf16 prefill figure on a B200 (TensorRT-LLM's B200 "
                                            "rows are FP4): the H100 SXM's, the nearest NVIDIA part with figures"),
    ("b200", "fp8"): (("h100-sxm", "fp8"), "no published fp8 prefill figure on a B200 (TensorRT-LLM's B200 rows "
                                          "are FP4): the H100 SXM's, the nearest NVIDIA part with figures"),
}
"""Entries with no figure of their own: (accelerator, precision) -> (the entry they take, why)."""


def _spread() -> tuple[float, float]:
    shares = [f.mfu() for f in LLAMA_7B_LATENCIES]
    middle = statistics.median(shares)
    return min(shares) / middle, max(shares) / middle


ONE_FIGURE_SPREAD = _spread()
"""(low, high) factors around a one-figure entry's value: TensorRT-LLM's three LLaMA-7B first-token latencies'
lowest and highest utilization over their median (0.751, 1.290)."""


@dataclass(frozen=True)
class Utilization:
    """One accelerator's prefill utilization at one precision (module docstring).

    Attributes:
        accelerator, precision: what it is of ("h100-sxm", "fp8").
        value: the share of the dense peak a prefill reaches; low, high: its interval (0 < low <= value <= high <=
            1).
        figures: the published figures it rests on (empty: carried over from another entry).
        rule: how value and interval follow from them, in words.
        carried_from: the entry it was carried over from ("h100-sxm bf16"), or None.
    """

    accelerator: str
    precision: str
    value: float
    low: float
    high: float
    figures: tuple[Figure, ...]
    rule: str
    carried_from: str | None = None

    def to_dict(self) -> dict:
        """``{value, low, high}``: the form ``kvcli hardware --json`` gives as ``mfu_bf16`` / ``mfu_fp8``."""
        return {"value": self.value, "low": self.low, "high": self.high}

    def basis(self) -> dict:
        """JSON-ready: the rule, where it was carried from, and each figure with its source."""
        return {"rule": self.rule, "carried_from": self.carried_from,
                "figures": [f.to_dict() for f in self.figures]}

    @property
    def sources(self) -> tuple[str, ...]:
        """The distinct sources of its figures (those of the entry it was carried from, when carried)."""
        figures = self.figures if self.carried_from is None else utilization(*self.carried_from.split()).figures
        return tuple(dict.fromkeys(f.source for f in figures))

    def summary(self) -> str:
        """The rule and sources in a few words: "median of 5: TensorRT-LLM 0.5 TTFT, TensorRT-LLM 1.0 throughput",
        "inference-sim 0.7.15, x0.75-x1.29", "h100-sxm bf16's, widened (none published)"."""
        if self.carried_from is not None:
            return f"{self.carried_from}'s, widened (none published)"
        names = ", ".join(dict.fromkeys(SOURCE_NAMES[f.source] for f in self.figures))
        if len(self.figures) == 1:
            low, high = ONE_FIGURE_SPREAD
            return f"{names}, x{low:.2f}-x{high:.2f}"
        return f"median of {len(self.figures)}: {names}"

    def label(self) -> str:
        """``"h100-sxm fp8: 0.39 [0.33, 0.50]"``."""
        return f"{self.accelerator} {self.precision}: {self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def _own(accelerator: str, precision: str, figures: list[Figure]) -> Utilization:
    shares = [f.mfu() for f in figures]
    if len(shares) == 1:
        low, high = ONE_FIGURE_SPREAD
        value = shares[0]
        return Utilization(accelerator, precision, round(value, 2), round(value * low, 2),
                           round(min(1.0, value * high), 2), tuple(figures),
                           f"one figure; its interval x{low:.2f} to x{high:.2f} around it (the spread of "
                           f"TensorRT-LLM's LLaMA-7B first-token latencies)")
    return Utilization(accelerator, precision, round(statistics.median(shares), 2), round(min(shares), 2),
                       round(max(shares), 2), tuple(figures),
                       f"the median of {len(shares)} figures; the interval their span")


def derive(figures: tuple[Figure, ...] = FIGURES) -> dict[tuple[str, str], Utilization]:
    """Every entry (accelerator, precision) -> :class:`Utilization` (module docstring's rules): the accelerators of
    :data:`kvcli.model.hardware.ACCELERATORS`, at each precision they have tensor cores for.

    Raises:
        ValueError: an accelerator with tensor cores for a precision has neither figures nor a carried entry.
    """
    out: dict[tuple[str, str], Utilization] = {}
    for name in ACCELERATORS:
        for precision in PRECISIONS:
            own = [f for f in figures if (f.accelerator, f.precision) == (name, precision)]
            if own:
                out[name, precision] = _own(name, precision, own)
    low, high = ONE_FIGURE_SPREAD
    for (name, precision), (source, why) in CARRIED.items():
        base = out[source]
        out[name, precision] = Utilization(
            name, precision, base.value, round(base.low * low, 2), round(min(1.0, base.high * high), 2), (),
            f"{why}: its value, the interval widened x{low:.2f} below and x{high:.2f} above",
            f"{source[0]} {source[1]}")
    for name, acc in ACCELERATORS.items():
        for precision in PRECISIONS:
            if _has_tensor_cores(acc, precision) and (name, precision) not in out:
                raise ValueError(f"no utilization for {name} {precision}: give figures or carry one")
    return out


def _has_tensor_cores(acc: Accelerator, precision: str) -> bool:
    return precision == "bf16" or acc.fp8_flops is not None


UTILIZATIONS = derive()
"""The table :func:`utilization` reads."""


def precision_of(compute_dtype: str) -> str:
    """The precision a compute dtype prices at: "bfloat16"/"float16" -> "bf16", "float8" -> "fp8".

    Raises:
        BadInputError: any other dtype (float32 has no tensor-core figure here).
    """
    for precision, dtype in (("bf16", "bfloat16"), ("bf16", "float16"), ("fp8", "float8")):
        if compute_dtype == dtype:
            return precision
    raise BadInputError(f"no published prefill utilization for {compute_dtype}: price a bfloat16, float16 or fp8 "
                        f"model")


def utilization(accelerator: str, precision: str) -> Utilization:
    """The published prefill utilization of ``accelerator`` (a ``--hardware`` name) at ``precision`` ("bf16" or
    "fp8").

    Raises:
        BadInputError: an accelerator with no figure at that precision (the A100 has no FP8 tensor cores; an
            accelerator built outside :data:`kvcli.model.hardware.ACCELERATORS`).
    """
    try:
        return UTILIZATIONS[accelerator, precision]
    except KeyError:
        raise BadInputError(f"--hardware {accelerator} has no {precision} tensor cores or no published prefill "
                            f"utilization at {precision}: give --mfu, or price another precision") from None


def accelerator_utilizations(acc: Accelerator) -> dict:
    """``kvcli hardware --json``'s MFU fields of one accelerator: ``mfu_bf16`` and ``mfu_fp8`` (``{value, low,
    high}``, or null without tensor cores at that precision) and ``mfu_basis`` (each one's rule and figures)."""
    entries = {p: UTILIZATIONS.get((acc.name, p)) for p in PRECISIONS}
    return {**{f"mfu_{p}": (u.to_dict() if u else None) for p, u in entries.items()},
            "mfu_basis": {p: (u.basis() if u else None) for p, u in entries.items()}}
