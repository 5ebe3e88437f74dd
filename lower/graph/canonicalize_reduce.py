"""canonicalize's rules for reductions, running sums (cumsum: a MATMUL by a triangle) and pooling
(reduce_window: a POOL over the last two dims)."""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import LoweringError

from .builder import Steps, dtype_of, out_shape, reshape_value, rule, transpose_value
from .graph_ir import OpKind, Step


@rule("reduce_sum", "reduce_max", "reduce_min")
def reduce(b, eqn, x):
    return b.emit(OpKind.REDUCE, [x], out_shape(eqn), func=eqn.primitive.name.split("_")[1],
                  axes=tuple(sorted(int(a) for a in eqn.params["axes"])))


@rule("argmax", "argmin")
def argmax(b, eqn, x):
    """The first index of the largest (smallest) element along an axis, as jnp's (the first NaN where
    there is one): the REDUCE max (min), then the least index of the elements equal to it (or NaN), the
    others given the axis' length, by a REDUCE min."""
    (ax,) = eqn.params["axes"]
    shape = np.shape(x)
    n = shape[ax]
    kept = tuple(1 if d == ax else s for d, s in enumerate(shape))
    func = eqn.primitive.name[3:]
    best = reshape_value(b, b.emit(OpKind.REDUCE, [x], out_shape(eqn), func=func, axes=(ax,)), kept)
    dtype = np.int32 if dtype_of(x) == "int32" else np.float32
    index = np.arange(n, dtype=dtype).reshape(tuple(n if d == ax else 1 for d in range(len(shape))))
    step = Steps(4)     # x, its extreme, the indices, n
    hit = step("cmp_eq", 0, 1)
    if dtype == np.float32:
        hit = step("max", hit, step("cmp_ne", 0, 0))
    step("select", hit, 3, 2)
    candidates = b.elementwise([x, best, index, dtype(n)], step.steps, shape)
    first = b.emit(OpKind.REDUCE, [candidates], out_shape(eqn), func="min", axes=(ax,))
    return first if dtype == np.int32 else b.elementwise([first], (Step("to_i32", (0,)),), out_shape(eqn))


@rule("cumsum")
def cumsum(b, eqn, x):
    """A running sum along an axis of length n: a MATMUL by the constant n x n 0/1 triangle (n MACs an
    element on the array), in float32 (integers, e.g. a mask's running count, are exact below 2**24)."""
    ax, shape = eqn.params["axis"], out_shape(eqn)
    n = shape[ax]
    triangle = np.triu(np.ones((n, n), np.float32))   # out[j] = sum of x[i] for i <= j
    if eqn.params["reverse"]:
        triangle = triangle.T
    rest = [d for d in range(len(shape)) if d != ax]
    rows = reshape_value(b, transpose_value(b, x, rest + [ax]), (math.prod(shape[d] for d in rest), n))
    integer = dtype_of(x) == "int32"
    if integer:
        rows = b.elementwise([rows], (Step("to_f32", (0,)),), np.shape(rows))
    out = b.emit(OpKind.MATMUL, [rows, triangle], np.shape(rows))
    if integer:
        out = b.elementwise([out], (Step("to_i32", (0,)),), np.shape(rows))
    out = reshape_value(b, out, tuple(shape[d] for d in rest) + (n,))
    return transpose_value(b, out, tuple(int(i) for i in np.argsort(rest + [ax])))


@rule("reduce_window_max", "reduce_window_sum")
def reduce_window(b, eqn, x):
    """Canonical POOL: the window on the last two dims, any leading dims."""
    p = eqn.params
    if any(d != 1 for d in p["base_dilation"]):
        raise LoweringError(f"reduce_window with base dilation (equation `{eqn}`)")
    window, strides, dilation = p["window_dimensions"], p["window_strides"], p["window_dilation"]
    padding = tuple(tuple(pd) for pd in p["padding"])
    rank, out = len(x.shape), out_shape(eqn)
    active = [d for d in range(rank) if window[d] != 1 or strides[d] != 1 or padding[d] != (0, 0)]
    if len(active) > 2:
        raise LoweringError(f"pooling over {len(active)} dims (equation `{eqn}`)")
    rest = [d for d in range(rank) if d not in active]
    perm = rest + active
    unit = (1,) * (2 - len(active))

    def param(values, default):
        return (default,) * len(unit) + tuple(values[d] for d in active)

    xt = reshape_value(b, transpose_value(b, x, perm), tuple(x.shape[d] for d in rest) + unit
                       + tuple(x.shape[d] for d in active))
    y = b.emit(OpKind.POOL, [xt], tuple(out[d] for d in rest) + unit + tuple(out[d] for d in active),
               func=eqn.primitive.name.split("_")[-1], window=param(window, 1), strides=param(strides, 1),
               padding=param(padding, (0, 0)), dilation=param(dilation, 1))
    yt = reshape_value(b, y, tuple(out[d] for d in perm))
    return transpose_value(b, yt, tuple(int(i) for i in np.argsort(perm)))
