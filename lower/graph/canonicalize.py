"""jaxpr -> graph IR: one interpreter loop, one rule per jaxpr primitive (keyed by name).

Equations whose inputs are all constants are evaluated on the spot (constant
folding, `lower.graph.fold`), unless that would blow a small constant up into a large one (a
broadcast stays a view of the small constant instead).  Calls (jit,
custom_jvp/vjp, closed_call, remat) are inlined.

The rules, one per primitive, are registered into builder.RULES by their families' modules:
elementwise math, comparisons, logic and casts (canonicalize_elementwise); gathers and scatters
(canonicalize_index); data movement (canonicalize_movement); reductions, running sums and pooling
(canonicalize_reduce); matmul and convolution (canonicalize_matrix).
"""

from __future__ import annotations

import math

import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from stagec.errors import LoweringError

from . import (  # noqa: F401 - imported for their registrations
    canonicalize_elementwise,
    canonicalize_index,
    canonicalize_matrix,
    canonicalize_movement,
    canonicalize_reduce,
)
from .builder import RULES, GraphBuilder
from .fold import fold
from .graph_ir import Graph, Step, Value, storage_dtype


def canonicalize(closed: ClosedJaxpr) -> Graph:
    b = GraphBuilder()
    inputs = [b.value(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    outs = _interpret(b, closed.jaxpr, closed.consts, inputs)
    outputs = []
    for i, o in enumerate(outs):
        if math.prod(np.shape(o)) == 0:
            raise LoweringError(f"output {i} has shape {list(np.shape(o))}, an empty tensor: stagec does not "
                                "lower empty outputs")
        if not isinstance(o, Value) or o in inputs or o.id in b.constants or o in outputs:
            # An output must be produced by a node of its own: copy it.
            o = b.elementwise([o], (Step("copy", (0,)),), np.shape(o) if not isinstance(o, Value) else o.shape)
        outputs.append(o)
    return b.finish(inputs, outputs)


_CALL_JAXPR_PARAMS = ("call_jaxpr", "jaxpr", "fun_jaxpr")


def _interpret(b: GraphBuilder, jaxpr, consts, args, views=None):
    env = {}
    # Value id -> (the host array, the size of its constant source) of each broadcast of a constant,
    # which stays a BROADCAST node: an equation over constants and these folds all the same (a mask
    # built from iota and a broadcast scalar), where its result is not much larger than the sources
    views = {} if views is None else views

    def read(v):
        return np.asarray(v.val) if isinstance(v, Literal) else env[v]

    def known(x) -> bool:
        return not isinstance(x, Value) or x.id in views

    def host(x):
        return views[x.id][0] if isinstance(x, Value) else x

    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = np.asarray(c)
    for var, a in zip(jaxpr.invars, args, strict=True):
        env[var] = a
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        call = next((eqn.params[p] for p in _CALL_JAXPR_PARAMS if p in eqn.params), None)
        scope = str(getattr(eqn.source_info, "name_stack", "")) or b.scope
        if call is not None:
            sub = call if isinstance(call, ClosedJaxpr) else ClosedJaxpr(call, ())
            outs = _interpret(b, sub.jaxpr, sub.consts, ins[len(ins) - len(sub.jaxpr.invars):], views)
        elif all(map(known, ins)) and _foldable(eqn, ins, views):
            outs = fold(eqn, [host(x) for x in ins])
        elif all(math.prod(v.aval.shape) == 0 for v in eqn.outvars):   # an empty slice: nothing to compute
            outs = [np.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
        else:
            if name not in RULES:
                raise LoweringError(f"Unimplemented primitive in stagec lowering: {name} "
                                    f"(equation `{eqn}`, in {scope or 'the top level'})")
            for v in eqn.outvars:
                try:
                    storage_dtype(v.aval.dtype)
                except NotImplementedError as e:
                    raise LoweringError(f"{name}: {e} (equation `{eqn}`, in {scope or 'the top level'})") from None
            b.scope = scope
            outs = RULES[name](b, eqn, *ins)
            outs = outs if eqn.primitive.multiple_results else [outs]
            if name == "broadcast_in_dim" and isinstance(outs[0], Value) and all(map(known, ins)):
                views[outs[0].id] = (fold(eqn, [host(x) for x in ins])[0], _size(ins[0], views))
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _size(x, views) -> int:
    """The elements behind a constant operand: a broadcast's, its source's."""
    return views[x.id][1] if isinstance(x, Value) else np.size(x)


def _foldable(eqn, ins, views) -> bool:
    out_size = sum(math.prod(v.aval.shape) for v in eqn.outvars)
    in_size = sum(_size(x, views) for x in ins)
    if eqn.primitive.name == "broadcast_in_dim":   # a real broadcast stays a (free) stride-0 view
        return out_size == in_size
    return out_size <= 2 * in_size + 4096
