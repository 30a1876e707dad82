"""A trace's answer: the chunk size to use (or not to cache), what it saves, the cache it assumes and the one
assumption that moves it most. :func:`answer_of` builds it from the replay's results (:class:`~kvcli.replay.results.
Answer`); :func:`answer_lines` words it as the first lines of the report (at most five, each within the console's
width where the figures allow) and :func:`answer_line` as the one stderr line per trace.

The figures are those of the chunk size the verdict points at (:attr:`kvcli.replay.savings.Verdict.focus`: the
recommended one, the tie's pick, or the most hopeful when none pays off). Per day of this traffic: the trace taken
as repeating at its own rate (its span, first to last timestamp), as the bill does (:mod:`kvcli.replay.bill`).

The assumption that moves the answer most is the largest of these, in seconds of the net benefit at that size:

* prefill timed on this machine's CPU (not a serving accelerator's): all of the saving;
* a roofline's utilization range, a profile's spread, or timings on this machine's GPU: the saving's interval,
  its larger side from the value;
* the cache's size: unbounded, what half of it would lose (the hit-ratio curve's hits at half the distinct chunks,
  at this size's saved seconds per hit token); bounded, what an unbounded cache would add;
* where stores run: the background's seconds (the difference between async and sync stores' net benefits; sync
  where asked for, or where the background cannot keep up over the trace's span).

A flat ``--prefill-tps`` rate has no spread to weigh: it is said when nothing else moves the answer.
"""
from __future__ import annotations

from kvcli.replay.bill import SECONDS_PER_DAY
from kvcli.replay.results import Answer, ChunkSizeResult, Pricing, TraceResult
from kvcli.replay.savings import Interval, sig
from kvcli.units import fmt_bytes, fmt_count

MAX_LINES = 5
"""The answer's most lines in the report."""


def answer_of(result: TraceResult, pricing: Pricing | None = None, capacity: str | None = None) -> Answer:
    """The answer of a replayed trace (module docstring).

    Args:
        result: the trace's results, its savings and verdict set (a result without a verdict is answered by the
            best net benefit).
        pricing: what priced the prefill (None: a roofline when the result's cost says so, else timed here).
        capacity: the replay's LRU capacity per chunk size in words ("64.0 GiB", "3,000,000 tokens"); None:
            unbounded.
    """
    pricing = pricing or _pricing_of(result)
    sizes = tuple(r.chunk_size for r in result.per_chunk_size)
    rows = {r.chunk_size: r for r in result.per_chunk_size if r.requests}
    if not rows:
        return Answer("empty", None, None, sizes=sizes, pricing=pricing, capacity_text="cache: nothing to hold",
                      assumption="nothing: no request had a prompt")
    v = result.verdict
    if v is not None and v.focus in rows:
        kind, focus = v.kind, v.focus
    else:  # a result built without a verdict: the best net benefit
        focus = max(rows.values(), key=lambda r: (r.net_benefit_seconds, -r.chunk_size)).chunk_size
        kind = "clear" if rows[focus].net_benefit_seconds > 0 else "none"
    at = rows[focus]
    s = at.savings
    saved = s.saved if s is not None else _point(at.saved_prefill_seconds)
    net = s.net(at.store_mode) if s is not None else _point(at.net_benefit_seconds)
    per_day, usd = _per_day(saved, result.span_seconds, pricing)
    cache = _unbounded_bytes(at)
    return Answer(kind, focus if kind in ("clear", "tie") else None, focus,
                  tied=v.tied if v is not None and kind == "tie" else (), sizes=sizes,
                  hit_token_ratio=at.hit_token_ratio, saved=saved, share=s.share if s is not None else None,
                  net=net, store_mode=at.store_mode, pricing=pricing, per_day=per_day, usd_per_day=usd,
                  cache_bytes=cache, capacity_text=_capacity_text(at, cache, capacity),
                  assumption=_assumption(result, at, pricing, capacity))


def _point(x: float) -> Interval:
    return Interval(x, x, x)


