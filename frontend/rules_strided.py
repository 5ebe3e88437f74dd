"""Views defined by strides: as_strided (which functionalization emits where a view has no other
form: adaptive pooling's output restrided, a user's x.as_strided) and diagonal.

A view is a constant index map into the flattened input. Where that map is affine and its rows do
not overlap (a plain view: a sub-box, every k-th element, a transpose, a broadcast), it becomes
slices, reshapes, a transpose and a broadcast, which the lowering keeps as views; any other map
(overlapping windows, a diagonal of a square read twice) is a gather with that constant map.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import aten, axis, register, takes_layout


def _affine(index: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) with index[j] == offset + sum(j * strides), or None for another map."""
    offset = int(index.flat[0]) if index.size else 0
    strides = tuple(int(index[(0,) * k + (1,) + (0,) * (index.ndim - k - 1)]) - offset if n > 1 else 0
                    for k, n in enumerate(index.shape))
    return (offset, strides) if np.array_equal(index, _positions(index.shape, strides, offset)) else None


def take_flat(x, index: np.ndarray):
    """x.ravel()[index] for a constant map `index` of in-range positions (module docstring)."""
    flat = jnp.reshape(jnp.asarray(x), -1)   # a weight arrives as a numpy array, which has no .at
    affine = _affine(index)
    view = affine and _strided_view(flat, index.shape, *affine)
    return flat.at[index].get(mode="promise_in_bounds") if view is None else view


def _strided_view(flat, shape, offset, strides):
    """flat[offset + sum(j * strides)] as slices, reshapes, a transpose and a broadcast, or None
    where the map has a negative stride or rows that overlap."""
    dims = sorted((k for k, n in enumerate(shape) if n > 1 and strides[k]), key=lambda k: -strides[k])
    if any(strides[k] < 0 for k in dims):
        return None
    # the span of dims[i:] in the flat array: each dim's stride must clear the span of those inside it
    spans = [1] * (len(dims) + 1)
    for i in reversed(range(len(dims))):
        spans[i] = (shape[dims[i]] - 1) * strides[dims[i]] + spans[i + 1]
    if any(strides[dims[i]] < spans[i + 1] for i in range(len(dims))):
        return None
    y = _cut(flat, offset, offset + spans[0])
    for i, k in enumerate(dims):   # the last axis, of length spans[i], -> (n, stride) rows, cut to the inner span
        n, stride = shape[k], strides[k]
        if n * stride > y.shape[-1]:   # the last row ends before a full stride: pad it (never read)
            y = jnp.pad(y, [(0, 0)] * (y.ndim - 1) + [(0, n * stride - y.shape[-1])])
        y = _cut(jnp.reshape(y, y.shape[:-1] + (n, stride)), 0, spans[i + 1])
    y = jnp.reshape(y, y.shape[:-1])   # the innermost span is one element
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    y = jnp.transpose(y, order)
    kept = sorted(dims)
    y = jnp.reshape(y, tuple(shape[k] if k in kept else 1 for k in range(len(shape))))
    return jnp.broadcast_to(y, tuple(shape))


def _cut(y, start: int, stop: int):
    """y[..., start:stop], or y itself where that is all of it (no slice equation)."""
    return y if (start, stop) == (0, y.shape[-1]) else lax.slice_in_dim(y, start, stop, axis=-1)


def _positions(shape, strides, offset) -> np.ndarray:
    """The storage position of every element of a strided tensor."""
    grid = np.zeros(shape, np.int64) + offset
    for k, (n, s) in enumerate(zip(shape, strides, strict=True)):
        grid = grid + np.arange(n).reshape((-1,) + (1,) * (len(shape) - k - 1)) * s
    return grid


@register(aten.as_strided.default)
@takes_layout
def as_strided(x, size, stride, storage_offset=None, *, layout):
    """The elements at storage_offset + sum(j * stride) of x's storage, which `layout` (x's recorded
    strides and storage offset) relates to x's own elements."""
    held = _positions(x.shape, *layout).ravel()
    wanted = _positions(tuple(size), tuple(stride), layout[1] if storage_offset is None else storage_offset)
    element = np.full(max(held.max(initial=0), wanted.max(initial=0)) + 1, -1, np.int64)
    element[held] = np.arange(held.size)
    index = element[wanted]
    if (index < 0).any():
        raise NotImplementedError(f"as_strided(size={list(size)}, stride={list(stride)}, storage_offset="
                                  f"{storage_offset}) reads storage outside its input of shape {list(x.shape)} "
                                  f"(strides {list(layout[0])}, offset {layout[1]})")
    return take_flat(x, index)


@register(aten.diagonal.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    a, b = axis(dim1, x.ndim), axis(dim2, x.ndim)
    rest = [k for k in range(x.ndim) if k not in (a, b)]
    length = max(0, min(x.shape[a] + min(offset, 0), x.shape[b] - max(offset, 0)))
    contiguous = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
    start = max(-offset, 0) * contiguous[a] + max(offset, 0) * contiguous[b]
    # the diagonal is the last axis, as torch puts it
    return take_flat(x, _positions(tuple(x.shape[k] for k in rest) + (length,),
                                   tuple(contiguous[k] for k in rest) + (contiguous[a] + contiguous[b],), start))
