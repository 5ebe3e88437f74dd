"""The mapping space of a layer: bounds, the relaxed parameters, random legal points, projection.

A relaxed mapping is a few numbers per layer: the log of each tile size (oh, ow, o, c) and the
logit of each switch the tuner relaxes (lower.schedule.nest.SWITCHES: double buffering, weight residency,
a single accumulator tile, transposed operands), each zero where the layer has no such switch.
`project` turns any of them into the nearest legal mapping: the floor and ceiling of every tile
size (in log space) crossed with the switches, evaluated with the exact model, the cheapest one
that fits kept; a layer none of whose neighbours fit falls back to the grid search's mapping
(lower.schedule.mapper), always legal.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from stagec.isa.instructions import MAX_COUNT
from stagec.lower.schedule.nest import SWITCHES, TILE_FIELDS, LayerShape, TileMapping
from stagec.lower.schedule.search import objective_of

from .batch import exact_cost
from .hardware import HardwarePoint
from .model import DEFAULT_CONSTANTS, MATRIX, CostConstants, layer_cost

TUNED = tuple(sw for sw in SWITCHES if sw.tuned)
PARAMETERS = len(TILE_FIELDS) + len(TUNED)


def tile_bounds(L: LayerShape):
    """(..., 4) upper bounds of (tile_oh, tile_ow, tile_o, tile_c): the dims, within the 16-bit
    counts (a MATMUL's k is kw * tile_c when column dilation is 1); window ops have tile_c 1."""
    fold = jnp.where(L.dilation_w == 1, L.kw, 1.0)
    c = jnp.where(L.kind == MATRIX, jnp.minimum(L.c, jnp.floor(MAX_COUNT / fold)), 1.0)
    return jnp.stack([jnp.minimum(L.oh, MAX_COUNT), jnp.minimum(L.ow, MAX_COUNT), jnp.minimum(L.o, MAX_COUNT), c], -1)


def _mapping(tiles, switches, L: LayerShape) -> TileMapping:
    """A TileMapping of (..., 4) tile sizes and (..., len(TUNED)) switch values, each switch zero where
    the layer has none and those the tuner does not relax off."""
    on = {sw.name: switches[..., i] * sw.exists(L) for i, sw in enumerate(TUNED)}
    off = jnp.zeros_like(tiles[..., 0])
    return TileMapping(*(tiles[..., i] for i in range(len(TILE_FIELDS))), *(on.get(sw.name, off) for sw in SWITCHES))


def to_mapping(theta, L: LayerShape) -> TileMapping:
    """Relaxed parameters (..., PARAMETERS) -> a TileMapping of fractional tiles within their bounds
    and switch probabilities."""
    tiles = jnp.clip(jnp.exp(theta[..., :len(TILE_FIELDS)]), 1.0, tile_bounds(L))
    return _mapping(tiles, jax.nn.sigmoid(theta[..., len(TILE_FIELDS):]), L)


def from_mapping(m: TileMapping):
    """A (legal, integer) mapping as relaxed parameters: a start for gradient descent."""
    switches = jnp.stack([getattr(m, sw.name) for sw in TUNED], -1)
    tiles = jnp.stack([getattr(m, f) for f in TILE_FIELDS], -1)
    return jnp.concatenate([jnp.log(tiles), jnp.where(switches > 0.5, 3.0, -3.0)], -1)


def random_theta(key, L: LayerShape, count: int):
    """`count` relaxed points, tile sizes log-uniform within the bounds, switches uniform."""
    k1, k2 = jax.random.split(key)
    hi = jnp.log(tile_bounds(L))
    tiles = jax.random.uniform(k1, (count, len(TILE_FIELDS))) * hi
    # the first three switches draw from one key, each later one from its own, so the numbers drawn
    # before a switch existed stay as they were (the same seed, the same starts)
    keys = [(k2, 3)] + [(jax.random.fold_in(k2, j), 1) for j in range(1, len(TUNED) - 2)]
    switches = [jax.random.uniform(k, (count, n), minval=-3.0, maxval=3.0) for k, n in keys]
    return jnp.concatenate([tiles, *switches], -1)


# the floor/ceil corners of the four tile sizes, times every setting of the relaxed switches
_CORNERS = np.array(list(itertools.product((0, 1), repeat=len(TILE_FIELDS))), np.float32)
_SWITCHES = np.array(list(itertools.product((0, 1), repeat=len(TUNED))), np.float32)
NEIGHBOURS = len(_CORNERS) * len(_SWITCHES)


def neighbours(m: TileMapping, L: LayerShape) -> TileMapping:
    """The NEIGHBOURS integer mappings around a relaxed one (a new last axis)."""
    tiles = jnp.stack([getattr(m, f) for f in TILE_FIELDS], -1)
    lo = jnp.clip(jnp.floor(tiles), 1.0, tile_bounds(L))
    hi = jnp.clip(jnp.ceil(tiles), 1.0, tile_bounds(L))
    corner = lo[..., None, :] + _CORNERS * (hi - lo)[..., None, :]          # (..., 16, 4)
    corner = jnp.repeat(corner, len(_SWITCHES), -2)                           # (..., NEIGHBOURS, 4)
    switch = jnp.broadcast_to(jnp.tile(_SWITCHES, (len(_CORNERS), 1)), corner.shape[:-1] + (len(TUNED),))
    return _mapping(corner, switch, jax.tree.map(lambda v: v[..., None], L))


def project(m: TileMapping, L: LayerShape, hw: HardwarePoint, fallback: TileMapping,
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
                 oversample: int = 8) -> TileMapping:
    """Up to `count` random legal integer mappings of one layer (log-uniform tile sizes, random
    switches) whose loop nest has at most `max_instructions` instructions, exact model's count."""
    theta = random_theta(key, L, count * oversample)
    m = jax.tree.map(jnp.round, to_mapping(theta, L))
    cost = exact_cost(jax.tree.map(lambda v: jnp.broadcast_to(v, m.tile_oh.shape), L), m, hw)
    keep = np.flatnonzero(np.asarray((cost.violation == 0) & (cost.instructions <= max_instructions)))[:count]
    return jax.tree.map(lambda a: np.asarray(a)[keep], m)
