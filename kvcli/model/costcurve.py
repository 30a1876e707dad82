"""Prefill time as a function of new and cached tokens, fitted from measured prefills.

Model: ``t(n, c) = a + b * n + d * n * (n + 1) / 2 + e * n * c`` seconds for ``n`` new tokens after ``c`` cached.

* ``a``: fixed overhead per call (Python, kernel launches, the one-row LM head), seconds.
* ``b``: per-token linear work (projections, MLP, norms), seconds per token.
* ``d``: causal attention among the new tokens, seconds per (query, key) pair: new token ``i`` (0-based) sees
  ``i + 1`` new keys, ``n * (n + 1) / 2`` pairs in all.
* ``e``: attention of the new tokens to the cached ones, seconds per pair, ``n * c`` pairs. A separate coefficient
  because it is a separate kernel call (:mod:`kvcli.model.attention`: unmasked over the cached keys, causal over
  the new ones) with its own efficiency; with ``d = e`` the model is the plain causal pair count
  ``n * (c + (n + 1) / 2)`` (:func:`kvcli.model.flops.attention_pairs`).

A saving follows: a hit of ``h`` tokens on a prompt of ``p`` saves ``t(p, 0) - t(p - h, h) = b * h +
d * h * (2p - h + 1) / 2 - e * (p - h) * h``.

All four are fitted by non-negative least squares on relative errors (each point weighted by 1 / its seconds, so
a 30 ms point and a 6 s point count alike: calibration spans prompts from 32 tokens to the trace's longest): a
negative overhead or cost per pair has no physical meaning and would make predictions for unmeasured (n, c) go
negative.

Spread: :meth:`CostCurve.draws` resamples the fit's relative residuals (a residual bootstrap, Efron & Tibshirani
1993, "An Introduction to the Bootstrap", section 9.5; residuals inflated by ``sqrt(N / (N - 4))`` for the 4 fitted
coefficients) and refits, giving coefficient draws whose predictions spread as far as the calibration's own
points scatter around the curve. Far outside the calibrated range the draws fan out: that is the extrapolation.
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvcli.errors import BadInputError


@dataclass(frozen=True)
class PrefillSample:
    """One timed prefill: ``new_tokens`` computed after ``cached_tokens`` reused ones, in ``seconds``."""

    new_tokens: int
    cached_tokens: int
    seconds: float


class PrefillCost(Protocol):
    """What prices a prefill of ``n`` new tokens after ``c`` cached ones, in seconds: a fitted :class:`CostCurve`
    (calibrated here, a flat rate, or a profile measured elsewhere) or a :class:`kvcli.model.roofline.Roofline`.

    ``points_data``: the timed points ``((new, cached, seconds), ...)`` it rests on (empty: not calibrated, so no
    range beyond which it extrapolates); ``longest_full_tokens``: the longest full prefill among them;
    ``residuals``: the relative noise of a timed prefill around it.
    """

    @property
    def points_data(self) -> tuple: ...

    @property
    def residuals(self) -> tuple: ...

    @property
    def longest_full_tokens(self) -> int: ...

    def predict(self, new_tokens, cached_tokens=0):
        """Seconds, numpy broadcasting (a float for scalars); 0 where ``new_tokens`` is 0."""

    def seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """Seconds for one pair of token counts."""

    def total(self, terms) -> float:
        """Seconds summed over requests and terms: ``terms`` is ``[(sign, new_tokens, cached_tokens), ...]``
        with arrays ``[requests]``, e.g. a saving ``[(1, p, 0), (-1, p - h, h)]``."""

    def draws(self, reps: int, seed: int = 0) -> np.ndarray:
        """``reps`` draws of what the cost is uncertain about, seeded (rows for :meth:`totals`)."""

    def totals(self, draws: np.ndarray, terms) -> np.ndarray:
        """:meth:`total` under each draw, ``[reps]``."""

    def to_dict(self) -> dict:
        """JSON-ready."""


@functools.lru_cache(maxsize=16)
def _bootstrap(points_data: tuple, residuals: tuple, coef: tuple, reps: int, seed: int) -> np.ndarray:
    """:meth:`CostCurve.draws` of a fitted curve, ``[reps, 4]``, read-only: computed once per curve and seed (a replay
    prices every trace with the same curve until the calibration grows, and each bootstrap is ``reps`` NNLS fits)."""
    n_points = len(points_data)
    pts = np.array(points_data, dtype=np.float64)
    x = _features(pts[:, 0], pts[:, 1])
    pred = x @ np.asarray(coef)
    resid = np.asarray(residuals) * np.sqrt(n_points / (n_points - 4))
    rng = np.random.default_rng(seed)
    ys = np.empty((reps, n_points))
    for i in range(reps):  # one draw at a time: the same resamples as ever for a seed
        ys[i] = pred * (1.0 + rng.choice(resid, size=n_points, replace=True))
    out = _weighted_nnls(np.broadcast_to(x, (reps, *x.shape)), np.maximum(ys, 1e-12))
    out.flags.writeable = False
    return out


def _features(new_tokens, cached_tokens) -> np.ndarray:
    """Design matrix ``[..., 4]``: columns 1, n, n * (n + 1) / 2, n * c."""
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    n, c = np.broadcast_arrays(n, c)
    return np.stack([np.ones_like(n), n, n * (n + 1) / 2, n * c], axis=-1)


def features(new_tokens, cached_tokens=0) -> np.ndarray:
    """The curve's design matrix ``[..., 4]`` (columns 1, n, n(n+1)/2, n*c; 0 where ``new_tokens == 0``): a
    prediction is ``features @ [a, b, d, e]``, so sums of features over many requests predict their total time."""
    f = _features(new_tokens, cached_tokens)
    return np.where(np.asarray(new_tokens)[..., None] > 0, f, 0.0)


def _summed(terms) -> np.ndarray:
    """``sum(sign * features(new, cached))`` over the terms and their requests, ``[4]``."""
    out = np.zeros(4)
    for sign, new_tokens, cached_tokens in terms:
        out += sign * features(new_tokens, cached_tokens).reshape(-1, 4).sum(axis=0)
    return out


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few unknowns, for a stack of problems at once: for each, the best
    feasible least-squares fit over the subsets of free coefficients (the others fixed at 0; the first best in
    the order of subsets, none first). ``x`` ``[..., points, k]``, ``y`` ``[..., points]`` -> ``[..., k]``.
    Columns are scaled to unit norm for conditioning; each subset is solved for the whole stack by its
    pseudo-inverse (SVD)."""
    k = x.shape[-1]
    scale = np.linalg.norm(x, axis=-2)  # [..., k]
    scale[scale == 0] = 1.0
    xs = x / scale[..., None, :]
    best = np.zeros((*x.shape[:-2], k))
    best_err = np.sum(y * y, axis=-1)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = xs[..., list(cols)]
            sol = np.einsum("...kp,...p->...k", np.linalg.pinv(sub), y)
            coef = np.zeros_like(best)
            coef[..., list(cols)] = sol
            err = np.sum((np.einsum("...pk,...k->...p", xs, coef) - y) ** 2, axis=-1)
            better = np.all(sol >= 0, axis=-1) & (err < best_err)
            best = np.where(better[..., None], coef, best)
            best_err = np.where(better, err, best_err)
    return best / scale


