"""What a chunk size saves, with an interval, and the recommendation that follows: :class:`Ledger` (per request
records, kept during the replay), :func:`summarize` (savings, shares, FLOPs, net benefit with intervals) and
:func:`recommend` (a chunk size only when it beats the runner-up by more than their intervals).

Savings, per request of ``n`` prompt tokens reusing ``r`` (hit tokens, at most ``n - 1``: the last token is always
computed): ``t(n, 0) - t(n - r, r)``. A measured request contributes its timed difference on the ``L`` tokens it ran
(its prompt, or its first ``L`` tokens when the measuring budget truncated it); the prefill cost gives the rest:
``cost(n, r) - cost(L, r_L)`` (0 when nothing was truncated; everything for an estimated request). The cost is a
:class:`~kvcli.model.costcurve.PrefillCost`: a curve calibrated in this run, a profile measured on other hardware,
or a roofline of a named accelerator; it sums its seconds over the ledger's requests (a fitted curve in one dot
product of summed features) under its point estimate and under each of its draws.

Intervals (95 %, percentiles of ``DRAWS`` bootstrap draws, seeded: the same inputs give the same interval):

* the cost part: the cost's own draws (a fitted curve: coefficient draws from the calibration's residual
  bootstrap, :meth:`CostCurve.draws`; a roofline: utilizations across their published range);
* every timing: multiplied by ``1 + x`` with ``x`` drawn from this run's relative timing noise: for a measured
  prefill, the calibration's relative residuals (how far a timed prefill strays from the curve); for an overhead
  total (critical path, background), the transfer calibration's repeat spread (``t / median - 1`` of chunk SETs
  and GETs on the same server). A measured full prefill shared by the chunk sizes gets one draw, so the sizes'
  comparison stays paired; suffix prefills draw independently per chunk size;
* an overhead total (critical path, background) summed from this run's wall times: its relative spread is the
  larger of what this run measured of it: the spread of the overhead per prompt token across ``BLOCKS``
  consecutive blocks of the trace's requests, and the repeat spread of the transfer calibration (how far one
  timing of the server strays: a robust standard deviation, :func:`kvcli.replay.network.repeat_spread`) (normal
  draws with that relative standard deviation, clipped at 0). A priced
  overhead (a profile or a named accelerator: counts through the network model) is not timed and has none.

Recommendation (:func:`recommend`): chunk sizes are compared in pairs with the same coefficient draws (the curve's
uncertainty is common to every size of a trace and cancels in a comparison); a size beats another when the 95 %
interval of their difference is above 0 and the difference is at least ``TIE_TOLERANCE`` of the best net benefit.
That tolerance is the run-to-run drift of such differences, which one run's intervals do not see: Redis timings
(wall time) swing with the machine's load between runs, and the curve's shape with the points calibrated; across
repeats of the README's main job the relative difference between two sizes moved by up to 3 percentage points
(bench/bench_recommendation.py, docs/measurements.md).

Saved FLOPs are exact (:func:`kvcli.model.flops.saved_prefill_flops` on the model's shapes): no interval.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcli.model.costcurve import PrefillCost
from kvcli.model.flops import prefill_flops, saved_prefill_flops
from kvcli.model.presets import ModelConfig

DRAWS = 400
LEVEL = 95.0
BLOCKS = 10
TIE_TOLERANCE = 0.05


@dataclass
class Ledger:
    """One chunk size's per-request records (tokens; seconds). ``measured_tokens`` is 0 for an estimated request."""

    prompt_tokens: list[int] = field(default_factory=list)
    reused_tokens: list[int] = field(default_factory=list)
    measured_tokens: list[int] = field(default_factory=list)
    measured_reused: list[int] = field(default_factory=list)
    # (index of the measured full prefill, its seconds, the suffix prefill's seconds or None when nothing was
    # reused: the cached path was the full prefill itself, saving exactly 0), one per measured request
    timings: list[tuple[int, float, float | None]] = field(default_factory=list)
    critical_seconds: list[float] = field(default_factory=list)
    background_seconds: list[float] = field(default_factory=list)

    def add(self, prompt: int, reused: int, measured: int = 0, measured_reused: int = 0,
            timing: tuple[int, float, float | None] | None = None, critical: float = 0.0,
            background: float = 0.0) -> None:
        """Record one request: ``prompt`` tokens reusing ``reused``; measured on its first ``measured`` tokens
        reusing ``measured_reused``, with ``timing = (full id, full seconds, suffix seconds)``; its critical-path
        and background overhead as accounted on the given server (seconds)."""
        self.prompt_tokens.append(prompt)
        self.reused_tokens.append(reused)
        self.measured_tokens.append(measured)
        self.measured_reused.append(measured_reused)
        self.critical_seconds.append(critical)
        self.background_seconds.append(background)
        if timing is not None:
            self.timings.append(timing)

    def overhead_spread(self, part: str) -> float:
        """Relative standard deviation of the ``part`` ("critical" or "background") overhead per prompt token across
        up to :data:`BLOCKS` consecutive blocks of requests (0 with fewer than 2 requests or no overhead)."""
        x = np.asarray(getattr(self, f"{part}_seconds"), dtype=np.float64)
        w = np.asarray(self.prompt_tokens, dtype=np.float64)
        blocks = min(BLOCKS, x.size)
        if blocks < 2 or x.sum() <= 0:
            return 0.0
        edges = np.arange(blocks + 1) * x.size // blocks
        rates = np.array([x[a:b].sum() / max(w[a:b].sum(), 1.0) for a, b in zip(edges[:-1], edges[1:])])
        return float(rates.std(ddof=1) / rates.mean()) if rates.mean() > 0 else 0.0


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval (same unit)."""

    value: float
    low: float
    high: float

    def to_dict(self, unit: str = "") -> dict:
        """``{"value_<unit>", "low_<unit>", "high_<unit>"}``."""
        suffix = f"_{unit}" if unit else ""
        return {f"value{suffix}": self.value, f"low{suffix}": self.low, f"high{suffix}": self.high}


@dataclass(frozen=True)
class Savings:
    """One chunk size's savings and net benefit (seconds unless named otherwise).

    ``saved`` = ``saved_measured`` + ``saved_estimated``; ``share`` = saved / ``trace_prefill`` (the whole trace's
    prefill time without a cache; None without any); ``beyond_share``: the share of ``saved`` from prompts longer
    than the longest calibrated full prefill (None when nothing is saved); ``critical`` (lookup, transfer,
    deserialize) delays the first token, ``background``
    (serialize, store) occupies the server and the link; ``net_sync`` = saved - critical - background,
    ``net_async`` = saved - critical. FLOPs exact.
    """

    saved: Interval
    saved_measured: float
    saved_estimated: float
    trace_prefill: Interval
    share: Interval | None
    beyond_share: float | None
    saved_flops: float
    trace_flops: float
    critical: float
    background: float
    net_sync: Interval
    net_async: Interval
    draws_sync: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    draws_async: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)

    def net(self, mode: str) -> Interval:
        """The net benefit for ``mode`` "async" or "sync"."""
        return self.net_async if mode == "async" else self.net_sync

    def net_draws(self, mode: str) -> np.ndarray:
        """The net benefit's bootstrap draws ``[DRAWS]`` for ``mode`` (paired with other chunk sizes' draws)."""
        return self.draws_async if mode == "async" else self.draws_sync

    def to_dict(self) -> dict:
        """JSON-ready, unit-suffixed."""
        return {"saved_prefill_seconds": self.saved.to_dict("seconds"),
                "saved_prefill_seconds_measured": self.saved_measured,
                "saved_prefill_seconds_estimated": self.saved_estimated,
                "trace_prefill_seconds": self.trace_prefill.to_dict("seconds"),
                "saved_prefill_share": self.share.to_dict() if self.share is not None else None,
                "saved_beyond_calibration_share": self.beyond_share,
                "saved_prefill_flops": self.saved_flops, "trace_prefill_flops": self.trace_flops,
                "saved_prefill_flops_share": self.saved_flops / self.trace_flops if self.trace_flops else None,
                "critical_path_seconds": self.critical, "background_seconds": self.background,
                "net_benefit_sync_seconds": self.net_sync.to_dict("seconds"),
                "net_benefit_async_seconds": self.net_async.to_dict("seconds")}


def _interval(point: float, draws: np.ndarray) -> Interval:
    lo, hi = np.percentile(draws, [(100 - LEVEL) / 2, 100 - (100 - LEVEL) / 2])
    return Interval(float(point), float(min(lo, point)), float(max(hi, point)))


def _priced(cost: PrefillCost, n, r, m, mr, draws: np.ndarray | None = None):
    """What ``cost`` prices of the requests ``(n, r, m, mr)`` (module docstring): ``(saved, full)`` seconds, the
    estimated saving and full prefill time, summed; under each of ``draws`` (``[reps]`` each) when given."""
    zero = np.zeros(len(n), dtype=np.int64)
    full = [(1, n, zero), (-1, m, zero)]
    saved = full + [(-1, n - r, r), (1, m - mr, mr)]
    if draws is None:
        return cost.total(saved), cost.total(full)
    return cost.totals(draws, saved), cost.totals(draws, full)


def priced_saving(cost: PrefillCost, prompt_tokens: np.ndarray, reused_tokens: np.ndarray,
                  draws: np.ndarray) -> Interval:
    """What ``cost`` prices the saving of requests of ``prompt_tokens`` reusing ``reused_tokens`` at (seconds, its
    95% interval over the cost's ``draws``: :meth:`~kvcli.model.costcurve.PrefillCost.draws`), every request
    estimated (module docstring)."""
    n = np.asarray(prompt_tokens, dtype=np.int64)
    r = np.asarray(reused_tokens, dtype=np.int64)
    if not len(n):
        return Interval(0.0, 0.0, 0.0)
    zero = np.zeros(len(n), dtype=np.int64)
    point = _priced(cost, n, r, zero, zero)[0]
    return _interval(point, _priced(cost, n, r, zero, zero, draws)[0])


def summarize(ledger: Ledger, curve: PrefillCost, critical: float, background: float, noise,
              model: ModelConfig | None, seed: int = 0, coef_draws: np.ndarray | None = None,
              stream: int = 0, overhead_spread: float | None = None, overhead_floor: float = 0.0) -> Savings:
    """Savings, shares, FLOPs and net benefits of one chunk size, with intervals (module docstring).

    Args:
        ledger: the chunk size's per-request records.
        curve: the prefill cost that prices what was not measured.
        critical, background: overhead totals (seconds) of the critical path and of background work.
        noise: relative noise samples of a timed prefill (e.g. ``[0.05, -0.02, ...]``); empty for none.
        model: the model's shapes for exact FLOPs (None: FLOPs reported as 0).
        seed: for the draws. coef_draws: ``curve.draws(DRAWS, seed)``, passed in to share them across chunk sizes.
        stream: this chunk size's own stream of timing-noise draws (its index): overhead and suffix-prefill noise
            is independent between chunk sizes; a measured full prefill's noise is the same for all of them.
        overhead_spread: the overheads' relative spread when they are priced rather than summed from this run's
            wall times (None: from the ledger, module docstring).
        overhead_floor: the least relative spread of an overhead summed from wall times: how far one timing of
            the server strays (the transfer calibration's repeats).
    """
    n = np.asarray(ledger.prompt_tokens, dtype=np.int64)
    r = np.asarray(ledger.reused_tokens, dtype=np.int64)
    m = np.asarray(ledger.measured_tokens, dtype=np.int64)
    mr = np.asarray(ledger.measured_reused, dtype=np.int64)
    beyond = n > curve.longest_full_tokens if curve.points_data else np.zeros(len(n), dtype=bool)
    draws = curve.draws(DRAWS, seed) if coef_draws is None else coef_draws
    rng = np.random.default_rng([seed, 1, stream])
    noise = np.asarray(noise, dtype=np.float64)

    def jitter(shape, gen=rng) -> np.ndarray:
        return 1.0 + (gen.choice(noise, size=shape) if noise.size else np.zeros(shape))

    ids = sorted({t[0] for t in ledger.timings})
    t_full = {i: s for i, s, _ in ledger.timings}
    full_j = {i: jitter(DRAWS, np.random.default_rng([seed, 2, i])) for i in ids}
    measured_full = sum(t_full.values())
    measured_saved = sum(f - s for _, f, s in ledger.timings if s is not None)
    saved_draws, full_draws = _priced(curve, n, r, m, mr, draws) if len(n) else (np.zeros(DRAWS), np.zeros(DRAWS))
    for i, f, s in ledger.timings:
        if s is not None:
            saved_draws = saved_draws + f * full_j[i] - s * jitter(DRAWS)
    for i in ids:
        full_draws = full_draws + t_full[i] * full_j[i]
    estimated, estimated_full = _priced(curve, n, r, m, mr) if len(n) else (0.0, 0.0)
    saved = measured_saved + estimated
    trace_prefill = measured_full + estimated_full
    with np.errstate(divide="ignore", invalid="ignore"):
        share_draws = np.where(full_draws > 0, saved_draws / full_draws, 0.0)
    beyond_saved = _priced(curve, n[beyond], r[beyond], m[beyond], mr[beyond])[0] if beyond.any() else 0.0
    if overhead_spread is None:
        crit_spread = max(overhead_floor, ledger.overhead_spread("critical"))
        back_spread = max(overhead_floor, ledger.overhead_spread("background"))
    else:
        crit_spread = back_spread = overhead_spread
    crit_draws = critical * np.maximum(0.0, 1.0 + crit_spread * rng.standard_normal(DRAWS))
    back_draws = background * np.maximum(0.0, 1.0 + back_spread * rng.standard_normal(DRAWS))
    flops_saved = flops_total = 0.0
    if model is not None and len(n):
        flops_saved = float(np.sum(saved_prefill_flops(model, n, r)))
        flops_total = float(np.sum(prefill_flops(model, n, 0)))
    return Savings(
        saved=_interval(saved, saved_draws), saved_measured=measured_saved, saved_estimated=estimated,
        trace_prefill=_interval(trace_prefill, full_draws),
        share=_interval(saved / trace_prefill, share_draws) if trace_prefill > 0 else None,
        beyond_share=beyond_saved / saved if saved > 0 else None,
        saved_flops=flops_saved, trace_flops=flops_total, critical=critical, background=background,
        net_sync=_interval(saved - critical - background, saved_draws - crit_draws - back_draws),
        net_async=_interval(saved - critical, saved_draws - crit_draws),
        draws_sync=saved_draws - crit_draws - back_draws, draws_async=saved_draws - crit_draws)


@dataclass(frozen=True)
class Verdict:
    """The recommendation of one trace.

    ``chunk_size``: recommended, or None. ``kind``: "clear" (it beats every other chunk size by more than the
    interval of their difference), "tie" (``tied``: the sizes the best one does not beat that way), "noise" (the
    best net benefit's own interval reaches 0: not distinguishable from not caching), "none" (no chunk size has a
    positive net benefit). ``text``: one line, starting with :attr:`headline`. ``focus``: the chunk size the
    verdict points at: the recommended one, the tied one it names (the fewest objects), the most hopeful, or the
    best net benefit when none pays (None when nothing was replayed). ``lower_bound``: the chunk sizes whose hit
    figures are a lower bound (:meth:`understated`), so the savings compared may be short of the truth.
    """

    chunk_size: int | None
    kind: str
    tied: tuple[int, ...]
    text: str
    focus: int | None = None
    lower_bound: tuple[int, ...] = ()

    def understated(self, sizes: Sequence[int]) -> Verdict:
        """This verdict, its :attr:`text` ending with a clause that the hit figures at chunk ``sizes`` are a lower
        bound (the run's own chunks vanished from the server, or Redis calls failed: the notes say which); itself
        when ``sizes`` is empty."""
        if not sizes:
            return self
        at = f"chunk size {sizes[0]}" if len(sizes) == 1 else f"chunk sizes {', '.join(map(str, sizes))}"
        return dataclasses.replace(self, lower_bound=tuple(sizes), text=(
            f"{self.text}; the hit figures at {at} are a lower bound (the run's chunks vanished from the server, or "
            f"Redis calls failed: see the notes), so their savings may be understated"))

    @property
    def headline(self) -> str:
        """The verdict in a few words, as :attr:`text` starts: "chunk size 64", "chunk sizes 16, 64 tie", "no chunk
        size pays off beyond noise", "no chunk size pays off"."""
        if self.kind == "clear":
            return f"chunk size {self.chunk_size}"
        if self.kind == "tie":
            return f"chunk sizes {', '.join(map(str, self.tied))} tie"
        return "no chunk size pays off beyond noise" if self.kind == "noise" else "no chunk size pays off"


def recommend(nets: dict[int, Interval], mode: str = "async", draws: dict[int, np.ndarray] | None = None
              ) -> Verdict:
    """Pick a chunk size from net benefits with intervals (``{chunk size: Interval}``, seconds). ``mode`` names
    the stores the nets assume, for the message: "async", "sync", or "mixed" (async, but sync at the sizes whose
    background work the trace's span cannot absorb).

    Not caching is a candidate too, with a net benefit of exactly 0: "none" when no size's interval reaches above
    0, "noise" when the best size's interval reaches 0 (or its value is not above 0). Otherwise the best size
    (largest point value) is recommended when it beats each
    other size by more than their intervals: with ``draws`` (each size's bootstrap draws of its net benefit, drawn
    with the same cost-curve coefficients), when the 95 % interval of the paired difference is above 0 (the curve's
    common uncertainty, the same for every size of a trace, cancels in a comparison); without draws, when the best
    one's interval lies above the other's. Either way the difference must also be at least :data:`TIE_TOLERANCE`
    of the best net benefit (module docstring). Sizes it does not beat tie with it. A single chunk size, with no
    other to beat, is recommended when its interval lies above 0 (its text says it was the only one).
    """
    how = {"async": "stores in the background", "sync": "stores on the request's path",
           "mixed": "stores in the background, on the request's path where the background cannot keep up"}[mode]
    if not nets:
        return Verdict(None, "none", (), "no chunk size was replayed")
    order = sorted(nets, key=lambda cs: (-nets[cs].value, cs))
    best = order[0]
    top = nets[best]
    if all(iv.high <= 0 for iv in nets.values()):
        return Verdict(None, "none", (), f"no chunk size pays off ({how}): every net benefit is <= 0", best)
    if top.low <= 0:
        hope = max(order, key=lambda cs: (nets[cs].high, -cs))
        return Verdict(None, "noise", (hope,), f"no chunk size pays off beyond noise ({how}): the most hopeful, "
                                               f"{hope}, nets {fmt_interval(nets[hope])} s, an interval that "
                                               f"reaches 0", hope)

    def beaten(cs: int) -> bool:
        if top.value - nets[cs].value < TIE_TOLERANCE * top.value:
            return False
        if draws is not None and cs in draws and best in draws and len(draws[cs]) and len(draws[best]):
            return float(np.percentile(draws[best] - draws[cs], (100 - LEVEL) / 2)) > 0
        return top.low > nets[cs].high

    tied = tuple(sorted([best] + [cs for cs in order[1:] if not beaten(cs)]))
    if len(nets) == 1:
        return Verdict(best, "clear", tied, f"chunk size {best} ({how}): the only size compared, and its net "
                                            f"benefit's interval lies above 0", best)
    if len(tied) == 1:
        return Verdict(best, "clear", tied, f"chunk size {best} ({how}): its net benefit beats every other size's "
                                            f"by more than their intervals and {TIE_TOLERANCE:.0%}", best)
    near = [cs for cs in tied if cs != best and top.value - nets[cs].value < TIE_TOLERANCE * top.value]
    why = ("within their intervals" if not near else f"within {TIE_TOLERANCE:.0%} of the best's"
           if len(near) == len(tied) - 1 else f"within {TIE_TOLERANCE:.0%} of the best's or within their intervals")
    return Verdict(None, "tie", tied, f"chunk sizes {', '.join(map(str, tied))} tie ({how}): the differences "
                                      f"between their net benefits are {why}; of them, "
                                      f"{max(tied)} writes the fewest objects", max(tied))


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits with thousands separators: 268355 -> "268,000", 0.01234 -> "0.0123",
    -2.2 -> "-2.20"; below 0.001 in scientific notation: 0.0000143 -> "1.43e-05"."""
    if x == 0 or not np.isfinite(x):
        return "0" if x == 0 else str(x)
    if abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    decimals = digits - 1 - int(np.floor(np.log10(abs(x))))
    if decimals >= 0:
        return f"{x:,.{decimals}f}"
    return f"{round(x, decimals):,.0f}"


def fmt_interval(iv: Interval, digits: int = 3) -> str:
    """``"value [low, high]"`` to ``digits`` significant digits (the value's magnitude sets the rounding)."""
    return f"{sig(iv.value, digits)} [{sig(iv.low, digits)}, {sig(iv.high, digits)}]"
