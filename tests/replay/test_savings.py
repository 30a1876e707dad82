"""kvcli.replay.savings and network: savings, FLOPs and overheads computed by hand; intervals; the recommendation."""
from __future__ import annotations

import numpy as np
import pytest

from kvcli.model.costcurve import CostCurve, PrefillSample
from kvcli.model.presets import PRESETS
from kvcli.replay.network import Link, ServerRates, overheads, repeat_spread
from kvcli.replay.results import ChunkSizeResult
from kvcli.replay.savings import (
    DRAWS,
    EXTRAPOLATION_DRIFT,
    PAYS_OVER_TIMED,
    STALL_SECONDS,
    TIE_TOLERANCE,
    TIMED_OVERHEAD_DRIFT,
    Interval,
    Ledger,
    TimedSavings,
    fmt_interval,
    recommend,
    sig,
    summarize,
)

TINY = PRESETS["tiny"]  # 2 layers, hidden 64, 4 heads, 2 KV heads, head_dim 32, ffn 128
FLAT = CostCurve.from_tokens_per_second(1000.0)  # 1 ms per token, nothing else


def _ledger() -> Ledger:
    led = Ledger()
    led.add(12, 8)  # estimated: 8 of 12 reused
    led.add(20, 0)  # estimated: a miss
    # measured on its first 16 of 40 tokens, reusing 15 of them (the whole prompt hits up to 32):
    # full 16 tokens took 0.030 s, the suffix 0.004 s
    led.add(40, 32, 16, 15, (7, 0.030, 0.004))
    return led


def test_savings_by_hand_flat_curve():
    s = summarize(_ledger(), FLAT, critical=0.002, background=0.010, noise=[], model=TINY)
    # curve part: 8 ms (estimated) + (32 - 15) ms (the truncated request's tokens beyond the measured 16) = 25 ms
    assert s.saved_estimated == pytest.approx(0.008 + 0.017)
    assert s.saved_measured == pytest.approx(0.026)
    assert s.saved.value == pytest.approx(0.051)
    # trace prefill: 12 + 20 ms by the curve, the measured request 30 ms for its 16 tokens + 24 ms for the rest
    assert s.trace_prefill.value == pytest.approx(0.012 + 0.020 + 0.030 + 0.024)
    assert s.share.value == pytest.approx(0.051 / 0.086)
    assert s.net_async.value == pytest.approx(0.051 - 0.002)
    assert s.net_sync.value == pytest.approx(0.051 - 0.012)
    # no spread in the saving (a flat rate, no timing noise) nor in the overheads (the ledger recorded none per
    # request, and no repeat spread is given): zero width
    assert (s.saved.low, s.saved.high) == pytest.approx((0.051, 0.051))
    assert (s.net_sync.low, s.net_sync.high) == pytest.approx((0.039, 0.039))
    assert s.beyond_share == 0.0  # a flat rate is not a calibration: nothing is "beyond" it
    # the server's timings strayed by 20% in the transfer calibration: the overheads spread by that much
    spread = summarize(_ledger(), FLAT, critical=0.002, background=0.010, noise=[], model=TINY, overhead_floor=0.2)
    assert spread.net_sync.low < spread.net_sync.value < spread.net_sync.high
    assert spread.net_sync.high - spread.net_sync.low < 2 * 1.96 * 0.2 * 0.012 * 1.2


def test_one_stalled_timing_does_not_set_the_repeat_spread():
    # four quantities timed 3 times each (t / median - 1; each triple's median is 0): deviations from the median 0
    # sorted 0 0 0 0 .05 .05 .1 .1 .1 .2 .3 11.5: the median absolute deviation is (.05 + .1) / 2 = 0.075
    calm = (0.0, 0.05, -0.1, 0.0, -0.05, 0.1, 0.0, 0.2, -0.1, 0.0, -0.3, 11.5)
    assert repeat_spread(ServerRates(1e-4, 1e-4, spread=calm)) == pytest.approx(1.4826 * 0.075)
    # a plain standard deviation would have been 3.3, an overhead interval 13 times the overhead wide
    assert np.std(calm, ddof=1) > 3.0
    assert repeat_spread(ServerRates(1e-4, 1e-4, spread=(0.0,))) == 0.0
    assert repeat_spread(ServerRates(1e-4, 1e-4, spread=(0.2, -0.2))) == pytest.approx(1.4826 * 0.2)


