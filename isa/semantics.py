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
    requantize: Callable    # (x, multiplier, shift, zero point, bounds) -> int8
    convert: Callable       # (x, DType) -> x as that type, as COPY converts (bf16 aside: `cast`)
    bitcast: Callable       # (x, numpy dtype of the same width) -> x's bits read as that type
    rescale: Callable       # (x, multiplier, shift, zero point, left shift) -> int32


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


def _scaled(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, left: np.ndarray) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier of x shifted left by `left` first (int64 results): a
    left shift saturating to int32 (by `left` + max(shift, 0)), a saturating rounding doubling high
    multiply by the Q31 `multiplier`, a rounding right shift by max(-shift, 0), ties away from zero."""
    x = x.astype(np.int64)
    m = multiplier.astype(np.int64)
    shift = shift.astype(np.int64)
    x = x << np.minimum(np.clip(left.astype(np.int64), 0, 32) + np.maximum(shift, 0), 32)   # 32 saturates any int32
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
    return (high >> right) + (remainder > threshold)


def record_fields(r) -> tuple:
    """(multiplier, shift, zero point, bounds, bias, left shift) of REQUANT or RESCALE records
    [..., 4] (isa.instructions.REQUANT_RECORD_BYTES), numpy or jax.numpy int32: the control word's
    two high bytes sign-extended by arithmetic shifts, its bounds as they are (`saturation_bounds`
    reads their two bytes)."""
    control = r[..., 1]
    return r[..., 0], control >> 24, (control << 8) >> 24, control, r[..., 2], r[..., 3]


def rescale_fields(r) -> tuple:
    """(multiplier, shift, zero point, left shift) of RESCALE records: `rescale`'s arguments."""
    multiplier, shift, zero_point, _, _, left = record_fields(r)
    return multiplier, shift, zero_point, left


def saturation_bounds(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of a record's control word: bits 0-7 hold lo + 128, bits 8-15 hold 127 - hi (the
    higher bits are ignored), so 0 is the whole int8 range and a fused clamp (ReLU6, hardtanh) is
    TFLite's activation_min/max."""
    bounds = np.asarray(bounds, np.int64)
    return -128 + (bounds & 255), 127 - (bounds >> 8 & 255)


def requantize(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero_point: np.ndarray,
               bounds: np.ndarray | int = 0, bias: np.ndarray | int = 0) -> np.ndarray:
    """int32 -> int8 as TFLite's int8 conv output stage: the int32 `bias` added (wrapping, as an int32
    add does), then MultiplyByQuantizedMultiplier: a saturating rounding doubling high multiply by the
    Q31 `multiplier`, a rounding shift (positive = left, negative = right, ties away from zero), plus
    `zero_point`, saturated to [-128, 127], then to the record's [lo, hi] (`saturation_bounds`: max
    with lo, then min with hi)."""
    biased = (np.asarray(x).astype(np.int64) + np.asarray(bias, np.int64) + 2**31) % 2**32 - 2**31
    rounded = _scaled(biased, multiplier, shift, np.zeros((), np.int64))
    lo, hi = saturation_bounds(bounds)
    y = np.clip(rounded + zero_point.astype(np.int64), -128, 127)
    return np.minimum(np.maximum(y, lo), hi).astype(np.int8)


# --- vector functions over a namespace (isa.opcodes.VECTOR_FUNCS) ---

def multiply(ns, a, b):
    """a * b; int8 operands multiply in int32 (an int8 result keeps the product's low byte, as before)."""
    if a.dtype == np.int8:
        a, b = a.astype(np.int32), b.astype(np.int32)
    return ns.xp.multiply(a, b)


def widening_sum(ns, x):
    """The sum over i2; int8 sums in int32 (a widening add across lanes, as Arm's SADDLV), wrapping."""
    return ns.xp.sum(x.astype(np.int32) if x.dtype == np.int8 else x, axis=-1)


def dot(ns, a, b):
    """The sum over i2 of a * b; int8 products and their sums in int32, wrapping (as SDOT)."""
    return ns.xp.sum(multiply(ns, a, b), axis=-1)


def floor_div(ns, a, b):
    """floor(a / b), 0 where b == 0 (DIV); int32's -2**31 / -1 wraps to -2**31 (numpy would warn)."""
    nonzero = b != 0
    with np.errstate(over="ignore"):
        return ns.xp.where(nonzero, ns.xp.floor_divide(a, ns.xp.where(nonzero, b, ns.xp.ones((), b.dtype))),
                           ns.xp.zeros((), a.dtype))


def clamp(xp, x, lo, hi, bias):
    """min(max(x + bias, lo), hi): the CLAMP vector function and the graph's clamp step (one rounding,
    the add's; max and min are exact)."""
    return xp.minimum(xp.maximum(x + bias, lo), hi)


def table_words(n, strides) -> np.ndarray:
    """Words a table function (CLAMP) reads of src2: from its base through the last element, at word
    n3 + sum((n_k - 1) * s_k) (strides non-negative: a check), at least one; over arrays of rows."""
    n, strides = np.asarray(n, np.int64), np.asarray(strides, np.int64)
    return np.maximum(n[..., 3] + (np.maximum(n[..., :3] - 1, 0) * strides).sum(-1) + 1, 1)


def table_index(n, strides) -> np.ndarray:
    """The word of a table (CLAMP's) each element of the iteration box n[:3] reads: n3 + i . strides."""
    return int(n[3]) + np.tensordot(np.asarray(strides, np.int64), np.indices(tuple(int(c) for c in n[:3])), 1)


def table_entries(xp, table, index):
    """(lo, hi, biases) of CLAMP tables (words on the last axis; leading: a batch, then the instruction's
    (1, 1, 1) dims), the biases at the words `index` (an iteration box), lo and hi broadcast over it."""
    lead = table.shape[:-4]
    t = table.reshape(*lead, table.shape[-1])
    box = (*lead, *(1,) * index.ndim)
    return t[..., 0].reshape(box), t[..., 1].reshape(box), xp.take(t, index, axis=-1)


def lookup(ns: Namespace, x, table):
    """table[x + 128] of int8 x, a table (256 entries, last axis) per leading index of x's batch
    (its axes before the instruction's three): the LUT vector function."""
    lead = table.shape[:-4]   # the table's (1, 1, 1) instruction dims sit between the batch and the entries
    idx = (x.astype(ns.xp.int32) + 128).reshape(*lead, -1)
    return ns.xp.take_along_axis(table.reshape(*lead, table.shape[-1]), idx, axis=-1).reshape(x.shape)


def rescale(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero_point: np.ndarray,
            left: np.ndarray) -> np.ndarray:
    """int8 or int32 -> int32 as TFLite Add scales each input: x * 2**max(left, 0) (saturating), then
    MultiplyByQuantizedMultiplier as `requantize`, plus `zero_point`, saturated to int32."""
    rounded = _scaled(x, multiplier, shift, left)
    return np.clip(rounded + zero_point.astype(np.int64), -2**31, 2**31 - 1).astype(np.int32)


NUMPY = Namespace(np, lambda x: _erf(x.astype(np.float64)).astype(x.dtype),
                  lambda x: x.dtype.type(1) / np.sqrt(x), requantize, convert, lambda x, t: np.asarray(x).view(t),
                  rescale)
