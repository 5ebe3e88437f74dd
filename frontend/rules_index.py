"""Indexing rules: advanced indexing, index_select, gather, embedding.

Indices are data, so they cannot be range-checked when tracing; every lookup here uses JAX's
"fill" mode, so an out-of-range index reads NaN (the dtype's minimum for integers) instead of a
silently clamped neighbour.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, axis, register


@register(aten.index.Tensor)
def index(x, indices):
    # torch's advanced indexing (None = a full slice) follows NumPy's rules, as JAX's does; a weight
    # or buffer arrives as a numpy array, which has no .at
    return jnp.asarray(x).at[tuple(slice(None) if i is None else i for i in indices)].get(mode="fill")


@register(aten.index_select.default)
def index_select(x, dim, index):
    return jnp.take(x, index, axis=axis(dim, x.ndim), mode="fill")


@register(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    ax = axis(dim, x.ndim)
    # torch.gather lets the index be smaller than x in the other axes: crop x to it first
    crop = [(0, n if a == ax else m) for a, (n, m) in enumerate(zip(x.shape, index.shape, strict=True))]
    x = lax.slice(x, [lo for lo, _ in crop], [hi for _, hi in crop])
    return jnp.take_along_axis(x, index, axis=ax, mode="fill")


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="fill")
