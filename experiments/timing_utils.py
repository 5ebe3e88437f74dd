"""Shared by the benchmarks: wall-clock medians (the machines are noisy; read ratios, not times)."""

from __future__ import annotations

import statistics
import time


def median_times(fns, repeat: int, warmup: bool = True) -> list[float]:
    """Median seconds of `repeat` calls of each of fns, after one uncounted call each (jit
    compilation) if `warmup`.  The calls take turns, one of each a round, so that a ratio of two
    medians compares runs made under the same load of a shared machine."""
    if warmup:
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def median_time(fn, repeat: int, warmup: bool = True) -> float:
    """Median seconds of `repeat` calls of fn (median_times of one)."""
    return median_times([fn], repeat, warmup)[0]