def _pricing_of(result: TraceResult) -> Pricing:
    """What priced a result's prefill when nobody said: a roofline when its cost is one, else timed here."""
    acc = result.cost_curve.get("accelerator") if result.cost_curve.get("kind") == "roofline" else None
    return Pricing("roofline", acc["label"]) if acc else Pricing("timed", "cpu")


def _per_day(saved: Interval, span: float | None, pricing: Pricing) -> tuple[Interval | None, Interval | None]:
    """Accelerator-seconds saved per day of this traffic (a priced prefill only: timed here, they are this
    machine's) and their money at the gpu-hour price (any pricing: the price is of the machine that prices it);
    None without a rate (no span) or a price."""
    if not span:
        return None, None
    rate = SECONDS_PER_DAY / span
    seconds = Interval(saved.value * rate, saved.low * rate, saved.high * rate)
    usd = None
    if pricing.gpu_hour_usd is not None:
        usd = Interval(*(x / 3600 * pricing.gpu_hour_usd for x in (seconds.value, seconds.low, seconds.high)))
    return (seconds if pricing.priced else None), usd


def _unbounded_bytes(r: ChunkSizeResult) -> int | None:
    """KV payload bytes an unbounded cache holds at ``r``'s chunk size: every distinct chunk (the curve's count),
    else what the replay wrote and accounted (the same without a capacity); None when nothing was written."""
    if r.hit_curve is not None:
        return r.hit_curve.distinct_chunks * r.hit_curve.payload_bytes_per_chunk
    written = r.payload_bytes_written + r.payload_bytes_accounted
    return written or None


def _capacity_text(r: ChunkSizeResult, cache: int | None, capacity: str | None) -> str:
    fills = "" if cache is None else f" (this trace fills {fmt_bytes(cache)} at {r.chunk_size})"
    if capacity is None:
        return f"cache: unbounded{fills}"
    unlimited = r.hit_tokens_unlimited / r.prompt_tokens if r.prompt_tokens else None
    return (f"cache: LRU {capacity} per chunk size (unbounded: hit {_pct(unlimited)}"
            + ("" if cache is None else f", {fmt_bytes(cache)}") + ")")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _assumption(result: TraceResult, r: ChunkSizeResult, pricing: Pricing, capacity: str | None) -> str:
    """The assumption that moves the net benefit at ``r`` most (module docstring), in words."""
    s = r.savings
    saved = r.saved_prefill_seconds
    if not r.hit_tokens and r.upper_bound_tokens == 0:
        return "nothing: no prompt repeats a prefix of an earlier one"
    candidates: list[tuple[float, str]] = []
    if pricing.kind == "timed" and pricing.label == "cpu":
        candidates.append((abs(saved), "prefill timed on this machine's cpu, not a serving GPU's (--hardware)"))
    elif pricing.kind == "timed" and s is not None:
        candidates.append((_half_width(s.saved), f"prefill timed on this machine's {pricing.label}: the saving "
                                                 f"spans {sig(s.saved.low)}-{sig(s.saved.high)} s"))
    elif pricing.kind == "rate":
        candidates.append((0.0, f"a flat {pricing.label} prefill (--prefill-tps: no attention term)"))
    elif s is not None:
        spread = _half_width(s.saved)
        curve = result.cost_curve
        what = _mfu_words(curve) if curve.get("kind") == "roofline" else f"{pricing.label}'s prefill"
        candidates.append((spread, f"{what}: the saving spans {sig(s.saved.low)}-{sig(s.saved.high)} s"))
    cache = _capacity_effect(r, capacity)
    if cache is not None:
        candidates.append(cache)
    if s is not None and s.background > 0:
        if r.store_mode == "async":
            text = f"async stores (off the request's path); sync, it nets {sig(s.net_sync.value)} s"
        elif result.store_mode == "async":  # asked for, but the background cannot keep up over the trace's span
            text = f"sync stores (the background cannot keep up); async, it would net {sig(s.net_async.value)} s"
        else:
            text = f"sync stores (on the request's path); async, it would net {sig(s.net_async.value)} s"
        candidates.append((s.background, text))
    return max(candidates, key=lambda c: c[0])[1] if candidates else "nothing else: the figures are counts"