def test_saved_flops_by_hand():
    # tiny, per new token: 2 layers x (QKV 32,768 + out 16,384 + MLP 49,152) = 196,608; attention 2 x 4 x 4 x 32
    # = 1,024 per pair. A hit of h on a prompt of p saves h x 196,608 + 1,024 x h (h + 1) / 2 (the LM head row
    # is computed either way).
    led = Ledger()
    led.add(12, 8)
    led.add(40, 32)
    s = summarize(led, FLAT, 0.0, 0.0, [], TINY)
    assert s.saved_flops == 8 * 196_608 + 1_024 * 36 + 32 * 196_608 + 1_024 * 528
    lm_head = 2 * 64 * 100_352
    assert s.trace_flops == (52 * 196_608 + 1_024 * (78 + 820) + 2 * lm_head)


def _noisy_curve() -> CostCurve:
    rng = np.random.default_rng(3)
    points = [(32, 0), (128, 0), (512, 0), (1024, 0), (256, 256), (512, 512), (64, 960), (2048, 0)]
    return CostCurve.fit([PrefillSample(n, c, (0.01 + 2e-4 * n + 3e-7 * n * (n + 1) / 2 + 4e-7 * n * c)
                                        * (1 + 0.1 * rng.standard_normal())) for n, c in points])


def test_intervals_are_deterministic_and_cover_the_point():
    curve = _noisy_curve()
    a = summarize(_ledger(), curve, 0.002, 0.01, curve.residuals, TINY, seed=5)
    b = summarize(_ledger(), curve, 0.002, 0.01, curve.residuals, TINY, seed=5)
    assert a.saved == b.saved and a.net_async == b.net_async
    assert a.saved.low < a.saved.value < a.saved.high
    assert a.share.low <= a.share.value <= a.share.high


def test_beyond_share_counts_prompts_longer_than_the_longest_full_prefill():
    curve = _noisy_curve()  # longest full prefill timed: 2,048 tokens
    led = Ledger()
    led.add(1000, 500)
    led.add(3000, 500)
    s = summarize(led, curve, 0.0, 0.0, [], None)
    beyond = curve.predict(3000, 0) - curve.predict(2500, 500)
    assert s.beyond_share == pytest.approx(beyond / s.saved.value)
    assert s.saved_flops == 0.0  # no model shapes given


def test_zero_reuse_measured_request_saves_exactly_zero():
    led = Ledger()
    led.add(100, 0, 100, 0, (1, 0.2, None))
    s = summarize(led, _noisy_curve(), 0.0, 0.0, [0.5, -0.5], TINY)
    assert (s.saved.value, s.saved.low, s.saved.high) == (0.0, 0.0, 0.0)
    assert s.trace_prefill.value == pytest.approx(0.2)


def test_overhead_spread_across_blocks():
    led = Ledger()
    for i in range(10):  # 100 tokens each; critical 1 ms per request, then 3 ms from the 6th on
        led.add(100, 0, critical=0.001 if i < 5 else 0.003, background=0.002)
    rates = np.array([0.001] * 5 + [0.003] * 5) / 100
    assert led.overhead_spread("critical") == pytest.approx(rates.std(ddof=1) / rates.mean())
    assert led.overhead_spread("background") == 0.0


def test_the_typical_overhead_leaves_out_a_stalled_block():
    led = Ledger()
    for i in range(10):  # 100 tokens each, 1 ms of critical path each, but one lookup that waited 150 ms
        led.add(100, 0, critical=0.151 if i == 3 else 0.001)
    assert sum(led.critical_seconds) == pytest.approx(0.16)
    assert led.typical_overhead("critical") == pytest.approx(0.01)
    one = Ledger()
    one.add(100, 0, critical=0.2)
    assert one.typical_overhead("critical") == pytest.approx(0.2)  # one request: nothing to compare it with


