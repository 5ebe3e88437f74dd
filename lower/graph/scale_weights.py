"""scale_weights: a per-channel scale computed at run time (a squeeze-excite's gate), applied to the
input of a 1x1 convolution, moves onto that convolution's weights.

    y = conv(x * s, W)  ==  conv(x, W * s)     s: [1, C, 1, 1], W: [O, C, 1, 1]

The multiply then reads and writes O x C weights instead of the C x H x W activation, which it
would read from DRAM and write back for the convolution to read again (EfficientNet and MobileNetV3
blocks: the depthwise result, 96 to 1152 channels).  Taken where it moves fewer bytes: O < H x W,
the early and middle blocks (the last 7x7 blocks' projections have more weights than pixels).
One image (a per-image scale does not fold into shared weights).  The graph is float32 here still for
every precision: bf16 (lower.graph.bfloat16 runs after) rounds the gated weights to bf16 where it would
have rounded the gated activation; int8 (lower.graph.quantize) requantizes them per output channel at
run time, from the int8 gate and int8 weights.
"""

from __future__ import annotations

import math

from .graph_ir import Graph, Node, OpKind, Step, Value
from .passes import _uses

MUL = (Step("mul", (0, 1)),)


def scale_weights(graph: Graph) -> Graph:
    """Every ELEMENTWISE x * s (s one value per channel, x [1, C, H, W] float32) read by a 1x1
    convolution alone (stride 1, no padding, one group, constant weights) with fewer output channels
    than x has pixels, as the convolution of x by its weights times s (module doc)."""
    uses, outputs, _ = _uses(graph)
    readers = {v.id: n for n in graph.nodes for v in n.inputs}
    nodes = list(graph.nodes)
    ids = graph.fresh_ids()
    where = {n.name: i for i, n in enumerate(nodes)}
    for i, node in enumerate(graph.nodes):
        conv = readers.get(node.output.id)
        operands = _scaled(node, graph) if uses.get(node.output.id) == 1 and node.output.id not in outputs else None
        if operands is None or not _pointwise(conv, node.output, graph):
            continue
        x, s = operands
        w = conv.inputs[1]
        if w.shape[0] >= math.prod(x.shape[2:]):   # the multiply moves fewer bytes where it is
            continue
        scaled = Value(next(ids), w.shape, w.dtype)
        nodes[i] = Node(OpKind.ELEMENTWISE, (w, s), scaled, (("expr", MUL),), node.name)
        j = where[conv.name]
        nodes[j] = Node(conv.op, (x, scaled, *conv.inputs[2:]), conv.output, conv.attrs, conv.name)
    return Graph(graph.inputs, graph.outputs, tuple(nodes), graph.constants)


def _scaled(node: Node, graph: Graph):
    """(x, s) of an ELEMENTWISE x * s whose s is one value per channel of a float32 x [1, C, H, W] and not a
    constant (fold_affine folds those), else None."""
    if node.op != OpKind.ELEMENTWISE or node.attr("expr") != MUL or len(node.inputs) != 2:
        return None
    for x, s in (node.inputs, node.inputs[::-1]):
        if (len(x.shape) == 4 and x.shape[0] == 1 and x.shape == node.output.shape and x.dtype == s.dtype == "float32"
                and s.shape == (1, x.shape[1], 1, 1) and s.id not in graph.constants):
            return x, s
    return None


def _pointwise(conv: Node | None, v: Value, graph: Graph) -> bool:
    """Whether `conv` is a 1x1 convolution of stride 1, no padding, one group and constant weights, of input `v`."""
    if conv is None or conv.op != OpKind.CONV or conv.inputs[0] != v or conv.inputs.count(v) != 1:
        return False
    w = conv.inputs[1]
    return (w.id in graph.constants and w.shape[2:] == (1, 1) and conv.attr("groups") == 1
            and conv.attr("stride") == (1, 1) and conv.attr("padding") == ((0, 0), (0, 0))
            and conv.attr("dilation") == (1, 1))


def gated_weights(node: Node | None, consts) -> tuple[Value, Value] | None:
    """(constant weights W [O, C, 1, 1], gate s [1, C, 1, 1]) of the multiply W * s this pass made, else None."""
    if node is None or node.op != OpKind.ELEMENTWISE or node.attr("expr") != MUL or len(node.inputs) != 2:
        return None
    w, s = node.inputs
    ok = (w.id in consts and s.id not in consts and len(w.shape) == 4 and w.shape[2:] == (1, 1)
          and s.shape == (1, w.shape[1], 1, 1))
    return (w, s) if ok else None