def _mfu_words(curve: dict) -> str:
    """A roofline's utilization and interval, named by where it comes from
    (:meth:`kvcli.model.roofline.Roofline.to_dict`): "h100-sxm bf16 MFU 0.45 (0.34-0.58)" (published), "--mfu 0.50
    (0.38-0.64)", or "MFU 0.52 (0.39-0.67)" without a published entry."""
    basis = curve.get("mfu_basis") or {}
    if str(curve.get("mfu_source", "")).startswith("--mfu"):
        name = "--mfu"
    else:
        name = f"{basis['accelerator']} {basis['precision']} MFU" if basis else "MFU"
    low, high = curve["mfu_interval"]
    return f"{name} {curve['mfu']:.2f} ({low:.2f}-{high:.2f})"


def _half_width(iv: Interval) -> float:
    """An interval's larger side from its value."""
    return max(iv.high - iv.value, iv.value - iv.low)


def _capacity_effect(r: ChunkSizeResult, capacity: str | None) -> tuple[float, str] | None:
    """What the cache's size moves (seconds, words): unbounded, half of it; bounded, no bound."""
    curve = r.hit_curve
    if not r.hit_tokens or not r.prompt_tokens:
        return None
    per_token = r.saved_prefill_seconds / r.hit_tokens
    if capacity is not None:
        more = r.hit_tokens_unlimited - r.hit_tokens
        return (per_token * more, f"a {capacity} cache; unbounded, it hits "
                                  f"{_pct(r.hit_tokens_unlimited / r.prompt_tokens)}, not "
                                  f"{_pct(r.hit_token_ratio)}") if more > 0 else None
    if curve is None or curve.distinct_chunks < 2:
        return None
    half = curve.distinct_chunks // 2
    lost = r.hit_tokens - curve.hit_tokens(half)
    return (per_token * lost, f"an unbounded cache; half of it ({fmt_bytes(half * curve.payload_bytes_per_chunk)}) "
                              f"hits {_pct(curve.hit_tokens(half) / r.prompt_tokens)}, not "
                              f"{_pct(r.hit_token_ratio)}") if lost > 0 else None


# -- words --------------------------------------------------------------------------------------------------------
def headline(a: Answer, width: int | None = None) -> str:
    """The answer in a few words, fitted to ``width`` columns after its "answer: " where a shorter wording allows
    (None: the long one): "chunk size 64 (16, 64 tie within noise; 64 writes the fewest objects)", "chunk size
    16 (it beats 64, 256, 1024 beyond noise)", "chunk size 16 (the only size compared; it pays off beyond
    noise)", "don't cache (no chunk size pays off beyond noise)"."""
    cs = a.chunk_size
    if a.verdict == "empty":
        return "nothing to replay (every request's prompt is empty)"
    if a.verdict == "tie":
        tied = ", ".join(map(str, a.tied))
        words = [f"chunk size {cs} ({tied} tie within noise; {cs} writes the fewest objects)",
                 f"chunk size {cs} ({tied} tie; {cs} writes the fewest objects)",
                 f"chunk size {cs} ({len(a.tied)} sizes tie; {cs} writes the fewest objects)",
                 f"chunk size {cs} ({len(a.tied)} sizes tie; it writes the fewest objects)"]
    elif a.verdict == "clear" and len(a.sizes) == 1:
        words = [f"chunk size {cs} (the only size compared; it pays off beyond noise)"]
    elif a.verdict == "clear":
        others = [x for x in a.sizes if x != cs]
        words = [f"chunk size {cs} (it beats {', '.join(map(str, others))} beyond noise)",
                 f"chunk size {cs} (it beats the other {len(others)} sizes beyond noise)"]
    elif a.verdict == "noise":
        words = ["don't cache (no chunk size pays off beyond noise)"]
    else:
        words = ["don't cache (no chunk size pays off)"]
    return _fit(words, width, len("answer: "))


