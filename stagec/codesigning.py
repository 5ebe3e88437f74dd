"""stagec.codesign: a buildable accelerator for one or several models, by gradient on the cost model.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
    >>> result = stagec.codesign([(model, (torch.randn(1, 8, 16, 16),))], area_budget_mm2=2.0)  # doctest: +SKIP
    >>> result.area_mm2 <= 2.0, result.reports[0].cycles                                      # doctest: +SKIP

Steps: every model's tunable layers (stagec.layers; shapes shared between models tuned once,
counted per model) -> costmodel.codesign.descend (hardware and mappings together) -> the
power-of-two corners within the area budget, each scored by the exact model with the relaxed
mappings projected onto it -> the best -> mappings tuned for it (stagec.tune) -> each model
lowered (the compiler's stages after tracing) and timed by the simulator: the confirmed report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from stagec.costmodel.batch import exact_cost
from stagec.costmodel.codesign import DEFAULT_CODESIGN, CodesignSettings, buildable_candidates, descend
from stagec.costmodel.hardware import area, hardware_point
from stagec.costmodel.model import DEFAULT_CONSTANTS, CostConstants
from stagec.costmodel.problem import mapping_arrays, stack, to_tile_mapping
from stagec.costmodel.space import objective_of
from stagec.costmodel.tuner import DEFAULT_SETTINGS, TuneSettings, project_all
from stagec.errors import InputError, TilingError
from stagec.isa import HardwareConfig
from stagec.lower.schedule.mapper import default_mapping
from stagec.sim.energy import area_mm2

from .layers import model_graph, model_layers
from .pipeline import lower_graph
from .progress import note
from .report import Report, make_report
from .tuning import tune_layer_list


@dataclass(frozen=True)
class Codesign:
    """The chosen buildable config, per model its tuned mappings and simulator report, and the cost
    model's prediction (conv-shaped layers only) for each model."""

    hw: HardwareConfig
    mappings: tuple[dict, ...]
    reports: tuple[Report, ...]
    predicted_cycles: tuple[float, ...]
    predicted_energy_pj: tuple[float, ...]
    objective: str

    @property
    def area_mm2(self) -> float:
        return float(sum(area_mm2(self.hw).values()))

    def __str__(self) -> str:
        hw = self.hw
        lines = [f"codesign for {self.objective}: array {hw.array_rows}x{hw.array_cols} {hw.dataflow}, scratchpad "
                 f"{hw.scratchpad_bytes // 1024} KiB, accumulator {hw.accumulator_bytes // 1024} KiB, DMA "
                 f"{hw.dma_bandwidth_bytes_per_cycle:g} B/cycle; area {self.area_mm2:.3f} mm^2"]
        for k, r in enumerate(self.reports):
            lines.append(f"  model {k}: simulated {r.cycles:.0f} cycles, {sum(r.energy_pj.values()) / 1e6:.2f} uJ "
                         f"(cost model, conv-shaped layers: {self.predicted_cycles[k]:.0f} cycles)")
        return "\n".join(lines)


def _example(item):
    model, args, *rest = item
    return model, args, (rest[0] if rest else None)


def codesign(models, area_budget_mm2: float, objective: str = "latency", power_budget_w: float | None = None,
             hw: HardwareConfig | None = None, settings: CodesignSettings = DEFAULT_CODESIGN,
             tune_settings: TuneSettings = DEFAULT_SETTINGS, constants: CostConstants = DEFAULT_CONSTANTS,
             progress: bool = True) -> Codesign:
    """Tune the array's rows and columns, scratchpad and accumulator sizes, DMA bandwidth and dataflow
    of `hw` (default HardwareConfig()) jointly with every layer's mapping of `models` (a list of
    (model, args) or (model, args, kwargs)), for `objective` ('latency', 'energy' or 'edp'; with
    several models, the product of theirs) within `area_budget_mm2` (and `power_budget_w`, on the
    cost model's prediction for the conv-shaped layers).  The result is buildable (powers of two),
    within the area budget, and confirmed by the simulator."""
    graphs = [model_graph(*_example(m)) for m in models]
    return codesign_graphs(graphs, area_budget_mm2, objective, power_budget_w, hw, settings, tune_settings,
                           constants, progress)


