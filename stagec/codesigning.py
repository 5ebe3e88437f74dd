"""stagec.codesign: a buildable accelerator for one or several models, by gradient on the cost model,
rounded with the exact model and confirmed by the simulator.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
    >>> result = stagec.codesign([(model, (torch.randn(1, 8, 16, 16),))], area_budget_mm2=2.0)  # doctest: +SKIP
    >>> result.area_mm2 <= 2.0, result.reports[0].cycles, result.binding                      # doctest: +SKIP

Steps: every model's tunable layers (stagec.layers; shapes shared between models counted per
model) -> costmodel.codesign.descend (hardware and mappings together, constraints as penalties)
-> costmodel.rounding: the grid configs (costmodel.grid: array sides in steps of 4, memories in
32 KiB steps) around the relaxed point, then a hill climb over grid neighbours, each config
scored by the exact model with the compiler's own mapping of every layer -> the best few, each
model lowered and timed by the simulator, the best whose simulated area, power and latencies
meet the constraints kept -> optionally, mappings tuned for it (stagec.tune), kept if the
simulator confirms them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import numpy as np

from stagec.costmodel.batch import exact_cost
from stagec.costmodel.codesign import DEFAULT_CODESIGN, OBJECTIVES, CodesignSettings, descend
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import DEFAULT_CONSTANTS, CostConstants
from stagec.costmodel.problem import mapping_arrays, stack
from stagec.costmodel.rounding import Constraints, Scored, Search, area_of, objective_value, relaxed_fields
from stagec.costmodel.tuner import TuneSettings
from stagec.errors import InputError, TilingError
from stagec.isa import HardwareConfig
from stagec.lower.schedule.mapper import default_mapping
from stagec.lower.schedule.nest_map import shared_pricing

from .fusing import fused_cost, model_chains, schedule
from .layers import model_graph, model_layers
from .pipeline import lower_graph
from .progress import note
from .report import Report, make_report
from .sweeps.results import CONFIG_COLUMNS
from .tuning import tune_graph


@dataclass(frozen=True)
class Codesign:
    """The chosen buildable config; per model its mappings, simulator report and the exact model's
    prediction (conv-shaped layers only); each constraint's simulated value over its limit
    (`ratios`, <= 1), the constraints that stop a better config (`binding`), and the configs the
    exact model scored (`evaluated`) and the simulator timed (`simulated`); the predictions price
    the program the simulator timed (with fusion, its cascades: stagec.fusing), mappings tuned
    (tune_settings) aside, whose layers run alone.  `scored` has a row per
    scored config and model (stagec.sweeps' row keys: model, area_mm2, latency_s, energy_pj and the
    config's fields): `stagec.sweeps.SweepResults(list(result.scored))` draws their Pareto fronts."""

    hw: HardwareConfig
    mappings: tuple[dict, ...]
    reports: tuple[Report, ...]
    predicted_cycles: tuple[float, ...]
    predicted_energy_pj: tuple[float, ...]
    objective: str
    ratios: dict
    binding: tuple[str, ...]
    evaluated: int
    simulated: int
    scored: tuple = ()
    predicted_dram_bytes: tuple[float, ...] = ()

    @property
    def area_mm2(self) -> float:
        return area_of(self.hw)

    def __str__(self) -> str:
        hw = self.hw
        lines = [f"codesign for {self.objective}: array {hw.array_rows}x{hw.array_cols} {hw.dataflow}, scratchpad "
                 f"{hw.scratchpad_bytes // 1024} KiB, accumulator {hw.accumulator_bytes // 1024} KiB, DMA "
                 f"{hw.dma_bandwidth_bytes_per_cycle:g} B/cycle; area {self.area_mm2:.3f} mm^2 "
                 f"({self.evaluated} configs scored, {self.simulated} simulated)"]
        for k, r in enumerate(self.reports):
            lines.append(f"  model {k}: simulated {r.cycles:.0f} cycles, {sum(r.energy_pj.values()) / 1e6:.2f} uJ "
                         f"(exact model, conv-shaped layers: {self.predicted_cycles[k]:.0f} cycles)")
        if self.ratios:
            lines.append("  constraints (simulated / limit): " + ", ".join(
                f"{k} {v:.2f}{' binds' if k in self.binding else ''}" for k, v in self.ratios.items()))
        return "\n".join(lines)


def _example(item):
    model, args, *rest = item
    return model, args, (rest[0] if rest else None)


def codesign(models, area_budget_mm2: float | None = None, objective: str = "latency",
             power_budget_w: float | None = None, latency_targets_s=None, hw: HardwareConfig | None = None,
             settings: CodesignSettings = DEFAULT_CODESIGN, tune_settings: TuneSettings | None = None,
             constants: CostConstants = DEFAULT_CONSTANTS, progress: bool = True, fusion: bool = True) -> Codesign:
    """Choose the array's rows and columns, scratchpad and accumulator sizes, DMA bandwidth and
    dataflow of `hw` (default HardwareConfig()) for `models` (a list of (model, args) or (model,
    args, kwargs)), minimizing `objective` ('latency', 'energy', 'edp': with several models, the
    product of theirs; or 'area') subject to `area_budget_mm2`, `power_budget_w` (each model's
    energy over its latency) and `latency_targets_s` (one number for every model, or one per model,
    None for none).  With `fusion` (the default) every config is priced with its layers fused into
    cascades as `stagec.compile` fuses them on it (stagec.fusing; the descent relaxes the choice:
    costmodel.fusion) and simulated so compiled; `fusion=False`: layer by layer, every activation
    through DRAM.  The result is on the buildable grid (settings.grid()) and its constraints are
    confirmed by the simulator; InputError when no config meets them."""
    graphs = [model_graph(*_example(m)) for m in models]
    return codesign_graphs(graphs, area_budget_mm2, objective, power_budget_w, latency_targets_s, hw, settings,
                           tune_settings, constants, progress, fusion)


def codesign_graphs(graphs, area_budget_mm2: float | None = None, objective: str = "latency",
                    power_budget_w: float | None = None, latency_targets_s=None, hw: HardwareConfig | None = None,
                    settings: CodesignSettings = DEFAULT_CODESIGN, tune_settings: TuneSettings | None = None,
                    constants: CostConstants = DEFAULT_CONSTANTS, progress: bool = True,
                    fusion: bool = True) -> Codesign:
    """codesign on models already traced to fused graphs (stagec.layers.model_graph): for sweeps
    (a Pareto front) that trace each model once."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown codesign objective {objective!r}; expected one of {OBJECTIVES}")
    base = hw or HardwareConfig()
    constraints = Constraints(area_budget_mm2, power_budget_w, _targets(latency_targets_s, len(graphs)))
    with shared_pricing():     # the configs scored differ in few fields, often the memories alone
        workloads = Workloads(graphs, objective, constants, fusion)
        start = stack([mapping_arrays(workloads.mapping(u, base)) for u in workloads.rows])
        point, _ = descend(workloads.shapes, start, workloads.counts, workloads.workload, len(graphs), base,
                           area_budget_mm2, objective, power_budget_w, constants,
                           settings if progress else replace(settings, report_every=0), constraints.latency_s,
                           workloads.chains(base))
        grid = settings.grid()
        search = Search(workloads.evaluate, constraints, objective)
        starts = search.best_few(grid.corners(base, relaxed_fields(point)), settings.starts)
        if not starts:
            raise InputError("no buildable config around the relaxed optimum can map every layer")
        chosen = min((search.climb(s, grid) for s in starts), key=lambda s: s.key)
        if chosen.overshoot > 0:
            raise InputError(f"no buildable config meets the constraints: the nearest, {_describe(chosen.hw)}, is at "
                             + ", ".join(f"{k} {v:.2f}x its limit" for k, v in chosen.ratios.items()))
        note(f"codesign: exact model scored {len(search.scored)} configs; best {_describe(chosen.hw)}; "
             f"simulating the best {settings.confirm}", progress)
        return _confirm(search, grid, workloads, constraints, objective, settings, tune_settings)


class Workloads:
    """The models' conv-shaped layers, each distinct (model, shape) once with its multiplicity:
    what the descent relaxes and what the exact model scores a config by; with `fusion`, the layers
    fused into cascades as the compiler fuses them (stagec.fusing)."""

    def __init__(self, graphs, objective: str, constants: CostConstants, fusion: bool = True):
        self.graphs, self.constants, self.fusion = graphs, constants, fusion
        self.mapper_objective = "latency" if objective == "area" else objective
        self.per_model = [model_layers(g) for g in graphs]
        unique, index = {}, []
        for w, layers in enumerate(self.per_model):
            for layer in layers:
                key = tuple(float(v) for v in jax.tree.leaves(layer.shape()))
                unique.setdefault(key, layer)
                index.append((w, list(unique).index(key)))
        firsts, pairs = list(unique.values()), sorted(set(index))
        self.rows = [firsts[u] for _, u in pairs]
        self.row_of = [[pairs.index(p) for p in index if p[0] == w] for w in range(len(graphs))]   # per model layer
        self.counts = np.array([index.count(p) for p in pairs], np.float32)
        self.workload = np.array([w for w, _ in pairs], np.int32)
        self.shapes = stack([layer.shape() for layer in self.rows])

    def mapping(self, layer, hw: HardwareConfig):
        """The compiler's mapping of `layer` on `hw` (lower.schedule.mapper, for codesign's objective)."""
        return default_mapping(layer.kind, layer.problem, hw, layer.extras, layer.name, self.mapper_objective)

    def evaluate(self, hw: HardwareConfig):
        """(cycles, energy pJ) per model by the exact model, each layer on the compiler's mapping (with
        fusion, its cascades too); None when a layer does not fit."""
        try:
            if self.fusion:
                return self.predict(hw)[:2]
            maps = [self.mapping(u, hw) for u in self.rows]
        except TilingError:
            return None
        return self.cost(hw, maps)

    def predict(self, hw: HardwareConfig, mappings: list[dict] | None = None) -> tuple:
        """(cycles, energy pJ, DRAM bytes) per model by the exact model, of what `simulate(hw, mappings)`
        compiles (stagec.fusing.fused_cost)."""
        costs = [fused_cost(schedule(g, hw, self.mapper_objective, m), self.constants)
                 for g, m in zip(self.graphs, mappings or [None] * len(self.graphs), strict=True)]
        return tuple(np.array(v, np.float64) for v in zip(*costs, strict=True))

    def chains(self, hw: HardwareConfig) -> list:
        """The models' chains of fusable layers as the compiler finds them on `hw` (none without fusion)."""
        if not self.fusion:
            return []
        found = []
        for w, (g, rows) in enumerate(zip(self.graphs, self.row_of, strict=True)):
            names = {layer.name: r for layer, r in zip(self.per_model[w], rows, strict=True)}
            found += model_chains(schedule(g, hw, self.mapper_objective), names, w)
        return found

    def simulate(self, hw: HardwareConfig, mappings: list[dict] | None = None) -> list[Report]:
        """Each model compiled on `hw` with `mappings` (one dict per model: no cascades), or, None, as
        stagec.compile maps and fuses it, and timed by the simulator."""
        if mappings is None:
            return [make_report(lower_graph(g, hw, objective=self.mapper_objective)) for g in self.graphs]
        return [make_report(lower_graph(g, hw, m)) for g, m in zip(self.graphs, mappings, strict=True)]

    def cost(self, hw: HardwareConfig, maps) -> tuple:
        """(cycles, energy pJ) per model by the exact model, `rows[k]` on `maps[k]`."""
        cost = exact_cost(self.shapes, stack([mapping_arrays(m) for m in maps]), hardware_point(hw), self.constants)
        n = len(self.graphs)
        return tuple(np.bincount(self.workload, np.asarray(v, np.float64) * self.counts, minlength=n)
                     for v in (cost.cycles, cost.energy_pj))

    def model_mappings(self, hw: HardwareConfig, maps=None) -> list[dict]:
        """Per model, each conv-shaped layer's mapping by name: the compiler's, or its row's in `maps`
        (one per row, as `cost` takes them)."""
        if maps is None:
            return [{layer.name: self.mapping(layer, hw) for layer in layers} for layers in self.per_model]
        return [{layer.name: maps[r] for layer, r in zip(layers, rows, strict=True)}
                for layers, rows in zip(self.per_model, self.row_of, strict=True)]


