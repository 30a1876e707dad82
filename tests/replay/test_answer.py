"""A trace's answer, from hand-made results (no server, no model): which chunk size, what it saves per day and at
what price, the cache it assumes, the assumption that moves it most, and its words: at most five lines of at most
80 columns, and one stderr line."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcli.replay.answer import answer_line, answer_lines, answer_of, headline
from kvcli.replay.results import ChunkSizeResult, Pricing, TraceResult
from kvcli.replay.savings import Interval, Savings, recommend
from kvcli.sim.curve import CurveResult


def _savings(saved: Interval, critical: float = 0.0, background: float = 0.0) -> Savings:
    net_async = Interval(saved.value - critical, saved.low - critical, saved.high - critical)
    net_sync = Interval(*(x - background for x in (net_async.value, net_async.low, net_async.high)))
    return Savings(saved, 0.0, saved.value, Interval(4 * saved.value, 4 * saved.low, 4 * saved.high),
                   Interval(0.25, 0.24, 0.26), None, 0.0, 0.0, critical, background, net_sync, net_async)


def _curve(cs: int, hits_by_capacity: list[int], payload_bytes: int) -> CurveResult:
    hits = np.array(hits_by_capacity, dtype=np.int64)
    return CurveResult(cs, payload_bytes, 1000, hits, np.zeros_like(hits), len(hits) - 1, None, None, "after write",
                       0, None, 0, 0.0)


def _row(cs: int, saved: Interval, hit_tokens: int = 500, **kw) -> ChunkSizeResult:
    return ChunkSizeResult(cs, "ns", requests=10, prompt_tokens=1000, hit_tokens=hit_tokens,
                           hit_tokens_unlimited=hit_tokens, upper_bound_tokens=600,
                           savings=kw.pop("savings", _savings(saved)), **kw)


def test_a_tie_names_the_size_with_the_fewest_objects_and_its_figures():
    nets = {16: Interval(2.0, 1.5, 2.5), 64: Interval(1.9, 1.4, 2.4)}
    rows = [_row(cs, iv) for cs, iv in nets.items()]
    a = answer_of(TraceResult("t", 10, 0, 0, "accounted", rows, verdict=recommend(nets)))
    assert (a.verdict, a.chunk_size, a.focus, a.tied) == ("tie", 64, 64, (16, 64))
    assert answer_lines(a) == [
        "answer: chunk size 64 (16, 64 tie within noise; 64 writes the fewest objects)",
        "  hit 50.0%; saves 1.90 s [1.40, 2.40] = 25.0% of prefill; net 1.90 s",  # the stores' mode: past 80
        "  cache: unbounded",
        "  assumes prefill timed on this machine's cpu, not a serving GPU's (--hardware)"]


@pytest.mark.parametrize("nets, words", [
    ({16: Interval(1.0, 0.9, 1.1), 64: Interval(2.0, 1.9, 2.1)}, "chunk size 64 (it beats 16 beyond noise)"),
    ({64: Interval(2.0, 1.9, 2.1)}, "chunk size 64 (the only size compared; it pays off beyond noise)"),
    ({16: Interval(0.5, -0.5, 1.5), 64: Interval(0.6, -0.1, 1.2)}, "don't cache (no chunk size pays off beyond "
                                                                     "noise)"),
    ({16: Interval(-2.0, -3.0, -1.0), 64: Interval(-1.0, -1.5, -0.5)}, "don't cache (no chunk size pays off)"),
])
def test_the_headline_says_the_verdict_and_why(nets, words):
    rows = [_row(cs, iv) for cs, iv in nets.items()]
    a = answer_of(TraceResult("t", 10, 0, 0, "accounted", rows, verdict=recommend(nets)))
    assert headline(a) == words
    assert (a.chunk_size is None) == words.startswith("don't cache")
    if a.chunk_size is None:  # the figures say which size they are of
        assert answer_lines(a)[1].startswith(f"  at {a.focus}: hit ")


def test_per_day_and_money_by_hand():
    saved = Interval(126.0, 98.8, 164.0)
    row = _row(256, saved)
    result = TraceResult("t", 10, 0, 0, "accounted", [row], verdict=recommend({256: row.savings.net_async}),
                         span_seconds=330.0)
    a = answer_of(result, Pricing("roofline", "NVIDIA H100 SXM5 80GB", 2.5))
    # 126 s of prefill every 330 s of traffic: 126 * 86,400 / 330 accelerator-seconds a day, at $2.5 an hour
    assert a.per_day.value == pytest.approx(126 * 86400 / 330)
    assert a.per_day.low == pytest.approx(98.8 * 86400 / 330)
    assert a.usd_per_day.value == pytest.approx(126 * 86400 / 330 / 3600 * 2.5)
    assert "; 33.0k accelerator-s/day, $22.9/day at $2.5/GPU-hour;" in answer_line("t", a, 0)
    # timed on this machine: its seconds are not an accelerator's; a price still prices them
    timed = answer_of(result, Pricing("timed", "cpu", 2.5))
    assert timed.per_day is None and timed.usd_per_day.value == pytest.approx(a.usd_per_day.value)
    # no timestamps: no rate, nothing per day
    assert answer_of(dataclasses.replace(result, span_seconds=None), Pricing("roofline", "x", 2.5)).usd_per_day is None


def test_five_lines_at_80_columns_with_every_part():
    """The longest answer: a four-way tie of large figures, priced per day with money, a capacity and a sizing
    line: five lines, each within 80 columns (the figures give up their interval to keep the day beside them)."""
    nets = {cs: Interval(8870.0, 4960.0, 13300.0) for cs in (16, 64, 256, 1024)}
    rows = [_row(cs, Interval(8900.0, 4960.0, 13300.0), hit_curve=_curve(cs, [0, 100, 300, 500], 2 ** 30))
            for cs in nets]
    result = TraceResult("sample_traces/mooncake_conversation_head1000.jsonl.gz", 10, 0, 0, "accounted", rows,
                         verdict=recommend(nets), span_seconds=330.0, cost_curve={
                             "kind": "roofline", "mfu": 0.45, "mfu_interval": [0.34, 0.58],
                             "mfu_source": "h100-sxm bf16, published",
                             "mfu_basis": {"accelerator": "h100-sxm", "precision": "bf16"}})
    a = answer_of(result, Pricing("roofline", "NVIDIA H100 SXM5 80GB", 2.5))
    a = dataclasses.replace(a, capacity_text="cache: GPU tier 54.0 GiB per node = 443k tokens",
                            sizing_text="sizes for 90/95/99% of unbounded hits: 759 GiB / 950 GiB / 1.2 TiB")
    lines = answer_lines(a)
    assert lines == [
        "answer: chunk size 1024 (16, 64, 256, 1024 tie; 1024 writes the fewest objects)",
        "  hit 50.0%; saves 8,900 s = 25.0% of prefill; net 8,900 s; $1,620/day",
        "  " + a.capacity_text, "  " + a.sizing_text,
        "  assumes h100-sxm bf16 MFU 0.45 (0.34-0.58): the saving spans 4,960-13,300 s"]
    assert len(lines) == 5 and max(map(len, lines)) <= 80
    unpriced = dataclasses.replace(a, usd_per_day=None)  # no price: the accelerator-seconds, "of prefill" left out
    assert answer_lines(unpriced)[1] == "  hit 50.0%; saves 8,900 s = 25.0%; net 8,900 s; 2.33M accelerator-s/day"
    # one line for stderr, whole
    assert answer_line(result.trace, a, 0) == (
        f"{result.trace}: {headline(a)}; hit 50.0%; saves 8,900 s [4,960, 13,300] = 25.0% of prefill; net 8,900 s "
        f"(async stores); 2.33M accelerator-s/day, $1,620/day at $2.5/GPU-hour; {a.capacity_text}; "
        f"{a.sizing_text}; assumes {a.assumption}; 0 measured")


def test_the_day_takes_its_own_line_when_there_is_one_to_spare():
    saved = Interval(8900.0, 4960.0, 13300.0)
    row = _row(1024, saved)
    result = TraceResult("t", 10, 0, 0, "accounted", [row], verdict=recommend({1024: row.savings.net_async}),
                         span_seconds=330.0)
    lines = answer_lines(answer_of(result, Pricing("rate", "3,000 tokens/s", 2.5)))
    assert len(lines) == 5 and max(map(len, lines)) <= 80, lines
    assert lines[1] == "  hit 50.0%; saves 8,900 s [4,960, 13,300] = 25.0% of prefill; net 8,900 s"
    assert lines[2] == "  saves per day of this traffic: 2.33M accelerator-s, $1,620 at $2.5/GPU-hour"


def test_the_assumption_that_moves_the_answer_most():
    curve = _curve(64, [0, 1, 2, 3, 4, 5], 2 ** 20)  # half of the 5 chunks (2) hit 128 of the 320 tokens
    saved = Interval(10.0, 9.0, 11.0)
    row = _row(64, saved, hit_tokens=320, hit_curve=curve)
    result = TraceResult("t", 10, 0, 0, "accounted", [row], verdict=recommend({64: row.savings.net_async}),
                         cost_curve={"kind": "roofline", "mfu": 0.52, "mfu_interval": [0.39, 0.67]})
    roofline = Pricing("roofline", "NVIDIA H100 SXM5 80GB")
    # half the cache loses 192 of 320 hit tokens: 6 s of the 10 s saved, more than the utilization's 1 s
    assert answer_of(result, roofline).assumption == ("an unbounded cache; half of it (2.0 MiB) hits 12.8%, not "
                                                      "32.0%")
    # a bounded cache: what no bound would add (here nothing: the hits are the unbounded ones)
    assert answer_of(result, roofline, capacity="64.0 GiB").assumption == ("MFU 0.52 (0.39-0.67): the saving "
                                                                           "spans 9.00-11.0 s")
    given = dataclasses.replace(result, cost_curve={**result.cost_curve, "mfu_source": "--mfu, h100-sxm bf16's "
                                                    "spread", "mfu_basis": {"accelerator": "h100-sxm",
                                                                            "precision": "bf16"}})
    assert answer_of(given, roofline, capacity="64.0 GiB").assumption == ("--mfu 0.52 (0.39-0.67): the saving "
                                                                          "spans 9.00-11.0 s")
    # stores on the request's path would cost 8 s: the largest
    heavy = dataclasses.replace(row, savings=_savings(saved, background=8.0))
    result.per_chunk_size = [heavy]
    assert answer_of(result, roofline).assumption == "async stores (off the request's path); sync, it nets 2.00 s"
    # stores made synchronous because the background cannot keep up over the trace's span: said so
    result.per_chunk_size = [dataclasses.replace(heavy, store_mode="sync")]
    assert answer_of(result, roofline).assumption == ("sync stores (the background cannot keep up); async, it "
                                                      "would net 10.0 s")
    # a flat rate has no spread: the cache moves it
    assert answer_of(dataclasses.replace(result, per_chunk_size=[row]), Pricing("rate", "3,000 tokens/s")
                     ).assumption.startswith("an unbounded cache")
    # timed on this machine's CPU: every second saved is this machine's
    assert answer_of(result, Pricing("timed", "cpu")).assumption.startswith("prefill timed on this machine's cpu")
    # nothing reused and nothing reusable: nothing moves it
    none = _row(64, Interval(0.0, 0.0, 0.0), hit_tokens=0)
    none.upper_bound_tokens = 0
    result.per_chunk_size = [none]
    assert answer_of(result, roofline).assumption == "nothing: no prompt repeats a prefix of an earlier one"


def test_the_cache_the_answer_assumes():
    curve = _curve(64, [0, 100, 200, 300], 2 ** 20)
    row = _row(64, Interval(10.0, 9.0, 11.0), hit_curve=curve)
    result = TraceResult("t", 10, 0, 0, "accounted", [row], verdict=recommend({64: row.savings.net_async}))
    a = answer_of(result)
    assert (a.cache_bytes, a.capacity_text) == (3 * 2 ** 20, "cache: unbounded (this trace fills 3.0 MiB at 64)")
    row.hit_tokens = 400
    bounded = answer_of(result, capacity="2.0 MiB")
    assert bounded.capacity_text == "cache: LRU 2.0 MiB per chunk size (unbounded: hit 50.0%, 3.0 MiB)"


def test_the_json_answer():
    row = _row(64, Interval(10.0, 9.0, 11.0))
    result = TraceResult("t", 10, 0, 2, "accounted", [row], verdict=recommend({64: row.savings.net_async}),
                         span_seconds=100.0)
    d = answer_of(result, Pricing("rate", "3,000 tokens/s", 2.0)).to_dict()
    assert (d["verdict"], d["chunk_size"], d["focus_chunk_size"], d["tied_chunk_sizes"]) == ("clear", 64, 64, [])
    assert d["saved_prefill_seconds"] == {"value": 10.0, "low": 9.0, "high": 11.0}
    assert d["pricing"] == {"kind": "rate", "label": "3,000 tokens/s", "gpu_hour_usd": 2.0}
    assert d["accelerator_seconds_per_day"]["value"] == pytest.approx(8640.0)
    assert d["usd_per_day"]["value"] == pytest.approx(8640.0 / 3600 * 2.0)
    assert (d["sizing_text"], d["store_mode"], d["hit_token_ratio"]) == (None, "async", 0.5)


def test_a_trace_without_prompts_answers_nothing_to_replay():
    a = answer_of(TraceResult("t", 0, 2, 0, "accounted", [ChunkSizeResult(16, "ns")]))
    assert (a.verdict, a.chunk_size) == ("empty", None)
    assert answer_lines(a) == ["answer: nothing to replay (every request's prompt is empty)"]
