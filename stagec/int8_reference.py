"""An independent integer reference for quantized graphs: plain numpy, int64 arithmetic.

The simulator must match it bit for bit on integer work.  Nothing here comes from
the simulator, `isa.semantics` or `lower.graph.evaluate`: convolutions are sums of
shifted int64 products, requantization is gemmlowp's
MultiplyByQuantizedMultiplier written out from its definition, and fp32 steps
are numpy float32 operations (single IEEE roundings: the QUANTIZE multiply and
the DEQUANTIZE multiply are exact matches; transcendental fp32 islands such as
softmax and GELU can differ from the simulator's in the last bits).  A bf16 value (of an
int8 graph's bf16 islands) is its float32 result rounded once to bf16 (ml_dtypes).

The fp32 islands are therefore not bit-exact, and where a float that a QUANTIZE converts lies within
a few ulps of a rounding boundary, its int8 value may round either way (the hardware's softmax sums in
another order and takes exp from another library).  `run(..., nudge=r)` scales every float converted
to an integer by (1 + r) first: runs nudged away from zero and toward it round each such value the
other way, so a comparison can tell a rounding tie from a wrong integer.

Integer values are held in int64; a value typed int32 that leaves int32's range
raises (the hardware would wrap), it is never wrapped or clipped here.

>>> from stagec.pipeline import build_graph  # doctest: +SKIP
>>> traced, graph = build_graph(model, args, quantize="int8")  # doctest: +SKIP
>>> outputs = run(graph, [x.numpy() for x in args])  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from stagec.errors import LoweringError
from stagec.lower.graph.graph_ir import Graph, Node, OpKind

INT32 = (-(2**31), 2**31 - 1)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2**31), ties away from zero (as C
    integer division after a +-2**30 nudge), INT32_MIN * INT32_MIN saturating to INT32_MAX."""
    ab = a.astype(np.int64) * b.astype(np.int64)
    num = ab + np.where(ab >= 0, 2**30, 1 - 2**30)
    quotient = np.sign(num) * (np.abs(num) // 2**31)   # C division truncates toward zero
    return np.where((a == INT32[0]) & (b == INT32[0]), INT32[1], quotient)


def rounding_shift_right(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: x / 2**exponent rounded to nearest, ties away from zero."""
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _multiply_by_quantized_multiplier(x: np.ndarray, multiplier, shift, pre_shift=0) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier of x * 2**pre_shift: one left shift by pre_shift +
    max(shift, 0) that saturates to int32 (as 32-bit hardware's), SaturatingRoundingDoublingHighMul,
    RoundingDivideByPOT by max(-shift, 0)."""
    left, right = np.maximum(shift, 0) + pre_shift, np.maximum(-shift, 0)
    big = np.abs(x) >= np.int64(1) << np.maximum(31 - left, 0)     # |x| << left would leave int64 too
    shifted = np.clip(np.where(big, np.sign(x) * 2**31, x.astype(np.int64) << np.minimum(left, 32)), *INT32)
    return rounding_shift_right(high_mul(shifted, multiplier), right)


def record_fields(record: np.ndarray) -> tuple:
    """(multiplier, shift, zero point, bounds, bias, left shift) of records [..., 4], int64: the
    control word's bytes are the bounds' two, then the zero point's and the shift's, signed."""
    multiplier, control, bias, left = (record[..., i].astype(np.int64) for i in range(4))
    byte = [(control >> (8 * i)) % 256 for i in range(4)]
    signed = [(b ^ 128) - 128 for b in byte[2:]]
    return multiplier, signed[1], signed[0], byte[0] + 256 * byte[1], bias, left


def requantize(x: np.ndarray, record: np.ndarray) -> np.ndarray:
    """int32 x to int8 by a record (`record_fields`): TFLite's int8 conv output stage: x + bias (an int32
    sum; outside int32 it raises, as any int32 value here), MultiplyByQuantizedMultiplier, plus the zero
    point, saturated to [-128, 127], then clamped to TFLite's activation range [activation_min,
    activation_max]: the control word's low byte is activation_min + 128, its second byte 127 -
    activation_max (0 and 0: the whole int8 range)."""
    multiplier, shift, zero_point, bounds, bias, _ = record_fields(record)
    biased = _held(x.astype(np.int64) + bias, "int32", "requant's bias add")
    y = np.clip(_multiply_by_quantized_multiplier(biased, multiplier, shift) + zero_point, -128, 127)
    activation_min, activation_max = bounds % 256 - 128, 127 - bounds // 256
    return np.minimum(np.maximum(y, activation_min), activation_max).astype(np.int8)


def lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int8 x through a 256-entry int8 table (TFLite's LUT activations): entry q + 128 for input q."""
    if table.shape != (256,) or table.dtype != np.int8:
        raise ValueError(f"a lut table has 256 int8 entries, not {table.dtype}{list(table.shape)}")
    return table[x.astype(np.int64) + 128]


def rescale(x: np.ndarray, record: np.ndarray) -> np.ndarray:
    """int8 or int32 x to int32 by a record (`record_fields`: its multiplier, shift, zero point and left
    shift): TFLite Add's scaling of an input (x << left_shift, then MultiplyByQuantizedMultiplier), plus the zero
    point, saturated to int32 (held in int64)."""
    multiplier, shift, zero_point, _, _, pre = record_fields(record)
    y = _multiply_by_quantized_multiplier(x.astype(np.int64), multiplier, shift, np.clip(pre, 0, 32)) + zero_point
    return np.clip(y, *INT32)


def _to_i32(x: np.ndarray) -> np.ndarray:
    """float -> int32: truncate toward zero, saturate, NaN -> 0."""
    x = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0)
    return np.clip(x, *INT32).astype(np.int64)


def _floor_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounded toward minus infinity, written with truncating division (as C has it); a
    zero divisor gives 0."""
    a, b = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
    safe = np.where(b == 0, 1, b)
    q = np.sign(a) * np.sign(safe) * (np.abs(a) // np.abs(safe))     # truncated toward zero
    q = q - ((q * safe != a) & ((a < 0) != (safe < 0)))               # a remainder of the other sign: one lower
    return np.where(b == 0, 0, q)


def _shift_right(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """floor(a / 2**b) for b clipped to [0, 31], as an integer division by the power of two."""
    return _floor_div(a, np.int64(1) << np.clip(b.astype(np.int64), 0, 31))


def _f32(fn):
    return lambda *xs: fn(*xs).astype(np.float32)


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(a.dtype)


STEPS = {
    "copy": lambda x: x, "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0).astype(x.dtype),
    "exp": np.exp, "log": np.log, "recip": lambda x: np.float32(1) / x,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "sqrt": np.sqrt, "tanh": np.tanh,
    "erf": _f32(lambda x: _erf(x.astype(np.float64))),
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "cmp_gt": _cmp(np.greater), "cmp_ge": _cmp(np.greater_equal), "cmp_eq": _cmp(np.equal),
    "cmp_ne": _cmp(np.not_equal), "select": lambda p, f, t: np.where(p != 0, t, f),
    "div": _floor_div, "shr": _shift_right,
    "to_f32": lambda x: x.astype(np.float32), "to_i32": _to_i32, "requant": requantize, "lut": lookup,
    "rescale": rescale, "mul_i32": lambda a, b: a.astype(np.int64) * b,
}


TYPED_STEPS = ("to_f32", "to_i32", "requant", "lut", "select")   # steps that take their operands as they are


def _held(x: np.ndarray, dtype: str, where: str) -> np.ndarray:
    """x held as `dtype`'s reference type: float32 (bfloat16: a float32 rounded once to bf16, to
    nearest even, held widened), int8, or int64 within int32's range."""
    if dtype in ("float32", "bfloat16"):
        x = np.asarray(x, np.float32)
        return x.astype(ml_dtypes.bfloat16).astype(np.float32) if dtype == "bfloat16" else x
    if dtype == "int8":
        if x.dtype != np.int8 and (x.min(initial=0) < -128 or x.max(initial=0) > 127):
            raise OverflowError(f"{where}: an int8 value out of range")
        return np.asarray(x, np.int8)
    if x.size and (x.min() < INT32[0] or x.max() > INT32[1]):
        raise OverflowError(f"{where}: an int32 value out of range ({x.min()}..{x.max()}); the hardware would wrap")
    return np.asarray(x, np.int64)


def _nudged_steps(nudge: float) -> dict:
    """STEPS whose float-to-integer conversion first scales the float by (1 + nudge)."""
    def to_i32(x):
        return _to_i32(x.astype(np.float64) * (1 + nudge) if x.dtype == np.float32 else x)
    return {**STEPS, "to_i32": to_i32} if nudge else STEPS


def eval_expr(expr, inputs, where: str, steps: dict = STEPS):
    values = list(inputs)
    for step in expr:
        args = [values[a] for a in step.args]
        if step.func not in TYPED_STEPS and any(a.dtype == np.float32 for a in args):
            args = [a.astype(np.float32) for a in args]   # int operands meet floats only in converted form
        values.append(steps[step.func](*args))
    return values[-1]


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype == np.float32 else x.astype(np.int64)


def _conv(node: Node, x, w, *extras, steps: dict = STEPS):
    (pt, pb), (pl, pr) = node.attr("padding")
    (sh, sw), (dh, dw), g = node.attr("stride"), node.attr("dilation"), node.attr("groups")
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = node.output.shape[2:]
    xp = np.pad(_wide(x), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    wg = _wide(w).reshape(g, o // g, cg, kh, kw)
    acc = np.zeros((n, g, o // g, oh, ow), xp.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            acc += np.einsum("ngchw,goc->ngohw", patch.reshape(n, g, cg, oh, ow), wg[..., i, j])
    return _epilogue(node, acc.reshape(n, o, oh, ow), extras, steps)


def _matmul(node: Node, a, b, *extras, steps: dict = STEPS):
    return _epilogue(node, np.matmul(_wide(a), _wide(b)), extras, steps)


def _epilogue(node: Node, acc, extras, steps: dict):
    acc = acc.astype(np.float32) if acc.dtype == np.float64 else acc
    expr = node.attr("epilogue")
    return eval_expr(expr, [acc, *extras], node.name, steps) if expr else acc


def _pool(node: Node, x):
    is_max = node.attr("func") == "max"
    lead = x.ndim - 2
    fill = (-np.inf if x.dtype == np.float32 else np.iinfo(x.dtype).min) if is_max else 0
    xp = np.pad(_wide(x), ((0, 0),) * lead + tuple(node.attr("padding")), constant_values=fill)
    (kh, kw), (sh, sw), (dh, dw) = node.attr("window"), node.attr("strides"), node.attr("dilation")
    oh, ow = node.output.shape[-2:]
    taps = [xp[..., i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    return np.max(taps, axis=0) if is_max else np.sum(taps, axis=0)


def _reduce(node: Node, x):
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[node.attr("func")]
    return fn(_wide(x) if node.attr("func") == "sum" else x, axis=node.attr("axes"))


def _broadcast(node: Node, x):
    shape = [1] * len(node.output.shape)
    for d, axis in zip(x.shape, node.attr("dims"), strict=True):
        shape[axis] = d
    return np.broadcast_to(x.reshape(shape), node.output.shape)


def _slice(node: Node, x):
    return x[tuple(slice(a, b, s) for a, b, s in zip(node.attr("start"), node.attr("limit"),
                                                      node.attr("step") or (1,) * x.ndim, strict=True))]


RULES = {
    OpKind.CONV: _conv,
    OpKind.MATMUL: _matmul,
    OpKind.ELEMENTWISE: lambda n, *xs, steps=STEPS: eval_expr(n.attr("expr"), xs, n.name, steps),
    OpKind.REDUCE: _reduce,
    OpKind.POOL: _pool,
    OpKind.BROADCAST: _broadcast,
    OpKind.RESHAPE: lambda n, x: x.reshape(n.output.shape),
    OpKind.TRANSPOSE: lambda n, x: x.transpose(n.attr("perm")),
    OpKind.SLICE: _slice,
    OpKind.PAD: lambda n, x: np.pad(x, tuple(zip(n.attr("lo"), n.attr("hi"), strict=True)),
                                    constant_values=n.attr("value")),
    OpKind.CONCAT: lambda n, *xs: np.concatenate(xs, n.attr("axis")),
    OpKind.GATHER: lambda n, table, idx: np.take(table, idx, axis=0),
}
EXPRESSION_OPS = (OpKind.CONV, OpKind.MATMUL, OpKind.ELEMENTWISE)   # the rules that take `steps`


def run(graph: Graph, inputs, keep: bool = False, nudge: float = 0.0):
    """The graph's outputs on `inputs` (its flat input arrays); with `keep`, also {value id: array}
    of every value, so tests can compare intermediate int8 tensors.  With `nudge`, every float
    converted to an integer is first scaled by (1 + nudge) (see the module's docstring)."""
    steps = _nudged_steps(nudge)
    rules = {**RULES, **{op: functools.partial(RULES[op], steps=steps) for op in EXPRESSION_OPS}}
    env = {vid: _held(np.asarray(a), str(a.dtype) if str(a.dtype) in ("int8", "float32", "bfloat16") else "int32",
                      f"%{vid}") for vid, a in graph.constants.items()}
    for v, a in zip(graph.inputs, inputs, strict=True):
        env[v.id] = _held(np.asarray(a), v.dtype, f"input %{v.id}")
    for node in graph.nodes:
        rule = rules.get(node.op)
        if rule is None:
            raise LoweringError(f"int8 reference: no rule for {node.op.value} ({node.name})")
        env[node.output.id] = _held(rule(node, *[env[v.id] for v in node.inputs]), node.output.dtype, node.name)
    outputs = [env[v.id] for v in graph.outputs]
    return (outputs, env) if keep else outputs
