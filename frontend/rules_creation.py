"""Creation rules: the constant tensors exported graphs build (ranges, fills, scalar tensors).
zeros/ones/new_full and the *_like fills decompose into full/full_like in core ATen.

Unspecified dtypes follow torch's inference (the interpreter casts to the recorded dtype)."""

from __future__ import annotations

import jax.numpy as jnp

from .registry import aten, jax_dtype, register


@register(aten.arange.start_step)
def arange(start, end, step=1, dtype=None, **layout_and_device):
    return jnp.arange(start, end, step, dtype=jax_dtype(dtype))


@register(aten.full.default)
def full(size, fill_value, dtype=None, **layout_and_device):
    return jnp.full(tuple(size), fill_value, dtype=jax_dtype(dtype))


@register(aten.full_like.default)
def full_like(x, fill_value, dtype=None, **layout_and_device):
    return jnp.full(x.shape, fill_value, dtype=jax_dtype(dtype) or x.dtype)


@register(aten.empty.memory_format, aten.empty_permuted.default)
def empty(size, physical_layout=None, dtype=None, **layout_and_device):
    # torch's memory is uninitialized; zeros are one valid value (a fill always follows in practice)
    return jnp.zeros(tuple(size), dtype=jax_dtype(dtype) or jnp.float32)


@register(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, dtype=None, **layout_and_device):   # strides: a layout JAX has no notion of
    return jnp.zeros(tuple(size), dtype=jax_dtype(dtype) or x.dtype)


@register(aten.scalar_tensor.default)
def scalar_tensor(value, dtype=None, **layout_and_device):
    return jnp.asarray(value, dtype=jax_dtype(dtype) or jnp.float32)
