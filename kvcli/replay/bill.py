"""The bill (``--price``): the saved prefill and the tiers' memory as money per day of the trace's traffic, and the
accelerators the saving frees at the trace's rate. Every price is the user's input: kvcli has no price list.

Inputs: ``gpu-hour=X`` ($ per accelerator-hour of the hardware the prefill is priced on: ``--hardware``,
``--prefill-profile``, or this machine with ``--prefill-tps`` / the calibrated model) and, per tier, ``NAME=Y`` ($
per GB-month of that tier's memory, GB = 10**9 bytes, a month = 365.25 / 12 days). The trace's traffic is taken as
repeating at its own rate: ``span`` = last minus first timestamp (seconds).

    days_per_second     = 86,400 / span
    saved $/day         = saved_prefill_seconds * 86,400 / span / 3,600 * gpu_hour
    memory $/day (tier) = tier_bytes / 1e9 * price_per_GB_month / (365.25 / 12)
    net $/day           = saved $/day - sum of memory $/day
    accelerators freed  = saved_prefill_seconds / span   (accelerators kept busy by the prefill the cache saves)

The saved prefill carries the replay's 95% interval (the cost curve's; :mod:`kvcli.replay.savings`), and so do
saved $/day, net $/day and accelerators freed; memory is exact given the sizes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvcli.errors import BadInputError
from kvcli.replay.savings import Interval

DAYS_PER_MONTH = 365.25 / 12
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Prices:
    """``--price`` values: ``gpu_hour`` ($ per accelerator-hour, None: not given) and ``per_gb_month`` ($ per
    GB-month by tier name)."""

    gpu_hour: float | None = None
    per_gb_month: dict[str, float] = field(default_factory=dict)


MAX_PRICE = 1e9  # $ per unit at most: larger is a typo, and its products overflow a float's finite range


def parse_prices(texts: list[str] | None) -> Prices | None:
    """``["gpu-hour=2.5", "host=0.3", "redis=1.2"]`` -> :class:`Prices` (None for no ``--price``).

    Raises:
        BadInputError: no ``=``, a price that is not a finite number >= 0, or a name given twice (names --price).
    """
    if not texts:
        return None
    gpu_hour, per_gb = None, {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        try:
            price = float(value.strip().removeprefix("$"))
        except ValueError:
            price = float("nan")
        if not sep or not name or not 0 <= price <= MAX_PRICE:
            raise BadInputError(f"--price must be gpu-hour=$ or TIER=$/GB-month with a number from 0 to "
                                f"{MAX_PRICE:,.0f}, got {text!r}")
        if name == "gpu-hour":
            if gpu_hour is not None:
                raise BadInputError("--price gpu-hour is given twice")
            gpu_hour = price
        elif name in per_gb:
            raise BadInputError(f"--price {name} is given twice")
        else:
            per_gb[name] = price
    return Prices(gpu_hour, per_gb)


def check_prices(prices: Prices | None, tier_names: list[str]) -> None:
    """Raise BadInputError (naming --price) for a per-GB price of a tier that ``--tier`` does not name."""
    if prices is None:
        return
    unknown = [n for n in prices.per_gb_month if n not in tier_names]
    if unknown:
        raise BadInputError(f"--price {', '.join(unknown)}: no --tier of that name (tiers: "
                            f"{', '.join(tier_names) or 'none'}; the accelerator's price is gpu-hour=...)")


def bill(saved_seconds: Interval, span_seconds: float | None, tier_bytes: dict[str, int], prices: Prices) -> dict:
    """The bill (module docstring) of one chunk size, JSON-ready: ``saved_usd_per_day``, ``memory_usd_per_day``
    (by tier), ``net_usd_per_day`` (intervals as ``{value, low, high}``; None where an input is missing),
    ``accelerators_freed``, and ``inputs``. ``span_seconds`` None or 0 (no timestamps): no rate, so no money per
    day and no accelerators freed."""
    rate = SECONDS_PER_DAY / span_seconds if span_seconds else None
    memory = {name: tier_bytes.get(name, 0) / 1e9 * price / DAYS_PER_MONTH
              for name, price in prices.per_gb_month.items()}
    out: dict = {"memory_usd_per_day": memory, "saved_usd_per_day": None, "net_usd_per_day": None,
                 "accelerators_freed": None,
                 "inputs": {"saved_prefill_seconds": saved_seconds.to_dict(), "trace_span_seconds": span_seconds,
                            "gpu_hour_usd": prices.gpu_hour, "usd_per_gb_month": dict(prices.per_gb_month),
                            "tier_bytes": dict(tier_bytes), "days_per_month": DAYS_PER_MONTH}}
    if span_seconds:
        out["accelerators_freed"] = _scaled(saved_seconds, 1 / span_seconds).to_dict()
    if rate is not None and prices.gpu_hour is not None:
        saved = _scaled(saved_seconds, rate / 3600 * prices.gpu_hour)
        cost = sum(memory.values())
        out["saved_usd_per_day"] = saved.to_dict()
        out["net_usd_per_day"] = Interval(saved.value - cost, saved.low - cost, saved.high - cost).to_dict()
    return out


def _scaled(iv: Interval, factor: float) -> Interval:
    return Interval(iv.value * factor, iv.low * factor, iv.high * factor)


FORMULAS = ("saved $/day = saved prefill s x 86,400 / trace span s / 3,600 x $/gpu-hour",
            "memory $/day = tier bytes / 1e9 x $/GB-month / 30.44 days",
            "net $/day = saved - memory; accelerators freed = saved prefill s / trace span s")
"""The bill's formulas, printed under the report's table."""
