"""Integer activations for int8: clamps as requantization bounds, every other unary function as a table.

An int8 NPU runs a layer's activation without leaving int8 (TFLite's int8 kernels):

  - a clamp (ReLU, ReLU6, hardtanh, clamp with constant bounds, one-sided ones) is folded into the
    requantization's saturation bounds (TFLite's activation_min/max): round(lo / s_y) and
    round(hi / s_y), clipped to int8;
  - any other function f of one int8 value and scalar constants (hardswish, hardsigmoid, sigmoid,
    SiLU, tanh, GELU, ...) is a 256-entry table, table[q + 128] = round(f(s_in q) / s_out) clipped
    to int8 (TFLite's LUT-based int8 logistic, tanh and hardswish), evaluated by the graph's own fp32
    reference (lower.graph.evaluate) at all 256 inputs, so every such expression gets one.

A CONV/MATMUL whose fused epilogue ends in such a function is split before calibration
(`split_activations`): [bias] on the accumulator, then the function as an ELEMENTWISE node, so
calibration sees the value between them and gives it its own int8 scale s_in.  Quantization makes
the function a table, and fusion afterwards puts it back in the epilogue (requant -> lut).
"""

from __future__ import annotations

import math
from types import MappingProxyType

import jax.numpy as jnp
import numpy as np

from .evaluate import eval_expr
from .graph_ir import MATRIX_OPS, Expr, Graph, Node, OpKind, Step, Value

INT8 = (-128, 127)


def integer_matrix(node: Node, consts) -> bool:
    """A CONV/MATMUL that int8 runs on the array: constant weights (a 2-D matrix for a MATMUL)."""
    w = node.inputs[1]
    return w.id in consts and (node.op == OpKind.CONV or len(w.shape) == 2)


def activation_matmul(node: Node, consts) -> bool:
    """A MATMUL of two activations (attention's Q K^T and P V): int8 runs it with per-tensor scales."""
    return node.op == OpKind.MATMUL and not any(v.id in consts for v in node.inputs[:2])


def scalar_scale(node: Node, consts) -> tuple[Node, float]:
    """(node less its epilogue's leading mul(acc, c), c) where c is a positive scalar constant (attention's
    1/sqrt(d) on the scores), so that int8 folds c into the accumulator's scale; else (node, 1.0)."""
    expr, n_in = node.attr("epilogue") or (), len(node.inputs) - 1
    if not expr or expr[0].func != "mul" or 0 not in expr[0].args or len(set(expr[0].args)) != 2:
        return node, 1.0
    other = max(expr[0].args)
    c = scalar(node.inputs[other + 1], consts) if other < n_in else None
    if c is None or not c > 0 or any(0 in s.args for s in expr[1:]):
        return node, 1.0
    keep = sorted({a for s in expr[1:] for a in s.args if 0 < a < n_in})
    position = {0: 0, n_in: 0, **{a: 1 + j for j, a in enumerate(keep)}}   # the product is the scaled acc

    def ref(a):
        return position[a] if a <= n_in else len(keep) + a - n_in
    steps = tuple(Step(s.func, tuple(ref(a) for a in s.args)) for s in expr[1:])
    attrs = {**dict(node.attrs), "epilogue": steps} if steps else {a: v for a, v in node.attrs if a != "epilogue"}
    inputs = node.inputs[:2] + tuple(node.inputs[a + 1] for a in keep)
    return Node(node.op, inputs, node.output, tuple(sorted(attrs.items())), node.name), c


def scalar(v: Value, consts) -> float | None:
    """The value of a one-element constant, else None."""
    arr = consts.get(v.id)
    return float(np.asarray(arr).reshape(-1)[0]) if arr is not None and np.size(arr) == 1 else None


def bias_steps(node: Node, consts) -> tuple[np.ndarray | None, int]:
    """(per-channel bias, 1) when a CONV/MATMUL epilogue starts with add(acc, constant per-channel
    bias), else (None, 0)."""
    expr = node.attr("epilogue") or ()
    if not expr or expr[0].func != "add" or sorted(expr[0].args)[0] != 0 or len(set(expr[0].args)) != 2:
        return None, 0
    b = max(expr[0].args)
    arr = consts.get(node.inputs[b + 1].id) if b < len(node.inputs) - 1 else None
    channels = node.output.shape[1 if node.op == OpKind.CONV else -1]
    if arr is None or np.size(arr) != channels:
        return None, 0
    return np.asarray(arr, np.float64).reshape(-1), 1


def clamp_bounds(expr: Expr, cur: int, first: int, scalar_of) -> tuple[float, float] | None:
    """(lo, hi) when `expr` (its steps numbered from `first`) clamps value `cur` to constant bounds
    (relu, max and min with scalars, in any order that keeps lo <= hi), else None.  `scalar_of(k)`:
    argument k's value when it is a scalar constant, else None."""
    lo, hi = -math.inf, math.inf
    for j, s in enumerate(expr):
        if s.func == "relu" and s.args == (cur,):
            func, c = "max", 0.0
        elif s.func in ("max", "min") and len(set(s.args)) == 2 and cur in s.args:
            func, c = s.func, scalar_of(s.args[1] if s.args[0] == cur else s.args[0])
        else:
            return None
        if c is None or (func == "max" and c > hi) or (func == "min" and c < lo):
            return None   # not a constant, or a bound beyond the other: a constant function
        lo, hi = (max(lo, c), hi) if func == "max" else (lo, min(hi, c))
        cur = first + j
    return (lo, hi) if expr else None


