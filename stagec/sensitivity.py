"""stagec.sensitivities: how a compiled model's latency, energy, EDP and area move with every hardware
field, per layer and in total; which resource buys the most latency per mm^2.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
    >>> s = stagec.sensitivities(model, (torch.randn(1, 8, 16, 16),))            # doctest: +SKIP
    >>> s.best_latency_per_mm2()                                                # doctest: +SKIP

Continuous fields (bandwidth, DMA latency, clock, the energy and area tables) get derivatives:
jax.grad through the differentiable timing simulator (sim.timing.program_times) and energy
model (sim.energy), on the program as compiled.  Discrete fields (the array's sides, the
memories, the vector lanes, the dataflow) get one-step differences: the model recompiled on the
next buildable grid value (costmodel.grid; lanes doubled; the other dataflow), each layer on the
compiler's mapping there, and timed.  Latency is in seconds (cycles over the clock), energy in
pJ, EDP their product; per layer, the layer's exclusive share of the timeline (as the report's).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from stagec.costmodel.grid import BuildableGrid
from stagec.isa import HardwareConfig, Program
from stagec.sim.energy import area_mm2, counts_of, energy_pj
from stagec.sim.timing import program_times

from .layers import model_graph
from .pipeline import lower_graph

DISCRETE = ("array_rows", "array_cols", "scratchpad_bytes", "accumulator_bytes", "vector_lanes", "dataflow")
CONTINUOUS = tuple(f.name for f in fields(HardwareConfig) if not f.metadata["static"])


@dataclass(frozen=True)
class FieldSensitivity:
    """One field's effect: `kind` 'derivative' (per unit of the field) or 'step' (from the config's
    value to `to`); the change of latency (s), energy (pJ), EDP (s pJ) and area (mm^2), in total and
    per layer (layer name -> (latency s, energy pJ))."""

    name: str
    kind: str
    value: object
    to: object
    latency_s: float
    energy_pj: float
    edp: float
    area_mm2: float
    per_layer: dict

    def elasticity(self, base: Sensitivities, metric: str) -> float:
        """Relative change of `metric` ('latency_s', 'energy_pj', 'edp') per relative change of the
        field (d ln metric / d ln field; a step's over its relative size; the dataflow's: the relative change)."""
        change = getattr(self, metric) / getattr(base, metric)
        if self.kind == "derivative":
            return change * float(self.value)
        if self.name == "dataflow":
            return change
        return change / (float(self.to) / float(self.value) - 1.0)

    @property
    def latency_per_mm2(self) -> float:
        """Seconds of latency saved per mm^2 the field's change adds (nan where it adds no area)."""
        return -self.latency_s / self.area_mm2 if self.area_mm2 > 0 else float("nan")


@dataclass(frozen=True)
class Sensitivities:
    hw: HardwareConfig
    latency_s: float
    energy_pj: float
    area_mm2: float
    fields: tuple[FieldSensitivity, ...]

    @property
    def edp(self) -> float:
        return self.latency_s * self.energy_pj

    def __getitem__(self, name: str) -> FieldSensitivity:
        return next(f for f in self.fields if f.name == name)

    def best_latency_per_mm2(self) -> str:
        """The field whose growth buys the most latency per mm^2."""
        priced = [f for f in self.fields if np.isfinite(f.latency_per_mm2)]
        return max(priced, key=lambda f: f.latency_per_mm2).name

    def table(self) -> str:
        lines = [f"{'field':36s} {'kind':10s} {'d latency %':>12s} {'d energy %':>11s} {'d EDP %':>9s} "
                 f"{'d area mm2':>11s} {'% latency/mm2':>14s}"]
        for f in self.fields:
            per_mm2 = 100 * f.latency_per_mm2 / self.latency_s
            lines.append(f"{f.name:36s} {f.kind:10s} {100 * f.latency_s / self.latency_s:12.4g} "
                         f"{100 * f.energy_pj / self.energy_pj:11.4g} {100 * f.edp / self.edp:9.4g} "
                         f"{f.area_mm2:11.4g} {per_mm2:14.4g}")
        return "\n".join(lines)


def sensitivities(model_or_fn, example_args, hw: HardwareConfig | None = None, mappings=None,
                  grid: BuildableGrid | None = None, kwargs=None, **options) -> Sensitivities:
    """Sensitivities of a model compiled for `hw` (default HardwareConfig()) with `mappings` (default:
    the compiler's); `options` are compile's fuse/quantize/calibration/percentile."""
    graph = model_graph(model_or_fn, example_args, kwargs, **options)
    return graph_sensitivities(graph, hw or HardwareConfig(), mappings, grid)