def prefill_clock(model):
    """The clock that times a prefill of ``model`` (seconds): the calling thread's CPU time when the model runs on
    the CPU with one torch thread (the work is all in this thread; time the machine gave to other processes is not
    counted, so timings repeat within a few percent on a loaded machine where wall time swings several-fold), else
    wall time (``time.perf_counter``: several threads, or a GPU, whose work the caller waits for)."""
    import torch

    device = getattr(model, "device", None)
    if getattr(device, "type", "cpu") == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def determines_curve(points) -> bool:
    """Whether prefills timed at ``points`` (``(new, cached)`` token pairs) determine all four coefficients: their
    design matrix (:func:`features`, each column scaled to its largest value) has rank 4. Four copies of one point
    do not (any a, b, d, e that meet it fit), nor do points without cached tokens (``e`` is free).
    """
    pairs = np.asarray(list(points), dtype=np.float64).reshape(-1, 2)
    if len(pairs) < 4:
        return False
    x = _features(pairs[:, 0], pairs[:, 1])
    x = x / np.maximum(np.abs(x).max(axis=0), 1e-300)
    return int(np.linalg.matrix_rank(x)) == 4


def _weighted_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`_nnls` minimizing relative errors: rows scaled by 1 / y (y > 0); stacks as :func:`_nnls`."""
    w = 1.0 / np.where(y > 0, y, 1.0)
    return _nnls(x * w[..., None], y * w)


@dataclass(frozen=True)
class CostCurve:
    """Fitted prefill cost ``t(n, c) = a + b*n + d*n*(n+1)/2 + e*n*c`` seconds (see the module docstring).

    Attributes:
        a: seconds per call. b: seconds per new token. d: seconds per causal (query, key) pair among the new
        tokens. e: seconds per (new, cached) pair.
        samples: number of samples the fit used (0 when not fitted); points: distinct (n, c) points.
        r2: coefficient of determination on the per-point minima (None when not fitted).
        max_rel_error: largest ``|predicted - measured| / measured`` over the points (None when not fitted).
        max_tokens: the longest prompt (new + cached tokens) among the fitted points; beyond it is extrapolation.
        points_data: the fitted points ``((new, cached, seconds), ...)`` (per-point minima), for :meth:`draws`.
        residuals: relative residuals ``measured / predicted - 1`` of those points.
    """

    a: float
    b: float
    d: float
    e: float = 0.0
    samples: int = 0
    points: int = 0
    r2: float | None = None
    max_rel_error: float | None = None
    max_tokens: int = 0
    points_data: tuple[tuple[int, int, float], ...] = ()
    residuals: tuple[float, ...] = ()

    @classmethod
    def fit(cls, samples) -> CostCurve:
        """Fit by non-negative least squares, on relative errors, to the per-(n, c) MINIMUM of the samples' seconds.

        This machine kind is noisy (stalls of 100+ ms, throttling to a fraction of full speed): a repeat can only
        be slowed down by a disturbance, never sped up, so the minimum is the least-disturbed run and the best
        estimate of the model's own cost. Means and medians would fold the VM's noise into the coefficients.

        Raises:
            BadInputError: no samples, a non-positive ``new_tokens``, a negative ``cached_tokens`` or ``seconds``.
        """
        samples = list(samples)
        if not samples:
            raise BadInputError("cannot fit a cost curve to no samples")
        best: dict[tuple[int, int], float] = {}
        for s in samples:
            if s.new_tokens < 1 or s.cached_tokens < 0 or not s.seconds >= 0:
                raise BadInputError(f"invalid prefill sample {s}")
            key = (s.new_tokens, s.cached_tokens)
            best[key] = min(best.get(key, float("inf")), s.seconds)
        points = np.array(list(best), dtype=np.float64)
        y = np.array(list(best.values()))
        x = _features(points[:, 0], points[:, 1])
        a, b, d, e = _weighted_nnls(x, y)
        pred = x @ np.array([a, b, d, e])
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        ss_res = float(np.sum((pred - y) ** 2))
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
        rel = np.abs(pred - y) / np.where(y > 0, y, np.inf)
        longest = int(max(n + c for n, c in best))
        resid = np.where(pred > 0, y / np.where(pred > 0, pred, 1.0) - 1.0, 0.0)
        data = tuple((int(n), int(c), float(t)) for (n, c), t in best.items())
        return cls(float(a), float(b), float(d), float(e), len(samples), len(best), r2, float(rel.max()), longest,
                   data, tuple(float(r) for r in resid))

    @property
    def coefficients(self) -> np.ndarray:
        """``[a, b, d, e]`` (see :func:`features`)."""
        return np.array([self.a, self.b, self.d, self.e])

    @property
    def longest_full_tokens(self) -> int:
        """The longest full prefill (no cached tokens) among the fitted points, tokens (0 when none): the
        calibrated range of the cost a hit saves."""
        return max((n for n, c, _ in self.points_data if c == 0), default=0)

    def draws(self, reps: int, seed: int = 0) -> np.ndarray:
        """Coefficient draws ``[reps, 4]`` (a, b, d, e) from a residual bootstrap (module docstring): each draw refits
        ``predicted * (1 + r)`` with ``r`` resampled from the relative residuals. Deterministic for a seed. A curve
        that was not fitted (a flat rate) or fitted to no more points than coefficients gives ``reps`` copies of
        its own coefficients: it carries no spread of its own."""
        coef = self.coefficients
        if len(self.points_data) <= 4 or not self.residuals:
            return np.tile(coef, (reps, 1))
        return _bootstrap(self.points_data, self.residuals, tuple(coef), reps, seed)

    @classmethod
    def from_tokens_per_second(cls, tokens_per_second: float) -> CostCurve:
        """A flat rate: ``t = n / tokens_per_second`` (no overhead, no attention term). Raises BadInputError if <= 0."""
        if not tokens_per_second > 0:
            raise BadInputError(f"tokens per second must be positive, got {tokens_per_second}")
        return cls(0.0, 1.0 / tokens_per_second, 0.0, 0.0)

    def predict(self, new_tokens, cached_tokens=0):
        """Predicted seconds to prefill ``new_tokens`` after ``cached_tokens``; a float for scalars, else an array
        (numpy broadcasting). ``new_tokens == 0`` costs 0 (nothing to compute: a full cache hit)."""
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(cached_tokens, dtype=np.float64)
        # term by term, in the order :meth:`seconds` adds them (so the two agree to the last bit)
        t = self.a * 1.0 + self.b * n + self.d * (n * (n + 1.0) / 2.0) + self.e * (n * c)
        t = np.where(n > 0, t, 0.0)
        return float(t) if t.ndim == 0 else t

    def seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """:meth:`predict` for one pair of ints (tokens), in plain Python floats: the same sum in the same order
        (``a * 1 + b * n + d * n(n+1)/2 + e * n c``), so the same value to the last bit, without numpy's per-call
        overhead (the routing simulator calls it once per prefill)."""
        if new_tokens <= 0:
            return 0.0
        n = float(new_tokens)
        return self.a * 1.0 + self.b * n + self.d * (n * (n + 1.0) / 2.0) + self.e * (n * float(cached_tokens))

    def tokens_per_second(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill throughput, new tokens per second, for ``new_tokens`` after ``cached_tokens``."""
        return new_tokens / self.predict(new_tokens, cached_tokens)

    def total(self, terms) -> float:
        """Seconds summed over requests and terms (:class:`PrefillCost`): the terms' features, summed with their
        signs, times the coefficients, one dot product however many requests (a difference of features is exact
        in integers, so a saving of a flat rate is exact too)."""
        return float(_summed(terms) @ self.coefficients)

    def totals(self, draws: np.ndarray, terms) -> np.ndarray:
        """:meth:`total` under each coefficient draw of :meth:`draws` (``[reps, 4]`` -> ``[reps]``)."""
        return draws @ _summed(terms)

    def to_dict(self) -> dict:
        """Coefficients and fit quality, JSON-ready."""
        return {"a_seconds": self.a, "b_seconds_per_token": self.b, "d_seconds_per_pair": self.d,
                "e_seconds_per_cached_pair": self.e, "samples": self.samples, "points": self.points, "r2": self.r2,
                "max_rel_error": self.max_rel_error, "max_tokens": self.max_tokens,
                "longest_full_tokens": self.longest_full_tokens, "relative_residuals": list(self.residuals)}


