"""Calibration: fit the cost model's free constants to simulator measurements by gradient.

The constants (model.CostConstants: pipeline fill share, single-buffer overlap, per-instruction
overhead) are fitted with adam on the mean squared log ratio of predicted to measured cycles, so
every layer counts alike whatever its size.  Energy needs no fit: the model counts the same
actions sim.energy does.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stagec.lower.schedule.nest import LayerShape, TileMapping

from .batch import exact_cost
from .hardware import HardwarePoint
from .model import DEFAULT_CONSTANTS, CostConstants

# where each constant may go: shares in [0, 2], the overhead in [0, 64] cycles
BOUNDS = CostConstants(fill=(0.0, 2.0), overlap=(0.0, 2.0), per_instruction=(0.0, 64.0))


@dataclass(frozen=True)
class Calibration:
    """Fitted constants and the median absolute relative error of cycles before and after."""

    constants: CostConstants
    error_before: float
    error_after: float

    def __str__(self) -> str:
        fitted = ", ".join(f"{k}={float(v):.3f}" for k, v in vars(self.constants).items())
        return (f"calibration: median |error| {100 * self.error_before:.2f}% -> {100 * self.error_after:.2f}% "
                f"({fitted})")


def _clip(c: CostConstants) -> CostConstants:
    return jax.tree.map(lambda v, b: jnp.clip(v, *b), c, BOUNDS, is_leaf=lambda x: isinstance(x, tuple))


def median_error(layers: LayerShape, mappings: TileMapping, hw: HardwarePoint, measured,
                 constants: CostConstants) -> float:
    predicted = np.asarray(exact_cost(layers, mappings, hw, constants).cycles)
    return float(np.median(np.abs(predicted / np.asarray(measured) - 1.0)))


def calibrate(layers: LayerShape, mappings: TileMapping, hw: HardwarePoint, measured_cycles,
              start: CostConstants = DEFAULT_CONSTANTS, steps: int = 300, learning_rate: float = 0.05) -> Calibration:
    """Fit the constants to `measured_cycles` (n,) of the (layer, mapping) pairs (fields (n,)) on `hw`."""
    target = jnp.log(jnp.asarray(measured_cycles, jnp.float32))
    optimizer = optax.adam(learning_rate)

    @jax.jit
    def step(c, state):
        def loss(c):
            predicted = exact_cost(layers, mappings, hw, _clip(c)).cycles
            return jnp.mean((jnp.log(predicted) - target) ** 2)
        grad = jax.grad(loss)(c)
        updates, state = optimizer.update(grad, state)
        return _clip(optax.apply_updates(c, updates)), state   # projected: a bound does not trap it

    c = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), start)
    state = optimizer.init(c)
    for _ in range(steps):
        c, state = step(c, state)
    fitted = jax.tree.map(float, _clip(c))
    return Calibration(fitted, median_error(layers, mappings, hw, measured_cycles, start),
                       median_error(layers, mappings, hw, measured_cycles, fitted))