def _simulated(hw: HardwareConfig, reports, constraints: Constraints, objective: str):
    """(objective value, constraint ratios) of simulator reports."""
    cycles = np.array([r.cycles for r in reports])
    energy = np.array([sum(r.energy_pj.values()) for r in reports])
    return objective_value(hw, cycles, energy, objective), constraints.ratios(hw, cycles, energy)


def _confirm(search: Search, grid, workloads: Workloads, constraints: Constraints, objective: str,
             settings: CodesignSettings, tune_settings: TuneSettings | None) -> Codesign:
    """The exact model's best configs in turn, `settings.confirm` at a time, timed by the simulator;
    the best whose simulated constraints hold."""
    ranked, found, simulated = search.ranked(), [], 0
    for k in range(0, len(ranked), max(settings.confirm, 1)):
        for s in ranked[k:k + max(settings.confirm, 1)]:
            maps = workloads.model_mappings(s.hw)
            reports = workloads.simulate(s.hw, None if workloads.fusion else maps)
            simulated += 1
            value, ratios = _simulated(s.hw, reports, constraints, objective)
            if max(ratios.values(), default=0.0) <= 1.0:
                found.append((value, s, maps, reports, ratios))
        if found:
            break
    if not found:
        raise InputError(f"none of the {simulated} configs the exact model found feasible meets the constraints "
                         "in the simulator (the exact model sees the conv-shaped layers only)")
    value, best, maps, reports, ratios = min(found, key=lambda f: f[0])
    dram = workloads.predict(best.hw, None if workloads.fusion else maps)[2]
    if tune_settings is not None:
        maps, reports, ratios = _tuned(workloads, best, maps, reports, value, constraints, objective, tune_settings)
    return Codesign(best.hw, tuple(maps), tuple(reports), tuple(map(float, best.cycles)),
                    tuple(map(float, best.energy_pj)), objective, ratios, search.binding(best, grid),
                    len(search.scored), simulated, _scored_rows(search), tuple(map(float, dram)))