def calibrate(model, lengths=(64, 256, 1024), cached=(0, 512), repeats: int = 2, seed: int = 0) -> list[PrefillSample]:
    """Time real prefills of random tokens at every (new, cached) point of ``lengths x cached``.

    For each cached length the prefix KV is computed once, untimed; then each repeat times every point once
    (interleaved, so a slow spell of the machine spreads over points instead of hitting one). One untimed warm-up
    prefill comes first. The timer is ``time.perf_counter`` around ``model.prefill`` (last-token logits, as
    serving), with the device synchronized. About 3 s in all for the ``cpu`` preset on a 2-vCPU machine.

    Args:
        model: a :class:`kvcli.model.llama.LocalModel`.
        lengths: new-token counts (each >= 1). cached: cached-prefix lengths (0 = no prefix).
        repeats: timed runs per point. seed: for the random token ids.

    Returns:
        ``len(lengths) * len(cached) * repeats`` samples; fit them with :meth:`CostCurve.fit`.
    """
    if not lengths or min(lengths) < 1 or not cached or min(cached) < 0 or repeats < 1:
        raise BadInputError("calibrate needs lengths >= 1, cached >= 0 and repeats >= 1")
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, model.config.vocab, max(cached) + max(lengths), dtype=np.uint32)
    prefixes = {c: (model.prefill(tokens[:c])[1] if c else None) for c in sorted(set(cached))}
    model.prefill(tokens[:min(lengths)])
    model.synchronize()
    clock = prefill_clock(model)
    samples = []
    for _ in range(repeats):
        for c in cached:
            for n in lengths:
                start = clock()
                model.prefill(tokens[c:c + n], prefixes[c], kv_for="new")
                model.synchronize()
                samples.append(PrefillSample(n, c, clock() - start))
    return samples
