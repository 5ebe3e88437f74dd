"""The graph IR's reference semantics: evaluate a Graph with jax.numpy (slow is fine).

Passes are tested by evaluating the graph before and after them.  A node computes on bfloat16
inputs as float32 and rounds its result once when it is bfloat16 (lower.graph.bfloat16).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.isa.semantics import clamp, record_fields, requantize, rescale, rescale_fields

from .graph_ir import Expr, Graph, Node, OpKind, clamp_table_parts


def _requant(x, records):
    return jnp.asarray(requantize(np.asarray(x), *record_fields(np.asarray(records))[:5]))


def _rescale(x, records):
    return jnp.asarray(rescale(np.asarray(x), *rescale_fields(np.asarray(records))))


STEP_FUNCS = {
    "copy": lambda x: x, "neg": jnp.negative, "abs": jnp.abs, "relu": lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "exp": jnp.exp, "log": jnp.log, "recip": lambda x: 1.0 / x, "rsqrt": lax.rsqrt, "sqrt": jnp.sqrt,
    "tanh": jnp.tanh, "erf": lax.erf, "sigmoid": lax.logistic,
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "cmp_gt": lambda a, b: (a > b).astype(a.dtype), "cmp_ge": lambda a, b: (a >= b).astype(a.dtype),
    "cmp_eq": lambda a, b: (a == b).astype(a.dtype), "cmp_ne": lambda a, b: (a != b).astype(a.dtype),
    "select": lambda p, f, t: jnp.where(p != 0, t, f),
    "div": lambda a, b: jnp.where(b != 0, jnp.floor_divide(a, jnp.where(b != 0, b, 1)), 0).astype(a.dtype),
    "shr": lambda a, b: jnp.right_shift(a, jnp.clip(b, 0, 31).astype(a.dtype)),
    "to_f32": lambda x: x.astype(jnp.float32), "to_i32": lambda x: jnp.trunc(x).astype(jnp.int32),
    "mul_i32": lambda a, b: a.astype(jnp.int32) * b.astype(jnp.int32),
    "requant": _requant, "rescale": _rescale, "lut": lambda x, table: jnp.take(table, x.astype(jnp.int32) + 128),
    "clamp": lambda x, table: clamp(jnp, x, *clamp_table_parts(jnp, table)),
}
ACC_TYPE = {jnp.dtype(jnp.int8): jnp.int32}   # int8 products and sums accumulate in int32
COMPUTED = {"bfloat16": "float32"}            # the type a node of a result type computes in


def _widened(x):
    return x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x


def eval_expr(expr: Expr, inputs):
    values = list(inputs)
    for step in expr:
        values.append(STEP_FUNCS[step.func](*[values[a] for a in step.args]))
    return values[-1]


def _epilogue(node: Node, acc, extras):
    expr = node.attr("epilogue")
    return eval_expr(expr, [acc, *extras]) if expr else acc


def _conv(node: Node, x, w, *extras):
    y = lax.conv_general_dilated(x, w, node.attr("stride"), node.attr("padding"),
                                 rhs_dilation=node.attr("dilation"), feature_group_count=node.attr("groups"),
                                 precision=lax.Precision.HIGHEST, preferred_element_type=ACC_TYPE.get(x.dtype))
    return _epilogue(node, y, extras)


def _matmul(node: Node, a, b, *extras):
    return _epilogue(node, jnp.matmul(a, b, precision=lax.Precision.HIGHEST,
                                      preferred_element_type=ACC_TYPE.get(a.dtype)), extras)


def _pool(node: Node, x):
    lead = x.ndim - 2
    if node.attr("func") == "max":
        init, op = (-jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min), lax.max
    else:
        x = x.astype(ACC_TYPE.get(x.dtype, x.dtype))
        init, op = 0, lax.add
    init = jnp.asarray(init, x.dtype)
    ones = (1,) * lead
    return lax.reduce_window(x, init, op, ones + node.attr("window"), ones + node.attr("strides"),
                             ((0, 0),) * lead + node.attr("padding"), window_dilation=ones + node.attr("dilation"))


EVAL_RULES = {
    OpKind.CONV: _conv,
    OpKind.MATMUL: _matmul,
    OpKind.ELEMENTWISE: lambda n, *xs: eval_expr(n.attr("expr"), xs),
    OpKind.REDUCE: lambda n, x: {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[n.attr("func")](
        x.astype(COMPUTED.get(n.output.dtype, n.output.dtype)), n.attr("axes")),
    OpKind.POOL: _pool,
    OpKind.BROADCAST: lambda n, x: lax.broadcast_in_dim(x, n.output.shape, n.attr("dims")),
    OpKind.RESHAPE: lambda n, x: jnp.reshape(x, n.output.shape),
    OpKind.TRANSPOSE: lambda n, x: jnp.transpose(x, n.attr("perm")),
    OpKind.SLICE: lambda n, x: lax.slice(x, n.attr("start"), n.attr("limit"), n.attr("step")),
    OpKind.PAD: lambda n, x: lax.pad(x, jnp.asarray(n.attr("value"), x.dtype),
                                     [(lo, hi, 0) for lo, hi in zip(n.attr("lo"), n.attr("hi"), strict=True)]),
    OpKind.CONCAT: lambda n, *xs: jnp.concatenate(xs, n.attr("axis")),
    OpKind.GATHER: lambda n, table, idx: jnp.take(table, idx, axis=0),
}


def evaluate(graph: Graph, *inputs, observe=None) -> list[np.ndarray]:
    """The graph's outputs on `inputs`; `observe(value, array)`, if given, sees every input and node
    result as it is computed (calibration records ranges with it)."""
    env = {vid: jnp.asarray(a) for vid, a in graph.constants.items()}
    for v, a in zip(graph.inputs, inputs, strict=True):
        env[v.id] = jnp.asarray(a, v.dtype)
        if observe:
            observe(v, env[v.id])
    for node in graph.nodes:
        out = EVAL_RULES[node.op](node, *[_widened(env[v.id]) for v in node.inputs])
        env[node.output.id] = out.astype(node.output.dtype) if node.output.dtype in COMPUTED else out
        if observe:
            observe(node.output, env[node.output.id])
    return [np.asarray(env[v.id]) for v in graph.outputs]
