"""The int8 quantizer's state while it rewrites a graph (lower.graph.quantize): the new nodes and
constants, each original value's int8 and fp32 versions and the int8 scales, and the few nodes every
rule emits the same way (QUANTIZE, DEQUANTIZE, an int8 -> int8 requantization).  The rules, keyed by
op, live in lower.graph.quantize, lower.graph.int8_binary and lower.graph.integer_ops."""

from __future__ import annotations

import numpy as np

from stagec.errors import QuantizationError

from .graph_ir import Graph, Node, OpKind, Step, Value, value_names
from .requant import QUANTIZE_EXPR, QUANTIZE_FRACTION_BITS, QUANTIZE_RECORD, records

QMAX = 127
INT8_VIEWS = frozenset({OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.BROADCAST})
DEQUANTIZE_EXPR = (Step("to_f32", (0,)), Step("mul", (2, 1)))



class Rewriter:
    """The new graph under construction: nodes, constants, and each value's int8/fp32 versions."""

    def __init__(self, graph: Graph, amax: dict[int, float], int8_scores: bool = True):
        self.graph, self.amax, self.int8_scores = graph, amax, int8_scores
        self.consts = dict(graph.constants)
        self.names = value_names(graph)
        self.producers, self.uses = graph.producer(), graph.consumers()
        self.ids = graph.fresh_ids()
        self.nodes: list[Node] = []
        self.int8: dict[int, Value] = {}     # original value id -> its int8 version
        self.fp32: dict[int, Value] = {v.id: v for v in graph.inputs}   # original id -> its fp32 version
        self.scales: dict[int, float] = {}   # int8 value id -> scale
        self.sums: dict[int, tuple[Value, float]] = {}   # original id -> its int32 sum of int8 values, their scale
        # original id of an average -> (its int32 sum, L / count or None, s_in / L): what float readers dequantize
        self.averages: dict[int, tuple[Value, Value | None, float]] = {}
        self.int8_uses: set[int] = set()     # values an integer kernel reads as int8 (lower.graph.integer_ops)
        self.integer: frozenset[str] = frozenset()   # the ops run integer-only (compile's integer_ops)
        self.channel_amax: dict = {}         # value id -> per-channel ranges (compile's activation_ranges)
        self.keep: frozenset[str] = frozenset()      # the nodes kept float (quantize's keep)
        # original id of gated 1x1 conv weights (lower.graph.scale_weights) -> (their int8, scale per output channel)
        self.gated: dict[int, tuple[Value, np.ndarray]] = {}

    def fresh(self, shape, dtype: str = "float32") -> Value:
        return Value(next(self.ids), tuple(shape), dtype)

    def const(self, array: np.ndarray) -> Value:
        v = self.fresh(array.shape, str(array.dtype))
        self.consts[v.id] = array
        return v

    def scale_of(self, v: Value) -> float:
        """The activation scale of original value v, from its calibrated range (a constant's, that an op
        takes where it takes activations: from its values)."""
        amax = self.amax.get(v.id)
        if amax is None and v.id in self.graph.constants and np.size(self.graph.constants[v.id]):
            amax = float(np.max(np.abs(self.graph.constants[v.id])))
        if amax is None:
            raise QuantizationError(f"value %{v.id} ({self.names.get(v.id, 'value')}) has no calibrated range")
        if not amax > 0 or not np.isfinite(amax):
            raise QuantizationError(f"value %{v.id} ({self.names.get(v.id, 'value')}) has calibrated range {amax}: "
                                    f"its int8 scale would be {amax / QMAX}; calibrate with data that exercises it")
        return amax / QMAX

    def emit(self, op: OpKind, inputs, output: Value, name: str, **attrs) -> None:
        self.nodes.append(Node(op, tuple(inputs), output, tuple(sorted(attrs.items())), name))

    def dequantize(self, q: Value, scale: float, name: str, factor: Value | None = None) -> Value:
        """A DEQUANTIZE node: the fp32 value of int8 (or int32) `q` at `scale`, `q` first multiplied by
        the int32 `factor` where one is given (an average's L / count)."""
        s = self.const(np.array(scale, np.float32))
        if factor is None:
            inputs, expr = (q, s), DEQUANTIZE_EXPR
        else:
            inputs, expr = (q, s, factor), (Step("mul", (0, 2)), Step("to_f32", (3,)), Step("mul", (4, 1)))
        f = self.fresh(np.broadcast_shapes(*(v.shape for v in inputs)))
        self.emit(OpKind.ELEMENTWISE, inputs, f, f"{name}/dequantize", expr=expr)
        return f

    def as_int8(self, v: Value) -> Value:
        """v's int8 version, quantizing its fp32 one the first time: a view's by viewing its source's
        int8 version (one QUANTIZE for a value that several views take, as attention's Q, K and V
        reshapes of one layer norm)."""
        view = self.producers.get(v.id)
        if v.id not in self.int8 and view is not None and view.op in INT8_VIEWS and view.inputs[0].id in self.amax:
            q = self.as_int8(view.inputs[0])
            # the view may already run in fp32 for other readers: the int8 one is a second node
            self.int8_result(view, (q, *view.inputs[1:]), self.scales[q.id],
                             name=f"{view.name}/int8" if v.id in self.fp32 else view.name)
        if v.id not in self.int8 and v.id in self.graph.constants:   # quantized on the host
            scale = self.scale_of(v)
            q = self.const(np.clip(np.round(self.graph.constants[v.id] / scale), -QMAX, QMAX).astype(np.int8))
            self.int8[v.id], self.scales[q.id] = q, scale
        if v.id not in self.int8:
            scale = self.scale_of(v)
            gain = self.const(np.array(2**QUANTIZE_FRACTION_BITS / scale, np.float32))
            q = self.fresh(v.shape, "int8")
            # an int32 sum of int8 values (a reduce's) has no fp32 version until it is dequantized
            source = self.as_fp32(v) if v.id in self.sums else self.fp32.get(v.id, v)
            self.emit(OpKind.ELEMENTWISE, (source, gain, self.const(QUANTIZE_RECORD.copy())), q,
                      f"{self.names.get(v.id, 'value')}/quantize", expr=QUANTIZE_EXPR)
            self.int8[v.id], self.scales[q.id] = q, scale
        return self.int8[v.id]

    def as_fp32(self, v: Value) -> Value:
        """v's fp32 version, dequantizing its int8 one the first time; an average's straight from its int32
        sum: its int8 rounding would leave x - mean a rounding residue where it is exactly 0 (a layer norm
        over a row of width 1 would return -beta), and a large one for narrow rows.  A view of an average
        (not an output: those keep TFLite Mean's int8) views the average's fp32 version."""
        if v.id in self.consts:
            return v
        if v.id not in self.fp32 and v.id in self.averages:
            total, factor, scale = self.averages[v.id]
            self.fp32[v.id] = self.dequantize(total, scale, self.names.get(v.id, 'value'), factor)
        view = self.producers.get(v.id)
        if v.id not in self.fp32 and v not in self.graph.outputs and self._views_average(v):
            out = self.fresh(v.shape)
            self.emit(view.op, (self.as_fp32(view.inputs[0]), *view.inputs[1:]), out, f"{view.name}/fp32",
                      **dict(view.attrs))
            self.fp32[v.id] = out
        if v.id not in self.fp32:
            q, scale = self.sums[v.id] if v.id in self.sums else (self.int8[v.id], self.scales[self.int8[v.id].id])
            self.fp32[v.id] = self.dequantize(q, scale, self.names.get(v.id, 'value'))
        return self.fp32[v.id]

    def _views_average(self, v: Value) -> bool:
        """Whether `v` is an average's value through views (INT8_VIEWS) that emit nothing."""
        view = self.producers.get(v.id)
        return v.id in self.averages or (view is not None and view.op in INT8_VIEWS
                                         and self._views_average(view.inputs[0]))

    def keep_fp32(self, node: Node) -> None:
        inputs = [self.as_fp32(v) for v in node.inputs]
        self.nodes.append(Node(node.op, tuple(inputs), node.output, node.attrs, node.name))
        self.fp32[node.output.id] = node.output

    def int8_result(self, node: Node, inputs, scale: float, dtype: str = "int8", name: str | None = None,
                    **attrs) -> None:
        """Emit `node` (as `name`, else its own) over int8 `inputs`: a `dtype` result (int8 at `scale`, int32 sums)."""
        out = self.fresh(node.output.shape, dtype)
        self.nodes.append(Node(node.op, tuple(inputs), out, tuple(sorted({**dict(node.attrs), **attrs}.items())),
                               name or node.name))
        if dtype == "int8":
            self.int8[node.output.id], self.scales[out.id] = out, scale
        else:   # an int32 sum of int8 values at `scale`: an average requantizes it, anything else dequantizes it
            self.sums[node.output.id] = (out, scale)

    def requantized(self, q: Value, scale: float, name: str) -> Value:
        """int8 `q` at `scale` (TFLite's int8 -> int8 REQUANTIZE: to_i32, REQUANT by s_q / scale)."""
        if self.scales[q.id] == scale:
            return q
        out = self.fresh(q.shape, "int8")
        rec = self.const(records(self.scales[q.id] / scale, f"{name}: requantization"))
        self.emit(OpKind.ELEMENTWISE, (q, rec), out, f"{name}/requantize",
                  expr=(Step("to_i32", (0,)), Step("requant", (2, 1))))
        self.scales[out.id] = scale
        return out
