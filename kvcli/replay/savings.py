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
  overhead (a flat rate, a profile or a named accelerator: counts through the network model) is not timed and has
  none.

Recommendation (:func:`recommend`): chunk sizes are compared in pairs with the same coefficient draws (the curve's
uncertainty is common to every size of a trace and cancels in a comparison); a size beats another when the 95 %
interval of their difference is above 0 and the difference is at least ``TIE_TOLERANCE`` of the best net benefit.
That tolerance is the run-to-run drift of such differences, which one run's intervals do not see: Redis timings
(wall time) swing with the machine's load between runs, and the curve's shape with the points calibrated; across
repeats of the README's main job the relative difference between two sizes moved by up to 3 percentage points
(bench/bench_recommendation.py, docs/measurements.md). Where the overheads are timed here, they move further
between runs than one run's interval says (up to 11x beside a CPU hog, :data:`TIMED_OVERHEAD_DRIFT`) while the
savings, timed in CPU time, move a point or two: the sizes are then compared on their savings, with the tolerance
widened where they are extrapolated (:data:`EXTRAPOLATION_DRIFT`), and the nets say whether caching pays.

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
TIMED_OVERHEAD_DRIFT = 11.0
"""How far a chunk size's overhead timed on this machine's Redis moved between runs: beside a one-core CPU hog on a
2-vCPU machine its critical path moved up to 11x between 5 runs of the main job where it was above 50 ms, 28x for
a 6 ms one (bench/bench_verdicts.py, docs/measurements.md): why a timed run compares savings (:func:`recommend`)."""
PAYS_OVER_TIMED = 2.0
"""A timed run's caching pays "beyond noise" only where the saving is more than this many times the overheads timed
here, without the blocks of requests a stall inflated (:func:`recommend`): another run may time them twice over
(5 runs of the main job beside a CPU hog: a trace's overheads moved 2.5x and more between runs)."""
STALL_SECONDS = 0.18
"""A timed run's caching pays "beyond noise" only where the saving is more than this, in seconds: the most one
stall of this machine added to a small trace's timed overheads between runs of the main job beside a CPU hog
(openai_batch_handmade: 15 -> 191 ms, tokens_small: 6 -> 165 ms; bench/bench_verdicts.py, docs/measurements.md):
a saving below it is decided by the run-to-run spread."""
EXTRAPOLATION_DRIFT = 0.15
"""How far the relative difference of two chunk sizes' savings moves between runs, per unit of the share of them
extrapolated beyond the calibrated range: by up to 10.5 points between 5 runs of the main job beside a CPU hog on
the Mooncake sample, 99.8% extrapolated (the calibration's long points move the curve's attention terms), where
calibrated savings moved under a point (bench/bench_verdicts.py, docs/measurements.md)."""


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

    def typical_overhead(self, part: str) -> float:
        """The ``part`` ("critical" or "background") overhead of the whole trace at its median rate per prompt token
        across up to :data:`BLOCKS` consecutive blocks of requests (seconds): the total without the blocks a stall
        of this machine inflated (a lookup that waited 150 ms for the CPU), which the plain sum keeps."""
        x = np.asarray(getattr(self, f"{part}_seconds"), dtype=np.float64)
        w = np.asarray(self.prompt_tokens, dtype=np.float64)
        blocks = min(BLOCKS, x.size)
        if blocks < 2:
            return float(x.sum())
        edges = np.arange(blocks + 1) * x.size // blocks
        rates = [x[a:b].sum() / max(w[a:b].sum(), 1.0) for a, b in zip(edges[:-1], edges[1:])]
        return float(np.median(rates) * w.sum())

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
    ``net_async`` = saved - critical. FLOPs exact. ``typical_overheads``: the critical and background overheads
    timed here without the blocks of requests a stall inflated (:meth:`Ledger.typical_overhead`; None: priced).
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
    draws_saved: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    typical_overheads: tuple[float, float] | None = None  # critical, background without stalled blocks (timed)

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
        draws_sync=saved_draws - crit_draws - back_draws, draws_async=saved_draws - crit_draws,
        draws_saved=saved_draws,
        typical_overheads=(ledger.typical_overhead("critical"), ledger.typical_overhead("background"))
        if overhead_spread is None else None)


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


@dataclass(frozen=True)
class TimedSavings:
    """What :func:`recommend` decides on where the overheads were timed here: each chunk size's saved prefill
    (``saved``), its bootstrap draws (``draws``, paired with the other sizes'), the share of it from prompts beyond
    the calibrated range (``beyond``, 0 to 1) and the overheads timed in its net benefit (``overhead``, seconds)."""

    saved: Interval
    draws: np.ndarray
    beyond: float = 0.0
    overhead: float = 0.0


