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


def interleaved(fns, repeats: int = 5, warmup: bool = True) -> list[list[float]]:
    """Seconds of ``repeats`` calls of each function, after one warm-up call each. Calls are interleaved (f1, f2, ...,
    f1, f2, ...), so a slow spell of the machine lands on every side of a comparison instead of on one."""
    if warmup:
        for fn in fns:
            fn()
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return out
