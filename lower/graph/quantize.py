"""Post-training int8 quantization of a graph: integer CONV/MATMUL, fp32 islands between.

Weights are symmetric int8 per output channel (scale max|w| / 127), activations
symmetric int8 per tensor (scale amax / 127, amax from lower.graph.calibrate), biases
int32 at the accumulator's scale s_x * s_w.  A CONV/MATMUL with constant weights
multiplies int8 x int8 -> int32 on the array; its epilogue is then

  - integer, when it is a bias add and/or a clamp (TFLite/gemmlowp): add the int32
    bias, REQUANT by M = s_x * s_w / s_y (fixed-point multiplier and shift,
    rounding to nearest, saturating to the clamp's bounds on the int8 grid: ReLU,
    ReLU6, hardtanh; lower.graph.activations);
  - otherwise fp32: the accumulator is dequantized per channel (to_f32, times
    s_x * s_w) and the original epilogue runs on it (a residual add, GELU, ...).

Max pooling, max/min reductions, lone ReLUs and views (reshape, transpose, slice,
broadcast, zero padding) keep int8 and the scale; sums of int8 accumulate in int32.  Any
other expression of one int8 value and scalar constants (a clamp, hardswish, sigmoid, GELU,
...) is a 256-entry table lookup (lower.graph.activations), int8 to int8.  Every
other op runs in fp32 on the vector unit; the pass inserts QUANTIZE (x * 256/s,
truncate to int32, REQUANT by exactly 1/256: round half away from zero) and
DEQUANTIZE (to_f32, times s) nodes at the boundaries, once per value.  Fusion
afterwards folds them into their neighbours' expressions and epilogues.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from stagec.errors import QuantizationError
from stagec.rule_tables import registrar

from .activations import bias_steps, clamp_bounds, int8_bounds, integer_matrix, lut_table, scalar, unary_input
from .graph_ir import Graph, Node, OpKind, Step, Value
from .requant import QUANTIZE_FRACTION_BITS, QUANTIZE_RECORD, records

QMAX = 127
INT8_VIEWS = frozenset({OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.BROADCAST})
QUANTIZE_EXPR = (Step("mul", (0, 1)), Step("to_i32", (3,)), Step("requant", (4, 2)))
DEQUANTIZE_EXPR = (Step("to_f32", (0,)), Step("mul", (2, 1)))


@dataclass(frozen=True)
class QuantParams:
    """The int8 scale of every quantized value of a graph (real = scale * q)."""
    scales: MappingProxyType   # value id -> float

    def __str__(self) -> str:
        return "\n".join(f"%{vid}: scale {s:.6g}" for vid, s in sorted(self.scales.items()))


class _Rewriter:
    """The new graph under construction: nodes, constants, and each value's int8/fp32 versions."""

    def __init__(self, graph: Graph, amax: dict[int, float]):
        self.graph, self.amax = graph, amax
        self.consts = dict(graph.constants)
        self.names = {n.output.id: n.name for n in graph.nodes}
        self.ids = graph.fresh_ids()
        self.nodes: list[Node] = []
        self.int8: dict[int, Value] = {}     # original value id -> its int8 version
        self.fp32: dict[int, Value] = {v.id: v for v in graph.inputs}   # original id -> its fp32 version
        self.scales: dict[int, float] = {}   # int8 value id -> scale

    def fresh(self, shape, dtype: str = "float32") -> Value:
        return Value(next(self.ids), tuple(shape), dtype)

    def const(self, array: np.ndarray) -> Value:
        v = self.fresh(array.shape, str(array.dtype))
        self.consts[v.id] = array
        return v

    def scale_of(self, v: Value) -> float:
        """The activation scale of original value v, from its calibrated range."""
        amax = self.amax.get(v.id)
        if amax is None:
            raise QuantizationError(f"value %{v.id} ({self.names.get(v.id, 'input')}) has no calibrated range")
        if not amax > 0 or not np.isfinite(amax):
            raise QuantizationError(f"value %{v.id} ({self.names.get(v.id, 'input')}) has calibrated range {amax}: "
                                    f"its int8 scale would be {amax / QMAX}; calibrate with data that exercises it")
        return amax / QMAX

    def emit(self, op: OpKind, inputs, output: Value, name: str, **attrs) -> None:
        self.nodes.append(Node(op, tuple(inputs), output, tuple(sorted(attrs.items())), name))

    def dequantize(self, q: Value, scale: float, name: str) -> Value:
        """A DEQUANTIZE node: the fp32 value of int8 (or int32) `q` at `scale`."""
        f = self.fresh(q.shape)
        self.emit(OpKind.ELEMENTWISE, (q, self.const(np.array(scale, np.float32))), f, f"{name}/dequantize",
                  expr=DEQUANTIZE_EXPR)
        return f

    def as_int8(self, v: Value) -> Value:
        """v's int8 version, quantizing its fp32 one the first time."""
        if v.id not in self.int8:
            scale = self.scale_of(v)
            gain = self.const(np.array(2**QUANTIZE_FRACTION_BITS / scale, np.float32))
            q = self.fresh(v.shape, "int8")
            self.emit(OpKind.ELEMENTWISE, (self.fp32.get(v.id, v), gain, self.const(QUANTIZE_RECORD.copy())), q,
                      f"{self.names.get(v.id, 'input')}/quantize", expr=QUANTIZE_EXPR)
            self.int8[v.id], self.scales[q.id] = q, scale
        return self.int8[v.id]

    def as_fp32(self, v: Value) -> Value:
        """v's fp32 version, dequantizing its int8 one the first time."""
        if v.id in self.consts:
            return v
        if v.id not in self.fp32:
            q = self.int8[v.id]
            self.fp32[v.id] = self.dequantize(q, self.scales[q.id], self.names[v.id])
        return self.fp32[v.id]

    def keep_fp32(self, node: Node) -> None:
        inputs = [self.as_fp32(v) for v in node.inputs]
        self.nodes.append(Node(node.op, tuple(inputs), node.output, node.attrs, node.name))
        self.fp32[node.output.id] = node.output

    def int8_result(self, node: Node, inputs, scale: float, dtype: str = "int8", **attrs) -> None:
        """Emit `node` over int8 `inputs` with a result of `dtype` (int8 at `scale`, or int32 sums)."""
        out = self.fresh(node.output.shape, dtype)
        self.nodes.append(Node(node.op, tuple(inputs), out, tuple(sorted({**dict(node.attrs), **attrs}.items())),
                               node.name))
        if dtype == "int8":
            self.int8[node.output.id], self.scales[out.id] = out, scale
        else:   # an int32 sum of int8 values at `scale`: dequantized at once
            self.fp32[node.output.id] = self.dequantize(out, scale, node.name)


