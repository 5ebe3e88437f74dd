"""Random hardware configs for fuzzing, drawn within `HardwareConfig`'s own field ranges.

Three kinds: "default" (the defaults, either dataflow), "tiny" (1x1 to 4x4 arrays, scratchpads
and accumulators of a few hundred bytes to a few KiB, a handful of lanes: every layer is split
into many tiles, or cannot be tiled at all) and "random" (every structural field drawn log-uniformly
over a realistic part of its range, continuous fields over theirs, so the timing model sees
extreme bandwidths and latencies too); the two kinds other than "default" pack sub-words or not,
on the array and on the vector unit, each at random.

    >>> import random
    >>> hw = random_hardware(random.Random(0), "tiny")
    >>> hw.array_rows <= 4 and hw.scratchpad_bytes <= 4096
    True
"""

from __future__ import annotations

import math
import random
from dataclasses import fields

from stagec.isa.config import DATAFLOWS, HardwareConfig

HW_KINDS = ("default", "tiny", "random")

# structural fields' (lo, hi) for each kind; fields left out keep their defaults
_TINY = {"array_rows": (1, 4), "array_cols": (1, 4), "scratchpad_bytes": (64, 4096), "accumulator_bytes": (64, 2048),
         "scratchpad_banks": (1, 4), "accumulator_banks": (1, 4), "vector_lanes": (1, 8)}
_RANDOM = {"array_rows": (1, 128), "array_cols": (1, 128), "scratchpad_bytes": (1024, 2**20),
           "accumulator_bytes": (256, 2**18), "scratchpad_banks": (1, 16), "accumulator_banks": (1, 16),
           "vector_lanes": (1, 512), "dram_bytes": (2**16, 2**31)}
_PACKING = ("array_subword_packing", "vector_subword_packing")
_CONTINUOUS = ("dma_bandwidth_bytes_per_cycle", "dma_latency_cycles", "clock_hz", "vector_cycles_per_transcendental")


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(max(lo, 1e-3)), math.log(hi)))


def _draw_int(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform, with the ends of the range drawn often: the edges are where bugs live."""
    r = rng.random()
    if r < 0.1:
        return lo
    if r < 0.2:
        return hi
    return min(hi, max(lo, round(_log_uniform(rng, lo, hi))))


def _bank_multiple(size: int, banks: int, lo: int) -> int:
    """`size` rounded down to whole banks, up where that falls under `lo`."""
    down = size - size % banks
    return down if down >= lo else down + banks


def random_hardware(rng: random.Random, kind: str) -> HardwareConfig:
    """A config of `kind` (one of HW_KINDS), either dataflow."""
    changes: dict = {"dataflow": rng.choice(DATAFLOWS)}
    if kind != "default":
        ranges = _TINY if kind == "tiny" else _RANDOM
        changes.update({name: _draw_int(rng, lo, hi) for name, (lo, hi) in ranges.items()})
        for mem in ("scratchpad", "accumulator"):   # sizes are whole banks
            changes[f"{mem}_bytes"] = _bank_multiple(changes[f"{mem}_bytes"], changes[f"{mem}_banks"],
                                                     ranges[f"{mem}_bytes"][0])
    if kind == "random":
        meta = {f.name: f.metadata for f in fields(HardwareConfig)}
        changes.update({name: _log_uniform(rng, meta[name]["lo"], meta[name]["hi"]) for name in _CONTINUOUS})
    if kind != "default":   # drawn last: the fields above draw as they did before these existed
        changes.update({name: rng.random() < 0.5 for name in _PACKING})
    return HardwareConfig(**changes)


def describe(hw: HardwareConfig) -> dict:
    """The fields of `hw` that differ from the defaults (what a failing case's report shows)."""
    default = HardwareConfig()
    return {f.name: getattr(hw, f.name) for f in fields(hw) if getattr(hw, f.name) != getattr(default, f.name)}
