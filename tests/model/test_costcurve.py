"""kvcli.model.costcurve: exact recovery of known coefficients, min-of-repeats, flat rates, real calibration."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.model.costcurve import CostCurve, PrefillSample, calibrate
from kvcli.model.llama import build_model

POINTS = [(64, 0), (256, 0), (1024, 0), (64, 512), (256, 512), (1024, 512), (256, 3840)]


def _exact(a, b, d, points=POINTS):
    return [PrefillSample(n, c, a + b * n + d * n * (c + (n + 1) / 2)) for n, c in points]


@pytest.mark.parametrize("a, b, d", [(0.009, 3.2e-4, 1.6e-7), (0.0, 1e-3, 0.0), (0.02, 0.0, 5e-8), (0.0, 0.0, 2e-7)])
def test_fit_recovers_exact_coefficients(a, b, d):
    curve = CostCurve.fit(_exact(a, b, d))
    for got, want in ((curve.a, a), (curve.b, b), (curve.d, d), (curve.e, d)):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert curve.r2 == pytest.approx(1.0, abs=1e-12) and curve.max_rel_error < 1e-9
    assert curve.samples == curve.points == len(POINTS)


def test_hand_computed_prediction():
    curve = CostCurve(a=0.01, b=0.001, d=1e-6, e=1e-6)
    # 256 new after 768 cached: 0.01 + 0.256 + 1e-6 * 256 * (768 + 128.5) = 0.495504
    assert curve.predict(256, 768) == pytest.approx(0.495504, rel=1e-12)
    assert curve.predict(0, 768) == 0.0
    got = curve.predict(np.array([256, 256]), np.array([768, 0]))
    assert got == pytest.approx([0.495504, 0.01 + 0.256 + 1e-6 * 256 * 128.5], rel=1e-12)


def test_fit_uses_minimum_of_repeats():
    clean = _exact(0.01, 2e-4, 1e-7)
    # Every point repeated with disturbed (slower) runs; only the minimum of each point is the clean one.
    noisy = clean + [PrefillSample(s.new_tokens, s.cached_tokens, s.seconds * f) for s in clean for f in (1.5, 7.0)]
    curve = CostCurve.fit(noisy)
    assert (curve.a, curve.b, curve.d) == pytest.approx((0.01, 2e-4, 1e-7), rel=1e-9)
    assert curve.samples == 3 * len(POINTS) and curve.points == len(POINTS)


def test_fit_clamps_negative_coefficients_to_zero():
    # Data whose unconstrained fit wants a negative overhead: pure per-token cost minus a constant.
    samples = [PrefillSample(n, 0, 1e-3 * n - 0.05) for n in (100, 200, 400, 800)]
    curve = CostCurve.fit(samples)
    assert curve.a == 0.0 and curve.b > 0 and curve.d >= 0
    assert np.all(curve.predict(np.array([1, 10, 100])) > 0)


def test_from_tokens_per_second():
    curve = CostCurve.from_tokens_per_second(2000.0)
    assert (curve.a, curve.b, curve.d) == (0.0, 1 / 2000.0, 0.0)
    assert curve.predict(1000, 5000) == pytest.approx(0.5)
    assert curve.tokens_per_second(4096) == pytest.approx(2000.0)
    with pytest.raises(BadInputError):
        CostCurve.from_tokens_per_second(0)


def test_to_dict():
    d = CostCurve.fit(_exact(0.01, 2e-4, 1e-7)).to_dict()
    assert set(d) == {"a_seconds", "b_seconds_per_token", "d_seconds_per_pair", "samples", "points", "r2",
                      "max_rel_error", "max_tokens", "relative_residuals", "e_seconds_per_cached_pair",
                      "longest_full_tokens"}
    assert d["max_tokens"] == max(n + c for n, c in POINTS)
    assert d["samples"] == len(POINTS) and d["b_seconds_per_token"] == pytest.approx(2e-4)


@pytest.mark.parametrize("bad", [[], [PrefillSample(0, 0, 1.0)], [PrefillSample(4, -1, 1.0)]])
def test_fit_rejects_bad_samples(bad):
    with pytest.raises(BadInputError):
        CostCurve.fit(bad)


def test_calibrate_on_tiny_model():
    model = build_model("tiny", device="cpu")
    samples = calibrate(model, lengths=(8, 32), cached=(0, 16), repeats=2)
    assert len(samples) == 2 * 2 * 2
    assert {(s.new_tokens, s.cached_tokens) for s in samples} == {(8, 0), (32, 0), (8, 16), (32, 16)}
    assert all(s.seconds > 0 for s in samples)
    curve = CostCurve.fit(samples)
    assert curve.samples == 8 and curve.points == 4 and min(curve.a, curve.b, curve.d) >= 0


@settings(max_examples=500, deadline=None)
@given(a=st.floats(0, 1), b=st.floats(0, 1e-2), d=st.floats(0, 1e-5), e=st.floats(0, 1e-5),
       new=st.integers(-5, 2_000_000), cached=st.integers(0, 10_000_000))
def test_scalar_seconds_equal_predict_to_the_last_bit(a, b, d, e, new, cached):
    curve = CostCurve(a, b, d, e)
    assert curve.seconds(new, cached) == curve.predict(new, cached)


def test_scalar_seconds_hand_computed():
    curve = CostCurve(a=0.01, b=0.001, d=1e-6, e=1e-6)
    assert curve.seconds(256, 768) == curve.predict(256, 768) == pytest.approx(0.495504, rel=1e-12)
    assert curve.seconds(0, 768) == 0.0 and isinstance(curve.seconds(1, 0), float)
