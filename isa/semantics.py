"""Reference semantics of the vector functions and pad values, in numpy.

This is the definition the simulator's fast path is tested against; it is
written for clarity, not speed.
"""

from __future__ import annotations

import math

import numpy as np

from .instructions import AccMode, DType, PadValue, VectorFunc

_erf = np.frompyfunc(math.erf, 1, 1)


def _same(fn):
    return lambda x: fn(x).astype(x.dtype)


VECTOR_FUNCS = {
    VectorFunc.COPY: lambda x: x,
    VectorFunc.NEG: np.negative,
    VectorFunc.ABS: np.abs,
    VectorFunc.RELU: lambda x: np.maximum(x, x.dtype.type(0)),
    VectorFunc.EXP: np.exp,
    VectorFunc.LOG: np.log,
    VectorFunc.RECIP: lambda x: x.dtype.type(1) / x,
    VectorFunc.RSQRT: lambda x: x.dtype.type(1) / np.sqrt(x),
    VectorFunc.SQRT: np.sqrt,
    VectorFunc.TANH: np.tanh,
    VectorFunc.ERF: _same(lambda x: _erf(x.astype(np.float64)).astype(np.float64)),
    VectorFunc.SIGMOID: lambda x: x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x)),
    VectorFunc.ADD: np.add,
    VectorFunc.SUB: np.subtract,
    VectorFunc.MUL: np.multiply,
    VectorFunc.MAX: np.maximum,
    VectorFunc.MIN: np.minimum,
    VectorFunc.RSUM: lambda x: x.sum(axis=-1, keepdims=True, dtype=x.dtype),
    VectorFunc.RMAX: lambda x: x.max(axis=-1, keepdims=True),
    VectorFunc.RMIN: lambda x: x.min(axis=-1, keepdims=True),
}

ACCUMULATE = {
    AccMode.ADD: np.add,
    AccMode.MAX: np.maximum,
    AccMode.MIN: np.minimum,
}


def pad_value(kind: PadValue, dtype: DType):
    """The fill value of a LOAD's padding, in the element type."""
    t = dtype.numpy
    if kind == PadValue.ZERO:
        return t.type(0)
    if np.issubdtype(t, np.floating):
        return t.type(-np.inf if kind == PadValue.NEG_INF else np.inf)
    info = np.iinfo(t)
    return t.type(info.min if kind == PadValue.NEG_INF else info.max)
