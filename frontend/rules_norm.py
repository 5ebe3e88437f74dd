"""Normalization rules: batch norm (inference), layer norm, group norm, softmax and log-softmax.

16-bit inputs are normalized in float32 (see registry.widen).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, axis, register, widen


def _channel_shape(x) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.ndim - 2)


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(x, weight, bias, mean, var, momentum, eps):
    scale = lax.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale + (bias if bias is not None else 0)
    # the saved mean and inverse std are empty in inference; nothing reads them
    return widen(x) * scale.reshape(_channel_shape(x)) + shift.reshape(_channel_shape(x)), None, None


def _normalize(x, reduced: tuple[int, ...], eps):
    """(x - mean) * rstd over `reduced` axes, with the mean and rstd (keepdims)."""
    mean = jnp.mean(x, axis=reduced, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=reduced, keepdims=True) + eps)
    return (x - mean) * rstd, mean, rstd


@register(aten.native_layer_norm.default)
def layer_norm(x, normalized_shape, weight, bias, eps):
    y, mean, rstd = _normalize(widen(x), tuple(range(x.ndim - len(normalized_shape), x.ndim)), eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@register(aten.native_group_norm.default)
def group_norm(x, weight, bias, batch, channels, spatial_size, groups, eps):
    grouped = widen(x).reshape(batch, groups, -1)
    y, mean, rstd = _normalize(grouped, (2,), eps)
    y = y.reshape(x.shape)
    if weight is not None:
        y = y * weight.reshape(_channel_shape(x))
    if bias is not None:
        y = y + bias.reshape(_channel_shape(x))
    return y, mean.reshape(batch, groups), rstd.reshape(batch, groups)


def softmax(x, axis: int):
    """exp(x - max) / sum: the max subtracted for range, as every softmax kernel does."""
    e = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True))
    return e / jnp.sum(e, axis=axis, keepdims=True)


@register(aten._softmax.default)
def softmax_rule(x, dim, half_to_float=False):
    return softmax(widen(x), axis(dim, x.ndim))


@register(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float=False):
    x, ax = widen(x), axis(dim, x.ndim)
    shifted = x - jnp.max(x, axis=ax, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=ax, keepdims=True))
