"""A layer and a mapping as arrays: what the cost model's functions take, so they `vmap` and trace.

lower.schedule.nest.LayerShape (a layer's problem, epilogue and repeat count as flat numbers) and
lower.schedule.nest.TileMapping (tile sizes and switches) are pytrees; here their fields become float32
arrays of one shape (tile sizes may be fractional and the switches probabilities in the relaxed
model), and a batch of layers or mappings is one of each with batched fields.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stagec.lower.schedule.buffers import NO_EXTRAS
from stagec.lower.schedule.nest import KINDS, LayerShape, TileMapping

__all__ = ["KINDS", "LayerShape", "broadcast_to", "layer_shape", "mapping_arrays", "stack", "to_tile_mapping"]


def layer_shape(kind: str, p, extras=NO_EXTRAS, repeat: int = 1) -> LayerShape:
    """One layer (a lower.schedule.nest.ConvProblem of `kind`, its epilogue's lower.schedule.buffers.Extras) as a
    LayerShape of float32 scalars (stack several with `stack`)."""
    return jax.tree.map(np.float32, LayerShape.of(kind, p, extras, repeat))


def mapping_arrays(m: TileMapping) -> TileMapping:
    """A mapping with float32 fields."""
    return jax.tree.map(np.float32, m)


def to_tile_mapping(m: TileMapping) -> TileMapping:
    """An integer mapping of arrays (scalars) back as a TileMapping of Python numbers."""
    values = [round(float(v)) for v in jax.tree.leaves(m)]
    return TileMapping(*values[:4], *(bool(v) for v in values[4:]))


def stack(items):
    """A list of LayerShape (or TileMapping) as one whose fields are arrays along a new first axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *items)


def broadcast_to(tree, shape):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, shape), tree)