def test_recommend_clear_tie_noise_none():
    iv = lambda v, lo, hi: Interval(v, lo, hi)  # noqa: E731
    clear = recommend({16: iv(10, 9, 11), 64: iv(7, 6.5, 7.5), 256: iv(3, 2, 4)})
    assert (clear.kind, clear.chunk_size, clear.tied) == ("clear", 16, (16,))
    overlap = recommend({16: iv(10, 8, 12), 64: iv(8.5, 7, 10)})
    assert (overlap.kind, overlap.chunk_size, overlap.tied) == ("tie", None, (16, 64))
    assert "64 writes the fewest objects" in overlap.text
    assert "are within their intervals;" in overlap.text  # 8.5 is 15% below 10: the overlap ties them
    close = 10 * (1 - TIE_TOLERANCE / 2)  # within the tolerance, even with disjoint intervals
    near = recommend({16: iv(10, 9.99, 10.01), 64: iv(close, close - 0.01, close + 0.01)})
    assert near.kind == "tie" and "are within 5% of the best's;" in near.text
    both = recommend({16: iv(10, 9.99, 10.01), 64: iv(close, close - 0.01, close + 0.01), 256: iv(8, 7, 10)})
    assert both.tied == (16, 64, 256) and "within 5% of the best's or within their intervals;" in both.text
    assert "by more than their intervals and 5%" in clear.text
    noise = recommend({16: iv(1, -0.5, 2), 64: iv(0.5, -1, 1)})
    assert (noise.kind, noise.chunk_size) == ("noise", None)
    none = recommend({16: iv(-1, -2, -0.5), 64: iv(-3, -4, -2)})
    assert (none.kind, none.chunk_size, none.tied) == ("none", None, ())
    maybe = recommend({16: iv(-0.1, -2, 0.5), 1024: iv(0, 0, 0)})  # not caching (1024 never hits) is the best
    assert (maybe.kind, maybe.tied) == ("noise", (16,))


def test_recommend_paired_draws_cancel_common_uncertainty():
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.5, 1.5, 400)  # a curve uncertainty common to both sizes
    draws = {16: 10 * scale, 64: 8 * scale}
    nets = {cs: Interval(float(np.median(d)), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5)))
            for cs, d in draws.items()}
    assert nets[16].low < nets[64].high  # the intervals overlap ...
    verdict = recommend(nets, draws=draws)  # ... but 16 saves 25 % more in every draw
    assert (verdict.kind, verdict.chunk_size) == ("clear", 16)
    assert recommend(nets).kind == "tie"  # without the draws: the overlap decides


