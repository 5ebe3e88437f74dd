"""GraphBuilder, what canonicalize's rules build the graph IR through; RULES, the table they
register in, keyed by jaxpr primitive name (filled by the canonicalize_* family modules, which
lower.graph.canonicalize imports); and the helpers rules of several families share.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from stagec.rule_tables import registrar

from .evaluate import EVAL_RULES
from .graph_ir import Graph, Node, OpKind, Step, Value, expr_dtype, storage_dtype

RULES = {}
rule = registrar(RULES)


class GraphBuilder:
    def __init__(self):
        self.nodes: list[Node] = []
        self.constants: dict[int, np.ndarray] = {}
        self._const_ids: dict[int, Value] = {}
        self._next = 0
        self._names: dict[str, int] = {}
        self._producer: dict[int, Node] = {}
        self.scope = ""

    def value(self, shape, dtype="float32") -> Value:
        self._next += 1
        return Value(self._next, tuple(int(d) for d in shape), storage_dtype(dtype))

    def const(self, array) -> Value:
        source = np.asarray(array)
        if id(source) in self._const_ids:   # the same array object (weights used twice): one constant
            return self._const_ids[id(source)][1]
        v = self.value(source.shape, source.dtype)
        self.constants[v.id] = source.astype(v.dtype, copy=False)
        self._const_ids[id(source)] = (source, v)   # holding `source` keeps its id from being reused
        return v

    def as_value(self, x) -> Value:
        return x if isinstance(x, Value) else self.const(x)

    def emit(self, op: OpKind, inputs, shape, dtype=None, **attrs) -> Value:
        inputs = [self.as_value(x) for x in inputs]
        if dtype is None:
            # an elementwise result's type follows its steps; every other op keeps its first input's
            dtype = expr_dtype(attrs["expr"], [v.dtype for v in inputs])[-1] if op == OpKind.ELEMENTWISE \
                else inputs[0].dtype
        out = self.value(shape, dtype)
        kind = "+".join(dict.fromkeys(s.func for s in attrs["expr"])) if op == OpKind.ELEMENTWISE else op.value
        base = f"{self.scope}/{kind}" if self.scope else kind
        k = self._names.get(base, 0)
        self._names[base] = k + 1
        self.nodes.append(Node(op, tuple(inputs), out, tuple(sorted(attrs.items())),
                               f"{base}_{k}" if k else base))
        self._producer[out.id] = self.nodes[-1]
        return out

    def constant_of(self, x) -> np.ndarray | None:
        """x's value where it is computed from constants alone (a broadcast that folding kept as a view,
        and what is built on it), else None."""
        known = {}
        stack = [x]
        while stack:
            v = stack[-1]
            if not isinstance(v, Value) or v.id in self.constants:
                known[id(v)] = np.asarray(v if not isinstance(v, Value) else self.constants[v.id])
            elif v.id not in self._producer:
                return None   # a graph input
            else:
                node = self._producer[v.id]
                pending = [u for u in node.inputs if id(u) not in known]
                if pending:
                    stack.extend(pending)
                    continue
                known[id(v)] = np.asarray(EVAL_RULES[node.op](node, *[known[id(u)] for u in node.inputs]))
            stack.pop()
        return known[id(x)]

    def elementwise(self, inputs, expr, shape) -> Value:
        return self.emit(OpKind.ELEMENTWISE, inputs, shape, expr=tuple(expr))

    def finish(self, inputs, outputs) -> Graph:
        used = {v.id for n in self.nodes for v in n.inputs} | {v.id for v in outputs}
        consts = {k: a for k, a in self.constants.items() if k in used}
        return Graph(tuple(inputs), tuple(outputs), tuple(self.nodes), MappingProxyType(consts))


class Steps:
    """An ELEMENTWISE expression built step by step after its `inputs` operands: each call appends a step
    and returns the operand index of its result."""

    def __init__(self, inputs: int):
        self.inputs, self.steps = inputs, []

    def __call__(self, op: str, *operands: int) -> int:
        self.steps.append(Step(op, operands))
        return self.inputs + len(self.steps) - 1


def out_shape(eqn):
    """The shape of the equation's (first) result."""
    return eqn.outvars[0].aval.shape


def dtype_of(x) -> str:
    """The graph dtype of a rule's operand: a Value's, or a constant's as the graph stores it."""
    return x.dtype if isinstance(x, Value) else storage_dtype(np.asarray(x).dtype)


def reshape_value(b, x, shape):
    """x in `shape`: itself when it has it, a constant reshaped on the host, else a RESHAPE node."""
    shape = tuple(int(d) for d in shape)
    if np.shape(x) == shape:
        return x
    if not isinstance(x, Value):
        return np.reshape(x, shape)
    return b.emit(OpKind.RESHAPE, [x], shape)


def transpose_value(b, x, perm):
    """x transposed by `perm`: itself for the identity, a constant on the host, else a TRANSPOSE node."""
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    if not isinstance(x, Value):
        return np.ascontiguousarray(np.transpose(x, perm))
    return b.emit(OpKind.TRANSPOSE, [x], tuple(x.shape[p] for p in perm), perm=perm)