def _scored_rows(search: Search) -> tuple[dict, ...]:
    """A row per config the exact model scored and per model: its predicted latency and energy."""
    return tuple({"model": f"model {k}", "area_mm2": area_of(s.hw), "latency_s": float(c) / s.hw.clock_hz,
                  "energy_pj": float(e), **{f: getattr(s.hw, f) for f in CONFIG_COLUMNS}}
                 for s in search.scored.values() if s is not None
                 for k, (c, e) in enumerate(zip(s.cycles, s.energy_pj, strict=True)))



def _tuned(workloads: Workloads, best: Scored, maps, reports, value, constraints, objective, tune_settings):
    """The gradient tuner's mappings on the chosen config, where the simulator finds them better and
    within the constraints; else the compiler's."""
    tuned = [tune_graph(g, best.hw, workloads.mapper_objective, tune_settings, workloads.constants, None).mappings
             for g in workloads.graphs]
    tuned_reports = workloads.simulate(best.hw, tuned)
    tuned_value, tuned_ratios = _simulated(best.hw, tuned_reports, constraints, objective)
    if tuned_value < value and max(tuned_ratios.values(), default=0.0) <= 1.0:
        return tuned, tuned_reports, tuned_ratios
    return maps, reports, _simulated(best.hw, reports, constraints, objective)[1]


def _targets(latency_targets_s, n: int) -> tuple:
    if latency_targets_s is None:
        return ()
    targets = [latency_targets_s] * n if np.isscalar(latency_targets_s) else list(latency_targets_s)
    if len(targets) != n or any(t is not None and not (np.isscalar(t) and float(t) > 0) for t in targets):
        raise InputError(f"latency_targets_s={latency_targets_s!r}: expected a positive number of seconds, or "
                         f"one per model ({n}), None where a model has none")
    return tuple(None if t is None else float(t) for t in targets)


def _describe(hw: HardwareConfig) -> str:
    return (f"{hw.array_rows}x{hw.array_cols} {hw.dataflow}, {hw.scratchpad_bytes // 1024} KiB + "
            f"{hw.accumulator_bytes // 1024} KiB, {hw.dma_bandwidth_bytes_per_cycle:g} B/cycle "
            f"({area_of(hw):.3f} mm^2)")
