"""A float layer's bias add and clamp as one clamp step (isa CLAMP), so its epilogue is one vector pass.

A float32 CONV/MATMUL whose epilogue is [add(acc, per-channel bias)] then a clamp to constant bounds
(ReLU, ReLU6, hardtanh: relu, max and min with scalars; lower.graph.activations.clamp_bounds) took
one vector instruction a step over every output tile: MobileNetV2's expand and depthwise layers
three (add, max, min).  `clamp(acc, r)` does them in one, by one float32 table per layer (lo, hi, 0, 0,
then the biases; a single 0 without a bias: graph_ir.clamp_table_parts), the bounds held once, not per
channel as REQUANT's records carry int8's.  The add rounds as before and max and min are exact, so the
result is the same (a -0.0 may become +0.0).
A bf16 layer's epilogue computes in float32 on its float32 accumulator, its bias a bf16 constant (exact
in float32), and rounds once where its result is stored: the same clamp, the same rounding.  int8
keeps its clamps in REQUANT's bounds (lower.graph.quantize): this pass leaves int8 layers alone.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from stagec.isa.instructions import CLAMP_HEADER_WORDS

from .activations import bias_steps, clamp_bounds, scalar
from .graph_ir import MATRIX_OPS, Graph, Node, Step, Value

FLOATS = ("float32", "bfloat16")


def clamp_table(node: Node, consts) -> np.ndarray | None:
    """The float32 clamp table of a float32 or bf16 CONV/MATMUL whose whole epilogue (two steps or more)
    is [bias add] then a clamp to constant bounds, shaped as the bias with its channel axis (its one
    longer than 1, or its first) CLAMP_HEADER_WORDS longer ([5] without a bias); else None."""
    expr = node.attr("epilogue") or ()
    if (node.op not in MATRIX_OPS or len(expr) < 2 or node.inputs[0].dtype != node.output.dtype
            or node.output.dtype not in FLOATS):
        return None
    bias, k = bias_steps(node, consts)
    n_in = len(node.inputs) - 1

    def scalar_of(a):
        return scalar(node.inputs[a + 1], consts) if 0 < a < n_in else None
    bounds = clamp_bounds(expr[k:], n_in if k else 0, n_in + k, scalar_of)
    if bounds is None:
        return None
    shape = node.inputs[max(expr[0].args) + 1].shape if k else ()
    biases = np.asarray(bias, np.float32).reshape(shape or (1,)) if k else np.zeros(1, np.float32)
    header = np.zeros(CLAMP_HEADER_WORDS, np.float32)
    header[:2] = bounds
    axis = int(np.argmax(biases.shape))
    head = header.reshape([CLAMP_HEADER_WORDS if a == axis else 1 for a in range(biases.ndim)])
    return np.concatenate([head, biases], axis=axis)


def fold_clamps(graph: Graph) -> Graph:
    """Each float32 or bf16 CONV/MATMUL epilogue of a bias add and a clamp (module doc) as one clamp step."""
    consts = dict(graph.constants)
    ids = graph.fresh_ids()
    nodes = []
    for node in graph.nodes:
        table = clamp_table(node, consts)
        if table is None:
            nodes.append(node)
            continue
        r = Value(next(ids), table.shape, "float32")
        consts[r.id] = table
        nodes.append(Node(node.op, (*node.inputs[:2], r), node.output, node.attrs, node.name)
                     .with_attrs(epilogue=(Step("clamp", (0, 1)),)))
    if len(consts) == len(graph.constants):
        return graph
    live = {v.id for n in nodes for v in n.inputs} | {v.id for v in graph.outputs}   # bias and bounds: in tables
    return Graph(graph.inputs, graph.outputs, tuple(nodes),
                 MappingProxyType({k: a for k, a in consts.items() if k in live}))
