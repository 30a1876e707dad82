"""The figures' text in tables and tooltips: three significant digits, as the terminal reports print them; ``–``
for a figure that was not computed (null in JSON)."""
from __future__ import annotations

from kvcli.units import fmt_bytes

NA = "–"


def sig(x: float | None) -> str:
    """``x`` to three significant digits, thousands separated from 1,000 on (``126.42`` -> ``"126"``,
    ``0.012179`` -> ``"0.0122"``, ``21573.5`` -> ``"21,574"``)."""
    if x is None:
        return NA
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def pct(x: float | None, digits: int = 1) -> str:
    """A ratio as a percentage (``0.2157`` -> ``"21.6%"``)."""
    return NA if x is None else f"{100 * x:.{digits}f}%"


def count(n: int | float | None) -> str:
    """A count with thousands separators."""
    return NA if n is None else f"{n:,.0f}"


def seconds(x: float | None) -> str:
    """Seconds, three significant digits (``"89.1 s"``)."""
    return NA if x is None else f"{sig(x)} s"


def size(n: float | None) -> str:
    """Bytes in binary units (:func:`kvcli.units.fmt_bytes`: ``"1.3 TiB"``)."""
    return fmt_bytes(n)


def interval(figure: dict | None, unit: str = " s") -> str:
    """A figure with its 95% interval, ``"89.1 [61.5, 127] s"``, from replay's ``{"value_seconds", "low_seconds",
    "high_seconds"}`` (or ``{"value", "low", "high"}``)."""
    if not figure:
        return NA
    value, low, high = (figure.get(f"{k}_seconds", figure.get(k)) for k in ("value", "low", "high"))
    return f"{sig(value)} [{sig(low)}, {sig(high)}]{unit}"
