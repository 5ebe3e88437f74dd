"""canonicalize's rules for elementwise math, comparisons, logic and casts: each an ELEMENTWISE
node of one or a few steps."""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import LoweringError

from .builder import Steps, dtype_of, out_shape, rule
from .graph_ir import Step, Value, storage_dtype

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "max": "max", "min": "min"}
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid",
          "erf": "erf", "sqrt": "sqrt", "rsqrt": "rsqrt"}


def _is_const(x, c: float) -> bool:
    return not isinstance(x, Value) and np.size(x) == 1 and float(np.asarray(x).reshape(())) == c


def _is_zero(x) -> bool:
    return _is_const(x, 0.0)


@rule(*_BINARY)
def binary(b, eqn, x, y):
    name = eqn.primitive.name
    if name == "max" and (_is_zero(x) or _is_zero(y)):
        return b.elementwise([y if _is_zero(x) else x], (Step("relu", (0,)),), out_shape(eqn))
    if name == "mul" and dtype_of(x) == dtype_of(y) == "float32":   # x * 1 is x, exactly (attention's scale 1)
        for v, one in ((x, y), (y, x)):
            if _is_const(one, 1.0) and isinstance(v, Value) and v.shape == tuple(out_shape(eqn)):
                return v
    return b.elementwise([x, y], (Step(_BINARY[name], (0, 1)),), out_shape(eqn))


def _truncated_division(b, eqn, x, y, remainder: bool):
    """lax.div and lax.rem of int32s (C's: the quotient truncated toward zero, the remainder of x's sign;
    XLA's x / 0 = -1 and x % 0 = x) from the vector unit's floor division (0 where y is 0): the floor
    quotient one more, and its remainder one y less, where that remainder is not 0 and x and y have
    opposite signs."""
    step = Steps(4)       # x, y, 0, -1
    floor_q = step("div", 0, 1)
    floor_r = step("sub", 0, step("mul", floor_q, 1))
    opposite = step("cmp_ne", step("cmp_gt", 2, 0), step("cmp_gt", 2, 1))
    adjust = step("mul", step("cmp_ne", floor_r, 2), opposite)
    if remainder:
        step("sub", floor_r, step("mul", adjust, 1))
    else:
        step("select", step("cmp_eq", 1, 2), step("add", floor_q, adjust), 3)
    return b.elementwise([x, y, np.int32(0), np.int32(-1)], step.steps, out_shape(eqn))


@rule("rem")
def rem(b, eqn, x, y):
    if dtype_of(x) != "int32":
        raise LoweringError(f"rem (fmod) of {dtype_of(x)} values is not lowered, only of int32 "
                            f"(equation `{eqn}`)")
    return _truncated_division(b, eqn, x, y, remainder=True)


@rule("div")
def div(b, eqn, x, y):
    if dtype_of(x) == "int32":
        return _truncated_division(b, eqn, x, y, remainder=False)
    if not isinstance(y, Value):    # division by a constant: multiply by its reciprocal
        return b.elementwise([x, (1.0 / np.asarray(y, np.float64)).astype(np.float32)], (Step("mul", (0, 1)),),
                             out_shape(eqn))
    if y.size < math.prod(out_shape(eqn)):   # a broadcast divisor (softmax's row sums): one reciprocal per row
        return b.elementwise([x, b.elementwise([y], (Step("recip", (0,)),), y.shape)], (Step("mul", (0, 1)),),
                             out_shape(eqn))
    return b.elementwise([x, y], (Step("recip", (1,)), Step("mul", (0, 2))), out_shape(eqn))


@rule(*_UNARY)
def unary(b, eqn, x):
    return b.elementwise([x], (Step(_UNARY[eqn.primitive.name], (0,)),), out_shape(eqn))


@rule("erfc")
def erfc(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("erf", (0,)), Step("sub", (1, 2))), out_shape(eqn))


