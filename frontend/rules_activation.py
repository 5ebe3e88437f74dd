"""Activation rules. SiLU, hard-swish, hard-sigmoid, softplus and mish decompose into elementwise
ops in core ATen, so they need no rule of their own; sigmoid and tanh are in the elementwise table."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .registry import aten, register


@register(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@register(aten.hardtanh.default)
def hardtanh(x, min_val=-1.0, max_val=1.0):   # ReLU6 is hardtanh(0, 6)
    return jnp.clip(x, min_val, max_val)


@register(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@register(aten.elu.default)
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * (alpha * scale))


@register(aten.gelu.default)
def gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2))))
