"""REQUANT and RESCALE in 32-bit JAX arithmetic, bit for bit equal to isa.semantics.requantize and
isa.semantics.rescale.

JAX runs without x64, so the 64-bit product of gemmlowp's saturating rounding
doubling high multiply is formed from 16-bit limbs in uint32 (its magnitude, the
sign applied after rounding), and every other step (the saturating left shift,
the rounding right shift, the zero point's saturating add) is written so that no
int32 intermediate overflows.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _u32(x):
    return lax.bitcast_convert_type(x, jnp.uint32)


def _i32(x):
    return lax.bitcast_convert_type(x, jnp.int32)


def _magnitude_product(a, b):
    """|a| * |b| of int32 arrays as (high, low) uint32 words (|a|, |b| <= 2**31, so high < 2**30)."""
    ua, ub = _u32(jnp.where(a < 0, -a, a)), _u32(jnp.where(b < 0, -b, b))   # -INT32_MIN wraps to 2**31
    mask = jnp.uint32(0xFFFF)
    a1, a0, b1, b0 = ua >> 16, ua & mask, ub >> 16, ub & mask
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & mask) + (p10 & mask)          # < 3 * 2**16: no overflow
    low = (p00 & mask) | (mid << 16)
    high = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    return high, low


def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul: (a * b + nudge) / 2**31 truncated toward zero,
    nudge = 2**30 for a non-negative product, 1 - 2**30 for a negative one; INT32_MIN * INT32_MIN
    saturates to INT32_MAX."""
    negative = (a < 0) != (b < 0)
    high, low = _magnitude_product(a, b)
    # |a*b| + nudge magnitude (2**30, or 2**30 - 1 for a negative product), then floor(/ 2**31)
    add = jnp.where(negative, jnp.uint32(2**30 - 1), jnp.uint32(2**30))
    low2 = low + add
    high = high + (low2 < low).astype(jnp.uint32)
    q = (high << 1) | (low2 >> 31)                             # <= 2**31: fits uint32
    saturated = q == jnp.uint32(2**31)                          # only INT32_MIN * INT32_MIN
    q = _i32(jnp.where(saturated, jnp.uint32(INT32_MAX), q))
    return jnp.where(negative, -q, q)


def _saturating_left_shift(x, left):
    """clip(x << left) to int32; a shift of 31 or more saturates every nonzero x, as 31 does."""
    left = jnp.minimum(left, 31)
    hi, lo = jnp.int32(INT32_MAX) >> left, jnp.int32(INT32_MIN) >> left
    return jnp.where(x > hi, INT32_MAX, jnp.where(x < lo, INT32_MIN, x << left))


def _rounding_right_shift(x, right):
    """x / 2**right rounded to nearest, ties away from zero (gemmlowp's RoundingDivideByPOT)."""
    r = jnp.minimum(right, 31)
    mask = _i32((jnp.uint32(1) << _u32(r)) - 1)
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(jnp.int32)
    rounded = (x >> r) + (remainder > threshold).astype(jnp.int32)
    # right >= 32: |x| <= 2**31 <= 2**(right - 1), so only -2**31 / 2**32 (a tie, -0.5) is not 0
    beyond = jnp.where((right == 32) & (x == INT32_MIN), -1, 0)
    return jnp.where(right > 31, beyond, rounded)


def _saturating_add(x, y):
    """x + y for any int32 x and y, saturated to int32."""
    s = _i32(_u32(x) + _u32(y))                                 # wraps on overflow
    overflow = ((x < 0) == (y < 0)) & ((s < 0) != (x < 0))
    return jnp.where(overflow, jnp.where(x < 0, INT32_MIN, INT32_MAX), s)


def _scaled(x, multiplier, shift, left):
    """MultiplyByQuantizedMultiplier of x shifted left by `left` first (isa.semantics._scaled)."""
    x = _saturating_left_shift(x, jnp.minimum(left, 32) + jnp.maximum(shift, 0))
    high = saturating_rounding_doubling_high_mul(x, multiplier)
    return _rounding_right_shift(high, jnp.maximum(-shift, 0))


def requantize(x, multiplier, shift, zero_point, bounds=0, bias=0):
    """int32 -> int8 as isa.semantics.requantize (the bias added, wrapping; TFLite's
    MultiplyByQuantizedMultiplier, then the zero point, saturated, then the record's saturation bounds), on
    int32 arrays that broadcast together."""
    x, multiplier, shift, zero_point, bounds, bias = (jnp.asarray(v, jnp.int32)
                                                      for v in (x, multiplier, shift, zero_point, bounds, bias))
    scaled = _scaled(_i32(_u32(x) + _u32(bias)), multiplier, shift, jnp.zeros((), jnp.int32))
    y = jnp.clip(_saturating_add(scaled, zero_point), -128, 127).astype(jnp.int8)
    lo, hi = (-128 + (bounds & 255)).astype(jnp.int8), (127 - (bounds >> 8 & 255)).astype(jnp.int8)
    return jnp.minimum(jnp.maximum(y, lo), hi)


def rescale(x, multiplier, shift, zero_point, left):
    """int8/int32 -> int32 as isa.semantics.rescale (TFLite Add's input scaling: a left shift, then
    MultiplyByQuantizedMultiplier, plus the zero point, saturated to int32)."""
    x, multiplier, shift, zero_point, left = (jnp.asarray(v, jnp.int32)
                                              for v in (x, multiplier, shift, zero_point, left))
    return _saturating_add(_scaled(x, multiplier, shift, jnp.maximum(left, 0)), zero_point)