def int8_bounds(bounds: tuple[float, float] | None, scale: float) -> tuple[int, int]:
    """A clamp's bounds on the int8 grid of `scale`: round(bound / scale), clipped to int8."""
    if bounds is None:
        return INT8
    return tuple(int(np.clip(np.round(b / scale), *INT8)) if math.isfinite(b) else INT8[k]
                 for k, b in enumerate(bounds))


def unary_input(expr: Expr, inputs, consts) -> int | None:
    """The one input an expression reads that is not a scalar constant, when every other input it
    reads is one; else None."""
    tensors = [k for k, v in enumerate(inputs) if scalar(v, consts) is None]
    return tensors[0] if len(tensors) == 1 and any(tensors[0] in s.args for s in expr) else None


def lut_table(expr: Expr, inputs, consts, k: int, s_in: float, s_out: float) -> np.ndarray | None:
    """The int8 table of an expression of input k (int8 at s_in) and scalar constants, to int8 at
    s_out: entry q + 128 is round(f(s_in q) / s_out) (ties away from zero, as QUANTIZE rounds),
    saturated; f is the fp32 expression on the dequantized input.  None where f is NaN."""
    q = np.arange(INT8[0], INT8[1] + 1, dtype=np.float32)
    x = q * np.float32(s_in)   # DEQUANTIZE's fp32 multiply
    args = [jnp.asarray(x) if i == k else jnp.asarray(consts[v.id]) for i, v in enumerate(inputs)]
    y = np.asarray(eval_expr(expr, args), np.float64).reshape(-1) / s_out
    if y.shape != q.shape or np.isnan(y).any():
        return None
    return np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), *INT8).astype(np.int8)


def _activation(node: Node, consts) -> int | None:
    """How many leading epilogue steps stay on the accumulator (the bias add) when the rest is a
    unary function of their result and scalar constants that is not a clamp; else None."""
    expr = node.attr("epilogue") or ()
    _, k = bias_steps(node, consts)
    n_in = len(node.inputs) - 1
    cur = n_in if k else 0
    tail = expr[k:]

    def scalar_of(a):
        return scalar(node.inputs[a + 1], consts) if 0 < a < n_in else None
    if not tail or not integer_matrix(node, consts) or clamp_bounds(tail, cur, n_in + k, scalar_of) is not None:
        return None
    reads = {a for s in tail for a in s.args if a < n_in + k}
    return k if all(a == cur or scalar_of(a) is not None for a in reads) else None


def _split(node: Node, k: int, mid: Value) -> tuple[Node, Node]:
    """CONV/MATMUL `node` as (itself with the epilogue's first k steps, writing `mid`; the rest as an
    ELEMENTWISE of mid and the scalar constants it reads)."""
    expr, n_in = node.attr("epilogue"), len(node.inputs) - 1
    cur = n_in if k else 0
    extras = sorted({a for s in expr[k:] for a in s.args if 0 < a < n_in and a != cur})
    position = {cur: 0, **{a: 1 + j for j, a in enumerate(extras)}}
    n_new = 1 + len(extras)
    steps = tuple(Step(s.func, tuple(position[a] if a < n_in + k else n_new + a - n_in - k for a in s.args))
                  for s in expr[k:])
    head_inputs = node.inputs[:2] + ((node.inputs[max(expr[0].args) + 1],) if k else ())
    attrs = {**dict(node.attrs), "epilogue": (Step("add", (0, 1)),)} if k else {
        a: v for a, v in node.attrs if a != "epilogue"}
    # fusion named the node producer+consumer: the halves get back their names (and fusion, the whole)
    head_name, _, act_name = node.name.rpartition("+")
    head = Node(node.op, head_inputs, mid, tuple(sorted(attrs.items())), head_name or node.name)
    act = Node(OpKind.ELEMENTWISE, (mid, *(node.inputs[a + 1] for a in extras)), node.output, (("expr", steps),),
               act_name if head_name else f"{node.name}/activation")
    return head, act


def split_activations(graph: Graph) -> Graph:
    """Each CONV/MATMUL whose epilogue is [bias] then a unary non-clamp function (module doc) as the
    CONV/MATMUL with [bias] and an ELEMENTWISE node of the function."""
    ids = graph.fresh_ids()
    nodes, changed = [], False
    for node in graph.nodes:
        k = _activation(node, graph.constants) if node.op in MATRIX_OPS else None
        if k is None:
            nodes.append(node)
            continue
        nodes.extend(_split(node, k, Value(next(ids), node.output.shape, node.output.dtype)))
        changed = True
    return Graph(graph.inputs, graph.outputs, tuple(nodes), MappingProxyType(dict(graph.constants))) if changed \
        else graph
