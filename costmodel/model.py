"""The closed-form cost of one layer: latency, energy and footprint as JAX functions of
(layer, mapping, hardware, constants, smooth).

It is the loop nest's own cost (lower.schedule.nest_cost.nest_cost: the tile counts, traffic, per-unit
cycles and their composition the mapper ranks candidates by), evaluated over jax.numpy with
every discrete step relaxed at temperature `smooth` (costmodel.smooth.Relaxed): `smooth=0` is
the exact model, `smooth>0` continuous in the tile sizes and hardware fields.  The switches of a
mapping enter linearly, so probabilities between 0 and 1 mix the candidates' costs.  Energy is
sim.energy's table applied to the nest's action counts, plus leakage over the latency.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp

from stagec.lower.schedule.nest import KINDS, LayerShape, TileMapping
from stagec.lower.schedule.nest_cost import DEFAULT_CONSTANTS, CostConstants, nest_cost
from stagec.sim.energy import energy_pj

from .hardware import HardwarePoint
from .smooth import Relaxed

MATRIX, DEPTHWISE, POOL = range(len(KINDS))
__all__ = ["DEFAULT_CONSTANTS", "CostConstants", "LayerCost", "layer_cost"]


@dataclass(frozen=True)
class LayerCost:
    """One layer's cost: cycles, energy (pJ), scratchpad/accumulator bytes it occupies,
    `violation` (0 when legal: the relative overshoot of every capacity limit, summed),
    and the instruction count."""

    cycles: object
    energy_pj: object
    spad_bytes: object
    acc_bytes: object
    violation: object
    instructions: object


jax.tree_util.register_dataclass(LayerCost, data_fields=[f.name for f in fields(LayerCost)], meta_fields=[])


def layer_cost(L: LayerShape, m: TileMapping, hw: HardwarePoint, k: CostConstants = DEFAULT_CONSTANTS,
               smooth=0.0) -> LayerCost:
    """Cost of `L` under mapping `m` on `hw` (scalars; vmap for batches).  smooth=0: exact."""
    cost = nest_cost(L, m, hw, Relaxed(smooth), k)
    energy = sum(energy_pj(cost.actions, cost.cycles, hw, jnp).values())
    return LayerCost(cost.cycles, energy, cost.spad_bytes, cost.acc_bytes, cost.violation, cost.instructions)
