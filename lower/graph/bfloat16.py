"""bf16: activations and weights held as bfloat16, two bytes, in DRAM: the whole model's
(quantize="bf16"), or an int8 graph's float islands (lower.graph.mixed_precision).

Which values are bf16 is decided here, once, for the graph; what an instruction does with a bf16
element follows from its type (isa.opcodes): the matrix unit multiplies bf16 operands exactly into
float32 accumulators, the vector unit computes in float32 on elements its DMA widened, and a
result is rounded to bf16, to nearest even, where it is stored.  So a node computes as in float32
and rounds its result once, as PyTorch's bf16 kernels do (lower.graph.evaluate says the same).

- Constants of more than one element (weights, biases, tables) are rounded to bf16; a constant of
  one element (an expression's parameter, such as GELU's 0.5) keeps float32: it is held in a word
  of its own anyway, and rounding it would change every element it touches.
- Every node's float32 result becomes bf16, except a graph output: its producer writes the model's
  float32, unrounded.
- A CONV or MATMUL multiplies bf16 by bf16: a float32 operand (a program input, or a graph output
  that is read again) is copied to bf16 first, once per value.  Other ops read either type.
- A view (reshape, transpose, slice, broadcast) is its input's bytes, so has its input's type; a
  graph output still bf16 then is copied to float32 at the end.
- int8 and int32 values stay as they are, and so do the float constants of a node that reads an
  int8 activation (an int8 CONV's per-channel dequantization scales, its fp32 epilogue's bias):
  they are the quantization's, not a float layer's weights.
- A node `keep_fp32(name)` names keeps its float32 result and weights (its CONV/MATMUL reads
  float32 operands, copied from bf16 ones once); a constant is rounded only if no such node and
  no node of int8 input reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import ml_dtypes
import numpy as np

from .graph_ir import MATRIX_OPS, Graph, Node, OpKind, Step, Value, value_names

BF16, F32 = "bfloat16", "float32"
VIEWS = frozenset({OpKind.BROADCAST, OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE})
COPY = (Step("copy", (0,)),)


class _Rewriter:
    def __init__(self, graph: Graph, keep_fp32: Callable[[str], bool]):
        self.graph, self.keep_fp32 = graph, keep_fp32
        self.ids = graph.fresh_ids()
        self.nodes: list[Node] = []
        self.consts = {}
        self.now: dict[int, Value] = {}      # original value id -> the value holding it now
        self.copies: dict[tuple[int, str], Value] = {}   # (value id, type) -> its copy of that type
        self.names = value_names(graph)
        exact = _float32_constants(graph, keep_fp32)
        for vid, a in graph.constants.items():
            a = np.asarray(a)
            if a.dtype == np.float32 and a.size > 1 and vid not in exact:
                a = a.astype(ml_dtypes.bfloat16)
                self.now[vid] = Value(vid, a.shape, BF16)
            self.consts[vid] = a

    def value(self, v: Value) -> Value:
        return self.now.get(v.id, v)

    def as_type(self, v: Value, dtype: str) -> Value:
        """v (as it is now) of float type `dtype`, copying it the first time."""
        name = self.names.get(v.id, "value")
        v = self.value(v)
        if v.dtype == dtype or v.dtype not in (BF16, F32):
            return v
        if (v.id, dtype) not in self.copies:
            out = Value(next(self.ids), v.shape, dtype)
            self.nodes.append(Node(OpKind.ELEMENTWISE, (v,), out, (("expr", COPY),), f"{name}/to_{dtype}"))
            self.copies[v.id, dtype] = out
        return self.copies[v.id, dtype]

    def node(self, node: Node, outputs: frozenset) -> None:
        inputs = [self.value(v) for v in node.inputs]
        kept = self.keep_fp32(node.name)
        if node.op in MATRIX_OPS:
            inputs[:2] = [self.as_type(v, F32 if kept else BF16) for v in node.inputs[:2]]
        out = node.output
        if node.op in VIEWS:
            dtype = inputs[0].dtype
        else:
            dtype = BF16 if out.dtype == F32 and out.id not in outputs and not kept else out.dtype
        new = Value(out.id, out.shape, dtype)
        self.now[out.id] = new
        self.nodes.append(Node(node.op, tuple(inputs), new, node.attrs, node.name))


def _float32_constants(graph: Graph, keep_fp32: Callable[[str], bool]) -> set[int]:
    """The constants that stay float32: read by a node kept float32 or by a node of int8 input."""
    exact = set()
    for node in graph.nodes:
        if keep_fp32(node.name) or any(v.dtype == "int8" and v.id not in graph.constants for v in node.inputs):
            exact.update(v.id for v in node.inputs if v.id in graph.constants)
    return exact


def to_bfloat16(graph: Graph, keep_fp32: Callable[[str], bool] = lambda name: False) -> Graph:
    """The graph with its float32 activations and weights as bf16 (module doc), but for the nodes
    `keep_fp32` names; inputs and outputs keep their types."""
    rw = _Rewriter(graph, keep_fp32)
    outputs = frozenset(v.id for v in graph.outputs)
    for node in graph.nodes:
        rw.node(node, outputs)
    results = tuple(rw.as_type(v, F32) if v.dtype == F32 else rw.value(v) for v in graph.outputs)
    return Graph(graph.inputs, results, tuple(rw.nodes), MappingProxyType(rw.consts))
