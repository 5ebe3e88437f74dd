"""Normalization rules: batch norm (inference, or by batch statistics as instance norm), layer norm,
group norm, softmax and log-softmax.

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


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_batch_statistics(x, weight, bias, training, momentum, eps):
    """Batch norm by the batch's own statistics (training=True without running statistics; instance
    norm is this over a (1, N*C, ...) view): the saved mean and rstd are per channel."""
    y, mean, rstd = _normalize(widen(x), tuple(a for a in range(x.ndim) if a != 1), eps)
    return _scale_shift(y, weight, bias, _channel_shape(x)), mean.reshape(-1), rstd.reshape(-1)


def _scale_shift(y, weight, bias, shape):
    """y * weight + bias (either may be absent), each reshaped to broadcast as `shape`."""
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _normalize(x, reduced: tuple[int, ...], eps):
    """(x - mean) * rstd over `reduced` axes, with the mean and rstd (keepdims)."""
    mean = jnp.mean(x, axis=reduced, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=reduced, keepdims=True) + eps)
    return (x - mean) * rstd, mean, rstd


@register(aten.native_layer_norm.default)
def layer_norm(x, normalized_shape, weight, bias, eps):
    y, mean, rstd = _normalize(widen(x), tuple(range(x.ndim - len(normalized_shape), x.ndim)), eps)
    return _scale_shift(y, weight, bias, tuple(normalized_shape)), mean, rstd


@register(aten.native_group_norm.default)
def group_norm(x, weight, bias, batch, channels, spatial_size, groups, eps):
    grouped = widen(x).reshape(batch, groups, -1)
    y, mean, rstd = _normalize(grouped, (2,), eps)
    y = _scale_shift(y.reshape(x.shape), weight, bias, _channel_shape(x))
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
