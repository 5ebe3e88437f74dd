"""Products of two int8 activations (TFLite's int8 Mul): a squeeze-excitation gate x * sigmoid(...)
stays int8 instead of an fp32 island over the whole feature map.

TFLite reference_ops::Mul with zero points 0: the int32 product of the two int8 values,
requantized by s_a * s_b / s_out (MultiplyByQuantizedMultiplier, rounding, saturating to int8);
the operands broadcast as numpy does (the gate one value per channel).  Two vector steps (MUL
multiplies int8 into int32 itself, then REQUANT), where the fp32 island took six (to_f32, scale,
the product, 1/scale, to_i32, requant).
"""

from __future__ import annotations

from .graph_ir import Node, Step
from .requant import records

MUL_EXPR = (Step("mul_i32", (0, 1)), Step("requant", (3, 2)))


def int8_mul(rw, node: Node) -> bool:
    """mul(a, b) of two distinct int8 values as TFLite's int8 Mul, emitted through `rw` (the
    quantize pass's rewriter); False, emitting nothing, for any other node."""
    expr, inputs = node.attr("expr"), node.inputs
    if (expr not in ((Step("mul", (0, 1)),), (Step("mul", (1, 0)),)) or len(inputs) != 2
            or any(v.id not in rw.int8 for v in inputs) or node.output.dtype != "float32"):
        return False
    a, b = (rw.int8[v.id] for v in inputs)
    s_y = rw.scale_of(node.output)
    rec = rw.const(records(rw.scales[a.id] * rw.scales[b.id] / s_y, f"{node.name}: mul"))
    rw.int8_result(node, (a, b, rec), s_y, expr=MUL_EXPR)
    return True