def graph_sensitivities(graph, hw: HardwareConfig, mappings=None, grid: BuildableGrid | None = None) -> Sensitivities:
    """Sensitivities of a fused graph (stagec.layers.model_graph) compiled for `hw`."""
    program = lower_graph(graph, hw, mappings)
    names = _names(program)
    cycles, energy = (np.asarray(v, np.float64) for v in _layer_costs(program, hw))
    latency = float(cycles.sum()) / hw.clock_hz
    total_e = float(energy.sum())
    base = (latency, total_e, float(sum(area_mm2(hw).values())))
    out = list(_derivatives(program, hw, names, base, cycles))
    for name in DISCRETE:
        to = _next(grid or BuildableGrid(), hw, name)
        if to is not None:
            out.append(_step(graph, hw, name, to, names, base, cycles, energy))
    return Sensitivities(hw, latency, total_e, base[2], tuple(out))


def _names(program: Program) -> list[str]:
    return [layer.name for layer in program.layers] + [OTHER]


OTHER = "(no layer)"


def _layer_costs(program: Program, hw: HardwareConfig):
    """(exclusive cycles, energy pJ) per layer, and last for the instructions of no layer, as JAX
    arrays of `hw`'s continuous fields: the report's split (stagec.report.make_report), adding up to
    the program's cycles."""
    _, _, end = program_times(program, hw)
    n = len(program.layers) + 1
    ids = np.where(program.layer_ids >= 0, program.layer_ids, n - 1)
    last = jax.ops.segment_max(end, jnp.asarray(ids), n)
    exclusive = jnp.diff(jax.lax.cummax(jnp.maximum(last, 0.0)), prepend=0.0)
    counts = counts_of(program, hw).by_group(ids, n)
    energy = jnp.stack([sum(energy_pj(c, exclusive[i], hw, jnp).values()) for i, c in enumerate(counts)])
    return exclusive, energy


def _derivatives(program: Program, hw: HardwareConfig, names, base, cycles):
    latency, energy, _ = base
    jac = jax.jacrev(lambda h: _layer_costs(program, h))(hw)
    d_area = jax.grad(lambda h: sum(area_mm2(h).values()))(hw)
    for name in CONTINUOUS:
        d_cycles, d_energy = (np.asarray(getattr(j, name), np.float64) for j in jac)
        d_lat = d_cycles / hw.clock_hz
        if name == "clock_hz":   # latency = cycles / clock: the clock's own term
            d_lat = d_lat - cycles / hw.clock_hz ** 2
        total_lat, total_e = float(np.sum(d_lat)), float(np.sum(d_energy))
        yield FieldSensitivity(name, "derivative", getattr(hw, name), None, total_lat, total_e,
                               total_lat * energy + latency * total_e, float(getattr(d_area, name)),
                               {n: (float(a), float(b)) for n, a, b in zip(names, d_lat, d_energy, strict=True)})


def _next(grid: BuildableGrid, hw: HardwareConfig, name: str):
    if name == "dataflow":
        return "output_stationary" if hw.weight_stationary else "weight_stationary"
    if name == "vector_lanes":
        return 2 * hw.vector_lanes
    return grid.step(name, getattr(hw, name), +1)


def _step(graph, hw: HardwareConfig, name: str, to, names, base, cycles, energy) -> FieldSensitivity:
    """The change one grid step of `name` makes, every layer on the compiler's mapping at the new value."""
    latency, total_e, area = base
    moved = hw.replace(**{name: to})
    program = lower_graph(graph, moved)
    c, e = (np.asarray(v, np.float64) for v in _layer_costs(program, moved))
    new_lat, new_e = float(c.sum()) / hw.clock_hz, float(e.sum())
    before = dict(zip(names, zip(cycles, energy, strict=True), strict=True))
    per_layer = {n: (float(c[i] - before[n][0]) / hw.clock_hz, float(e[i] - before[n][1]))
                 for i, n in enumerate(_names(program)) if n in before}
    return FieldSensitivity(name, "step", getattr(hw, name), to, new_lat - latency, new_e - total_e,
                            new_lat * new_e - latency * total_e, float(sum(area_mm2(moved).values())) - area,
                            per_layer)