def figures(a: Answer, width: int | None = None, per_day: bool = True) -> str:
    """Hit ratio, prefill saved (its interval, its share of the trace's prefill) and net benefit at the answer's
    chunk size, with the saving per day when there is one (``per_day``); fitted to ``width`` columns after a
    2-column indent by leaving out the stores' mode, then the interval, then all but one figure per day, then
    "of prefill" (None: all of it)."""
    saved, net = a.saved, a.net
    if saved is None or net is None:
        return "no figures"
    at = "" if a.chunk_size is not None else f"at {a.focus}: "
    ends = (sig(saved.low), sig(saved.high))
    iv = "" if ends == (sig(saved.value),) * 2 else f" [{ends[0]}, {ends[1]}]"  # none to give: exact
    mode = f" ({a.store_mode} stores)"
    day, one = (day_text(a), day_text(a, one=True)) if per_day else ("", "")

    def words(interval: str, stores: str, of: str, days: str) -> str:
        share = "" if a.share is None else f" = {_pct(a.share.value)}{of}"
        return (f"{at}hit {_pct(a.hit_token_ratio)}; saves {sig(saved.value)} s{interval}{share}; net "
                f"{sig(net.value)} s{stores}{'; ' + days if days else ''}")

    of = " of prefill"
    return _fit([words(iv, mode, of, day), words(iv, "", of, day), words("", "", of, day), words("", "", of, one),
                 words("", "", "", one)], width, 2)


def day_text(a: Answer, unit: str = "/day", one: bool = False) -> str:
    """The saving per day of this traffic: accelerator-seconds (a priced prefill) and money at the gpu-hour price
    it names (a price given), each followed by ``unit`` ("" where the line says "per day" itself); with ``one``, the
    money alone where there is some, without its price; "" without either."""
    parts = []
    if a.per_day is not None and not (one and a.usd_per_day is not None):
        parts.append(f"{_short(a.per_day.value)} accelerator-s{unit}")
    if a.usd_per_day is not None:
        parts.append(f"${_short(a.usd_per_day.value)}{unit}"
                     + ("" if one else f" at ${a.pricing.gpu_hour_usd:g}/GPU-hour"))
    return ", ".join(parts)


def _short(x: float) -> str:
    """A figure to 3 significant digits, k, M, ... from 10,000 on (2,330,000 -> "2.33M")."""
    return fmt_count(round(x)) if abs(x) >= 10_000 else sig(x)


def _fit(words: list[str], width: int | None, indent: int) -> str:
    """The first of ``words`` (longest first) that fits ``width`` columns after ``indent``; the last one else."""
    if width is None:
        return words[0]
    return next((w for w in words if indent + len(w) <= width), words[-1])


def answer_lines(a: Answer, width: int = 80) -> list[str]:
    """The answer as the report's first lines, at most :data:`MAX_LINES`: the answer; hit ratio, saving and net
    benefit (and the saving per day); the cache it assumes; how big a cache must be (when sized); the assumption
    that moves it most. Each fits ``width`` where its figures allow: the saving per day takes a line of its own
    when it does not fit beside the figures and there is a line to spare; else the figures drop detail (the
    stores' mode, the interval, the price's rate) until they fit."""
    if a.verdict == "empty":
        return [f"answer: {headline(a, width)}"]
    rest = [f"  {a.capacity_text}"] + ([f"  {a.sizing_text}"] if a.sizing_text else []) + [f"  assumes {a.assumption}"]
    numbers = [f"  {figures(a)}"]
    if len(numbers[0]) > width:
        if day_text(a) and 2 + len(rest) < MAX_LINES:  # a line to spare: the figures, then the day
            numbers = [f"  {figures(a, width, per_day=False)}", f"  saves per day of this traffic: {day_text(a, '')}"]
        else:
            numbers = [f"  {figures(a, width)}"]
    return [f"answer: {headline(a, width)}", *numbers, *rest]


def answer_line(trace: str, a: Answer, measured: int) -> str:
    """The answer in one line for stderr (never wrapped): ``trace: `` and every part of :func:`answer_lines`, whole,
    then how many requests were measured."""
    if a.verdict == "empty":
        return f"{trace}: {headline(a)}"
    parts = [headline(a), figures(a), a.capacity_text, a.sizing_text, f"assumes {a.assumption}",
             f"{measured} measured"]
    return f"{trace}: " + "; ".join(p for p in parts if p)
