"""kvcli.model.calibration: the planned points by hand, budgets, the pool across traces, interleaved timing of given
points, residual-bootstrap draws."""
from __future__ import annotations

import numpy as np
import pytest

from kvcli.errors import BadInputError
from kvcli.model.calibration import BASE_POINTS, Calibration, ladder, plan_points
from kvcli.model.costcurve import CostCurve, PrefillSample
from kvcli.model.llama import build_model


def test_ladder_and_plan_by_hand():
    assert ladder(1000, 2048) == []  # covered below the ladder (the base points reach 1,024)
    assert ladder(1500, 2048) == [2048]
    assert ladder(3000, 2048) == [2048, 4096]
    assert ladder(60_000, 4096, 4) == [4096, 16384, 65536]
    assert [p[1:] for p in plan_points(500)] == list(BASE_POINTS)
    assert plan_points(3000)[len(BASE_POINTS):] == [
        ("full", 2048, 0), ("full", 4096, 0), ("thin", 64, 4032), ("half", 1024, 1024), ("half", 2048, 2048)]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", "float32", "cpu", seed=0)


def test_budget_zero_times_only_the_base_points(tiny):
    cal = Calibration(tiny)
    cov = cal.cover(1500, 0.0)
    assert cov.points_added == len(BASE_POINTS)
    assert {(s.new_tokens, s.cached_tokens) for s in cal.samples} == set(BASE_POINTS)
    assert cov.skipped == ((2048, 0), (64, 4032), (1024, 1024))
    assert cov.longest_tokens == 1024 and cal.curve().longest_full_tokens == 1024
    assert all(s.seconds > 0 for s in cal.samples)


def test_cover_extends_the_pool_and_reuses_it(tiny):
    cal = Calibration(tiny)
    first = cal.cover(1500, 600.0)
    assert first.points_added == len(BASE_POINTS) + 3 and first.skipped == ()
    assert cal.curve().longest_full_tokens == 2048 and first.longest_tokens == 4096
    timed = len(cal.samples)
    again = cal.cover(1200, 600.0)  # the same ladder: nothing new to time
    assert again.points_added == 0 and len(cal.samples) == timed


def test_past_memory_cap_skips_thin_points(tiny):
    cal = Calibration(tiny, max_past_bytes=2000 * 1024)  # tiny: 1,024 KV bytes per token in fp32
    cov = cal.cover(1500, 600.0)
    assert cov.skipped == ((64, 4032),)  # its 4,032 cached tokens would take 4 MiB of random KV


def test_time_points_interleaves_and_skips_what_does_not_fit(tiny):
    cal = Calibration(tiny, max_past_bytes=100 * 1024)
    order = []
    skipped = cal.time_points([(32, 0), (16, 200), (64, 64)], 3, lambda done, total, p: order.append((done, p)))
    assert skipped == [(16, 200, "prefix KV of 200 tokens is 200.0 KiB, over the 100.0 KiB cap")]
    assert order == [(0, (32, 0)), (1, (64, 64)), (2, (32, 0)), (3, (64, 64)), (4, (32, 0)), (5, (64, 64)),
                     (6, (64, 64))]
    assert [(s.new_tokens, s.cached_tokens) for s in cal.samples] == [(32, 0)] * 3 + [(64, 64)] * 3
    with pytest.raises(BadInputError):
        cal.time_points([(32, 0), (32, 0)], 1)


def test_draws_exact_data_have_no_spread_and_noisy_data_are_seeded():
    points = [(32, 0), (128, 0), (512, 0), (1024, 0), (256, 256), (512, 512), (64, 960)]
    exact = CostCurve.fit([PrefillSample(n, c, 0.01 + 2e-4 * n + 3e-7 * n * (n + 1) / 2 + 5e-7 * n * c)
                           for n, c in points])
    assert np.allclose(exact.draws(50, seed=1), exact.coefficients, rtol=1e-6, atol=1e-15)
    rng = np.random.default_rng(0)
    noisy = CostCurve.fit([PrefillSample(n, c, (0.01 + 2e-4 * n + 3e-7 * n * (n + 1) / 2 + 5e-7 * n * c)
                                         * (1 + 0.2 * rng.standard_normal())) for n, c in points])
    a, b = noisy.draws(50, seed=1), noisy.draws(50, seed=1)
    assert np.array_equal(a, b) and a.shape == (50, 4)
    assert np.ptp(a[:, 1]) > 0 and (a >= 0).all()
    assert len(noisy.residuals) == len(points)


def test_flat_rate_has_no_draw_spread():
    flat = CostCurve.from_tokens_per_second(1000.0)
    assert np.array_equal(flat.draws(3), np.tile([0.0, 1e-3, 0.0, 0.0], (3, 1)))
    assert flat.longest_full_tokens == 0
