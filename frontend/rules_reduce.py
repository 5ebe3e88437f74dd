"""Reduction rules: sum, mean, prod, amax/amin, any, max/min (with indices), argmax/argmin, var,
cumsum and vector norm. Torch's `dim` of None or [] means every axis."""

from __future__ import annotations

import math
from functools import partial

import jax.numpy as jnp

from .registry import aten, axes, axis, jax_dtype, register, register_table


def _reduce(fn, x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    return fn(x, axis=axes(dim, x.ndim), keepdims=keepdim)


register_table({op: partial(_reduce, fn) for ops, fn in [
    ((aten.sum.dim_IntList,), jnp.sum),
    ((aten.mean.dim, aten.mean.default), jnp.mean),
    ((aten.prod.dim_int, aten.prod.default), jnp.prod),
    ((aten.amax.default, aten.max.default), jnp.max),
    ((aten.amin.default, aten.min.default), jnp.min),
    ((aten.any.dim, aten.any.dims, aten.any.default), jnp.any),
] for op in ops})


def _value_and_index(reduce, arg_reduce, x, dim, keepdim=False):
    return reduce(x, axis=axis(dim, x.ndim), keepdims=keepdim), arg_reduce(x, axis=axis(dim, x.ndim), keepdims=keepdim)


register_table({aten.max.dim: partial(_value_and_index, jnp.max, jnp.argmax),
                aten.min.dim: partial(_value_and_index, jnp.min, jnp.argmin)})


def _arg_reduce(fn, x, dim=None, keepdim=False):
    # dim=None: the index into the flattened tensor, as torch.argmax
    return fn(x, axis=None if dim is None else axis(dim, x.ndim), keepdims=keepdim)


register_table({aten.argmax.default: partial(_arg_reduce, jnp.argmax),
                aten.argmin.default: partial(_arg_reduce, jnp.argmin)})


@register(aten.var.correction)
def var(x, dim=None, correction=None, keepdim=False):
    reduced = axes(dim, x.ndim)
    count = math.prod(x.shape[a] for a in reduced)
    squares = jnp.square(x - jnp.mean(x, axis=reduced, keepdims=True))
    # NOTE: count - correction == 0 gives inf/nan, as in torch, not a silent zero
    return jnp.sum(squares, axis=reduced, keepdims=keepdim) / (count - (1 if correction is None else correction))


@register(aten.var_mean.correction)
def var_mean(x, dim=None, correction=None, keepdim=False):
    return var(x, dim, correction, keepdim), jnp.mean(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@register(aten.cumsum.default)
def cumsum(x, dim, dtype=None):
    return jnp.cumsum(x, axis=axis(dim, x.ndim), dtype=jax_dtype(dtype))


@register(aten.linalg_vector_norm.default)
def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002 - torch's argument name
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    return jnp.linalg.vector_norm(x, axis=axes(dim, x.ndim), keepdims=keepdim, ord=ord)
