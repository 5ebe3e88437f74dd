"""I-BERT's integer-only softmax and layer norm (Kim et al. 2021), int8 in and out, int32 inside.

Each kernel is a handful of graph nodes over integer vector steps (add, sub, mul, max, min, select,
the int32 floor division `div` and arithmetic shift `shr`, REQUANT), emitted through the quantize
pass's rewriter; `stagec.int8_reference` runs the same steps with its own integer arithmetic.

Softmax of int8 x at scale s (a row is the last axis), I-BERT's Algorithm 2 and 3:
  - d = x - max(x), taken to a working grid s_e = s * k / m (k, m integers: an exact multiply or,
    for a grid finer than needed, a floor division) on which exp(0) is about 2**24; masked positions
    (a `select` with a very negative fill) become the row's smallest d;
  - i-exp: d >= 30 x0 (x0 = floor(-ln 2 / s_e)), q = floor(d / x0), r = d - q x0 in (-ln 2, 0],
    L(r) = (r + b) r + c (the second-order polynomial 0.3585 (r + 1.353)**2 + 0.344 on s_e's grid),
    e = L(r) >> (q + t), t the extra shift that keeps a row's sum below 2**20;
  - the int32 row sum (below 2**20: the grid trades exp's resolution for the factor's), factor =
    round(2**30 / sum) once per row (>= 2**10), e * factor <= 2**30 + e / 2, REQUANT by 2**-30 / s_out
    to the output's int8 grid.
Layer norm of int8 x at s over the last axis (n channels), I-BERT's IntLayerNorm with exact integers:
  - y = 2**j x - round(2**j sum(x) / n) (j as large as keeps sum(y**2) in int32), v = sum(y**2);
  - i-sqrt: k = floor(sqrt(v)) by integer Newton from above, k <- min(k, (k + v // k) >> 1), started
    at a bound of sqrt(v) and iterated until it has converged for every v;
  - u = (y * floor(2**29 / k)) >> 9, the normalized value times 2**20 / sqrt(n); the per-channel
    gamma and beta as integers G = round(2**10 gamma / max|gamma|), B (at u G's scale), REQUANT of
    u G + B by max|gamma| sqrt(n) / (2**30 s_out).
"""

from __future__ import annotations

import math

import numpy as np

from .graph_ir import OpKind, Step, Value
from .requant import records

# I-BERT's polynomial for exp on (-ln 2, 0]: A (r + B)**2 + C, as A (r**2 + (B2) r + C2)
EXP_A, EXP_B, EXP_C = 0.35815147, 0.96963238 / 0.35815147, 1.0 / 0.35815147
EXP_CLAMP = 30              # I-BERT's n: exp below 2**-30 of the row's largest is 0
EXP_BITS = 24               # exp(0) on the working grid at most 2**24 (the grid no finer)
SUM_BITS = 20               # a row's sum of exponentials < 2**20: factor = round(2**30 / sum) >= 2**10
FACTOR_BITS = 30            # e * factor <= 2**30 + e / 2
NORM_BITS = 29              # y * floor(2**29 / k) < 2**30
GAMMA_BITS = 10             # gamma's integer multiplier G, |G| <= 2**10
U_BITS = 20                 # u = (y * factor) >> 9: |u| <= 2**20, |u G| <= 2**30
MASK_FILL = -(2**24)        # a masked score, far below any int8 value


def _i32(rw, value: int) -> Value:
    return rw.const(np.array(value, np.int32))


def _rows(rw, x: Value, func: str, name: str, dtype: str) -> Value:
    """REDUCE func over x's last axis, reshaped to keep it as 1 (a per-row value broadcasting over x);
    the layers are named `name`."""
    r = rw.fresh(x.shape[:-1], dtype)
    rw.emit(OpKind.REDUCE, (x,), r, name, func=func, axes=(len(x.shape) - 1,))
    kept = rw.fresh(x.shape[:-1] + (1,), dtype)
    rw.emit(OpKind.RESHAPE, (r,), kept, f"{name}/rows")
    return kept


