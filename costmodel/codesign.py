"""Hardware by gradient: the array's sides, the scratchpad and accumulator sizes, the DMA bandwidth
and the dataflow, tuned jointly with every layer's mapping under an area (and power) budget and
per-model latency targets.

The hardware's relaxed parameters are logs (of rows, cols, bytes, bytes/cycle) and a logit (the
weight-stationary probability); each layer has one relaxed mapping (costmodel.space).  Adam
descends, per workload (a model's layers with their multiplicities), the log of its objective
summed over workloads (so no model dominates by scale; objective 'area': the log of the area),
plus penalties for capacity violations, for area or power over budget and for latency over a
model's target.  Each model's chains of fusable layers (costmodel.fusion) add their relaxed fusion
choices and cascade tilings, so the descent sees the DRAM traffic a larger scratchpad saves.  The
relaxed point is where costmodel.rounding's grid search starts.

The area and energy tables price the DRAM interface per byte/cycle of bandwidth (isa/config.py),
so bandwidth has a cost and does not drift to the top of `bandwidth_range`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stagec.isa.config import HardwareConfig
from stagec.progress import bar, shown

from .fusion import chain_terms, start_params
from .grid import BuildableGrid
from .hardware import HardwarePoint, area, hardware_point
from .model import DEFAULT_CONSTANTS, CostConstants, layer_cost
from .problem import LayerShape
from .space import from_mapping, objective_of, to_mapping


@dataclass(frozen=True)
class CodesignSettings:
    """The descent (steps, learning rate, annealed temperature, penalty weight), the ranges it moves
    in, the buildable grid's steps (costmodel.grid), how many of the best grid corners around the
    relaxed point a climb starts from (`starts`), and how many of the exact model's best configs
    the simulator confirms (`confirm`)."""

    steps: int = 200
    learning_rate: float = 0.05
    smooth: tuple[float, float] = (0.5, 0.05)
    penalty: float = 20.0
    bandwidth_range: tuple[float, float] = (4.0, 64.0)
    array_range: tuple[float, float] = (2.0, 256.0)
    memory_range: tuple[float, float] = (4096.0, 8.0 * 2**20)
    array_step: int = 4
    memory_step: int = 32 * 1024
    starts: int = 4
    confirm: int = 3
    report_every: int = 50   # steps between the progress bar's hardware readouts (0: no bar)

    def grid(self) -> BuildableGrid:
        return BuildableGrid(self.array_step, self.memory_step, tuple(int(v) for v in self.array_range),
                             tuple(int(v) for v in self.memory_range), self.bandwidth_range)


DEFAULT_CODESIGN = CodesignSettings()


def log_ranges(settings: CodesignSettings):
    """(2, 5) logs of the lower and upper ends of rows, cols, scratchpad, accumulator, bandwidth."""
    return jnp.log(jnp.array([[r[i] for r in (settings.array_range, settings.array_range, settings.memory_range,
                                              settings.memory_range, settings.bandwidth_range)] for i in (0, 1)]))


def point_from(hw_theta, base: HardwarePoint, ranges) -> HardwarePoint:
    """Relaxed hardware parameters -> a HardwarePoint (sizes clipped to `ranges`, log_ranges')."""
    v = jnp.exp(jnp.clip(hw_theta[:5], ranges[0], ranges[1]))
    config = _with(base.config, dma_bandwidth_bytes_per_cycle=v[4])
    return HardwarePoint(v[0], v[1], v[2], v[3], base.vector_lanes, jax.nn.sigmoid(hw_theta[5]),
                        base.vector_subword_packing, base.array_subword_packing, config)


def _with(config: HardwareConfig, **leaves) -> HardwareConfig:
    """A config pytree with some continuous leaves replaced by (traced) values."""
    flat, tree = jax.tree_util.tree_flatten(config)
    names = [f.name for f in fields(HardwareConfig) if not f.metadata["static"]]   # the leaves, in order
    return jax.tree_util.tree_unflatten(tree, [leaves.get(n, v) for n, v in zip(names, flat, strict=True)])


def hw_theta_of(point: HardwarePoint):
    v = jnp.array([point.array_rows, point.array_cols, point.scratchpad_bytes, point.accumulator_bytes,
                   point.dma_bandwidth_bytes_per_cycle], jnp.float32)
    return jnp.concatenate([jnp.log(v), jnp.array([jnp.where(point.weight_stationary > 0.5, 2.0, -2.0)])])


def workload_costs(layers: LayerShape, mappings, hw: HardwarePoint, counts, workload, n_workloads: int,
                   constants: CostConstants, smooth, chains=(), fusion=None):
    """(cycles, energy pJ, violation) per workload: layer costs x multiplicity, summed by workload, with
    what fusing `chains` (costmodel.fusion, relaxed parameters `fusion`) adds or saves."""
    cost = jax.vmap(lambda L, m: layer_cost(L, m, hw, constants, smooth))(layers, mappings)

    def total(x):
        return jax.ops.segment_sum(x * counts, workload, n_workloads)
    cycles, energy, violation = total(cost.cycles), total(cost.energy_pj), jnp.sum(cost.violation * (counts > 0))
    if not chains:
        return cycles, energy, violation
    more = chain_terms(chains, fusion, cost.cycles, cost.energy_pj, hw, smooth, n_workloads)
    return cycles + more[0], energy + more[1], violation + more[2]


OBJECTIVES = ("latency", "energy", "edp", "area")


@partial(jax.jit, static_argnames=("n_workloads", "chains"))
def _step(params, opt_state, step, layers, counts, workload, base, limits, constants, knobs, n_workloads: int,
          chains=()):
    """One adam step.  Everything but the number of workloads and the chains (costmodel.fusion) is
    traced (one compilation serves every objective, budget and setting): `limits` (area mm^2, power W,
    per-workload latency s; inf: none), `knobs` (first and last temperature, steps, penalty, learning
    rate, objective index, log ranges)."""
    area_budget, power, targets = limits
    first, last, steps, penalty, learning_rate, which, ranges = knobs
    smooth = first * (last / first) ** (step / jnp.maximum(steps - 1, 1))

    def loss(params):
        hw = point_from(params["hw"], base, ranges)
        maps = jax.vmap(to_mapping)(params["maps"], layers)
        cycles, energy, violation = workload_costs(layers, maps, hw, counts, workload, n_workloads, constants, smooth,
                                                   chains, params.get("fusion"))
        # 'area': the cycles a little too, so the mappings descend toward meeting the targets
        value = jnp.stack([jnp.sum(jnp.log(objective_of(cycles, energy, o))) for o in OBJECTIVES[:3]]
                          + [jnp.log(area(hw)) + 0.01 * jnp.sum(jnp.log(cycles))])[which]
        over = jnp.maximum(area(hw) / area_budget - 1.0, 0.0)
        over += jnp.sum(jnp.maximum(cycles / hw.clock_hz / targets - 1.0, 0.0))
        over += jnp.sum(jnp.maximum(energy * 1e-12 * hw.clock_hz / cycles / power - 1.0, 0.0))   # W: pJ/cycle x clock
        return value + penalty * (violation + 10.0 * over)

    value, grad = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.adam(learning_rate).update(grad, opt_state)
    return optax.apply_updates(params, updates), opt_state, value


def _bucket(tree, n: int):
    """Rows padded (repeating the first) to a power of two: codesign calls on models of similar sizes
    share one compilation of the step."""
    size = max(2, 1 << (n - 1).bit_length())
    return jax.tree.map(lambda a: jnp.concatenate([jnp.asarray(a), jnp.repeat(jnp.asarray(a)[:1], size - n, 0)]), tree)


def descend(layers: LayerShape, start_maps, counts, workload, n_workloads: int, base: HardwareConfig,
            area_budget_mm2: float | None, objective: str = "latency", power_budget_w: float | None = None,
            constants: CostConstants = DEFAULT_CONSTANTS, settings: CodesignSettings = DEFAULT_CODESIGN,
            latency_targets_s=None, chains=()):
    """Adam on (hardware, mappings, and the fusion of `chains`: costmodel.fusion) jointly; returns the
    relaxed HardwarePoint and mappings' parameters.  `latency_targets_s`: per workload, seconds or None."""
    point, n = hardware_point(base), len(counts)
    layers, start_maps = _bucket(layers, n), _bucket(start_maps, n)
    counts = jnp.concatenate([jnp.asarray(counts, jnp.float32), jnp.zeros(len(start_maps.tile_oh) - n)])
    workload = jnp.concatenate([jnp.asarray(workload), jnp.zeros(len(start_maps.tile_oh) - n, jnp.int32)])
    params = {"hw": hw_theta_of(point), "maps": from_mapping(start_maps)}
    if chains:
        params["fusion"] = start_params(chains, base, "latency" if objective == "area" else objective)
    opt_state = optax.adam(settings.learning_rate).init(params)
    targets = jnp.asarray([np.inf if t is None else t for t in (latency_targets_s or [None] * n_workloads)],
                          jnp.float32)
    limits = (jnp.float32(np.inf if area_budget_mm2 is None else area_budget_mm2),
              jnp.float32(np.inf if power_budget_w is None else power_budget_w), targets)
    ranges = log_ranges(settings)
    knobs = (*(jnp.float32(v) for v in (*settings.smooth, settings.steps, settings.penalty, settings.learning_rate)),
             jnp.int32(OBJECTIVES.index(objective)), ranges)
    steps = bar(range(settings.steps), desc="codesign", enabled=bool(settings.report_every))
    for step in steps:
        params, opt_state, value = _step(params, opt_state, step, layers, counts, workload, point, limits, constants,
                                         knobs, n_workloads, tuple(chains))
        if settings.report_every and (step + 1) % settings.report_every == 0 and shown():
            hw = point_from(params["hw"], point, ranges)
            steps.set_postfix_str(f"loss {float(value):.4f}  array {float(hw.array_rows):.1f}x"
                                  f"{float(hw.array_cols):.1f}  spad {float(hw.scratchpad_bytes) / 1024:.0f} KiB  acc "
                                  f"{float(hw.accumulator_bytes) / 1024:.0f} KiB  bw "
                                  f"{float(hw.dma_bandwidth_bytes_per_cycle):.1f} B/cycle  area {float(area(hw)):.2f} "
                                  "mm^2")
    return point_from(params["hw"], point, ranges), params["maps"][:n]