def codesign_graphs(graphs, area_budget_mm2: float, objective: str = "latency", power_budget_w: float | None = None,
                    hw: HardwareConfig | None = None, settings: CodesignSettings = DEFAULT_CODESIGN,
                    tune_settings: TuneSettings = DEFAULT_SETTINGS, constants: CostConstants = DEFAULT_CONSTANTS,
                    progress: bool = True) -> Codesign:
    """codesign on models already traced to fused graphs (stagec.layers.model_graph): for sweeps
    (a Pareto front) that trace each model once."""
    base = hw or HardwareConfig()
    per_model = [model_layers(g) for g in graphs]
    if not all(per_model):
        raise InputError(f"model {[bool(m) for m in per_model].index(False)} has no conv, matmul or pooling layer: "
                         "nothing for co-design to size the array for")
    unique, index = {}, []          # shape key -> (first layer), and (workload, unique id) per layer
    for w, layers in enumerate(per_model):
        for layer in layers:
            key = tuple(float(v) for v in jax.tree.leaves(layer.shape()))
            unique.setdefault(key, layer)
            index.append((w, list(unique).index(key)))
    firsts = list(unique.values())
    pairs = sorted(set(index))
    counts = np.array([index.count(p) for p in pairs], np.float32)
    shapes = stack([firsts[u].shape() for _, u in pairs])
    workload = np.array([w for w, _ in pairs], np.int32)
    start = stack([mapping_arrays(default_mapping(firsts[u].kind, firsts[u].problem, base, firsts[u].extras,
                                                  firsts[u].name, objective)) for _, u in pairs])
    point, theta = descend(shapes, start, counts, workload, len(graphs), base, area_budget_mm2, objective,
                           power_budget_w, constants, settings if progress else _quiet(settings))
    best, best_value, best_maps = None, np.inf, None
    for cand in buildable_candidates(point, base, area_budget_mm2, settings):
        try:
            fallback = stack([mapping_arrays(default_mapping(firsts[u].kind, firsts[u].problem, cand,
                                                             firsts[u].extras, firsts[u].name, objective))
                              for _, u in pairs])
        except TilingError:
            continue
        hp = hardware_point(cand)
        maps, _ = project_all(theta[:, None], shapes, fallback, hp, constants, objective)
        cost = exact_cost(shapes, jax.tree.map(lambda a: a[:, 0], maps), hp, constants)
        cycles = jax.ops.segment_sum(cost.cycles * counts, workload, len(graphs))
        energy = jax.ops.segment_sum(cost.energy_pj * counts, workload, len(graphs))
        watts = energy * 1e-12 * cand.clock_hz / cycles
        if power_budget_w is not None and bool(jnp.any(watts > power_budget_w)):
            continue
        value = float(jnp.sum(jnp.log(objective_of(cycles, energy, objective))))
        if value < best_value:
            best, best_value, best_maps = cand, value, jax.tree.map(lambda a: np.asarray(a[:, 0]), maps)
    if best is None:
        raise InputError(f"no buildable config within {area_budget_mm2} mm^2"
                         + (f" and {power_budget_w} W" if power_budget_w else "") + " can map every layer")
    note(f"codesign: chose {best.array_rows}x{best.array_cols}, {best.scratchpad_bytes // 1024} KiB + "
         f"{best.accumulator_bytes // 1024} KiB, {best.dma_bandwidth_bytes_per_cycle:g} B/cycle "
         f"({float(area(hardware_point(best))):.3f} mm^2); tuning and simulating", progress)
    mappings, reports, cycles, energy = [], [], [], []
    for w, (graph, layers) in enumerate(zip(graphs, per_model, strict=True)):
        mine = [p for p in index if p[0] == w]
        chosen = tune_layer_list(layers, best, objective, tune_settings, constants, None).mappings
        c, e = _predicted(layers, chosen, best, constants)
        if power_budget_w is not None and e * 1e-12 * best.clock_hz / c > power_budget_w:
            # the tuner does not see the power budget; the selection's projected mappings met it
            rows = [pairs.index(p) for p in mine]
            chosen = {layer.name: to_tile_mapping(jax.tree.map(lambda a, k=k: a[k], best_maps))
                      for layer, k in zip(layers, rows, strict=True)}
            c, e = _predicted(layers, chosen, best, constants)
        mappings.append(chosen)
        reports.append(make_report(lower_graph(graph, best, chosen)))
        cycles.append(c)
        energy.append(e)
    return Codesign(best, tuple(mappings), tuple(reports), tuple(cycles), tuple(energy), objective)


def _predicted(layers, mappings: dict, hw: HardwareConfig, constants: CostConstants) -> tuple[float, float]:
    """The cost model's (cycles, energy pJ) of a model's conv-shaped layers under `mappings`."""
    cost = exact_cost(stack([layer.shape() for layer in layers]),
                      stack([mapping_arrays(mappings[layer.name]) for layer in layers]), hardware_point(hw), constants)
    return float(np.sum(cost.cycles)), float(np.sum(cost.energy_pj))


def _quiet(settings: CodesignSettings) -> CodesignSettings:
    return replace(settings, report_every=0)
