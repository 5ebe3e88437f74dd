"""Shared by the benchmarks: wall-clock medians (the machines are noisy; read ratios, not times)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeat: int, warmup: bool = True) -> float:
    """Median seconds of `repeat` calls of fn, after one uncounted call (jit compilation) if `warmup`."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
