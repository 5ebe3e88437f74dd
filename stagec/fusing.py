"""A model's cost with its layers fused as the compiler fuses them: what codesign ranks configs by.

`schedule` runs the compiler's stages from `pack` to `schedule` (the depthwise packing, layouts, every
layer's default mapping and the cascades, lower.schedule.cascade_map), so the exact model prices the
program `stagec.compile` builds: `fused_cost` sums each conv-shaped layer outside a cascade alone
(lower.schedule.nest_cost, the cost model at temperature 0) and each cascade once
(lower.schedule.cascade.cascade_cost), whose intermediates never reach DRAM.  `model_chains` gives the
descent (costmodel.fusion) the chains the compiler may fuse, with what it fused on the start config.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from stagec.costmodel.fusion import Chain
from stagec.lower.schedule.cascade import Cascade, cascade_cost
from stagec.lower.schedule.cascade_map import chains
from stagec.lower.schedule.nest import Exact, LayerShape
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.sim.energy import energy_pj

from .layers import model_layers
from .pipeline import PIPELINE, Compilation, Request, position, run


def schedule(graph, hw, objective: str, mappings: dict | None = None) -> Compilation:
    """`graph` (stagec.layers.model_graph's) through the compiler's stages up to its schedule, the
    layers in `mappings` mapped so (and in no cascade), as stagec.pipeline.lower_graph."""
    request = Request(None, hw=hw, objective=objective, mappings=MappingProxyType(dict(mappings or {})))
    return run(PIPELINE[position("pack"):position("schedule") + 1], Compilation(request, graph=graph))


def cascades_of(c: Compilation) -> list[Cascade]:
    """The schedule's cascades of conv-shaped layers (not flash attention's, nor rows of vector ops)."""
    return [k for k in c.schedule.cascades if isinstance(k, Cascade)]


def fused_cost(c: Compilation, constants) -> tuple[float, float, float]:
    """(cycles, energy pJ, DRAM bytes) of a scheduled model's conv-shaped layers, each cascade priced once."""
    hw, found = c.request.hw, cascades_of(c)
    members = {name for k in found for name in k.layers}
    parts = [nest_cost(LayerShape.of(u.kind, u.problem, u.extras, u.repeat), c.schedule[u.name].mapping, hw, Exact,
                       constants) for u in model_layers(c.graph) if u.name not in members]
    parts += [cascade_cost([LayerShape.of(*c.schedule[name].nests[0]) for name in k.layers], list(k.mappings), hw,
                           Exact, int(k.chunk is not None), k.line) for k in found]
    cycles = [float(p.cycles) for p in parts]
    energy = [float(sum(energy_pj(p.actions, p.cycles, hw).values())) for p in parts]
    dram = [float(p.actions.dram_read_bytes + p.actions.dram_write_bytes) for p in parts]
    return float(np.sum(cycles)), float(np.sum(energy)), float(np.sum(dram))


def model_chains(c: Compilation, rows: dict, workload: int) -> list[Chain]:
    """The chains of a scheduled model (cascade_map.chains) whose members have rows (`rows`: layer name
    -> the workload's row pricing it alone), each edge marked as the schedule fused it."""
    tilings = dict(c.schedule.tilings)
    fused = {pair for k in cascades_of(c) for pair in zip(k.layers, k.layers[1:], strict=False)}
    out = []
    for run_ in chains(c.graph, c.layout, tilings, frozenset()):
        names = [node.name for node in run_]
        if all(name in rows for name in names):
            out.append(Chain(tuple(names), tuple(tilings[name].nests[0] for name in names),
                             tuple(rows[name] for name in names),
                             workload, tuple(pair in fused for pair in zip(names, names[1:], strict=False))))
    return out