def test_a_timed_run_compares_the_savings_and_asks_the_nets_whether_caching_pays():
    """Overheads timed here move up to 11x between runs: a timed run ranks and compares chunk sizes on their saved
    prefill (paired draws), with the tolerance widened where the savings are extrapolated; the nets still decide
    "none" and "noise". A priced run (no timed savings) decides on the nets as before."""
    iv = lambda v, lo, hi: Interval(v, lo, hi)  # noqa: E731
    one = np.ones(DRAWS)
    # 16 saves 10 s but a stall timed 1.7 s on it: by net 64 leads by 7%; by saving 16 does, by 10%
    nets = {16: iv(8.3, 8.2, 8.4), 64: iv(8.9, 8.8, 9.0), 256: iv(5, 4.9, 5.1)}
    saved = {16: TimedSavings(iv(10, 9.9, 10.1), 10 * one), 64: TimedSavings(iv(9, 8.9, 9.1), 9 * one),
             256: TimedSavings(iv(5.1, 5, 5.2), 5.1 * one)}
    assert (recommend(nets).kind, recommend(nets).chunk_size) == ("clear", 64)  # priced: the nets decide
    timed = recommend(nets, timed=saved)
    assert (timed.kind, timed.chunk_size) == ("clear", 16) and "its saved prefill (overheads timed here" in timed.text
    # 90% of the saving beyond the calibrated range: 10% apart is within 5% + 0.15 x 0.9
    far = {cs: TimedSavings(t.saved, t.draws, 0.9) for cs, t in saved.items()}
    tie = recommend(nets, timed=far)
    assert (tie.kind, tie.tied) == ("tie", (16, 64))
    assert "within the run-to-run drift of savings extrapolated beyond the calibrated range" in tie.text
    assert EXTRAPOLATION_DRIFT == 0.15 and TIMED_OVERHEAD_DRIFT == 11.0
    # caching pays beyond noise where the saving is more than twice the overheads timed here; "none" only when
    # nothing was saved (another run may time the overheads lower)
    small = {16: iv(-0.02, -0.03, -0.01)}
    assert recommend(small).kind == "none"
    assert recommend(small, timed={16: TimedSavings(iv(0.01, 0.008, 0.012), 0.01 * one, 0, 0.03)}).kind == "noise"
    assert recommend(small, timed={16: TimedSavings(iv(0, 0, 0), 0 * one, 0, 0.02)}).kind == "none"
    assert (PAYS_OVER_TIMED, STALL_SECONDS) == (2.0, 0.18)
    paid = {16: TimedSavings(iv(1, 0.9, 1.1), one, 0, 0.44)}  # 0.9 s is more than twice 0.44 s
    assert recommend({16: iv(0.56, 0.4, 0.7)}, timed=paid).kind == "clear"
    assert recommend({16: iv(0.56, 0.4, 0.7)}, timed={16: TimedSavings(iv(1, 0.9, 1.1), one, 0, 0.46)}
                     ).kind == "noise"
    stall = recommend({16: iv(0.1, 0.09, 0.11)}, timed={16: TimedSavings(iv(0.11, 0.1, 0.12), 0.11 * one, 0, 0.01)})
    assert stall.kind == "noise" and "the run-to-run spread decides it" in stall.text  # below one stall: 0.18 s


def test_sig_and_interval_format():
    assert [sig(x) for x in (268_355, 0.01234, -2.2, 1.0)] == ["268,000", "0.0123", "-2.20", "1.00"]
    assert fmt_interval(Interval(32_319.1, 12_788.9, 63_624.4)) == "32,300 [12,800, 63,600]"


def _result(**kw) -> ChunkSizeResult:
    res = ChunkSizeResult(256, "ns")
    for k, v in kw.items():
        setattr(res, k, v)
    return res


def test_network_model_by_hand():
    # 256-token chunks of llama-3-8b: 32 MiB of KV each, plus a 128-byte header
    value = 256 * 131_072 + 128
    res = _result(lookups=10, lookup_seconds=0.004, hit_requests=4, chunks_hit=30, store_requests=6,
                  chunks_written=50, metadata_bytes_written=50 * 300, deserialize_seconds_estimated=0.05)
    rates = ServerRates(set_seconds=0.02, get_seconds=0.01, serialize_seconds=0.003, deserialize_seconds=0.001)
    link = Link(gbps=25.0, rtt_seconds=0.0002)
    got = overheads(res, value, rates, link)
    assert got.lookup == pytest.approx(0.004 + 10 * 0.0002)
    assert got.transfer == pytest.approx(4 * 0.0002 + 30 * value * 8 / 25e9)
    assert got.deserialize == pytest.approx(0.05)
    assert got.serialize_store == pytest.approx(6 * 0.0002 + (50 * value + 15_000) * 8 / 25e9 + 50 * 0.003)
    assert got.critical == pytest.approx(got.lookup + got.transfer + got.deserialize)
    local = overheads(_result(lookup_seconds=0.004, transfer_seconds_measured=0.1, transfer_seconds_estimated=0.2,
                              store_seconds=0.3, store_seconds_estimated=0.4), value, rates, None)
    assert (local.transfer, local.background) == pytest.approx((0.3, 0.7))


