"""Resizing rules: nearest and bilinear upsampling (segmentation and depth heads), 2-D.

Source positions follow PyTorch's formulas exactly (computed here in float32, as its CPU kernels
do): nearest takes floor(dst * scale); bilinear is the half-pixel (or align_corners) linear
interpolation, applied per spatial axis as a constant (out x in) weight matrix. 1-D resizing
decomposes into index ops in core ATen.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import aten, register


def _sizes_and_scales(x, output_size, scale_factors) -> list[tuple[int, int, np.float32]]:
    """(input size, output size, input/output scale) per resized axis, as PyTorch computes them."""
    spatial = x.shape[2:]
    if output_size is not None:
        return [(n, out, np.float32(n) / np.float32(out)) for n, out in zip(spatial, output_size, strict=True)]
    return [(n, int(np.floor(n * s)), np.float32(1.0 / s)) for n, s in zip(spatial, scale_factors, strict=True)]


def _nearest_source(n: int, out: int, scale: np.float32) -> np.ndarray:
    return np.minimum(np.floor(np.arange(out, dtype=np.float32) * scale).astype(np.int64), n - 1)


@register(aten.upsample_nearest2d.vec)
def upsample_nearest(x, output_size, scale_factors):
    for ax, (n, out, scale) in enumerate(_sizes_and_scales(x, output_size, scale_factors), start=2):
        source = _nearest_source(n, out, scale)
        if out % n == 0 and (source == np.arange(out) // (out // n)).all():
            x = jnp.repeat(x, out // n, axis=ax)    # an integer factor: a broadcast, not a gather
        else:
            x = jnp.take(x, source, axis=ax)
    return x


def _linear_weights(n: int, out: int, scale: np.float32, align_corners: bool) -> np.ndarray:
    """The (out, n) matrix of PyTorch's linear interpolation weights along one axis."""
    dst = np.arange(out, dtype=np.float32)
    if align_corners:
        src = dst * np.float32((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        src = np.maximum(scale * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0))
    lo = np.floor(src).astype(np.int64)
    hi = np.where(lo < n - 1, lo + 1, lo)
    frac = src - lo
    weights = np.zeros((out, n), np.float32)
    np.add.at(weights, (np.arange(out), lo), 1 - frac)
    np.add.at(weights, (np.arange(out), hi), frac)
    return weights


@register(aten.upsample_bilinear2d.vec)
def upsample_bilinear(x, output_size, align_corners, scale_factors):
    for ax, (n, out, scale) in enumerate(_sizes_and_scales(x, output_size, scale_factors), start=2):
        weights = _linear_weights(n, out, scale, align_corners).astype(x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, weights, axes=([ax], [1]), precision=lax.Precision.HIGHEST), -1, ax)
    return x
