"""The buildable hardware grid co-design rounds to and sensitivities step along.

Array sides in multiples of `array_step` (4 by default: 4, 8, 12, 16, ...), memories in multiples
of `memory_step` (32 KiB: 32, 64, 96, ...), the DMA bandwidth on a ladder of two steps per
octave (4, 6, 8, 12, 16, 24, ...), each within its range; below the first step, the powers of
two (1 and 2 rows, 4, 8 and 16 KiB), so small configs stay reachable.  Not only powers of two:
the best 1x1 conv config under 2 mm^2 (issue 21) is 12x16, which no power-of-two grid holds.

    >>> grid = BuildableGrid()
    >>> grid.values("array_rows")[:6]
    (1, 2, 4, 8, 12, 16)
    >>> grid.step("scratchpad_bytes", 64 * 1024, +1) // 1024
    96
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stagec.errors import InputError
from stagec.isa.config import HardwareConfig

SIZED = ("array_rows", "array_cols", "scratchpad_bytes", "accumulator_bytes", "dma_bandwidth_bytes_per_cycle")


@dataclass(frozen=True)
class BuildableGrid:
    array_step: int = 4
    memory_step: int = 32 * 1024
    array_range: tuple[int, int] = (1, 256)
    memory_range: tuple[int, int] = (4096, 8 * 2**20)
    bandwidth_range: tuple[float, float] = (4.0, 64.0)

    def __post_init__(self):
        if self.array_step < 1 or self.memory_step < 64:
            raise InputError(f"BuildableGrid: array_step {self.array_step} must be >= 1 and memory_step "
                             f"{self.memory_step} >= 64 bytes")

    @cached_property
    def _values(self) -> dict:
        def ladder(step, lo, hi):
            below = [1 << k for k in range(int(np.log2(step)) + 1) if lo <= 1 << k < step]
            return tuple(sorted({*below, *range(max(step, -(-lo // step) * step), hi + 1, step)}))

        lo, hi = self.bandwidth_range
        octaves = [2.0 ** k * f for k in range(-10, 21) for f in (1.0, 1.5)]
        return {"array_rows": ladder(self.array_step, *self.array_range),
                "array_cols": ladder(self.array_step, *self.array_range),
                "scratchpad_bytes": ladder(self.memory_step, *self.memory_range),
                "accumulator_bytes": ladder(self.memory_step, *self.memory_range),
                "dma_bandwidth_bytes_per_cycle": tuple(v for v in octaves if lo <= v <= hi) or (float(lo),)}

    def values(self, name: str) -> tuple:
        """The buildable values of a sized field, ascending."""
        if name not in SIZED:
            raise InputError(f"BuildableGrid has no field {name!r}; expected one of {SIZED}")
        return self._values[name]

    def index(self, name: str, value) -> int:
        """The index of the grid value nearest `value` (in log space)."""
        v = np.asarray(self.values(name), np.float64)
        return int(np.argmin(np.abs(np.log(v) - np.log(max(float(value), 1e-9)))))

    def step(self, name: str, value, direction: int):
        """The grid value `direction` steps from the one nearest `value`, or None past the range's end."""
        k = self.index(name, value) + direction
        v = self.values(name)
        return v[k] if 0 <= k < len(v) else None

    def bracket(self, name: str, value) -> tuple:
        """The grid values just below and above `value` (one when it is on the grid or outside)."""
        v = np.asarray(self.values(name), np.float64)
        k = int(np.searchsorted(v, float(value)))
        return tuple(self.values(name)[i] for i in sorted({min(max(k - 1, 0), len(v) - 1), min(k, len(v) - 1)}))

    def snap(self, hw: HardwareConfig) -> HardwareConfig:
        """`hw` with each sized field at its nearest grid value (memories a multiple of their banks)."""
        return fit_banks(hw.replace(**{n: self.values(n)[self.index(n, getattr(hw, n))] for n in SIZED}))

    def corners(self, hw: HardwareConfig, point: dict) -> list[HardwareConfig]:
        """Every config whose sized fields bracket the relaxed values `point` (field -> number)."""
        options = [self.bracket(n, point[n]) for n in SIZED]
        return [fit_banks(hw.replace(**dict(zip(SIZED, vs, strict=True)))) for vs in itertools.product(*options)]

    def neighbours(self, hw: HardwareConfig) -> list[HardwareConfig]:
        """Configs one grid step away: each field up or down, one field up while another goes down
        (the trades along an area budget), the other dataflow, and the array's other shapes."""
        moves = [{n: d} for n in SIZED for d in (-1, 1)]
        moves += [{a: 1, b: -1} for a, b in itertools.permutations(SIZED, 2)]
        out = [self._moved(hw, move) for move in moves]
        return [h for h in out if h is not None] + [hw.replace(dataflow=_other(hw.dataflow))] + self.reshapes(hw)

    def king(self, hw: HardwareConfig) -> list[HardwareConfig]:
        """Configs at most one grid step away in every sized field at once, in either dataflow: the
        wider neighbourhood a climb tries where `neighbours` finds nothing better."""
        out = []
        for steps in itertools.product((-1, 0, 1), repeat=len(SIZED)):
            moved = self._moved(hw, dict(zip(SIZED, steps, strict=True)))
            if moved is not None:
                out += [moved, moved.replace(dataflow=_other(hw.dataflow))]
        return [h for h in out if h != hw]

    def _moved(self, hw: HardwareConfig, move: dict) -> HardwareConfig | None:
        changed = {n: self.step(n, getattr(hw, n), d) for n, d in move.items()}
        return None if None in changed.values() else fit_banks(hw.replace(**changed))

    def reshapes(self, hw: HardwareConfig) -> list[HardwareConfig]:
        """The array's other shapes of at most as many PEs (each row count with the most columns that
        fit), in either dataflow: the landscape is rugged in the array's aspect (a side's folds of the
        layer's dims round up), so one-step moves alone stop at a shape whose transpose is far better."""
        pes, out = hw.array_rows * hw.array_cols, []
        for rows in self.values("array_rows"):
            cols = [c for c in self.values("array_cols") if rows * c <= pes]
            if cols and rows * cols[-1] >= pes / 2:
                shaped = hw.replace(array_rows=rows, array_cols=cols[-1])
                out += [shaped, shaped.replace(dataflow=_other(hw.dataflow))]
        return out


def _other(dataflow: str) -> str:
    return "output_stationary" if dataflow == "weight_stationary" else "weight_stationary"


def fit_banks(hw: HardwareConfig) -> HardwareConfig:
    """Memories raised to at least 64 bytes per bank and to a multiple of their bank counts."""
    def fit(size, banks):
        return max(-(-int(size) // banks) * banks, 64 * banks)
    return hw.replace(scratchpad_bytes=fit(hw.scratchpad_bytes, hw.scratchpad_banks),
                      accumulator_bytes=fit(hw.accumulator_bytes, hw.accumulator_banks),
                      dma_bandwidth_bytes_per_cycle=float(hw.dma_bandwidth_bytes_per_cycle))
