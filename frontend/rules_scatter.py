"""Indexed-assignment rules: index_put (x[idx] = v, accumulate or not; index_add, index_copy and
index_fill reach it in core ATen), scatter / scatter_add / scatter_reduce, index_reduce, put, masked_scatter and
slice_scatter (select_scatter decomposes into a select with where).

Each is a JAX scatter (`x.at[...]`), which the lowering runs as gathers with a constant index map
(lower/graph/canonicalize_index.py): so a scatter's integer indices must be constants of the model (buffers,
literals), and `SCATTER_INDEX_ARGS` names the argument that holds them, for the trace-time check
that says so (torch_export.check_rules). Boolean masks are not scatters: x[mask] = 0 is a select,
masked_scatter a running count and a gather; either mask may depend on the inputs.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import SCATTER_INDEX_ARGS, aten, axis, register, register_table


def _at(x):
    return jnp.asarray(x).at   # weights and buffers arrive as numpy arrays, which have no .at


def _is_mask(index) -> bool:
    return index is not None and np.dtype(index.dtype) == np.bool_


def _mask_fill(x, indices, values):
    """x[..., mask] = value (full slices, then one boolean mask, one value) as a select, or None."""
    lead = next((k for k, i in enumerate(indices) if i is not None), len(indices))
    if lead != len(indices) - 1 or not _is_mask(indices[lead]) or np.size(values) != 1:
        return None
    mask = indices[lead]
    mask = jnp.reshape(mask, (1,) * lead + mask.shape + (1,) * (x.ndim - lead - mask.ndim))
    return jnp.where(mask, jnp.reshape(values, ()).astype(x.dtype), x)


@register(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    filled = None if accumulate else _mask_fill(x, indices, values)
    if filled is not None:
        return filled
    where = _at(x)[tuple(slice(None) if i is None else i for i in indices)]
    values = jnp.asarray(values).astype(x.dtype)   # a scalar value arrives as a tensor of its own dtype
    return where.add(values) if accumulate else where.set(values)


@register(aten.put.default)
def put(x, index, source, accumulate=False):
    where = _at(jnp.reshape(x, -1))[jnp.reshape(index, -1)]
    source = jnp.reshape(source, -1).astype(x.dtype)
    return jnp.reshape(where.add(source) if accumulate else where.set(source), x.shape)


def _scatter_target(x, dim, index):
    """x.at[...] for torch's scatter along `dim`: each position of `index` (which may be smaller than
    x in every axis) names its own coordinates, with the index value in place of the one along dim."""
    coords = list(np.indices(np.shape(index), sparse=True))
    coords[axis(dim, x.ndim)] = index
    return _at(x)[tuple(coords)]


def _cropped(src, index):
    """The part of torch's src that scatter reads: the leading block of index's shape (a scalar as is)."""
    if np.ndim(src) == 0:
        return src
    return lax.slice(jnp.asarray(src), (0,) * src.ndim, tuple(np.shape(index)))


def scatter(method, x, dim, index, src):
    return getattr(_scatter_target(x, dim, index), method)(jnp.asarray(_cropped(src, index)).astype(x.dtype))


register_table({aten.scatter.src: partial(scatter, "set"), aten.scatter.value: partial(scatter, "set"),
                aten.scatter_add.default: partial(scatter, "add")})

# scatter_reduce's combiners: the .at method, and what a reached element starts from without itself
# (include_self=False): the sum's and product's identities; max and min start from the updates, as a
# repeated update leaves them as they are
_COMBINERS = {"sum": ("add", 0), "mean": ("add", 0), "prod": ("multiply", 1), "amax": ("max", None),
              "amin": ("min", None)}


@register(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    if reduce not in _COMBINERS:
        raise NotImplementedError(f"scatter_reduce with reduce={reduce!r} (supported: {sorted(_COMBINERS)})")
    method, start = _COMBINERS[reduce]
    src = _cropped(src, index).astype(x.dtype)
    if not include_self:
        x = _scatter_target(x, dim, index).set(src if start is None else start)
    combined = getattr(_scatter_target(x, dim, index), method)(src)
    if reduce != "mean":
        return combined
    ones = jnp.ones(np.shape(index), x.dtype)
    count = _scatter_target(jnp.full(x.shape, int(include_self), x.dtype), dim, index).add(ones)
    count = jnp.maximum(count, 1)   # an element nothing reached (include_self=False) is x, over 1
    return jnp.floor_divide(combined, count) if jnp.issubdtype(x.dtype, jnp.integer) else combined / count


@register(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    """Row index[i] along dim combines source's row i: scatter_reduce by the index broadcast to source."""
    ax = axis(dim, x.ndim)
    full = jnp.broadcast_to(jnp.reshape(index, [-1 if a == ax else 1 for a in range(source.ndim)]), source.shape)
    return scatter_reduce(x, ax, full, source, reduce, include_self)


@register(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    """Where mask (broadcast to x) holds, x takes source's elements in order: element k of the
    flattened mask's true elements reads source's element k."""
    mask = jnp.broadcast_to(mask, x.shape)
    order = jnp.cumsum(jnp.reshape(mask, -1).astype(jnp.int32)) - 1
    taken = jnp.reshape(jnp.take(jnp.reshape(source, -1), jnp.clip(order, 0, None), mode="clip"), x.shape)
    return jnp.where(mask, taken.astype(x.dtype), x)


@register(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    ax = axis(dim, x.ndim)
    start, end, step = slice(start, end, step).indices(x.shape[ax])
    src = jnp.asarray(src).astype(x.dtype)
    if step == 1:   # a contiguous block: the slices around it and a concatenation, no scatter
        before, after = lax.slice_in_dim(x, 0, start, axis=ax), lax.slice_in_dim(x, max(start, end), None, axis=ax)
        pieces = [before, src, after]
        return jnp.concatenate([p for p in pieces if p.shape[ax]], axis=ax)
    return _at(x)[(slice(None),) * ax + (slice(start, end, step),)].set(src)


SCATTER_INDEX_ARGS.update({aten.index_put.default: 1, aten.put.default: 1, aten.scatter.src: 2,
                           aten.scatter.value: 2, aten.scatter_add.default: 2, aten.scatter_reduce.two: 2,
                           aten.index_reduce.default: 2})