@pytest.mark.parametrize("nets, headline, answer, at", [
    # 64 beats 16 by more than both intervals and by more than TIE_TOLERANCE: recommended
    ({16: Interval(1.0, 0.9, 1.1), 64: Interval(2.0, 1.9, 2.1)}, "chunk size 64",
     "chunk size 64 (it beats 16 beyond noise)", 64),
    # within each other's intervals: a tie, and the answer names the tied size with the fewest objects (64)
    ({16: Interval(2.0, 1.5, 2.5), 64: Interval(1.9, 1.4, 2.4)}, "chunk sizes 16, 64 tie",
     "chunk size 64 (16, 64 tie within noise; 64 writes the fewest objects)", 64),
    # the best one's interval reaches 0: noise; the figures are the most hopeful's (16: the highest high end)
    ({16: Interval(0.5, -0.5, 1.5), 64: Interval(0.6, -0.1, 1.2)}, "no chunk size pays off beyond noise",
     "don't cache (no chunk size pays off beyond noise); at 16:", 16),
    # every interval <= 0: none pays; the figures are the best net benefit's (64)
    ({16: Interval(-2.0, -3.0, -1.0), 64: Interval(-1.0, -1.5, -0.5)}, "no chunk size pays off",
     "don't cache (no chunk size pays off); at 64:", 64),
])
def test_the_summary_line_is_the_answer_to_the_verdict(nets, headline, answer, at):
    from kvcli.replay.report import summary_line
    from kvcli.replay.results import TraceResult

    verdict = recommend(nets)
    assert verdict.text.startswith(headline) and verdict.headline == headline and verdict.focus == at
    rows = [ChunkSizeResult(cs, "ns", requests=2, prompt_tokens=100, hit_tokens=cs // 2,
                            saved_prefill_seconds_estimated=iv.value) for cs, iv in nets.items()]
    line = summary_line(TraceResult("t.jsonl", 2, 0, 0, "accounted", rows, verdict=verdict))
    hit = {16: "8.0%", 64: "32.0%"}[at]
    assert line.startswith(f"t.jsonl: {answer}") and f"hit {hit}; saves " in line and line.endswith("; 0 measured")


def test_one_chunk_size_is_recommended_as_the_only_one_compared():
    verdict = recommend({64: Interval(10.0, 9.0, 11.0)})
    assert (verdict.kind, verdict.chunk_size) == ("clear", 64)
    assert "beats" not in verdict.text and "the only size compared" in verdict.text
    assert recommend({64: Interval(1.0, -0.5, 2.0)}).kind == "noise"


def test_the_summary_line_is_the_answer_in_one_line():
    from kvcli.replay.report import summary_line
    from kvcli.replay.results import TraceResult
    from kvcli.replay.savings import Savings

    iv = Interval(10.0, 9.0, 11.0)
    savings = Savings(iv, 0.0, 10.0, Interval(40.0, 39.0, 41.0), Interval(0.25, 0.24, 0.26), 0.625, 0.0, 0.0,
                      0.5, 0.0, iv, iv)
    row = ChunkSizeResult(64, "ns", requests=1, prompt_tokens=100, hit_tokens=50, savings=savings)
    line = summary_line(TraceResult("t", 1, 0, 0, "accounted", [row], verdict=recommend({64: iv})))
    assert line == ("t: chunk size 64 (the only size compared; it pays off beyond noise); hit 50.0%; saves 10.0 s "
                    "[9.00, 11.0] = 25.0% of prefill; net 10.0 s (async stores); cache: unbounded; assumes prefill "
                    "timed on this machine's cpu, not a serving GPU's (--hardware); 0 measured")


def test_a_verdict_says_which_stores_its_nets_assume():
    nets = {16: Interval(-1.0, -2.0, -0.5), 64: Interval(-0.2, -0.3, -0.1)}
    assert "(stores in the background)" in recommend(nets, "async").text
    assert "(stores on the request's path)" in recommend(nets, "sync").text
    mixed = recommend(nets, "mixed").text
    assert mixed.startswith("no chunk size pays off (stores in the background, on the request's path where the "
                            "background cannot keep up)")
