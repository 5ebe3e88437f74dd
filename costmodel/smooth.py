"""Relaxations of the loop nest's discrete steps, with a temperature `smooth` where 0 is exact.

The exact and the relaxed cost model are one code path: lower.schedule.nest's formulas take their ceil,
tile counts and the maximum over units from an ops namespace, `Relaxed` here, so at `smooth=0`
the model is the exact closed form (the mapper's, lower.schedule.nest.Exact, in float32) and at
`smooth>0` it is continuous in the tile sizes and hardware fields (for gradients).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from stagec.lower.schedule.nest import Exact


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


def _hard_max(values):
    """max over the last axis as a chain of pairwise maxima: its gradient goes to one operand, where a
    reduction's splits over the operands equal to the maximum, and under jit, when recomputing them
    differs in the last bit from the forward pass, finds none and divides by zero."""
    return functools.reduce(jnp.maximum, jnp.moveaxis(values, -1, 0))


def maximum(values, smooth):
    """max over the last axis; a log-sum-exp at a temperature relative to the values' scale."""
    if _exact(smooth):
        return _hard_max(values)
    scale = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.abs(values), -1, keepdims=True), 1.0))
    s = jnp.maximum(smooth, 1e-6) * scale
    soft = s[..., 0] * jax.nn.logsumexp(values / s, -1)
    return jnp.where(smooth > 0, soft, _hard_max(values))


class Relaxed(Exact):
    """lower.schedule.nest's ops namespace over jax.numpy at temperature `smooth`: ceilings, tile counts and
    the maximum over units relaxed; floors and the positional minima and maxima (which tiles
    reach into the padding, lower.schedule.nest.Exact's) left hard, piecewise linear."""

    xp = jnp

    def __init__(self, smooth=0.0):
        self.smooth = smooth

    def cdiv(self, a, b):
        return ceil(a / b, self.smooth)

    @staticmethod
    def fdiv(a, b):
        return jnp.floor(a / b)

    def tiles(self, dim, tile):
        """The tiles of `dim` by `tile` as (size, count) pairs: floor(dim / tile) full tiles and one
        remainder tile, weighted by how much it exists when relaxed: a sum over tiles is exact at
        smooth 0 and continuous in `tile` (the remainder shrinks to nothing as the full tiles
        reach `dim`)."""
        ratio = dim / tile
        full = jax.lax.stop_gradient(jnp.floor(ratio))
        return [(tile, full), (dim - full * tile, step_up(ratio - full, self.smooth))]

    def smax(self, *xs):
        return maximum(jnp.stack(jnp.broadcast_arrays(*xs), -1), self.smooth)
