"""Matmul and convolution rules. Linear layers, matmul and baddbmm decompose into these in core ATen.

Every contraction asks for HIGHEST precision: torch computes fp32 matmuls in fp32, and a GPU host
running the jaxpr would otherwise use TF32 and miss PyTorch by ~1e-3.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, register

HIGHEST = lax.Precision.HIGHEST


@register(aten.mm.default, aten.bmm.default)
def matmul(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


@register(aten.addmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    product = matmul(a, b)
    return beta * bias + alpha * product if (beta, alpha) != (1, 1) else bias + product


def _conv_spec(spatial_rank: int) -> tuple[str, str, str]:
    spatial = "DHW"[3 - spatial_rank:]
    return "NC" + spatial, "OI" + spatial, "NC" + spatial


def _transposed_weight(w, groups: int):
    """Torch's transposed-conv weight (Cin, Cout/g, k...) as the forward conv over the dilated input
    needs it: (Cout, Cin/g, k...), spatially flipped."""
    cin, cout_g, *kernel = w.shape
    w = w.reshape(groups, cin // groups, cout_g, *kernel).swapaxes(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


@register(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    rank = x.ndim - 2
    # torch accepts one value for every spatial dim
    stride, padding, dilation, output_padding = (tuple(v) * (rank // len(v)) if len(v) == 1 else tuple(v)
                                                 for v in (stride, padding, dilation, output_padding))
    if transposed:
        # The adjoint of the strided conv: dilate the input by the stride and pad by the kernel's reach
        # minus the forward padding (plus output_padding on the high side).
        reach = [d * (k - 1) for d, k in zip(dilation, w.shape[2:], strict=True)]
        pads = [(r - p, r - p + op) for r, p, op in zip(reach, padding, output_padding, strict=True)]
        w, lhs_dilation, strides = _transposed_weight(w, groups), tuple(stride), (1,) * rank
    else:
        pads, lhs_dilation, strides = [(p, p) for p in padding], (1,) * rank, tuple(stride)
    y = lax.conv_general_dilated(x, w, window_strides=strides, padding=pads, lhs_dilation=lhs_dilation,
                                 rhs_dilation=tuple(dilation), dimension_numbers=_conv_spec(rank),
                                 feature_group_count=groups, precision=HIGHEST)
    return y if bias is None else y + bias.reshape((1, -1) + (1,) * rank)
