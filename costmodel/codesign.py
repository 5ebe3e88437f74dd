"""Hardware by gradient: the array's sides, the scratchpad and accumulator sizes, the DMA bandwidth
and the dataflow, tuned jointly with every layer's mapping under an area (and power) budget.

The hardware's relaxed parameters are logs (of rows, cols, bytes, bytes/cycle) and a logit (the
weight-stationary probability); each layer has one relaxed mapping (costmodel.space).  Adam
descends, per workload (a model's layers with their multiplicities), the log of its objective
summed over workloads (so no model dominates by scale), plus penalties for capacity violations
and for area or power over budget.  The result is rounded to buildable values (powers of two,
`hardware.buildable`); among the corners of the rounding that fit the budget the cheapest by the
exact model (each layer's relaxed mapping projected onto it) is kept.

The area table prices PEs and SRAM but not DMA bandwidth, so bandwidth moves within
`bandwidth_range` rather than being priced.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stagec.errors import InputError
from stagec.isa.config import HardwareConfig
from stagec.progress import bar, shown

from .hardware import HardwarePoint, area, buildable, hardware_point
from .model import DEFAULT_CONSTANTS, CostConstants, layer_cost
from .problem import LayerShape
from .space import from_mapping, objective_of, to_mapping

HW_FIELDS = ("array_rows", "array_cols", "scratchpad_bytes", "accumulator_bytes", "dma_bandwidth_bytes_per_cycle")


@dataclass(frozen=True)
class CodesignSettings:
    steps: int = 200
    learning_rate: float = 0.05
    smooth: tuple[float, float] = (0.5, 0.05)
    penalty: float = 20.0
    bandwidth_range: tuple[float, float] = (4.0, 64.0)
    array_range: tuple[float, float] = (2.0, 256.0)
    memory_range: tuple[float, float] = (4096.0, 8.0 * 2**20)
    report_every: int = 50   # steps between the progress bar's hardware readouts (0: no bar)


DEFAULT_CODESIGN = CodesignSettings()


def point_from(hw_theta, base: HardwarePoint, settings: CodesignSettings) -> HardwarePoint:
    """Relaxed hardware parameters -> a HardwarePoint (sizes clipped to their ranges)."""
    lo = jnp.log(jnp.array([settings.array_range[0]] * 2 + [settings.memory_range[0]] * 2
                           + [settings.bandwidth_range[0]]))
    hi = jnp.log(jnp.array([settings.array_range[1]] * 2 + [settings.memory_range[1]] * 2
                           + [settings.bandwidth_range[1]]))
    v = jnp.exp(jnp.clip(hw_theta[:5], lo, hi))
    config = _with(base.config, dma_bandwidth_bytes_per_cycle=v[4])
    return HardwarePoint(v[0], v[1], v[2], v[3], base.vector_lanes, jax.nn.sigmoid(hw_theta[5]), config)


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
                   constants: CostConstants, smooth):
    """(cycles, energy pJ, violation) per workload: layer costs x multiplicity, summed by workload."""
    cost = jax.vmap(lambda L, m: layer_cost(L, m, hw, constants, smooth))(layers, mappings)

    def total(x):
        return jax.ops.segment_sum(x * counts, workload, n_workloads)
    return total(cost.cycles), total(cost.energy_pj), jnp.sum(cost.violation)


@partial(jax.jit, static_argnames=("objective", "n_workloads", "settings", "power"))
def _step(params, opt_state, step, layers, counts, workload, base, budget, constants, objective: str,
          n_workloads: int, settings: CodesignSettings, power: float | None):
    first, last = settings.smooth
    smooth = first * (last / first) ** (step / max(settings.steps - 1, 1))

    def loss(params):
        hw = point_from(params["hw"], base, settings)
        maps = jax.vmap(to_mapping)(params["maps"], layers)
        cycles, energy, violation = workload_costs(layers, maps, hw, counts, workload, n_workloads, constants, smooth)
        value = jnp.sum(jnp.log(objective_of(cycles, energy, objective)))
        over = jnp.maximum(area(hw) / budget - 1.0, 0.0)
        if power is not None:   # watts: pJ per cycle x clock
            over += jnp.sum(jnp.maximum(energy * 1e-12 * hw.clock_hz / cycles / power - 1.0, 0.0))
        return value + settings.penalty * (violation + 10.0 * over)

    value, grad = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.adam(settings.learning_rate).update(grad, opt_state)
    return optax.apply_updates(params, updates), opt_state, value


def descend(layers: LayerShape, start_maps, counts, workload, n_workloads: int, base: HardwareConfig,
            area_budget_mm2: float, objective: str = "latency", power_budget_w: float | None = None,
            constants: CostConstants = DEFAULT_CONSTANTS, settings: CodesignSettings = DEFAULT_CODESIGN):
    """Adam on (hardware, mappings) jointly; returns the relaxed HardwarePoint and mappings' parameters."""
    point = hardware_point(base)
    params = {"hw": hw_theta_of(point), "maps": from_mapping(start_maps)}
    opt_state = optax.adam(settings.learning_rate).init(params)
    steps = bar(range(settings.steps), desc="codesign", enabled=bool(settings.report_every))
    for step in steps:
        params, opt_state, value = _step(params, opt_state, step, layers, jnp.asarray(counts, jnp.float32),
                                         jnp.asarray(workload), point, area_budget_mm2, constants, objective,
                                         n_workloads, settings, power_budget_w)
        if settings.report_every and (step + 1) % settings.report_every == 0 and shown():
            hw = point_from(params["hw"], point, settings)
            steps.set_postfix_str(f"loss {float(value):.4f}  array {float(hw.array_rows):.1f}x"
                                  f"{float(hw.array_cols):.1f}  spad {float(hw.scratchpad_bytes) / 1024:.0f} KiB  acc "
                                  f"{float(hw.accumulator_bytes) / 1024:.0f} KiB  bw "
                                  f"{float(hw.dma_bandwidth_bytes_per_cycle):.1f} B/cycle  area {float(area(hw)):.2f} "
                                  "mm^2")
    return point_from(params["hw"], point, settings), params["maps"]