def recommend(nets: dict[int, Interval], mode: str = "async", draws: dict[int, np.ndarray] | None = None,
              timed: dict[int, TimedSavings] | None = None) -> Verdict:
    """Pick a chunk size from net benefits with intervals (``{chunk size: Interval}``, seconds). ``mode`` names
    the stores the nets assume, for the message: "async", "sync", or "mixed" (async, but sync at the sizes whose
    background work the trace's span cannot absorb).

    Priced (``timed`` None: nothing timed here). Not caching is a candidate too, with a net benefit of exactly 0:
    "none" when no size's interval reaches above 0, "noise" when the best size's interval reaches 0 (or its value
    is not above 0). Otherwise the best size (largest point value) is recommended when it beats each other size by
    more than their intervals: with ``draws`` (each size's bootstrap draws of its net benefit, drawn with the same
    cost-curve coefficients), when the 95 % interval of the paired difference is above 0 (the curve's common
    uncertainty, the same for every size of a trace, cancels in a comparison); without draws, when the best one's
    interval lies above the other's. Either way the difference must also be at least :data:`TIE_TOLERANCE` of the
    best net benefit (module docstring). Sizes it does not beat tie with it.

    Timed here (``timed``: each size's saving and timed overhead). The overheads timed on this machine's Redis move
    up to 11x between runs (:data:`TIMED_OVERHEAD_DRIFT`), enough to reorder sizes whose savings differ by 20%,
    while the savings, timed in CPU time, move a point or two: so the sizes are compared the same way on their
    saved prefill, the best being the one that saves most, with the tolerance grown by
    :data:`EXTRAPOLATION_DRIFT` times the share of the savings extrapolated beyond the calibrated range; "none"
    when nothing is saved, "noise" when the best one's saving (its interval's low end) is not above
    :data:`PAYS_OVER_TIMED` times its timed overheads (``overhead``: their typical total, without stalled blocks)
    and :data:`STALL_SECONDS`. A single chunk size, with no other to beat,
    is recommended when its interval lies above 0 (its text says it was the only one).
    """
    how = {"async": "stores in the background", "sync": "stores on the request's path",
           "mixed": "stores in the background, on the request's path where the background cannot keep up"}[mode]
    if not nets:
        return Verdict(None, "none", (), "no chunk size was replayed")
    if timed is None:
        compared, paired, tolerance = nets, draws, dict.fromkeys(nets, TIE_TOLERANCE)
    else:
        compared = {cs: timed[cs].saved for cs in nets}
        paired = {cs: timed[cs].draws for cs in nets}
    order = sorted(nets, key=lambda cs: (-compared[cs].value, cs))
    best = order[0]
    lead = compared[best]
    if timed is None:
        if all(iv.high <= 0 for iv in nets.values()):
            return Verdict(None, "none", (), f"no chunk size pays off ({how}): every net benefit is <= 0", best)
        if lead.low <= 0:
            hope = max(order, key=lambda cs: (nets[cs].high, -cs))
            return Verdict(None, "noise", (hope,), f"no chunk size pays off beyond noise ({how}): the most "
                                                   f"hopeful, {hope}, nets {fmt_interval(nets[hope])} s, an "
                                                   f"interval that reaches 0", hope)
    else:
        if all(t.saved.high <= 0 for t in timed.values()):
            return Verdict(None, "none", (), f"no chunk size pays off ({how}): none saves any prefill", best)
        if lead.low <= max(PAYS_OVER_TIMED * timed[best].overhead, STALL_SECONDS):
            return Verdict(None, "noise", (best,), f"no chunk size pays off beyond noise ({how}): the one that "
                                                   f"saves most, {best}, saves {fmt_interval(lead)} s, not "
                                                   f"{PAYS_OVER_TIMED:g}x the {sig(timed[best].overhead)} s of "
                                                   f"overheads timed here and {STALL_SECONDS:g} s (one stall of "
                                                   f"this machine's timings: the run-to-run spread decides it)",
                           best)
        tolerance = {cs: TIE_TOLERANCE + EXTRAPOLATION_DRIFT * max(timed[cs].beyond, timed[best].beyond)
                     for cs in nets}

    def near(cs: int) -> bool:
        return lead.value - compared[cs].value < tolerance[cs] * lead.value

    def beaten(cs: int) -> bool:
        if near(cs):
            return False
        if paired is not None and cs in paired and best in paired and len(paired[cs]) and len(paired[best]):
            return float(np.percentile(paired[best] - paired[cs], (100 - LEVEL) / 2)) > 0
        return lead.low > compared[cs].high

    tied = tuple(sorted([best] + [cs for cs in order[1:] if not beaten(cs)]))
    what = "net benefit" if timed is None else "saved prefill (overheads timed here move too much between runs)"
    if len(nets) == 1:
        return Verdict(best, "clear", tied, f"chunk size {best} ({how}): the only size compared, and its {what}'s "
                                            f"interval lies above 0", best)
    if len(tied) == 1:
        return Verdict(best, "clear", tied, f"chunk size {best} ({how}): its {what} beats every other size's by "
                                            f"more than their intervals and {TIE_TOLERANCE:.0%}", best)
    close = [cs for cs in tied if cs != best and near(cs)]
    widened = [cs for cs in close if lead.value - compared[cs].value >= TIE_TOLERANCE * lead.value]
    rest = [cs for cs in tied if cs != best and cs not in close]
    reasons = [text for text, sizes in (
        (f"within {TIE_TOLERANCE:.0%} of the best's", [cs for cs in close if cs not in widened]),
        ("within the run-to-run drift of savings extrapolated beyond the calibrated range", widened),
        ("within their intervals", rest)) if sizes]
    return Verdict(None, "tie", tied, f"chunk sizes {', '.join(map(str, tied))} tie ({how}): the differences "
                                      f"between their {'net benefits' if timed is None else 'savings'} are "
                                      f"{' or '.join(reasons)}; of them, {max(tied)} writes the fewest objects",
                   max(tied))


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
