"""Elementwise rules: unary and binary math, comparisons, logic, where, clamp, casts."""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax import lax

from .registry import aten, jax_dtype, register, register_table


def _float_unary(fn, x):
    # Torch computes math functions of integer tensors in float (exp of an int tensor is float32);
    # some jnp functions would stay integer (reciprocal) or reject ints (rsqrt).
    return fn(x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32))


register_table({op: partial(_float_unary, fn) for op, fn in {
    aten.exp.default: jnp.exp, aten.expm1.default: jnp.expm1, aten.log.default: jnp.log,
    aten.log1p.default: jnp.log1p, aten.log2.default: jnp.log2, aten.log10.default: jnp.log10,
    aten.sqrt.default: jnp.sqrt, aten.rsqrt.default: lax.rsqrt, aten.reciprocal.default: jnp.reciprocal,
    aten.sin.default: jnp.sin, aten.cos.default: jnp.cos, aten.tan.default: jnp.tan, aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos, aten.atan.default: jnp.arctan, aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh, aten.tanh.default: jnp.tanh, aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh, aten.atanh.default: jnp.arctanh, aten.erf.default: lax.erf,
    aten.sigmoid.default: lax.logistic,
}.items()})

register_table({
    aten.abs.default: jnp.abs, aten.neg.default: jnp.negative, aten.sign.default: jnp.sign,
    aten.floor.default: jnp.floor, aten.ceil.default: jnp.ceil, aten.trunc.default: jnp.trunc,
    aten.round.default: jnp.round,   # half to even, as torch.round
    aten.isnan.default: jnp.isnan, aten.isinf.default: jnp.isinf,
    aten.logical_not.default: jnp.logical_not, aten.bitwise_not.default: jnp.invert,
})

# Comparisons and logic: each ATen op in its Tensor and Scalar forms, the same JAX function.
register_table({getattr(getattr(aten, name), kind): fn
                for name, fn in {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                                 "gt": jnp.greater, "ge": jnp.greater_equal, "bitwise_and": jnp.bitwise_and,
                                 "bitwise_or": jnp.bitwise_or, "bitwise_xor": jnp.bitwise_xor,
                                 "remainder": jnp.remainder, "fmod": jnp.fmod}.items()
                for kind in ("Tensor", "Scalar")})

register_table({
    aten.logical_and.default: jnp.logical_and, aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor, aten.maximum.default: jnp.maximum,
    aten.minimum.default: jnp.minimum, aten.atan2.default: jnp.arctan2, aten.where.self: jnp.where,
    aten.mul.Tensor: jnp.multiply, aten.mul.Scalar: jnp.multiply, aten.hypot.default: jnp.hypot,
})


@register(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    return a + (b * alpha if alpha != 1 else b)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    return a - (b * alpha if alpha != 1 else b)


@register(aten.div.Tensor, aten.div.Tensor_mode, aten.div.Scalar, aten.div.Scalar_mode)
def div(a, b, rounding_mode=None):
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)     # numpy's floor division, which torch's matches bit for bit
    if rounding_mode == "trunc" and jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        dtype = jnp.result_type(a, b)
        return lax.div(jnp.asarray(a, dtype), jnp.asarray(b, dtype))   # C division truncates
    quotient = jnp.true_divide(a, b)
    return jnp.trunc(quotient) if rounding_mode == "trunc" else quotient


@register(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(base, exponent):
    if isinstance(exponent, float) and exponent.is_integer():
        exponent = int(exponent)   # x ** 2.0 as products (integer_pow), as torch does: exact for negative x
    return jnp.power(base, exponent)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):  # noqa: A002 - torch's argument names
    return jnp.clip(x, min, max)


@register(aten._to_copy.default)
def to_copy(x, dtype=None, **layout_and_device):   # layout, device, memory format: meaningless for JAX values
    return x if dtype is None else x.astype(jax_dtype(dtype))


@register(aten._assert_tensor_metadata.default, aten._assert_async.msg)
def assert_tensor_metadata(x, *args, **kwargs):
    # `.to(dtype)` leaves a metadata check in the graph, F.one_hot a check of its values; torch.export
    # ran them on the example inputs, and the interpreter checks every result's dtype and shape
    # against the export's record.
    return None
