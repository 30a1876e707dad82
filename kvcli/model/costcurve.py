"""Prefill time as a function of new and cached tokens, fitted from measured prefills.

Model: ``t(n, c) = a + b * n + d * n * (c + (n + 1) / 2)`` seconds for ``n`` new tokens after ``c`` cached ones.

* ``a``: fixed overhead per call (Python, kernel launches, the one-row LM head), seconds.
* ``b``: per-token linear work (projections, MLP, norms), seconds per token.
* ``d``: attention, seconds per (query, key) pair. New token ``i`` (0-based) attends to ``c + i + 1`` keys, so a
  call computes ``sum_i (c + i + 1) = n * (c + (n + 1) / 2)`` pairs (causal).

All three are fitted by non-negative least squares: a negative overhead or cost per pair has no physical meaning
and would make predictions for unmeasured (n, c) go negative.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from kvcli.errors import BadInputError


@dataclass(frozen=True)
class PrefillSample:
    """One timed prefill: ``new_tokens`` computed after ``cached_tokens`` reused ones, in ``seconds``."""

    new_tokens: int
    cached_tokens: int
    seconds: float


def _features(new_tokens, cached_tokens) -> np.ndarray:
    """Design matrix ``[..., 3]``: columns 1, n, n * (c + (n + 1) / 2)."""
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    n, c = np.broadcast_arrays(n, c)
    return np.stack([np.ones_like(n), n, n * (c + (n + 1) / 2)], axis=-1)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for 3 unknowns: the best feasible least-squares fit over the 8 subsets of
    free coefficients (the others fixed at 0). Columns are scaled to unit norm for conditioning."""
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y * y))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            sol, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(x.shape[1])
            coef[list(cols)] = sol
            err = float(np.sum((xs @ coef - y) ** 2))
            if err < best_err:
                best, best_err = coef, err
    return best / scale


@dataclass(frozen=True)
class CostCurve:
    """Fitted prefill cost ``t(n, c) = a + b*n + d*n*(c + (n+1)/2)`` seconds (see the module docstring).

    Attributes:
        a: seconds per call. b: seconds per new token. d: seconds per attended (query, key) pair.
        samples: number of samples the fit used (0 when not fitted); points: distinct (n, c) points.
        r2: coefficient of determination on the per-point minima (None when not fitted).
        max_rel_error: largest ``|predicted - measured| / measured`` over the points (None when not fitted).
        max_tokens: the longest prompt (new + cached tokens) among the fitted points; beyond it is extrapolation.
    """

    a: float
    b: float
    d: float
    samples: int = 0
    points: int = 0
    r2: float | None = None
    max_rel_error: float | None = None
    max_tokens: int = 0

    @classmethod
    def fit(cls, samples) -> CostCurve:
        """Fit by non-negative least squares on the per-(n, c) MINIMUM of the samples' seconds.

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
        a, b, d = _nnls(x, y)
        pred = x @ np.array([a, b, d])
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        ss_res = float(np.sum((pred - y) ** 2))
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
        rel = np.abs(pred - y) / np.where(y > 0, y, np.inf)
        longest = int(max(n + c for n, c in best))
        return cls(float(a), float(b), float(d), len(samples), len(best), r2, float(rel.max()), longest)

    @classmethod
    def from_tokens_per_second(cls, tokens_per_second: float) -> CostCurve:
        """A flat rate: ``t = n / tokens_per_second`` (no overhead, no attention term). Raises BadInputError if <= 0."""
        if not tokens_per_second > 0:
            raise BadInputError(f"tokens per second must be positive, got {tokens_per_second}")
        return cls(0.0, 1.0 / tokens_per_second, 0.0)

    def predict(self, new_tokens, cached_tokens=0):
        """Predicted seconds to prefill ``new_tokens`` after ``cached_tokens``; a float for scalars, else an array
        (numpy broadcasting). ``new_tokens == 0`` costs 0 (nothing to compute: a full cache hit)."""
        n = np.asarray(new_tokens, dtype=np.float64)
        t = _features(n, cached_tokens) @ np.array([self.a, self.b, self.d])
        t = np.where(n > 0, t, 0.0)
        return float(t) if t.ndim == 0 else t

    def seconds(self, new_tokens: int, cached_tokens: int) -> float:
        """:meth:`predict` for one pair of ints (tokens), in plain Python floats: the same sum in the same order
        (``a * 1 + b * n + d * pairs``), so the same value to the last bit, without numpy's per-call overhead (the
        routing simulator calls it once per prefill)."""
        if new_tokens <= 0:
            return 0.0
        n = float(new_tokens)
        return self.a * 1.0 + self.b * n + self.d * (n * (float(cached_tokens) + (n + 1.0) / 2.0))

    def tokens_per_second(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill throughput, new tokens per second, for ``new_tokens`` after ``cached_tokens``."""
        return new_tokens / self.predict(new_tokens, cached_tokens)

    def to_dict(self) -> dict:
        """Coefficients and fit quality, JSON-ready."""
        return {"a_seconds": self.a, "b_seconds_per_token": self.b, "d_seconds_per_pair": self.d,
                "samples": self.samples, "points": self.points, "r2": self.r2,
                "max_rel_error": self.max_rel_error, "max_tokens": self.max_tokens}


def calibrate(model, lengths=(64, 256, 1024), cached=(0, 512), repeats: int = 2, seed: int = 0) -> list[PrefillSample]:
    """Time real prefills of random tokens at every (new, cached) point of ``lengths x cached``.

    For each cached length the prefix KV is computed once, untimed; then each repeat times every point once
    (interleaved, so a slow spell of the machine spreads over points instead of hitting one). One untimed warm-up
    prefill comes first. The timer is ``time.perf_counter`` around ``model.prefill`` (last-token logits, as
    serving), with the device synchronized. About 3 s in all for the ``cpu`` preset on a 2-vCPU machine.

    Args:
        model: a :class:`kvcli.model.LocalModel`.
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
    samples = []
    for _ in range(repeats):
        for c in cached:
            for n in lengths:
                start = time.perf_counter()
                model.prefill(tokens[c:c + n], prefixes[c])
                model.synchronize()
                samples.append(PrefillSample(n, c, time.perf_counter() - start))
    return samples
