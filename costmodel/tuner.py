"""Gradient tuning of mappings: optax (adam) on the relaxed model from many starts at once.

For a batch of layers, `starts` relaxed points per layer (one of them the grid search's
mapping, the rest random) descend log(objective) + penalty x capacity violation while the
temperature anneals from `smooth[0]` to `smooth[1]`; every `chunk` steps each point is
projected to its nearest legal mapping (costmodel.space.project) and scored with the exact
model, and each layer keeps the best legal mapping seen, never worse than the grid search's.
One jitted step serves every layer and start (vmap over both).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stagec.lower.schedule.nest import LayerShape, TileMapping
from stagec.progress import Reporter

from .batch import exact_cost
from .hardware import HardwarePoint
from .model import DEFAULT_CONSTANTS, CostConstants, layer_cost
from .space import NEIGHBOURS, from_mapping, objective_of, project, random_theta, to_mapping


@dataclass(frozen=True)
class TuneSettings:
    """starts: points per layer; steps: adam steps; smooth: (first, last) temperature;
    penalty: weight of the capacity violation; chunk: steps between projections."""

    starts: int = 16
    steps: int = 120
    learning_rate: float = 0.1
    smooth: tuple[float, float] = (0.5, 0.02)
    penalty: float = 20.0
    chunk: int = 30
    seed: int = 0


DEFAULT_SETTINGS = TuneSettings()


@dataclass(frozen=True)
class TuneOutcome:
    """Per layer: the chosen legal mapping, its exact objective, the grid search's objective;
    `evaluations`: exact-model evaluations spent (projections), `steps`: relaxed gradient steps
    summed over starts."""

    mappings: TileMapping
    values: np.ndarray
    fallback_values: np.ndarray
    evaluations: int
    gradient_steps: int


def relaxed_loss(theta, L: LayerShape, hw: HardwarePoint, constants: CostConstants, smooth, objective: str,
                 penalty: float):
    """What one relaxed point descends: log objective (scale-free across layers) + penalty x violation."""
    cost = layer_cost(L, to_mapping(theta, L), hw, constants, smooth)
    return jnp.log(jnp.maximum(objective_of(cost.cycles, cost.energy_pj, objective), 1.0)) + penalty * cost.violation


# The default progress report: a bar over the projection rounds (stagec.progress: a terminal only)
print_progress = Reporter("tune", "best objective")


_LOSSES = jax.vmap(jax.vmap(relaxed_loss, (0, None, None, None, None, None, None)),
                   (0, 0, None, None, None, None, None))


@partial(jax.jit, static_argnames=("objective", "settings"))
def _descend(theta, opt_state, step, layers, hw, constants, objective: str, settings: TuneSettings):
    """One adam step of every point at the step's temperature (annealed geometrically).
    NOTE: one step per call, not a scan of many: it compiles in half the time."""
    first, last = settings.smooth
    smooth = first * (last / first) ** (step / max(settings.steps - 1, 1))
    grad = jax.grad(lambda t: jnp.sum(_LOSSES(t, layers, hw, constants, smooth, objective, settings.penalty)))(theta)
    updates, opt_state = optax.adam(settings.learning_rate).update(grad, opt_state)
    return optax.apply_updates(theta, updates), opt_state


@partial(jax.jit, static_argnames=("objective",))
def project_all(theta, layers, fallback, hw, constants, objective: str):
    """Every layer's points (n, starts, 8) projected: (mappings, exact objectives), both (n, starts)."""
    def one(t, L, fb):
        return project(to_mapping(t, L), L, hw, fb, constants, objective)
    return jax.vmap(jax.vmap(one, (0, None, None)), (0, 0, 0))(theta, layers, fallback)


@jax.jit
def _keep_best(cand, values, best_m, best_v):
    """Per layer, the better of the best so far and this round's best start."""
    k = jnp.argmin(values, 1)
    round_m = jax.tree.map(lambda c: jnp.take_along_axis(c, k[:, None], 1)[:, 0], cand)
    round_v = jnp.take_along_axis(values, k[:, None], 1)[:, 0]
    better = round_v < best_v
    return jax.tree.map(lambda a, b: jnp.where(better, a, b), round_m, best_m), jnp.minimum(round_v, best_v)


def tune_layers(layers: LayerShape, fallback: TileMapping, hw: HardwarePoint, objective: str = "latency",
                constants: CostConstants = DEFAULT_CONSTANTS, settings: TuneSettings = DEFAULT_SETTINGS,
                progress: Callable | None = print_progress) -> TuneOutcome:
    """Tune every layer of a batch (LayerShape with fields of shape (n,)); `fallback` (n,) are legal
    mappings to start from and to fall back on (the grid search's)."""
    n = np.shape(layers.kind)[0]
    key = jax.random.PRNGKey(settings.seed)
    theta = jax.vmap(lambda k, L: random_theta(k, L, settings.starts))(jax.random.split(key, n), layers)
    theta = theta.at[:, 0].set(from_mapping(fallback))
    cost = exact_cost(layers, fallback, hw, constants)
    best_m, best_v = fallback, objective_of(cost.cycles, cost.energy_pj, objective)
    fallback_values = best_v
    opt_state = optax.adam(settings.learning_rate).init(theta)
    t0, evaluations = time.perf_counter(), 0
    rounds = max(1, settings.steps // settings.chunk)
    for r in range(rounds):
        for step in range(r * settings.chunk, (r + 1) * settings.chunk):
            theta, opt_state = _descend(theta, opt_state, step, layers, hw, constants, objective, settings)
        cand, values = project_all(theta, layers, fallback, hw, constants, objective)
        evaluations += NEIGHBOURS * n * settings.starts
        best_m, best_v = _keep_best(cand, values, best_m, best_v)
        if progress is not None:
            progress((r + 1) * settings.chunk, rounds * settings.chunk, float(jnp.sum(best_v)),
                     time.perf_counter() - t0)
    return TuneOutcome(jax.tree.map(np.asarray, best_m), np.asarray(best_v), np.asarray(fallback_values),
                       evaluations, rounds * settings.chunk * n * settings.starts)