# NOTE: the vector unit has exp and log, not expm1 and log1p: these keep the absolute error of one
# rounding of 1.0 (6e-8), not the relative accuracy of the fused functions near 0 -- as activations
# (ELU, SELU, softplus, mish) use them, next to values of order 1.
@rule("expm1")
def expm1(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("exp", (0,)), Step("sub", (2, 1))), out_shape(eqn))


@rule("log1p")
def log1p(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("add", (0, 1)), Step("log", (2,))), out_shape(eqn))


# The vector unit converts float32 to int32 by truncation (isa.semantics.convert): below 2**23 in
# magnitude that is exact, and every float32 from there on is already an integer (inf and NaN stay x).
_X, _BIG, _HALF, _ZERO = range(4)      # the operands: x, 2**23, 0.5, 0.0


def _rounding(b, eqn, x, integer_part):
    """x's integer part by `integer_part(step)` below 2**23 in magnitude, x itself above."""
    if dtype_of(x) != "float32":
        return x    # an integer is its own floor, ceiling and rounding
    step = Steps(4)
    small = step("cmp_gt", _BIG, step("abs", _X))
    step("select", small, _X, integer_part(step))
    return b.elementwise([x, np.float32(2**23), np.float32(0.5), np.float32(0.0)], step.steps, out_shape(eqn))


def _truncated(step, operand: int) -> int:
    return step("to_f32", step("to_i32", operand))


def _floored(step, operand: int, ceil_: bool = False) -> int:
    """trunc(operand), one less where that is above it (floor), one more where it is below (ceil)."""
    t = _truncated(step, operand)
    return step("add" if ceil_ else "sub", t, step("cmp_gt", *((operand, t) if ceil_ else (t, operand))))


@rule("floor", "ceil")
def floor_or_ceil(b, eqn, x):
    return _rounding(b, eqn, x, lambda step: _floored(step, _X, eqn.primitive.name == "ceil"))


@rule("round")
def round_(b, eqn, x):
    """lax.round: halves to even (jnp.round, torch.round) or away from zero (lax.round's default), on |x|
    (whose fraction |x| - trunc(|x|) is exact, where x - floor(x) of a small negative x is not), the
    sign put back."""
    to_even = int(eqn.params["rounding_method"]) == 1

    def nearest(step):
        a = step("abs", _X)
        whole = _truncated(step, a)
        frac = step("sub", a, whole)
        if to_even:    # a half goes up where the whole part is odd: 2 (w/2 - trunc(w/2)) is 1
            half_whole = step("mul", whole, _HALF)
            odd = step("sub", half_whole, _truncated(step, half_whole))
            tie = step("mul", step("cmp_eq", frac, _HALF), step("add", odd, odd))
            up = step("add", step("cmp_gt", frac, _HALF), tie)
        else:
            up = step("cmp_ge", frac, _HALF)
        r = step("add", whole, up)
        return step("select", step("cmp_gt", _ZERO, _X), r, step("neg", r))

    return _rounding(b, eqn, x, nearest)


@rule("sign")
def sign(b, eqn, x):
    """(x > 0) - (x < 0); NaN stays NaN (x == x is false only there)."""
    step = Steps(2)
    signum = step("sub", step("cmp_gt", 0, 1), step("cmp_gt", 1, 0))
    if dtype_of(x) == "float32":
        step("select", step("cmp_eq", 0, 0), 0, signum)
    return b.elementwise([x, np.zeros((), dtype_of(x))], step.steps, out_shape(eqn))


@rule("is_finite")
def is_finite(b, eqn, x):
    """|x| < inf: false for inf and NaN (a boolean, held as float32 0/1)."""
    return b.elementwise([x, np.float32(np.inf)], (Step("abs", (0,)), Step("cmp_gt", (1, 2))), out_shape(eqn))


@rule("exp2")
def exp2(b, eqn, x):
    return b.elementwise([x, np.float32(math.log(2))], (Step("mul", (0, 1)), Step("exp", (2,))), out_shape(eqn))


