"""The arithmetic the reference semantics (isa.opcodes) are written with: pad values, gemmlowp
requantization, COPY's conversion, bf16, the accumulate modes, and the numpy namespace.

bf16 is held as its 16-bit pattern (DType.BF16.numpy is uint16).  Arithmetic never happens on
bf16: a bf16 operand is widened to float32 (exact), and a float32 result is rounded to bf16 to
nearest, ties to even (as torch's `.to(torch.bfloat16)`), where an instruction writes a bf16
element.  `widen`, `round_bf16` and `cast` say this once, over a namespace, for the reference
interpreter (numpy) and the batched executor (jax.numpy) alike.

This is the definition the simulator's fast path is tested against; it is
written for clarity, not speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .instructions import AccMode, DType, PadValue

_erf = np.frompyfunc(math.erf, 1, 1)


@dataclass(frozen=True)
class Namespace:
    """The array operations the vector functions' semantics (isa.opcodes) are written over: `xp` is
    numpy or jax.numpy; the rest are the operations the two spell differently."""

    xp: Any
    erf: Callable
    rsqrt: Callable
    requantize: Callable    # (x, multiplier, shift, zero point) -> int8
    convert: Callable       # (x, DType) -> x as that type, as COPY converts (bf16 aside: `cast`)
    bitcast: Callable       # (x, numpy dtype of the same width) -> x's bits read as that type


BF16_BITS = np.dtype(np.uint16)   # how a bf16 element is held (DType.BF16.numpy)


def widen(ns: Namespace, x):
    """x as the arithmetic sees it: bf16 bit patterns widened exactly to float32, others as they are."""
    if x.dtype != BF16_BITS:
        return x
    return ns.bitcast(x.astype(np.uint32) << 16, np.float32)


def round_bf16(ns: Namespace, x):
    """float32 -> bf16 bit patterns, to nearest, ties to even; a NaN stays a (quiet) NaN of its sign."""
    bits = ns.bitcast(x.astype(np.float32), np.uint32)
    nearest = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    return ns.xp.where(ns.xp.isnan(x), (bits >> 16) | 0x40, nearest).astype(np.uint16)


def cast(ns: Namespace, x, to: DType):
    """x (an element type's storage) as `to`: bf16 through float32 both ways; otherwise COPY's conversion."""
    x = widen(ns, x)
    if to == DType.BF16:
        return round_bf16(ns, x.astype(np.float32))
    return ns.convert(x, to)


def convert(x: np.ndarray, to: DType) -> np.ndarray:
    """COPY's type conversion: float -> int truncates toward zero and saturates (NaN -> 0)."""
    t = to.numpy
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(t, np.integer):
        info = np.iinfo(t)
        # in float64: int32's bounds are not float32 numbers (2**31 - 1 rounds up and would wrap)
        x = np.clip(np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0), info.min, info.max)
    return x.astype(t)


# An accumulate mode: how a destination's old value and the new one combine, and how a run of
# values accumulated one after another reduces (the batched executor's chains), by xp name.
ACCUMULATE = {AccMode.ADD: ("add", "sum"), AccMode.MAX: ("maximum", "max"), AccMode.MIN: ("minimum", "min")}


def accumulate(ns: Namespace, mode: AccMode, old, new):
    return getattr(ns.xp, ACCUMULATE[AccMode(mode)][0])(old, new)


def pad_value(kind: PadValue, dtype: DType):
    """The fill value of a LOAD's padding, in the element type."""
    t = dtype.numpy
    if dtype == DType.BF16:
        return round_bf16(NUMPY, np.float32(0 if kind == PadValue.ZERO else -np.inf if kind == PadValue.NEG_INF
                                            else np.inf))[()]
    if kind == PadValue.ZERO:
        return t.type(0)
    if np.issubdtype(t, np.floating):
        return t.type(-np.inf if kind == PadValue.NEG_INF else np.inf)
    info = np.iinfo(t)
    return t.type(info.min if kind == PadValue.NEG_INF else info.max)


def requantize(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """int32 -> int8 as TFLite's MultiplyByQuantizedMultiplier: a saturating rounding doubling
    high multiply by the Q31 `multiplier`, a rounding shift (positive = left, negative = right,
    ties away from zero), plus `zero_point`, saturated to [-128, 127]."""
    x = x.astype(np.int64)
    m = multiplier.astype(np.int64)
    shift = shift.astype(np.int64)
    x = x << np.maximum(shift, 0)
    x = np.clip(x, -2**31, 2**31 - 1)   # the left shift saturates as the 32-bit hardware would
    prod = x * m
    nudge = np.where(prod >= 0, 1 << 30, 1 - (1 << 30))
    num = prod + nudge
    high = np.where(num >= 0, num >> 31, -((-num) >> 31))   # C division truncates toward zero
    high = np.where((x == -2**31) & (m == -2**31), 2**31 - 1, high)
    right = np.maximum(-shift, 0)
    mask = (np.int64(1) << right) - 1
    remainder = high & mask
    threshold = (mask >> 1) + (high < 0)
    rounded = (high >> right) + (remainder > threshold)
    return np.clip(rounded + zero_point.astype(np.int64), -128, 127).astype(np.int8)


NUMPY = Namespace(np, lambda x: _erf(x.astype(np.float64)).astype(x.dtype),
                  lambda x: x.dtype.type(1) / np.sqrt(x), requantize, convert, lambda x, t: np.asarray(x).view(t))
