"""Relaxations of the model's discrete steps, with a temperature `smooth` where 0 is exact.

The exact and the relaxed cost model are one code path: every ceil, max and tile-count sum
in `costmodel.model` goes through these, so at `smooth=0` the model is the exact closed form
and at `smooth>0` it is continuous in the tile sizes and hardware fields (for gradients).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _exact(smooth) -> bool:
    """A temperature known to be 0 when tracing: the relaxed branch need not be computed at all."""
    return isinstance(smooth, (int, float)) and smooth == 0


def step_up(frac, smooth):
    """0 at frac == 0, rising to 1 at frac == 1: a hard step (frac > 0) at smooth 0, a ramp
    (1 - e^(-f/s)) / (1 - e^(-1/s)) otherwise, which tends to frac itself as smooth grows."""
    if _exact(smooth):
        return (frac > 0).astype(jnp.result_type(frac))
    s = jnp.maximum(smooth, 1e-6)
    ramp = -jnp.expm1(-frac / s) / -jnp.expm1(-1.0 / s)
    return jnp.where(smooth > 0, ramp, (frac > 0).astype(jnp.result_type(frac)))


def ceil(x, smooth):
    """ceil(x), exact at integers for every temperature and continuous in x when smooth > 0."""
    floor = jnp.floor(x)
    return floor + step_up(x - floor, smooth)


def tile_sizes(dim, tile, smooth):
    """The tiles of `dim` by `tile` as (sizes, counts), two of each along a new last axis:
    floor(dim / tile) full tiles and one remainder tile (weighted by how much it exists when
    relaxed).  A sum over tiles of f(size) is sum(counts * f(sizes)), exact at smooth 0 and
    continuous in `tile` (the remainder shrinks to nothing as the full tiles reach `dim`)."""
    ratio = dim / tile
    full = jax.lax.stop_gradient(jnp.floor(ratio))
    rem = dim - full * tile
    part = step_up(ratio - full, smooth)
    return jnp.stack([tile, rem], -1), jnp.stack([full, part], -1)


def maximum(values, smooth):
    """max over the last axis; a log-sum-exp at a temperature relative to the values' scale."""
    if _exact(smooth):
        return jnp.max(values, -1)
    scale = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.abs(values), -1, keepdims=True), 1.0))
    s = jnp.maximum(smooth, 1e-6) * scale
    soft = s[..., 0] * jax.nn.logsumexp(values / s, -1)
    return jnp.where(smooth > 0, soft, jnp.max(values, -1))