@rule("pow")
def pow_(b, eqn, x, y):
    """x ** c for a scalar constant c: a product for a small integer c, else sqrt or rsqrt for c = 1/2 or
    -1/2 and exp(c log x) for any other (NaN for x < 0, as a real power of a non-integer; 0 and inf at
    x = 0), with pow's -inf ** c (inf for c > 0, 0 for c < 0) put in."""
    if isinstance(y, Value) or np.size(y) != 1:
        raise LoweringError(f"pow with a computed or non-scalar exponent (equation `{eqn}`): only x ** c for "
                            "a constant c is lowered")
    c = float(np.asarray(y).reshape(()))
    if c == 0:    # 1 everywhere, NaN included
        return np.ones(out_shape(eqn), np.float32)
    if c == int(c) and abs(c) <= 8:
        return _integer_power(b, x, int(c), out_shape(eqn))
    step = Steps(4)     # x, c, -inf, -inf ** c
    if c in (0.5, -0.5):
        power = step("sqrt" if c > 0 else "rsqrt", 0)
    else:
        power = step("exp", step("mul", step("log", 0), 1))
    step("select", step("cmp_eq", 0, 2), power, 3)
    return b.elementwise([x, np.float32(c), np.float32(-np.inf), np.float32(np.inf if c > 0 else 0.0)], step.steps,
                         out_shape(eqn))


# sin and cos as Cephes' sinf and cosf: x less the nearest multiple k of pi/2, in Cody and Waite's three
# parts (each product exact below |x| = 8192, so r keeps float32's digits there), then k's quadrant
# picks +-sin(r) or +-cos(r), each a polynomial on [-pi/4, pi/4].  Past 8192 the reduction loses digits
# as |x| grows (Payne and Hanek's would not), about 1e-6 at 1e5 and 3e-2 at 1e6: from |x| = 2**17 on the
# result is NaN rather than a wrong number, as for inf and NaN.
_PI_2_PARTS = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)
_SIN_POLY = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_POLY = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
_SINE_CONSTS = (2 / math.pi, *_PI_2_PARTS, *_SIN_POLY, *_COS_POLY, 0.5, -0.5, 1.0, 0.25, 4.0, 2.0, 3.0, 0.0,
                2.0**17, math.nan)


def _sine(b, eqn, x, quarters: int):
    """sin(x + quarters pi/2)."""
    if dtype_of(x) != "float32":
        raise LoweringError(f"{eqn.primitive.name} of {dtype_of(x)} values (equation `{eqn}`)")
    step = Steps(2 + len(_SINE_CONSTS))
    (two_over_pi, c1, c2, c3, s0, s1, s2, k0, k1, k2, half, minus_half, one, fourth, four, two, three, zero,
     bound, nan) = range(2, 2 + len(_SINE_CONSTS))
    y = step("mul", 0, two_over_pi)
    k = _truncated(step, step("add", y, step("select", step("cmp_gt", zero, y), half, minus_half)))
    r = step("sub", step("sub", step("sub", 0, step("mul", k, c1)), step("mul", k, c2)), step("mul", k, c3))
    z = step("mul", r, r)
    sin_r = step("add", r, step("mul", step("mul", r, z),
                                step("add", step("mul", step("add", step("mul", z, s0), s1), z), s2)))
    cos_poly = step("add", step("mul", step("add", step("mul", z, k0), k1), z), k2)
    cos_r = step("add", step("sub", one, step("mul", z, half)), step("mul", step("mul", z, z), cos_poly))
    turns = step("add", k, 1)                      # k + quarters, whose value mod 4 is the quadrant
    floor_4 = _floored(step, step("mul", turns, fourth))
    q = step("sub", turns, step("mul", floor_4, four))             # 0, 1, 2 or 3
    odd = step("max", step("cmp_eq", q, one), step("cmp_eq", q, three))
    value = step("select", odd, sin_r, cos_r)
    signed = step("select", step("cmp_ge", q, two), value, step("neg", value))
    step("select", step("cmp_gt", bound, step("abs", 0)), nan, signed)
    return b.elementwise([x, np.float32(quarters), *np.float32(_SINE_CONSTS)], step.steps, out_shape(eqn))