def buildable_candidates(point: HardwarePoint, base: HardwareConfig, area_budget_mm2: float,
                         settings: CodesignSettings = DEFAULT_CODESIGN) -> list[HardwareConfig]:
    """Power-of-two configs around a relaxed point (floor/ceil of each sized field, both dataflows
    only if undecided) within the area budget; halving the biggest part of the area if none is."""
    rounded = buildable(point, base)
    ranges = [settings.array_range] * 2 + [settings.memory_range] * 2 + [settings.bandwidth_range]
    options = []
    for name, (lo_limit, hi_limit) in zip(HW_FIELDS, ranges, strict=True):
        lo = 2.0 ** np.floor(np.log2(float(getattr(point, name))))
        options.append(sorted({float(np.clip(v, lo_limit, hi_limit)) for v in (lo, 2 * lo)}))
    out = []
    for values in itertools.product(*options):
        changes = dict(zip(HW_FIELDS, values, strict=True))
        changes = {k: (int(v) if k != "dma_bandwidth_bytes_per_cycle" else float(v)) for k, v in changes.items()}
        changes["scratchpad_bytes"] = max(changes["scratchpad_bytes"], 64 * base.scratchpad_banks)
        changes["accumulator_bytes"] = max(changes["accumulator_bytes"], 64 * base.accumulator_banks)
        hw = rounded.replace(**changes)
        if area(hardware_point(hw)) <= area_budget_mm2:
            out.append(hw)
    hw = rounded
    smallest = {"array_rows": 1, "array_cols": 1, "scratchpad_bytes": 64 * base.scratchpad_banks,
                "accumulator_bytes": 64 * base.accumulator_banks}
    while not out:
        parts = {k: v for k, v in area_parts(hw).items() if getattr(hw, k) > smallest[k]}
        if not parts:
            raise InputError(f"no buildable config fits {area_budget_mm2} mm^2: the smallest one takes "
                             f"{float(area(hardware_point(hw))):.3f} mm^2")
        big = max(parts, key=parts.get)
        hw = hw.replace(**{big: getattr(hw, big) // 2})
        if area(hardware_point(hw)) <= area_budget_mm2:
            out.append(hw)
    return out


def area_parts(hw: HardwareConfig) -> dict:
    """The area (mm^2) each halvable field stands for (an array side: half the array)."""
    pe = hw.array_rows * hw.array_cols * hw.area_mm2_per_pe
    return {"array_rows": pe / 2, "array_cols": pe / 2,
            "scratchpad_bytes": hw.scratchpad_bytes / 1024 * hw.area_mm2_per_sram_kib,
            "accumulator_bytes": hw.accumulator_bytes / 1024 * hw.area_mm2_per_sram_kib}
