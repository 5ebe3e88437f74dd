"""Post-training int8 quantization of a graph: integer CONV/MATMUL, fp32 islands between.

Weights are symmetric int8 per output channel (scale max|w| / 127), activations
symmetric int8 per tensor (scale amax / 127, amax from lower.graph.calibrate), biases
int32 at the accumulator's scale s_x * s_w.  A CONV/MATMUL with constant weights
multiplies int8 x int8 -> int32 on the array; its epilogue is then

  - integer, when it is a bias add and/or a clamp (TFLite/gemmlowp): one REQUANT
    whose records add the int32 bias, then multiply by M = s_x * s_w / s_y
    (fixed-point multiplier and shift, rounding to nearest, saturating to the clamp's
    bounds on the int8 grid: ReLU, ReLU6, hardtanh; lower.graph.activations);
  - otherwise fp32: the accumulator is dequantized per channel (to_f32, times
    s_x * s_w) and the original epilogue runs on it (GELU, ...).

A MATMUL of two activations (attention's Q K^T and P V) multiplies them int8 x int8 at their
per-tensor scales (TFLite's int8 BatchMatMul), s_w a single scale; it requantizes for a
CONV/MATMUL that takes its result and, with `int8_scores` (the default), for anything else too:
attention's scores then cross DRAM as int8 on their way to softmax (max keeps int8, the exp's
island reads them dequantized), half the bytes of bf16 scores; without it they are dequantized from
the accumulator, without a second rounding.  Measured on the full-size zoo, int8 scores cost no
accuracy: cosine against fp32 0.99987 (Whisper-tiny encoder), 0.98359 (BERT-base), 0.99829
(ViT-B/16), each within 4e-5 of the dequantized scores'.  A leading multiply by a positive scalar
constant in either epilogue (1/sqrt(d)) is part of the requant or dequant multiplier.

A 1x1 conv's weights times a squeeze-excite gate (lower.graph.scale_weights) are int8 per output
channel at s_w * amax(gate): the int32 product of the int8 weights and the int8 gate requantized by
1/127, at run time (the gate is per sample).

A residual add in an epilogue is split off before calibration (`split_residuals`), so the
conv's own result gets a range, an int8 result and a TFLite Add; fusion puts the add back
into the epilogue afterwards.  Int8 integer ops with TFLite's semantics (zero points 0):

  - an add of two int8 values [then ReLU] (TFLite Add): each input shifted left by 20 bits
    and RESCALEd to the common scale 2 max(s_a, s_b) / 2**20, an int32 add, REQUANT to s_y;
  - a concatenation stays int8 at its calibrated scale; each input whose only use is the
    concat is given the concat's range at quantization time (TFLite's shared scale), any
    other input at another scale is requantized to it (to_i32, REQUANT by s_in / s_out);
  - an average (a window or reduction sum times 1/count) is the int32 sum requantized by
    s_in / (count * s_out) (TFLite Mean); where the count varies per window (padding left
    out of the count, ceil mode) the sum is first multiplied by the int32 L / count, L the
    least common multiple of the counts, and requantized by s_in / (L * s_out).  A float node that
    reads an average (a layer norm's x - mean) dequantizes it straight from the sum at s_in / L
    instead, without the int8 rounding (x - mean is then exactly 0 where it should be).

Max pooling, max/min reductions, lone ReLUs and views (reshape, transpose, slice,
broadcast, zero padding) keep int8 and the scale; sums of int8 accumulate in int32 (and are
dequantized when no average takes them).  Any other expression of one int8 value and scalar
constants (a clamp, hardswish, sigmoid, GELU, ...) is a 256-entry table lookup
(lower.graph.activations), int8 to int8.  With `integer`
(compile's integer_ops=), softmax, layer norm and GELU run as I-BERT's integer kernels
(lower.graph.integer_ops finds them; the scores a softmax takes are requantized to int8).  Every
other op runs in fp32 on the vector unit; the pass inserts QUANTIZE (x * 256/s,
truncate to int32, REQUANT by exactly 1/256: round half away from zero) and
DEQUANTIZE (to_f32, times s) nodes at the boundaries, once per value.  Fusion
afterwards folds them into their neighbours' expressions and epilogues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from stagec.errors import QuantizationError
from stagec.rule_tables import registrar

from .activations import (
    activation_matmul,
    bias_steps,
    clamp_bounds,
    int8_bounds,
    integer_matrix,
    lut_table,
    scalar,
    scalar_scale,
    unary_input,
)
from .graph_ir import MATRIX_OPS, Graph, Node, OpKind, Step, Value
from .int8_binary import MUL_EXPR, int8_mul
from .int8_rewriter import INT8_VIEWS, QMAX, Rewriter
from .integer_ops import emit_island, find_islands, int8_gelu, int8_inputs
from .passes import dce, prune
from .requant import add_records, records
from .scale_weights import gated_weights


@dataclass(frozen=True)
class QuantParams:
    """The int8 scale of every quantized value of a graph (real = scale * q)."""
    scales: MappingProxyType   # value id -> float

    def __str__(self) -> str:
        return "\n".join(f"%{vid}: scale {s:.6g}" for vid, s in sorted(self.scales.items()))


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


def _int8_operands(rw: Rewriter, node: Node):
    """(int8 x, int8 w, accumulator scale per output channel, its shape on the output) of a CONV/MATMUL
    that int8 runs on the array, else None: constant weights are int8 per output channel, the second
    activation of a MATMUL of two activations (attention's Q K^T and P V, TFLite's int8 BatchMatMul)
    int8 per tensor, as the first always is."""
    if integer_matrix(node, rw.consts):
        wq, s_w = quantize_weights(rw.consts[node.inputs[1].id], 0 if node.op == OpKind.CONV else -1)
        w = rw.const(wq)
    elif activation_matmul(node, rw.consts):
        w = rw.as_int8(node.inputs[1])
        s_w = np.array([rw.scales[w.id]])
    elif node.op == OpKind.CONV and node.inputs[1].id in rw.gated:
        w, s_w = rw.gated[node.inputs[1].id]
    else:
        return None
    x = rw.as_int8(node.inputs[0])
    return x, w, rw.scales[x.id] * s_w, (1, -1, 1, 1) if node.op == OpKind.CONV else (-1,)


def _multiplied(v: Value, uses) -> bool:
    """Whether a CONV/MATMUL takes v (through views) as an operand: only then does a product of two
    activations requantize to int8; softmax, which takes the scores in fp32, gets them dequantized from
    the accumulator, without a second rounding."""
    return any(n.op in MATRIX_OPS or n.op in INT8_VIEWS and _multiplied(n.output, uses) for n in uses.get(v.id, ()))


def _viewed_into(v: Value, uses, wanted: set[int]) -> bool:
    """Whether v, or a view of it, is among the `wanted` values (an integer kernel's int8 input)."""
    return v.id in wanted or any(n.op in INT8_VIEWS and _viewed_into(n.output, uses, wanted)
                                 for n in uses.get(v.id, ()))


@register(OpKind.CONV, OpKind.MATMUL)
def _matrix(rw: Rewriter, node: Node) -> None:
    operands = _int8_operands(rw, node)
    if operands is None:
        return rw.keep_fp32(node)   # a CONV with activation weights, a MATMUL by a batched constant
    x, wv, acc_scale, cshape = operands
    node, factor = scalar_scale(node, rw.consts)   # a scalar scale in the epilogue: part of the multiplier
    acc_scale = acc_scale * factor
    integer = _integer_epilogue(node, rw.consts)
    if integer is not None and activation_matmul(node, rw.consts) and not (
            rw.int8_scores or _multiplied(node.output, rw.uses) or _viewed_into(node.output, rw.uses, rw.int8_uses)):
        integer = None
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
    reals, bq = acc_scale / s_y, None
    if bias is not None:   # int32 at the accumulator's scale, in the records: added before the multiply
        bq = np.round(bias / acc_scale)
        if np.abs(bq).max() >= 2**31:
            raise QuantizationError(f"{node.name}: a bias is {np.abs(bq).max():.3g} accumulator units, beyond int32")
        bq = bq.astype(np.int32)
        reals = np.broadcast_to(reals, bq.shape)   # a per-tensor scale (activation x activation): a record per channel
    rec = records(reals, where, bounds=int8_bounds(bounds, s_y), bias=bq)
    rw.int8_result(node, [x, wv, rw.const(rec.reshape(cshape + (rec.shape[-1],)))], s_y,
                   epilogue=(Step("requant", (0, 1)),))


@register(OpKind.POOL, OpKind.REDUCE)
def _window(rw: Rewriter, node: Node) -> None:
    """Max and min keep int8 and the scale; sums of int8 accumulate in int32."""
    x = node.inputs[0]
    if x.id not in rw.int8:
        return rw.keep_fp32(node)
    q = rw.int8[x.id]
    rw.int8_result(node, (q,), rw.scales[q.id], "int32" if node.attr("func") == "sum" else "int8")


@register(*INT8_VIEWS, OpKind.PAD)
def _view(rw: Rewriter, node: Node) -> None:
    """Views and zero padding keep an int8 value int8 at its scale, an int32 sum int32."""
    x = node.inputs[0]
    if node.op == OpKind.PAD and node.attr("value") != 0:
        return rw.keep_fp32(node)
    if x.id in rw.sums and node.op in INT8_VIEWS:
        q, scale = rw.sums[x.id]
        return rw.int8_result(node, (q,), scale, "int32")
    if x.id not in rw.int8:
        return rw.keep_fp32(node)
    q = rw.int8[x.id]
    rw.int8_result(node, (q,), rw.scales[q.id])


@register(OpKind.CONCAT)
def _concat(rw: Rewriter, node: Node) -> None:
    """Int8 at the concat's calibrated scale, inputs at another scale requantized to it."""
    if any(v.id not in rw.int8 for v in node.inputs):
        return rw.keep_fp32(node)
    scale = rw.scale_of(node.output)
    rw.int8_result(node, [rw.requantized(rw.int8[v.id], scale, f"{node.name}/input{i}")
                          for i, v in enumerate(node.inputs)], scale)


@register(OpKind.ELEMENTWISE)
def _elementwise(rw: Rewriter, node: Node) -> None:
    """An add of two int8 values [then ReLU] is a TFLite Add, a sum times 1/count an average, a
    product of two int8 values a TFLite Mul (lower.graph.int8_binary); an
    expression of one int8 value and scalar constants stays int8: a lone ReLU at the value's scale
    (the zero point is 0), any other as a table lookup (lower.graph.activations) -- to the value's
    own scale for a clamp, which only narrows the range its int8 grid already holds, to the
    result's calibrated scale for the rest.  Any other expression runs in fp32."""
    if (_int8_add(rw, node) or _average(rw, node) or int8_mul(rw, node) or int8_gelu(rw, node)
            or _gated_weights(rw, node)):
        return
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


def _int8_add(rw: Rewriter, node: Node) -> bool:
    """add(a, b) [relu] of int8 a and b as TFLite's int8 Add (lower.graph.requant.add_records)."""
    expr, n = node.attr("expr"), len(node.inputs)
    if (not expr or expr[0].func != "add" or expr[1:] not in ((), (Step("relu", (n,)),))
            or any(v.id not in rw.int8 for v in node.inputs)):
        return False
    a, b = (rw.int8[node.inputs[k].id] for k in expr[0].args)
    s_y = rw.scale_of(node.output)
    recs = add_records(rw.scales[a.id], rw.scales[b.id], s_y, f"{node.name}: add")
    steps = (Step("rescale", (0, 2)), Step("rescale", (1, 3)), Step("add", (5, 6)), Step("requant", (7, 4)))
    rw.int8_result(node, (a, b, *(rw.const(r) for r in recs)), s_y,
                   expr=steps + ((Step("relu", (8,)),) if len(expr) == 2 else ()))
    return True


def _gated_weights(rw: Rewriter, node: Node) -> bool:
    """W * s of lower.graph.scale_weights, an int8 gate s and a 1x1 conv's constant weights W that an int8
    conv reads: per output channel o, int8 W' = requant(q_w * q_s) by 1/127 at scale s_w[o] * amax(s), the
    range that W[o] times any s in the calibrated range keeps (TFLite's int8 Mul at a per-channel output
    scale, the same multiplier for every channel)."""
    operands, readers = gated_weights(node, rw.consts), rw.uses.get(node.output.id, ())
    if (operands is None or len(readers) != 1 or readers[0].op != OpKind.CONV or readers[0].name in rw.keep
            or readers[0].inputs.index(node.output) != 1):
        return False
    w, s = operands
    wq, s_w = quantize_weights(rw.consts[w.id], 0)
    q_s = rw.as_int8(s)
    out = rw.fresh(node.output.shape, "int8")
    rw.emit(OpKind.ELEMENTWISE, (rw.const(wq), q_s, rw.const(records(1 / QMAX, f"{node.name}: gated weights"))),
            out, node.name, expr=MUL_EXPR)
    rw.gated[node.output.id] = (out, s_w * rw.scales[q_s.id] * QMAX)
    return True


def _average(rw: Rewriter, node: Node) -> bool:
    """mul(sum, 1/count) of an int32 sum of int8 values: int8 at the result's scale (module doc)."""
    expr, ins = node.attr("expr"), node.inputs
    if expr not in ((Step("mul", (0, 1)),), (Step("mul", (1, 0)),)) or len(ins) != 2:
        return False
    (total, c), = [(x, k) for x, k in (ins, ins[::-1]) if x.id in rw.sums and k.id in rw.consts] or [(None, None)]
    counts = _counts(rw.consts[c.id]) if total is not None else None
    if counts is None:
        return False
    q, s_in = rw.sums[total.id]
    s_y = rw.scale_of(node.output)
    common = math.lcm(*np.unique(counts).tolist())
    if common * QMAX * counts.max() >= 2**31:
        return False
    rec = rw.const(records(s_in / (common * s_y), f"{node.name}: average"))
    uniform = (counts == common).all()
    factor = None if uniform else rw.const((common // counts).astype(np.int32))
    if node.output not in rw.graph.outputs:   # an output is TFLite Mean's int8 result, dequantized
        rw.averages[node.output.id] = (q, factor, s_in / common)
    if uniform:
        return rw.int8_result(node, (q, rec), s_y, expr=(Step("requant", (0, 1)),)) or True
    rw.int8_result(node, (q, factor, rec), s_y, expr=(Step("mul", (0, 1)), Step("requant", (3, 2))))
    return True


def _counts(c: np.ndarray) -> np.ndarray | None:
    """The integer counts whose reciprocals `c` holds (to float32 rounding), or None."""
    c = np.asarray(c, np.float64)
    if c.size == 0 or not (c > 0).all() or not np.isfinite(c).all():
        return None
    counts = np.rint(1 / c)
    ok = (counts >= 1).all() and np.allclose(c * counts, 1, rtol=1e-6, atol=0) and counts.max() < 2**16
    return counts.astype(np.int64) if ok else None


def _shared_concat_ranges(graph: Graph, amax: dict[int, float]) -> dict[int, float]:
    """`amax` with each concat input whose only use is the concat given the concat's range (never
    smaller than its own: the concat holds it), so it is produced at the concat's scale (TFLite's
    int8 concatenation shares one scale).  Outer concats first, so nested ones pass it inward."""
    amax, uses = dict(amax), graph.consumers()
    outputs = {v.id for v in graph.outputs}
    for node in reversed(graph.nodes):
        if node.op != OpKind.CONCAT or node.output.id not in amax:
            continue
        for v in node.inputs:
            if len(uses[v.id]) == 1 and v.id not in outputs and v.id in amax:
                amax[v.id] = max(amax[v.id], amax[node.output.id])
    return amax


def split_residuals(graph: Graph) -> Graph:
    """A CONV/MATMUL with constant weights whose epilogue is [steps over constants] add(residual)
    [relu] becomes the CONV/MATMUL with those steps (a bias, an activation) and an ELEMENTWISE add
    [relu]: calibration then sees the conv's own result, which int8 needs (a TFLite Add takes two
    int8 values), and split_activations, after, splits an activation off it.  fuse_quantized fuses
    the add back, under the fused node's name."""
    ids, nodes, producers = graph.fresh_ids(), [], graph.producer()
    for node in graph.nodes:
        split = _residual_split(graph, node, producers)
        if split is None:
            nodes.append(node)
            continue
        head, r, relu = split
        conv_name, _, add_name = node.name.rpartition("+")
        acc = Value(next(ids), node.output.shape, node.output.dtype)

        def ref(a, r=r):   # the epilogue's arguments without the residual input r
            return a - (a > r)
        extras, steps = prune([acc, *(v for k, v in enumerate(node.inputs[2:], 1) if k != r)],
                              tuple(Step(s.func, tuple(ref(a) for a in s.args)) for s in head))
        nodes.append(Node(node.op, (*node.inputs[:2], *extras[1:]), acc, _attrs_with(node, epilogue=steps or None),
                          conv_name))
        nodes.append(Node(OpKind.ELEMENTWISE, (acc, node.inputs[1 + r]), node.output,
                          (("expr", (Step("add", (0, 1)),) + ((Step("relu", (2,)),) if relu else ())),),
                          add_name or f"{node.name}/residual"))
    return Graph(graph.inputs, graph.outputs, tuple(nodes), graph.constants)


def _attrs_with(node: Node, **changes) -> tuple:
    return tuple(sorted((k, v) for k, v in {**dict(node.attrs), **changes}.items() if v is not None))


def _residual_split(graph: Graph, node: Node, producers):
    """(the epilogue's steps before the add, the residual's epilogue argument, relu?) of a
    quantizable CONV/MATMUL (constant weights, or gated ones: lower.graph.scale_weights) whose epilogue
    is [steps reading constants] add(·, an activation of the output's shape) [relu], else None."""
    w, expr = node.inputs[1] if len(node.inputs) > 1 else None, node.attr("epilogue") or ()
    if (node.op not in MATRIX_OPS or node.op == OpKind.MATMUL and len(w.shape) != 2 or not expr
            or w.id not in graph.constants and gated_weights(producers.get(w.id), graph.constants) is None):
        return None
    n_in, consts = len(node.inputs) - 1, graph.constants
    k = next((j for j, s in enumerate(expr) if any(0 < a < n_in and node.inputs[1 + a].id not in consts
                                                      for a in s.args)), None)
    if k is None:
        return None
    cur = n_in + k - 1 if k else 0   # the head's result, or the accumulator
    if expr[k].func != "add" or cur not in expr[k].args or len(set(expr[k].args)) != 2:
        return None
    r = expr[k].args[expr[k].args[0] == cur]
    if node.inputs[1 + r].shape != node.output.shape:
        return None
    rest = expr[k + 1:]
    if rest not in ((), (Step("relu", (n_in + k,)),)):
        return None
    return expr[:k], r, bool(rest)


def quantize(graph: Graph, amax: dict[int, float], keep: frozenset[str] = frozenset(),
             int8_scores: bool = True, integer: frozenset[str] = frozenset(),
             channel_amax: dict | None = None) -> tuple[Graph, QuantParams]:
    """The int8 graph of `graph` (same inputs and fp32 outputs) and its activation scales;
    `amax` ({value id: calibrated range}) comes from lower.graph.calibrate on this same graph.
    The nodes named in `keep` stay float (lower.graph.mixed_precision: pinned or sensitive layers);
    `int8_scores`: products of two activations requantize to int8 whatever takes them (module doc);
    the ops named in `integer` run as integer-only kernels (lower.graph.integer_ops), their inputs at
    the per-channel ranges of `channel_amax` where those kernels take them."""
    rw = Rewriter(graph, _shared_concat_ranges(graph, amax), int8_scores)
    islands = find_islands(graph, integer, keep)
    inner = {i for island in islands.values() for i in island.inner}
    rw.int8_uses, rw.integer, rw.channel_amax, rw.keep = int8_inputs(islands), integer, channel_amax or {}, keep
    for node in graph.nodes:
        if node.output.id in islands:
            emit_island(rw, islands[node.output.id])
            continue
        if node.output.id in inner:
            continue
        rule = Rewriter.keep_fp32 if node.name in keep else QUANT_RULES.get(node.op, Rewriter.keep_fp32)
        rule(rw, node)
    outputs = tuple(rw.as_fp32(v) for v in graph.outputs)
    out = dce(Graph(graph.inputs, outputs, tuple(rw.nodes), MappingProxyType(rw.consts)))   # views as_int8 replaced
    return out, QuantParams(MappingProxyType(dict(rw.scales)))
