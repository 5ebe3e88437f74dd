"""Calibration: the range of every float value of a graph over representative inputs.

The graph reference (lower.graph.evaluate) runs on each batch; every float32 input and
node result is observed.  A value's range is the bound `amax` of its symmetric
int8 scale (amax / 127): the largest |x| seen (min/max calibration), or the
given percentile of |x| over all batches, which clips rare outliers.  The
percentile is exact (numpy's linear interpolation) from the largest |x| kept per
value, never the whole tensor.
"""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import InputError

from .evaluate import evaluate
from .graph_ir import Graph, Value


class _Largest:
    """The `keep` largest |x| of a stream of arrays, and how many elements went by."""

    def __init__(self, keep: int):
        self.keep, self.count, self.top = keep, 0, np.zeros(0, np.float32)

    def add(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float32)).reshape(-1)
        self.count += a.size
        both = np.concatenate([self.top, a])
        self.top = both if both.size <= self.keep else np.partition(both, both.size - self.keep)[-self.keep:]

    def percentile(self, q: float) -> float:
        """np.percentile(all |x|, q), from the kept tail."""
        desc = np.sort(self.top)[::-1]
        pos = q / 100 * (self.count - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        v_lo, v_hi = float(desc[self.count - 1 - lo]), float(desc[self.count - 1 - hi])
        return v_lo + (pos - lo) * (v_hi - v_lo)


def calibrate(graph: Graph, batches: list[list[np.ndarray]], percentile: float | None = None) -> dict[int, float]:
    """{value id: amax} of every float32 graph input and node result over `batches` (each the graph's
    flat inputs).  `percentile` (e.g. 99.99) takes that percentile of |x| instead of the maximum."""
    if not batches:
        raise InputError("calibration needs at least one batch of inputs")
    if percentile is not None and not 0 < percentile <= 100:
        raise InputError(f"percentile must be in (0, 100], got {percentile}")
    floats = [v for v in (*graph.inputs, *(n.output for n in graph.nodes)) if v.dtype == "float32"]
    ranges = {}
    for v in floats:
        total = v.size * len(batches)
        keep = 1 if percentile is None else min(total, math.floor((total - 1) * (1 - percentile / 100)) + 2)
        ranges[v.id] = _Largest(keep)

    def observe(v: Value, x) -> None:
        if v.id in ranges:
            ranges[v.id].add(np.asarray(x))
    for i, batch in enumerate(batches):
        if len(batch) != len(graph.inputs):
            raise InputError(f"calibration batch {i} has {len(batch)} inputs; the model takes {len(graph.inputs)}")
        evaluate(graph, *batch, observe=observe)
    return {vid: float(r.top.max()) if percentile is None else r.percentile(percentile) for vid, r in ranges.items()}


def channel_ranges(graph: Graph, batches: list[list[np.ndarray]]) -> dict[int, np.ndarray]:
    """{value id: max |x| per channel} of every float32 graph input and node result of two or more
    dims over `batches`, a channel being an index of the last axis (a transformer's hidden unit)."""
    ranges: dict[int, np.ndarray] = {}

    def observe(v: Value, x) -> None:
        if v.dtype == "float32" and len(v.shape) >= 2:
            a = np.abs(np.asarray(x, np.float32)).reshape(-1, v.shape[-1]).max(0)
            ranges[v.id] = np.maximum(ranges[v.id], a) if v.id in ranges else a
    for batch in batches:
        evaluate(graph, *batch, observe=observe)
    return ranges
