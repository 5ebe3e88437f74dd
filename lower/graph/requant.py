"""Requantization parameters: a positive real scale as REQUANT's fixed-point multiplier and shift.

A real multiplier M > 0 is M = (multiplier / 2**31) * 2**shift with a Q31 multiplier in
[2**30, 2**31) (TFLite's QuantizeMultiplier), so that isa REQUANT computes
round((x + bias) * M) + zero point, saturated to [lo, hi].  Records are int32 [..., 4]: (multiplier,
control, bias, left shift), control = bounds | zero point << 16 | shift << 24 (one byte each,
`control_word`), bounds = (lo + 128) | (127 - hi) << 8 (0: the whole int8 range;
isa.semantics.saturation_bounds), bias an int32 added before the multiply (TFLite's int8 conv output
stage, so a conv's epilogue is one REQUANT, not an add and a REQUANT), the left shift RESCALE's
(TFLite Add's), 0 in a REQUANT record.
"""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import QuantizationError

from .graph_ir import RECORD_WORDS, Step

MAX_SHIFT = 30     # a larger multiplier saturates every nonzero input: a compiler bug, not a scale
MIN_SHIFT = -31    # a smaller one rounds every int32 input to 0


def quantize_multiplier(real: float, where: str = "") -> tuple[int, int]:
    """(Q31 multiplier, shift) of a positive finite real multiplier; multipliers below 2**-32 are (0, 0)."""
    real = float(real)
    if not (real > 0 and math.isfinite(real)):
        raise QuantizationError(f"{where or 'requantization'}: the scale ratio must be positive and finite, got {real} "
                                f"(a zero scale comes from a tensor that was all zeros in calibration)")
    mantissa, shift = math.frexp(real)          # real = mantissa * 2**shift, mantissa in [0.5, 1)
    multiplier = round(mantissa * 2**31)
    if multiplier == 2**31:                     # the mantissa rounded up to 1.0
        multiplier, shift = 2**30, shift + 1
    if shift > MAX_SHIFT:
        raise QuantizationError(f"{where or 'requantization'}: scale ratio {real:g} is too large to requantize "
                                "(>= 2**30)")
    if shift < MIN_SHIFT:
        return 0, 0
    return multiplier, shift


def bounds_word(lo: int = -128, hi: int = 127) -> int:
    """A record's saturation bounds [lo, hi] (int8, lo <= hi), the control word's two low bytes."""
    if not -128 <= lo <= hi <= 127:
        raise QuantizationError(f"saturation bounds [{lo}, {hi}] are not an int8 range")
    return (lo + 128) | (127 - hi) << 8


def control_word(shift: int, zero_point: int = 0, bounds: tuple[int, int] = (-128, 127)) -> int:
    """A record's second word, int32 (isa.instructions.REQUANT_RECORD_BYTES): the bounds, then the zero
    point and the shift, one signed byte each."""
    for what, v in (("zero point", zero_point), ("shift", shift)):
        if not -128 <= v <= 127:
            raise QuantizationError(f"a record's {what} {v} is not an int8")
    return int(np.uint32(bounds_word(*bounds) | (zero_point & 255) << 16 | (shift & 255) << 24).view(np.int32))


def records(reals, where: str = "", zero_point: int = 0, bounds: tuple[int, int] = (-128, 127),
            bias=None) -> np.ndarray:
    """REQUANT records, int32 [*reals.shape, RECORD_WORDS], of an array of real multipliers, saturating to
    `bounds`, adding `bias` (int32, broadcast to reals; None: 0) first."""
    reals = np.asarray(reals, np.float64)
    out = np.zeros(reals.shape + (RECORD_WORDS,), np.int32)
    for idx in np.ndindex(*reals.shape):
        multiplier, shift = quantize_multiplier(reals[idx], where)
        out[idx][:2] = multiplier, control_word(shift, zero_point, bounds)
    if bias is not None:
        out[..., 2] = np.broadcast_to(np.asarray(bias, np.int32), reals.shape)
    return out


# Float -> int8 in three vector steps: y = x * (256 / scale); to_i32 (truncates); REQUANT by exactly
# 1/256 (multiplier 2**31 - 1 is the identity on |v| < 2**30, then a rounding shift right by 8).
# Truncating 256 y loses less than 1/256, which never moves it across a rounding tie (ties sit on
# multiples of 1/2), so the result is round-half-away-from-zero(y / 256), saturated.
QUANTIZE_FRACTION_BITS = 8
QUANTIZE_RECORD = np.array([2**31 - 1, control_word(-QUANTIZE_FRACTION_BITS)] + [0] * (RECORD_WORDS - 2), np.int32)
QUANTIZE_EXPR = (Step("mul", (0, 1)), Step("to_i32", (3,)), Step("requant", (4, 2)))   # (x, 256 / scale, record)


# TFLite Add (reference_ops::Add, int8): both inputs shifted left by 20 bits, each scaled by
# s_in / (2 max(s_a, s_b)) to a common scale, summed in int32, the sum requantized by
# 2 max(s_a, s_b) / (2**20 s_out).
ADD_LEFT_SHIFT = 20


def add_records(s_a: float, s_b: float, s_out: float, where: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(RESCALE record of a, RESCALE record of b, REQUANT record of the sum) of a TFLite int8 Add."""
    twice = 2 * max(s_a, s_b)
    rescales = [records(s / twice, where) for s in (s_a, s_b)]
    for r in rescales:
        r[..., 3] = ADD_LEFT_SHIFT
    return *rescales, records(twice / (2**ADD_LEFT_SHIFT * s_out), where)
