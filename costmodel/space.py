"""The mapping space of a layer: bounds, the relaxed parameters, random legal points, projection.

A relaxed mapping is eight numbers per layer: the log of each tile size (oh, ow, o, c) and the
logits of double buffering, weight residency, a single accumulator tile and transposed operands.
`project` turns any of them into the nearest legal mapping: the floor and ceiling of every tile
size (in log space) crossed with the four switches, evaluated with the exact model, the cheapest
one that fits kept; a layer none of whose neighbours fit falls back to the grid search's mapping
(lower.schedule), always legal.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from stagec.errors import InputError
from stagec.lower.schedule import MAX_HALO, strides_turn

from .batch import exact_cost
from .hardware import HardwarePoint
from .model import DEFAULT_CONSTANTS, MATRIX, CostConstants, layer_cost
from .problem import LayerShape, MappingArrays

TILE_FIELDS = ("tile_oh", "tile_ow", "tile_o", "tile_c")


def tile_bounds(L: LayerShape):
    """(..., 4) upper bounds of (tile_oh, tile_ow, tile_o, tile_c): the dims, within the 16-bit
    counts (a MATMUL's k is kw * tile_c when column dilation is 1); window ops have tile_c 1."""
    fold = jnp.where(L.dilation_w == 1, L.kw, 1.0)
    c = jnp.where(L.kind == MATRIX, jnp.minimum(L.c, jnp.floor(MAX_HALO / fold)), 1.0)
    return jnp.stack([jnp.minimum(L.oh, MAX_HALO), jnp.minimum(L.ow, MAX_HALO), jnp.minimum(L.o, MAX_HALO), c], -1)


def matrix_switches(L: LayerShape):
    """Where weight residency and a single accumulator tile, and where transposed operands, exist:
    on the matrix unit; transposed only where a tile's pixels lie on one line (lower.schedule's
    strides_turn)."""
    matrix = L.kind == MATRIX
    return matrix, matrix & strides_turn((L.stride_h, L.stride_w))


def to_mapping(theta, L: LayerShape) -> MappingArrays:
    """Relaxed parameters (..., 8) -> a MappingArrays of fractional tiles within their bounds
    and switch probabilities (window ops never hold weights resident nor a single accumulator)."""
    tiles = jnp.clip(jnp.exp(theta[..., :4]), 1.0, tile_bounds(L))
    db = jax.nn.sigmoid(theta[..., 4])
    matrix, turns = matrix_switches(L)
    res, single, turned = (jax.nn.sigmoid(theta[..., i]) * on for i, on in ((5, matrix), (6, matrix), (7, turns)))
    return MappingArrays(*(tiles[..., i] for i in range(4)), db, res, single, turned, jnp.zeros_like(db))


def from_mapping(m: MappingArrays):
    """A (legal, integer) mapping as relaxed parameters: a start for gradient descent."""
    switches = jnp.stack([m.double_buffer, m.weights_resident, m.single_acc, m.transposed], -1)
    tiles = jnp.stack([m.tile_oh, m.tile_ow, m.tile_o, m.tile_c], -1)
    return jnp.concatenate([jnp.log(tiles), jnp.where(switches > 0.5, 3.0, -3.0)], -1)


def random_theta(key, L: LayerShape, count: int):
    """`count` relaxed points, tile sizes log-uniform within the bounds, switches uniform."""
    k1, k2 = jax.random.split(key)
    hi = jnp.log(tile_bounds(L))
    tiles = jax.random.uniform(k1, (count, 4)) * hi
    # the transposed switch draws from its own key, so the other seven numbers stay as they were drawn
    # before it existed (the same seed, the same starts)
    switches = [jax.random.uniform(k, (count, n), minval=-3.0, maxval=3.0)
                for k, n in ((k2, 3), (jax.random.fold_in(k2, 1), 1))]
    return jnp.concatenate([tiles, *switches], -1)


# the 16 floor/ceil corners of four tile sizes, times the 16 switch settings
_CORNERS = np.array(list(itertools.product((0, 1), repeat=4)), np.float32)
_SWITCHES = np.array(list(itertools.product((0, 1), repeat=4)), np.float32)
NEIGHBOURS = len(_CORNERS) * len(_SWITCHES)


def neighbours(m: MappingArrays, L: LayerShape) -> MappingArrays:
    """The NEIGHBOURS integer mappings around a relaxed one (a new last axis)."""
    tiles = jnp.stack([getattr(m, f) for f in TILE_FIELDS], -1)
    lo = jnp.clip(jnp.floor(tiles), 1.0, tile_bounds(L))
    hi = jnp.clip(jnp.ceil(tiles), 1.0, tile_bounds(L))
    corner = lo[..., None, :] + _CORNERS * (hi - lo)[..., None, :]          # (..., 16, 4)
    corner = jnp.repeat(corner, len(_SWITCHES), -2)                           # (..., 256, 4)
    switch = jnp.broadcast_to(jnp.tile(_SWITCHES, (len(_CORNERS), 1)), corner.shape[:-1] + (4,))
    matrix, turns = matrix_switches(L)
    res, single, turned = (switch[..., i] * on[..., None] for i, on in ((1, matrix), (2, matrix), (3, turns)))
    return MappingArrays(*(corner[..., i] for i in range(4)), switch[..., 0], res, single, turned,
                         jnp.zeros_like(res))


def objective_of(cycles, energy_pj, objective: str):
    """The scalar a tuner minimizes: cycles, energy (pJ) or their product (EDP)."""
    if objective == "latency":
        return cycles
    if objective == "energy":
        return energy_pj
    if objective == "edp":
        return cycles * energy_pj
    raise InputError(f"unknown objective {objective!r}; expected 'latency', 'energy' or 'edp'")


def project(m: MappingArrays, L: LayerShape, hw: HardwarePoint, fallback: MappingArrays,
            constants: CostConstants = DEFAULT_CONSTANTS, objective: str = "latency"):
    """The cheapest legal integer neighbour of relaxed mapping `m` (one layer, scalar fields), or
    `fallback` when none fits; returns (mapping, its exact objective)."""
    cand = neighbours(m, L)
    cost = jax.vmap(lambda c: layer_cost(L, c, hw, constants))(cand)
    value = jnp.where(cost.violation > 0, jnp.inf, objective_of(cost.cycles, cost.energy_pj, objective))
    best = jnp.argmin(value)
    chosen = jax.tree.map(lambda c: c[best], cand)
    ok = jnp.isfinite(value[best])
    fallback_cost = layer_cost(L, fallback, hw, constants)
    fallback_value = objective_of(fallback_cost.cycles, fallback_cost.energy_pj, objective)
    return (jax.tree.map(lambda a, b: jnp.where(ok, a, b), chosen, fallback),
            jnp.where(ok, value[best], fallback_value))


def random_legal(key, L: LayerShape, hw: HardwarePoint, count: int, max_instructions: float = np.inf,
                 oversample: int = 8) -> MappingArrays:
    """Up to `count` random legal integer mappings of one layer (log-uniform tile sizes, random
    switches) whose loop nest has at most `max_instructions` instructions, exact model's count."""
    theta = random_theta(key, L, count * oversample)
    m = to_mapping(theta, L)
    m = MappingArrays(*(jnp.round(getattr(m, f)) for f in TILE_FIELDS), jnp.round(m.double_buffer),
                      jnp.round(m.weights_resident), jnp.round(m.single_acc), jnp.round(m.transposed),
                      m.stacked)
    cost = exact_cost(jax.tree.map(lambda v: jnp.broadcast_to(v, m.tile_oh.shape), L), m, hw)
    keep = np.flatnonzero(np.asarray((cost.violation == 0) & (cost.instructions <= max_instructions)))[:count]
    return jax.tree.map(lambda a: np.asarray(a)[keep], m)
