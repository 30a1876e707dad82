"""Shared helpers for bench/ scripts: repeat a timing, report min and median."""
from __future__ import annotations

import statistics
import time


def timed(fn, repeats: int = 5) -> tuple[float, float]:
    """Run ``fn`` ``repeats`` times; return (min, median) wall seconds. The machine is noisy: report both."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)
