"""The one request order every command uses: arrival (timestamp) order when every request has a timestamp,
stable (equal timestamps keep their file order); file order otherwise. A trace that is not already in that order
is reordered, and the command says so (:func:`order_note`), so replay, route and warm see one sequence."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def arrival_order(timestamps: Sequence[float | None]) -> np.ndarray | None:
    """Indices of the requests in arrival order, or None when the file order already is that order (timestamps
    non-decreasing) or some request has no timestamp (file order then). Seconds; stable for equal timestamps."""
    if not len(timestamps) or any(t is None for t in timestamps):
        return None
    ts = np.asarray(timestamps, dtype=np.float64)
    if not np.any(ts[1:] < ts[:-1]):
        return None
    return np.argsort(ts, kind="stable")


def order_note(order: np.ndarray | None, name: str) -> str:
    """One line saying a trace was reordered (empty when ``order`` is None)."""
    if order is None:
        return ""
    moved = int(np.count_nonzero(order != np.arange(len(order))))
    return (f"{name} is not sorted by timestamp ({moved:,} of {len(order):,} requests out of place): requests are "
            f"taken in timestamp order (stable), the order every kvcli command uses")