QUANT_RULES = {}


register = registrar(QUANT_RULES)


def quantize_weights(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float64 scale per slice along `axis`), symmetric: scale = max|w| / 127.  An
    all-zero channel gets scale 1 (its weights are exactly 0 at any scale)."""
    w = np.asarray(w, np.float64)
    others = tuple(d for d in range(w.ndim) if d != axis % w.ndim)
    amax = np.abs(w).max(axis=others, keepdims=True)
    scale = np.where(amax > 0, amax / QMAX, 1.0)
    return np.clip(np.round(w / scale), -QMAX, QMAX).astype(np.int8), scale.reshape(-1)


def _integer_epilogue(node: Node, consts) -> tuple[np.ndarray | None, tuple[float, float] | None] | None:
    """(per-channel bias or None, clamp bounds or None) when the epilogue is [add(acc, const bias)]
    [clamp], else None."""
    expr, n_in = node.attr("epilogue") or (), len(node.inputs) - 1
    bias, k = bias_steps(node, consts)
    if k == len(expr):
        return bias, None
    bounds = clamp_bounds(expr[k:], n_in if k else 0, n_in + k,
                          lambda a: scalar(node.inputs[a + 1], consts) if 0 < a < n_in else None)
    return None if bounds is None else (bias, bounds)


@register(OpKind.CONV, OpKind.MATMUL)
def _matrix(rw: _Rewriter, node: Node) -> None:
    w = node.inputs[1]
    if not integer_matrix(node, rw.consts):
        return rw.keep_fp32(node)   # activations times activations (attention) stay fp32
    axis = 0 if node.op == OpKind.CONV else -1
    wq, s_w = quantize_weights(rw.consts[w.id], axis)
    x = rw.as_int8(node.inputs[0])
    s_x = rw.scales[x.id]
    acc_scale = s_x * s_w
    cshape = (1, -1, 1, 1) if node.op == OpKind.CONV else (-1,)
    wv = rw.const(wq)
    integer = _integer_epilogue(node, rw.consts)
    if integer is None:   # dequantize the accumulator, then the fp32 epilogue as it was
        expr, n_in = node.attr("epilogue") or (), len(node.inputs) - 1
        extras = [rw.as_fp32(v) for v in node.inputs[2:]]
        dq = rw.const(acc_scale.astype(np.float32).reshape(cshape))

        def ref(a):   # acc -> the dequantized acc; extras stay; steps move past dq and the two new steps
            return n_in + 2 if a == 0 else a if a < n_in else a + 3
        steps = (Step("to_f32", (0,)), Step("mul", (n_in + 1, n_in))) + tuple(
            Step(s.func, tuple(ref(a) for a in s.args)) for s in expr)
        rw.nodes.append(Node(node.op, (x, wv, *extras, dq), node.output,
                             tuple(sorted({**dict(node.attrs), "epilogue": steps}.items())), node.name))
        rw.fp32[node.output.id] = node.output
        return
    bias, bounds = integer
    s_y = rw.scale_of(node.output)
    where = f"{node.name}: requantization"
    steps, inputs = [], [x, wv]
    if bias is not None:
        bq = np.round(bias / acc_scale)
        if np.abs(bq).max() >= 2**31:
            raise QuantizationError(f"{node.name}: a bias is {np.abs(bq).max():.3g} accumulator units, beyond int32")
        inputs.append(rw.const(bq.astype(np.int32).reshape(cshape)))
        steps.append(Step("add", (0, 1)))
    rec = records(acc_scale / s_y, where, bounds=int8_bounds(bounds, s_y))
    inputs.append(rw.const(rec.reshape(cshape + (rec.shape[-1],))))
    n = len(inputs) - 1   # epilogue inputs: acc, [bias], records; steps are numbered from n
    steps.append(Step("requant", (n if bias is not None else 0, n - 1)))
    rw.int8_result(node, inputs, s_y, epilogue=tuple(steps))


@register(OpKind.POOL, OpKind.REDUCE)
def _window(rw: _Rewriter, node: Node) -> None:
    """Max and min keep int8 and the scale; sums of int8 accumulate in int32."""
    x = node.inputs[0]
    if x.id not in rw.int8:
        return rw.keep_fp32(node)
    q = rw.int8[x.id]
    rw.int8_result(node, (q,), rw.scales[q.id], "int32" if node.attr("func") == "sum" else "int8")


@register(*INT8_VIEWS, OpKind.PAD)
def _view(rw: _Rewriter, node: Node) -> None:
    x = node.inputs[0]
    if x.id not in rw.int8 or (node.op == OpKind.PAD and node.attr("value") != 0):
        return rw.keep_fp32(node)
    q = rw.int8[x.id]
    rw.int8_result(node, (q,), rw.scales[q.id])


@register(OpKind.ELEMENTWISE)
def _elementwise(rw: _Rewriter, node: Node) -> None:
    """An expression of one int8 value and scalar constants stays int8: a lone ReLU at the value's
    scale (the zero point is 0), any other as a table lookup (lower.graph.activations) -- to the
    value's own scale for a clamp, which only narrows the range its int8 grid already holds, to the
    result's calibrated scale for the rest.  Any other expression runs in fp32."""
    expr = node.attr("expr")
    k = unary_input(expr, node.inputs, rw.consts)
    if k is None or node.inputs[k].id not in rw.int8 or node.output.dtype != "float32":
        return rw.keep_fp32(node)
    q = rw.int8[node.inputs[k].id]
    s_in = rw.scales[q.id]
    if expr == (Step("relu", (0,)),):
        return rw.int8_result(node, (q,), s_in)
    bounds = clamp_bounds(expr, k, len(node.inputs), lambda a: scalar(node.inputs[a], rw.consts)
                          if a < len(node.inputs) else None)
    s_out = s_in if bounds is not None else rw.scale_of(node.output)
    table = lut_table(expr, node.inputs, rw.consts, k, s_in, s_out)
    if table is None:
        return rw.keep_fp32(node)
    rw.int8_result(node, (q, rw.const(table)), s_out, expr=(Step("lut", (0, 1)),))


def quantize(graph: Graph, amax: dict[int, float]) -> tuple[Graph, QuantParams]:
    """The int8 graph of `graph` (same inputs and fp32 outputs) and its activation scales;
    `amax` ({value id: calibrated range}) comes from lower.graph.calibrate on this same graph."""
    rw = _Rewriter(graph, amax)
    for node in graph.nodes:
        QUANT_RULES.get(node.op, _Rewriter.keep_fp32)(rw, node)
    outputs = tuple(rw.as_fp32(v) for v in graph.outputs)
    out = Graph(graph.inputs, outputs, tuple(rw.nodes), MappingProxyType(rw.consts))
    return out, QuantParams(MappingProxyType(dict(rw.scales)))
