"""Pooling rules: max and average pooling (floor or ceil mode) and adaptive average and max pooling
of any input and output sizes. 1-D pooling reaches these 2-D rules through an unsqueeze in core ATen."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import aten, register


def _pair(values, default) -> tuple[int, int]:
    values = tuple(values) if values else default
    return values * (2 // len(values))      # torch accepts one value for both spatial dims


def _output_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size; in ceil mode the last window must start inside input or left pad."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return out - 1 if ceil_mode and (out - 1) * s >= n + p else out


def _axis_window(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool):
    """(window, stride, (low, high) padding, dilation) of one pooled axis; the high padding is what
    ceil mode's last window needs."""
    out = _output_size(n, k, s, p, d, ceil_mode)
    if out == 1 and d == 1 and k - p >= n:
        # One window over the whole axis (EfficientNet pools with a 1280-wide kernel in ceil mode):
        # the padding adds only identity elements, so it is the window of the axis itself.
        return n, 1, (0, 0), 1
    return k, s, (p, max(p, (out - 1) * s + d * (k - 1) + 1 - n - p)), d


def _window(x, init, op, kernel, stride, padding, dilation, ceil_mode):
    """reduce_window over the last two axes, as PyTorch's pooling windows them."""
    windows, strides, pads, dilations = zip(*[_axis_window(*axis, ceil_mode) for axis in zip(
        x.shape[-2:], kernel, stride, padding, dilation, strict=True)], strict=True)
    lead = x.ndim - 2
    # NOTE: a numpy init value (not a jnp array) lets lax recognize the monoid: reduce_window_max/sum,
    # not the generic reduce_window with a body jaxpr
    return lax.reduce_window(x, np.array(init, x.dtype), op, (1,) * lead + windows, (1,) * lead + strides,
                             [(0, 0)] * lead + list(pads), window_dilation=(1,) * lead + dilations)


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    kernel = _pair(kernel, None)
    pooled = _window(x, -jnp.inf, lax.max, kernel, _pair(stride, kernel), _pair(padding, (0,)),
                     _pair(dilation, (1,)), ceil_mode)
    return pooled, None     # the indices (for max_unpool) are not computed


def _window_counts(n: int, k: int, s: int, p: int, out: int, include_pad: bool) -> np.ndarray:
    """How many elements each output's window averages along one axis (PyTorch's avg_pool2d)."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, n + p)
    if include_pad:
        return end - start
    return np.minimum(end, n) - np.maximum(start, 0)


@register(aten.avg_pool2d.default)
def avg_pool2d(x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    kernel = _pair(kernel, None)
    stride, padding = _pair(stride, kernel), _pair(padding, (0,))
    total = _window(x, 0, lax.add, kernel, stride, padding, (1, 1), ceil_mode)
    if divisor_override:
        return total / divisor_override
    counts = [_window_counts(n, k, s, p, out, count_include_pad)
              for n, k, s, p, out in zip(x.shape[-2:], kernel, stride, padding, total.shape[-2:], strict=True)]
    divisor = np.outer(*counts)
    if (divisor == divisor.flat[0]).all():
        return total / divisor.flat[0].item()     # the common case: one divisor, a scalar in the jaxpr
    return total / divisor.astype(x.dtype)


def _adaptive_windows(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows along one axis: output i reduces [floor(i*n/out), ceil((i+1)*n/out))."""
    i = np.arange(out)
    return (i * n) // out, -(-(i + 1) * n // out)


def _uneven_mean(x, ax: int, out: int):
    """The windows' means along axis ax: a contraction with a constant matrix of 1/len over each window."""
    start, end = _adaptive_windows(x.shape[ax], out)
    weights = np.zeros((out, x.shape[ax]), np.float32)
    for i, (lo, hi) in enumerate(zip(start, end, strict=True)):
        weights[i, lo:hi] = 1.0 / (hi - lo)
    y = jnp.tensordot(x, weights.astype(x.dtype), axes=([ax], [1]), precision=lax.Precision.HIGHEST)
    return jnp.moveaxis(y, -1, ax)


def _uneven_max(x, ax: int, out: int):
    """The windows' maxima along axis ax: a gather of each window's elements (a short window repeats
    its last, which leaves its maximum as it is), then the maximum over them."""
    start, end = _adaptive_windows(x.shape[ax], out)
    taps = np.minimum(start[:, None] + np.arange((end - start).max())[None, :], end[:, None] - 1)
    return jnp.max(jnp.take(x, taps, axis=ax), axis=ax + 1)


_ADAPTIVE = {"avg": (0, lax.add, _uneven_mean), "max": (-np.inf, lax.max, _uneven_max)}


def _adaptive(kind: str, x, output_size):
    """Adaptive pooling of the last two axes to output_size (None keeps an axis). An axis whose size
    the output divides has windows of one size: a strided window (the POOL op); another axis has
    windows of two sizes, reduced by _uneven_mean or _uneven_max."""
    init, op, uneven = _ADAPTIVE[kind]
    sizes = [n if o is None else o for n, o in zip(x.shape[-2:], output_size, strict=True)]
    kernel = tuple(n // o if n % o == 0 else 1 for n, o in zip(x.shape[-2:], sizes, strict=True))
    if kernel != (1, 1):
        x = _window(x, init, op, kernel, kernel, (0, 0), (1, 1), False)
        x = x / math.prod(kernel) if kind == "avg" else x
    for ax, out in zip((x.ndim - 2, x.ndim - 1), sizes, strict=True):
        if x.shape[ax] != out:
            x = uneven(x, ax, out)
    return x


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive("avg", x, output_size)


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _adaptive("max", x, output_size), None     # the indices (for max_unpool) are not computed