@rule("sin")
def sin(b, eqn, x):
    return _sine(b, eqn, x, 0)


@rule("cos")
def cos(b, eqn, x):
    return _sine(b, eqn, x, 1)


@rule("square")
def square(b, eqn, x):
    return b.elementwise([x], (Step("mul", (0, 0)),), out_shape(eqn))


@rule("integer_pow")
def integer_pow(b, eqn, x):
    y = eqn.params["y"]
    if y == 0 or abs(y) > 8:
        raise LoweringError(f"integer_pow with exponent {y}")
    return _integer_power(b, x, y, out_shape(eqn))


def _integer_power(b, x, y: int, shape):
    steps = [Step("copy", (0,))] if abs(y) == 1 else [Step("mul", (0, 0))]
    for _ in range(abs(y) - 2):
        steps.append(Step("mul", (len(steps), 0)))   # the previous step times the input
    if y < 0:
        steps.append(Step("recip", (len(steps),)))
    return b.elementwise([x], steps, shape)


@rule("copy", "copy_p", "stop_gradient", "reduce_precision", "optimization_barrier")
def identity(b, eqn, *xs):
    return list(xs) if eqn.primitive.multiple_results else xs[0]


@rule("convert_element_type")
def convert_element_type(b, eqn, x):
    to = np.dtype(eqn.params["new_dtype"])
    src = eqn.invars[0].aval.dtype
    if to == np.bool_:    # x != 0, held as 0/1
        steps = (Step("cmp_ne", (0, 1)),) if dtype_of(x) == "float32" else (Step("cmp_ne", (0, 1)),
                                                                               Step("to_f32", (2,)))
        return b.elementwise([x, np.zeros((), src)], steps, out_shape(eqn))
    if storage_dtype(to) == dtype_of(x):
        return x
    return b.elementwise([x], (Step("to_" + {"float32": "f32", "int32": "i32"}[storage_dtype(to)], (0,)),),
                         out_shape(eqn))


_COMPARISONS = {"gt": ("cmp_gt", False), "ge": ("cmp_ge", False), "lt": ("cmp_gt", True), "le": ("cmp_ge", True),
                "eq": ("cmp_eq", False), "ne": ("cmp_ne", False)}


@rule(*_COMPARISONS)
def compare(b, eqn, x, y):
    func, swap = _COMPARISONS[eqn.primitive.name]
    steps = [Step(func, (1, 0) if swap else (0, 1))]
    if dtype_of(x) == "int32":   # the result is a boolean, held as float32 0/1
        steps.append(Step("to_f32", (2,)))
    return b.elementwise([x, y], steps, out_shape(eqn))


@rule("select_n")
def select_n(b, eqn, pred, *cases):
    if len(cases) != 2:
        raise LoweringError(f"select_n with {len(cases)} cases (equation `{eqn}`)")
    steps = [Step("select", (0, 1, 2))]
    if dtype_of(cases[1]) == "int32" and dtype_of(pred) == "float32":   # one type per vector instruction
        steps = [Step("to_i32", (0,)), Step("select", (3, 1, 2))]
    return b.elementwise([pred, *cases], steps, out_shape(eqn))


@rule("and", "or", "not")
def logical(b, eqn, *xs):
    if eqn.invars[0].aval.dtype != np.bool_:
        raise LoweringError(f"bitwise {eqn.primitive.name} on integers (equation `{eqn}`)")
    if eqn.primitive.name == "not":   # booleans are 0/1
        return b.elementwise([np.float32(1.0), xs[0]], (Step("sub", (0, 1)),), out_shape(eqn))
    return b.elementwise(list(xs), (Step("mul" if eqn.primitive.name == "and" else "max", (0, 1)),), out_shape(eqn))


@rule("clamp")
def clamp(b, eqn, lo, x, hi):
    return b.elementwise([x, lo, hi], (Step("max", (0, 1)), Step("min", (3, 2))), out_shape(eqn))
