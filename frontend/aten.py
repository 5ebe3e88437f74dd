"""ATen rules: one small JAX function per core-ATen op, keyed by the op.

A rule takes the op's arguments (tensors as JAX arrays, everything else as the
Python values the exported graph holds) and returns JAX arrays (a tuple for
multi-output ops).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

aten = torch.ops.aten
ATEN_RULES: dict[object, Callable] = {}


def register(*ops):
    def wrap(fn):
        for op in ops:
            ATEN_RULES[op] = fn
        return fn
    return wrap


def _axis(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# --- elementwise -------------------------------------------------------------------------------

@register(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    return a + (b * alpha if alpha != 1 else b)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    return a - (b * alpha if alpha != 1 else b)


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    return a * b


@register(aten.div.Tensor, aten.div.Scalar)
def div(a, b):
    return a / b


@register(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def clone(x, memory_format=None):
    return x


# --- matmul family -----------------------------------------------------------------------------

@register(aten.mm.default)
def mm(a, b):
    return a @ b


@register(aten.addmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * (a @ b) if (beta, alpha) != (1, 1) else bias + a @ b


@register(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise NotImplementedError("transposed convolution")
    spatial = "DHW"[3 - len(stride):]
    spec = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    y = lax.conv_general_dilated(x, w, window_strides=tuple(stride), padding=[(p, p) for p in padding],
                                 rhs_dilation=tuple(dilation), dimension_numbers=spec, feature_group_count=groups)
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * len(stride))
    return y


# --- normalization -----------------------------------------------------------------------------

@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(x, weight, bias, mean, var, momentum, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = lax.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale + (bias if bias is not None else 0)
    return x * scale.reshape(shape) + shift.reshape(shape), mean, var


# --- pooling -----------------------------------------------------------------------------------

def _window(x, init, op, kernel, stride, padding, dilation=None):
    k = len(kernel)
    stride = stride or kernel
    dilation = dilation or (1,) * k
    lead = x.ndim - k
    return lax.reduce_window(x, init, op, (1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
                             [(0, 0)] * lead + [(p, p) for p in padding],
                             window_dilation=(1,) * lead + tuple(dilation))


def _ceil_mode_unsupported(ceil_mode, op):
    if ceil_mode:
        raise NotImplementedError(f"{op} with ceil_mode=True")


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    _ceil_mode_unsupported(ceil_mode, "max_pool2d")
    padding = tuple(padding) * (2 // len(padding)) if padding else (0, 0)
    return _window(x, -jnp.inf, lax.max, kernel, stride, padding, dilation), None


@register(aten.avg_pool2d.default)
def avg_pool2d(x, kernel, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True, divisor_override=None):
    _ceil_mode_unsupported(ceil_mode, "avg_pool2d")
    padding = tuple(padding) * (2 // len(padding)) if padding else (0, 0)
    total = _window(x, 0.0, lax.add, kernel, stride, padding)
    if divisor_override:
        return total / divisor_override
    if count_include_pad or not any(padding):
        return total / math.prod(kernel)
    counts = _window(jnp.ones(x.shape[-2:], x.dtype), 0.0, lax.add, kernel, stride, padding)
    return total / counts


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    (h, w), (oh, ow) = x.shape[-2:], output_size
    if h % oh == 0 and w % ow == 0:
        kernel = (h // oh, w // ow)
        return _window(x, 0.0, lax.add, kernel, kernel, (0, 0)) / math.prod(kernel)
    # Uneven windows: a constant averaging matrix, as PyTorch's start/end index formula.
    pool = np.zeros((oh, ow, h, w), np.float32)
    for i in range(oh):
        for j in range(ow):
            r0, r1 = (i * h) // oh, -((-(i + 1) * h) // oh)
            c0, c1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            pool[i, j, r0:r1, c0:c1] = 1.0 / ((r1 - r0) * (c1 - c0))
    return jnp.einsum("...hw,ijhw->...ij", x, pool.astype(x.dtype))


@register(aten.mean.dim)
def mean(x, dims=None, keepdim=False, dtype=None):
    axes = tuple(range(x.ndim)) if not dims else tuple(_axis(d, x.ndim) for d in dims)
    return jnp.mean(x, axis=axes, keepdims=keepdim)


# --- data movement -----------------------------------------------------------------------------

@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(x, shape):
    return jnp.reshape(x, tuple(shape))


@register(aten.permute.default)
def permute(x, dims):
    return jnp.transpose(x, tuple(_axis(d, x.ndim) for d in dims))


@register(aten.t.default)
def t(x):
    return x.T


@register(aten.slice.Tensor)
def slice_tensor(x, dim=0, start=None, end=None, step=1):
    axis = _axis(dim, x.ndim)
    start, end, _ = slice(start, end, step).indices(x.shape[axis])
    return lax.slice_in_dim(x, start, max(start, end), step, axis)


# --- softmax -----------------------------------------------------------------------------------

@register(aten._softmax.default)
def softmax(x, dim, half_to_float=False):
    axis = _axis(dim, x.ndim)
    e = jnp.exp(x - lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True)))
    return e / jnp.sum(e, axis=axis, keepdims=True)