def _elementwise(rw, inputs, steps, shape, dtype: str, name: str) -> Value:
    out = rw.fresh(shape, dtype)
    rw.emit(OpKind.ELEMENTWISE, tuple(inputs), out, name, expr=tuple(steps))
    return out


def exp_grid(s_in: float, n: int) -> tuple[int, int, int]:
    """(m, k, t): the working grid s_e = s_in * k / m, the finest not finer than c = 1 / (A s_e**2)
    (exp(0) on the grid) <= 2**24 allows, and the extra shift t that keeps a row of n exponentials
    below 2**20."""
    finest = math.sqrt(EXP_C / 2**EXP_BITS) * 1.0001
    m, k = (int(s_in // finest), 1) if s_in >= finest else (1, math.ceil(finest / s_in))
    c = math.floor(EXP_C / (s_in * k / m) ** 2)
    return m, k, max(0, math.ceil(math.log2(n * c)) - SUM_BITS)


def softmax(rw, x: Value, s_in: float, s_out: float, name: str, mask: tuple[Value, bool] | None = None) -> Value:
    """int8 softmax of int8 `x` (scale s_in) over its last axis, to int8 at s_out.  `mask`: (the
    predicate, whether a nonzero predicate keeps the score) of a masked softmax."""
    n = x.shape[-1]
    m, k, t = exp_grid(s_in, n)
    s_e = s_in * k / m
    x0 = math.floor(-math.log(2) / s_e)
    b, c = math.floor(EXP_B / s_e), math.floor(EXP_C / s_e**2)
    low = math.floor(EXP_CLAMP * x0 * k / m) - 1       # in x's units: below the clamp once on the grid
    src = x
    if mask is not None:   # the masked scores, int32: MASK_FILL where the mask drops them
        pred, keep_nonzero = mask
        steps = [Step("to_i32", (0,)), Step("to_i32", (1,)), Step("cmp_eq" if keep_nonzero else "cmp_ne", (5, 3)),
                 Step("mul", (6, 2)), Step("add", (4, 7))]       # x + FILL where dropped
        src = _elementwise(rw, (x, pred, _i32(rw, MASK_FILL), _i32(rw, 0)), steps, x.shape, "int32",
                           f"{name}/mask")
    top = _rows(rw, src, "max", f"{name}/max", src.dtype)
    grid = "mul" if k == 1 else "div"
    inputs = (src, top, *[_i32(rw, v) for v in (low, m if k == 1 else k, EXP_CLAMP * x0, x0, b, c, t)])
    e = _elementwise(rw, inputs, _exp_steps(len(inputs), grid), x.shape, "int32", f"{name}/i_exp")
    total = _rows(rw, e, "sum", f"{name}/sum", "int32")
    factor = _elementwise(rw, (total, _i32(rw, 2**FACTOR_BITS), _i32(rw, 1)),   # (2**30 + sum // 2) // sum
                          [Step("shr", (0, 2)), Step("add", (3, 1)), Step("div", (4, 0))], total.shape, "int32",
                          f"{name}/factor")
    rec = rw.const(records(2.0**-FACTOR_BITS / s_out, f"{name}: integer softmax"))
    # the exponentials again from int8 x, not read back as int32: a quarter of the bytes
    i = len(inputs) + 2
    steps = [*_exp_steps(i, grid), Step("mul", (i + 13, i - 2)), Step("requant", (i + 14, i - 1))]
    return _elementwise(rw, (*inputs, factor, rec), steps, x.shape, "int8", f"{name}/normalize")


def _exp_steps(i: int, grid: str) -> list[Step]:
    """i-exp of arguments (x, its row max, the clamp in x's units, the grid's multiplier or divisor,
    the clamp on the grid, x0, b, c, t), the steps numbered from i, `grid` "mul" or "div" taking x to
    the working grid; the last step is e = L(r) >> (q + t)."""
    return [Step("to_i32", (0,)), Step("to_i32", (1,)), Step("sub", (i, i + 1)), Step("max", (i + 2, 2)),
            Step(grid, (i + 3, 3)), Step("max", (i + 4, 4)),   # d on the grid, clamped
            Step("div", (i + 5, 5)), Step("mul", (i + 6, 5)), Step("sub", (i + 5, i + 7)),   # q, r
            Step("add", (i + 8, 6)), Step("mul", (i + 9, i + 8)), Step("add", (i + 10, 7)),  # L(r)
            Step("add", (i + 6, 8)), Step("shr", (i + 11, i + 12))]


def mean_bits(n: int, span: int = 255) -> int:
    """j: y = 2**j x - mean (|x - mean| <= span) keeps 2**j more resolution while
    n (span 2**j + 1)**2 < 2**31."""
    j = 0
    while j < 8 and n * (span * 2 ** (j + 1) + 1) ** 2 < 2**31:
        j += 1
    return j


def ptf_levels(n: int) -> int:
    """The largest power-of-two factor 2**K (K <= 3, FQ-ViT's) of a layer norm over n channels whose
    sum of squares still fits int32: n (255 * 2**K + 1)**2 < 2**31."""
    k = 0
    while k < 3 and n * (255 * 2 ** (k + 1) + 1) ** 2 < 2**31:
        k += 1
    return k


def isqrt_steps(v: int, one: int, k: int, at: int, bound: int) -> tuple[list[Step], int]:
    """Steps of floor(sqrt(v)) for every 1 <= v < bound**2: integer Newton from above, from k = bound,
    each iteration k <- min(k, (k + v // k) >> 1) (v, one, k: argument numbers; the steps are numbered
    from `at`); (steps, the result's number).  Enough iterations for the smallest v: halvings from
    the bound down to sqrt(v), then the quadratic tail."""
    steps = []
    for _ in range(max(1, math.ceil(math.log2(bound))) + 3):
        steps += [Step("div", (v, k)), Step("add", (k, at)), Step("shr", (at + 1, one)), Step("min", (k, at + 2))]
        k, at = at + 3, at + 4
    return steps, k


def _affine_unit(gamma: np.ndarray, n: int) -> float:
    """The real value of one unit of u G: max|gamma| sqrt(n) / 2**30."""
    return float(np.abs(gamma).max()) * math.sqrt(n) / 2 ** (U_BITS + GAMMA_BITS)


def layer_norm_fits(gamma: np.ndarray, beta: np.ndarray) -> bool:
    """Whether the integer layer norm holds gamma and beta: some gamma nonzero, beta within int32 beside it."""
    unit = _affine_unit(gamma, len(gamma))
    return unit > 0 and bool(np.abs(np.asarray(beta, np.float64) / unit).max() < 2**30)


def layer_norm(rw, x: Value, s_out: float, gamma: np.ndarray, beta: np.ndarray, name: str,
               alpha: np.ndarray | None = None) -> Value:
    """int8 layer norm of int8 `x` over its last axis, times gamma plus beta (per channel,
    `layer_norm_fits`), to int8 at s_out.  `alpha`: channel c of x is on the grid s 2**alpha[c]
    (FQ-ViT's power-of-two factors; None: one grid), so 2**alpha[c] x is on the common grid s."""
    n = x.shape[-1]
    alpha = np.zeros(n, np.int64) if alpha is None else np.asarray(alpha, np.int64)
    span = 255 * 2 ** int(alpha.max())
    g_max = float(np.abs(gamma).max())
    unit = _affine_unit(gamma, n)
    big_b = np.round(np.asarray(beta, np.float64) / unit)
    big_g = np.round(np.asarray(gamma, np.float64) / g_max * 2**GAMMA_BITS)
    j = mean_bits(n, span)
    if alpha.any():   # the row sum on the common grid, sum of x 2**alpha: int8 x int8 -> int32 on the array
        rows = rw.fresh((math.prod(x.shape[:-1]), n), "int8")
        rw.emit(OpKind.RESHAPE, (x,), rows, f"{name}/sum/rows_in")
        sums = rw.fresh((rows.shape[0], 1), "int32")
        rw.emit(OpKind.MATMUL, (rows, rw.const((2**alpha).astype(np.int8).reshape(n, 1))), sums, f"{name}/sum")
        total = rw.fresh(x.shape[:-1] + (1,), "int32")
        rw.emit(OpKind.RESHAPE, (sums,), total, f"{name}/sum/rows")
        widen = rw.const((2 ** (j + alpha)).astype(np.int32))
    else:
        total = _rows(rw, x, "sum", f"{name}/sum", "int32")
        widen = _i32(rw, 2**j)
    inputs = (x, total, widen, *[_i32(rw, v) for v in (2 ** (j + 1), n, 2 * n)])
    square = _elementwise(rw, inputs, [*_center_steps(6), Step("mul", (11, 11))], x.shape, "int32",
                          f"{name}/square")
    var = _rows(rw, square, "sum", f"{name}/sum_squares", "int32")
    bound = math.isqrt(n * (span * 2**j + 1) ** 2) + 1
    newton, k = isqrt_steps(4, 1, 3, 5, bound)       # inputs: v, 1, 2**29, the bound; step 4: max(v, 1)
    factor = _elementwise(rw, (var, _i32(rw, 1), _i32(rw, 2**NORM_BITS), _i32(rw, bound)),
                          [Step("max", (0, 1)), *newton, Step("div", (2, k))], var.shape, "int32", f"{name}/isqrt")
    # y again from int8 x, not read back as int32
    extra = (factor, rw.const(big_g.astype(np.int32)), rw.const(big_b.astype(np.int32)),
             rw.const(records(unit / s_out, f"{name}: integer layer norm")), _i32(rw, NORM_BITS - U_BITS))
    steps = [*_center_steps(11), Step("mul", (16, 6)), Step("shr", (17, 10)), Step("mul", (18, 7)),
             Step("add", (19, 8)), Step("requant", (20, 9))]
    return _elementwise(rw, (*inputs, *extra), steps, x.shape, "int8", f"{name}/normalize")


def _center_steps(i: int) -> list[Step]:
    """y = 2**j x - round(2**j sum / n) of arguments (x, its row sum, 2**j (per channel: 2**(j + alpha)),
    2**(j + 1), n, 2n), the steps numbered from i; the last is y."""
    return [Step("to_i32", (0,)), Step("mul", (i, 2)), Step("mul", (1, 3)), Step("add", (i + 2, 4)),
            Step("div", (i + 3, 5)), Step("sub", (i + 1, i + 4))]


# I-BERT's i-erf: erf(t) ~ sgn(t) (1 - A (min(|t|, B) - B)**2) on t = x / sqrt(2)
ERF_A, ERF_B = 0.2888, 1.769


def gelu_fits(s_in: float) -> bool:
    """Whether i-GELU's int32 product holds on s_in's grid: 2 * 128 * (1 / (A s'**2)) < 2**31."""
    return 256 / (ERF_A * (s_in / math.sqrt(2)) ** 2) < 2**31


def gelu(rw, x: Value, s_in: float, s_out: float, name: str) -> Value:
    """I-BERT's i-GELU of int8 `x` (scale s_in, `gelu_fits`) to int8 at s_out: with t = x / sqrt(2)
    on the grid s' = s_in / sqrt(2), unit U = A s'**2, ONE = round(1 / U) and B = round(ERF_B / s'),
    GELU = x (1 + erf(t)) / 2 = (x ONE + |x| (ONE - (min(|x|, B) - B)**2)) s_in U / 2."""
    grid = s_in / math.sqrt(2)
    unit = ERF_A * grid**2
    inputs = (x, _i32(rw, round(ERF_B / grid)), _i32(rw, round(1 / unit)),
              rw.const(records(s_in * unit / 2 / s_out, f"{name}: integer GELU")))
    steps = [Step("to_i32", (0,)), Step("abs", (4,)), Step("min", (5, 1)), Step("sub", (6, 1)), Step("mul", (7, 7)),
             Step("sub", (2, 8)), Step("mul", (5, 9)), Step("mul", (4, 2)), Step("add", (11, 10)),
             Step("requant", (12, 3))]
    return _elementwise(rw, inputs, steps, x.shape, "int8", f"{name}/i_gelu")
