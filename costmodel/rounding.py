"""From the relaxed optimum to a buildable config: a local search on the grid with the exact model.

The relaxed descent (costmodel.codesign.descend) lands between grid values, and where it lands
is only as good as the relaxed model near it: its relaxed ceilings and maxima bend the
landscape (issue 21: a relaxed optimum near a 7x7 array, the simulator's best 8x16 to 12x16).
So the descent only says where to look: every grid config bracketing the relaxed point is
scored with the exact model (each layer on the compiler's own mapping for that config, which the
exact model predicts to a fraction of a percent across hardware, tests/test_codesign.py), and a
hill climb over one-step neighbours (costmodel.grid.BuildableGrid.neighbours) moves while a
neighbour is better: feasible before infeasible, infeasible ones by how far they overshoot,
feasible ones by the objective.  The caller confirms the best few with the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.sim.energy import area_mm2

from .grid import SIZED, BuildableGrid


@dataclass(frozen=True)
class Constraints:
    """Limits a config must meet: its area (mm^2), each model's average power (W: energy over its
    latency) and each model's latency (s; None: no target for that model)."""

    area_mm2: float | None = None
    power_w: float | None = None
    latency_s: tuple = ()

    def ratios(self, hw: HardwareConfig, cycles, energy_pj) -> dict[str, float]:
        """Each constraint's value over its limit (<= 1: met), by name ('area', 'power', 'latency[k]')."""
        cycles, energy_pj = np.asarray(cycles, np.float64), np.asarray(energy_pj, np.float64)
        out = {}
        if self.area_mm2 is not None:
            out["area"] = area_of(hw) / self.area_mm2
        if self.power_w is not None:
            out["power"] = float(np.max(energy_pj * 1e-12 * hw.clock_hz / cycles)) / self.power_w
        for k, target in enumerate(self.latency_s):
            if target is not None:
                out[f"latency[{k}]"] = float(cycles[k]) / hw.clock_hz / target
        return out


def area_of(hw: HardwareConfig) -> float:
    return float(sum(area_mm2(hw).values()))


@dataclass(frozen=True)
class Scored:
    """A config, its exact-model cycles and energy per model, its objective value and constraint ratios."""

    hw: HardwareConfig
    cycles: np.ndarray
    energy_pj: np.ndarray
    value: float
    ratios: dict

    @property
    def overshoot(self) -> float:
        """How far the worst constraint is over its limit (0: feasible)."""
        return max([r - 1.0 for r in self.ratios.values()] + [0.0])

    @property
    def key(self) -> tuple:
        return (self.overshoot, self.value)


def objective_value(hw: HardwareConfig, cycles, energy_pj, objective: str) -> float:
    """What co-design minimizes: the area, or the log of each model's latency, energy or EDP summed
    (so no model dominates by its scale)."""
    if objective == "area":
        return area_of(hw)
    per_model = {"latency": cycles, "energy": energy_pj, "edp": np.asarray(cycles) * np.asarray(energy_pj)}[objective]
    return float(np.sum(np.log(np.asarray(per_model, np.float64))))


def hw_key(hw: HardwareConfig) -> tuple:
    return (hw.dataflow, *(getattr(hw, n) for n in SIZED))


class Search:
    """The exact-model scores of the configs visited, each scored once.  `evaluate(hw)` gives
    (cycles, energy pJ) per model, or None when some layer cannot be mapped on `hw`."""

    def __init__(self, evaluate: Callable, constraints: Constraints, objective: str):
        self.evaluate, self.constraints, self.objective = evaluate, constraints, objective
        self.scored: dict[tuple, Scored | None] = {}

    def score(self, hw: HardwareConfig) -> Scored | None:
        key = hw_key(hw)
        if key not in self.scored:
            found = self.evaluate(hw)
            self.scored[key] = None if found is None else Scored(
                hw, *found, objective_value(hw, *found, self.objective), self.constraints.ratios(hw, *found))
        return self.scored[key]

    def best_of(self, configs) -> Scored | None:
        best = self.best_few(configs, 1)
        return best[0] if best else None

    def best_few(self, configs, count: int) -> list[Scored]:
        scored = {hw_key(s.hw): s for s in map(self.score, configs) if s is not None}
        return sorted(scored.values(), key=lambda s: s.key)[:count]

    def climb(self, start: Scored, grid: BuildableGrid, max_rounds: int = 100) -> Scored:
        """Move to the best neighbour (grid.neighbours; where none is better, grid.king's wider
        neighbourhood) while it is better; the config where none is."""
        current = start
        for _ in range(max_rounds):
            best = self._best_near(grid.neighbours(current.hw), current)
            if best is None or best.key >= current.key:
                best = self._best_near(grid.king(current.hw), current)
            if best is None or best.key >= current.key:
                break
            current = best
        return current

    def _best_near(self, configs, current: Scored) -> Scored | None:
        if current.overshoot == 0 and self.constraints.area_mm2 is not None:   # over budget cannot win
            configs = [hw for hw in configs if area_of(hw) <= self.constraints.area_mm2]
        return self.best_of(configs)

    def ranked(self) -> list[Scored]:
        """Every feasible config visited, best first."""
        return sorted((s for s in self.scored.values() if s is not None and s.overshoot == 0), key=lambda s: s.value)

    def binding(self, chosen: Scored, grid: BuildableGrid) -> tuple[str, ...]:
        """The constraints that stop the search: each is the only one a better neighbour of `chosen` breaks."""
        out = set()
        for hw in grid.neighbours(chosen.hw):
            s = self.score(hw)
            if s is not None and s.value < chosen.value:
                broken = [name for name, r in s.ratios.items() if r > 1.0]
                if len(broken) == 1:
                    out.add(broken[0])
        return tuple(sorted(out))


def relaxed_fields(point) -> dict:
    """A relaxed HardwarePoint's sized fields as numbers."""
    return {n: float(getattr(point, n)) for n in SIZED}
