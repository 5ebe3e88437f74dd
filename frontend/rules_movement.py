"""Data-movement rules: views, permutes, broadcasts, slices, concatenation and splitting, flips,
padding, patch extraction (unfold), tiling. Transpose, flatten, stack, chunk, narrow, movedim and
roll decompose into these (or into indexing) in core ATen."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import aten, axis, register


@register(aten.clone.default, aten.alias.default)
def identity(x, memory_format=None):   # JAX values are immutable: a copy or an alias is the value itself
    return x


@register(aten.copy.default)
def copy(x, src, non_blocking=False):   # x's shape and dtype, src's values
    return jnp.broadcast_to(src, x.shape).astype(x.dtype)


@register(aten.view.default)
def view(x, shape):
    return jnp.reshape(x, tuple(shape))


@register(aten.permute.default)
def permute(x, dims):
    return jnp.transpose(x, tuple(axis(d, x.ndim) for d in dims))


@register(aten.expand.default)
def expand(x, size, implicit=False):
    lead = len(size) - x.ndim     # expand may add leading axes; -1 keeps an existing axis' size
    return jnp.broadcast_to(x, tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)))


@register(aten.slice.Tensor)
def slice_tensor(x, dim=0, start=None, end=None, step=1):
    ax = axis(dim, x.ndim)
    start, end, _ = slice(start, end, step).indices(x.shape[ax])
    return lax.slice_in_dim(x, start, max(start, end), step, ax)


@register(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    return slice_tensor(x, dim, start, start + length)


@register(aten.select.int)
def select(x, dim, index):
    ax = axis(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[ax], ax, keepdims=False)


@register(aten.squeeze.dims)
def squeeze(x, dims):
    # torch leaves a named dim that is not of size 1 in place
    return jnp.squeeze(x, tuple(a for a in {axis(d, x.ndim) for d in dims} if x.shape[a] == 1)) if x.ndim else x


@register(aten.unsqueeze.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@register(aten.cat.default)
def cat(tensors, dim=0):
    return jnp.concatenate(tensors, axis=axis(dim, tensors[0].ndim))


@register(aten.split_with_sizes.default)
def split_with_sizes(x, split_sizes, dim=0):
    ax, start, pieces = axis(dim, x.ndim), 0, []
    for size in split_sizes:
        pieces.append(lax.slice_in_dim(x, start, start + size, axis=ax))
        start += size
    return tuple(pieces)


@register(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, tuple(axis(d, x.ndim) for d in dims))


@register(aten.constant_pad_nd.default)
def constant_pad(x, pad, value=0):
    # torch lists (low, high) pairs from the last axis backwards; negative pads crop, as in lax.pad
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


@register(aten.unfold.default)
def unfold(x, dimension, size, step):
    """Windows of `size` every `step` along `dimension`: that axis becomes the window count and the
    window is a new last axis (Tensor.unfold, patch extraction)."""
    ax = axis(dimension, x.ndim)
    count = (x.shape[ax] - size) // step + 1
    if step == size:      # non-overlapping patches: a slice and a reshape, no gather
        windows = lax.slice_in_dim(x, 0, count * size, axis=ax)
        windows = windows.reshape(x.shape[:ax] + (count, size) + x.shape[ax + 1:])
    else:
        starts = np.arange(count)[:, None] * step + np.arange(size)[None, :]
        windows = jnp.take(x, starts, axis=ax)
    return jnp.moveaxis(windows, ax + 1, -1)


@register(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats))
