"""jaxpr -> graph IR: one interpreter loop, one rule per jaxpr primitive (keyed by name).

Equations whose inputs are all constants are evaluated on the spot (constant
folding, `lower.graph.fold`), unless that would blow a small constant up into a large one (a
broadcast stays a view of the small constant instead).  Calls (jit,
custom_jvp/vjp, closed_call, remat) are inlined.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from stagec.errors import LoweringError
from stagec.rule_tables import registrar

from .evaluate import EVAL_RULES
from .fold import fold
from .graph_ir import Graph, Node, OpKind, Step, Value, expr_dtype, storage_dtype


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


RULES = {}


rule = registrar(RULES)


def canonicalize(closed: ClosedJaxpr) -> Graph:
    b = GraphBuilder()
    inputs = [b.value(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    outs = _interpret(b, closed.jaxpr, closed.consts, inputs)
    outputs = []
    for o in outs:
        if not isinstance(o, Value) or o in inputs or o.id in b.constants or o in outputs:
            # An output must be produced by a node of its own: copy it.
            o = b.elementwise([o], (Step("copy", (0,)),), np.shape(o) if not isinstance(o, Value) else o.shape)
        outputs.append(o)
    return b.finish(inputs, outputs)


_CALL_JAXPR_PARAMS = ("call_jaxpr", "jaxpr", "fun_jaxpr")


def _interpret(b: GraphBuilder, jaxpr, consts, args):
    env = {}

    def read(v):
        return np.asarray(v.val) if isinstance(v, Literal) else env[v]

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
            outs = _interpret(b, sub.jaxpr, sub.consts, ins[len(ins) - len(sub.jaxpr.invars):])
        elif all(not isinstance(x, Value) for x in ins) and _foldable(eqn, ins):
            outs = fold(eqn, ins)
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
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _foldable(eqn, ins) -> bool:
    out_size = sum(math.prod(v.aval.shape) for v in eqn.outvars)
    in_size = sum(np.size(x) for x in ins)
    if eqn.primitive.name == "broadcast_in_dim":   # a real broadcast stays a (free) stride-0 view
        return out_size == in_size
    return out_size <= 2 * in_size + 4096


def _out_shape(eqn):
    return eqn.outvars[0].aval.shape


# --- elementwise -------------------------------------------------------------------------------

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "max": "max", "min": "min"}
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid",
          "erf": "erf", "sqrt": "sqrt", "rsqrt": "rsqrt"}


def _is_const(x, c: float) -> bool:
    return not isinstance(x, Value) and np.size(x) == 1 and float(np.asarray(x).reshape(())) == c


def _is_zero(x) -> bool:
    return _is_const(x, 0.0)


@rule(*_BINARY)
def binary(b, eqn, x, y):
    name = eqn.primitive.name
    if name == "max" and (_is_zero(x) or _is_zero(y)):
        return b.elementwise([y if _is_zero(x) else x], (Step("relu", (0,)),), _out_shape(eqn))
    if name == "mul" and _dtype_of(x) == _dtype_of(y) == "float32":   # x * 1 is x, exactly (attention's scale 1)
        for v, one in ((x, y), (y, x)):
            if _is_const(one, 1.0) and isinstance(v, Value) and v.shape == tuple(_out_shape(eqn)):
                return v
    return b.elementwise([x, y], (Step(_BINARY[name], (0, 1)),), _out_shape(eqn))


@rule("div")
def div(b, eqn, x, y):
    if not isinstance(y, Value):    # division by a constant: multiply by its reciprocal
        return b.elementwise([x, (1.0 / np.asarray(y, np.float64)).astype(np.float32)], (Step("mul", (0, 1)),),
                             _out_shape(eqn))
    if y.size < math.prod(_out_shape(eqn)):   # a broadcast divisor (softmax's row sums): one reciprocal per row
        return b.elementwise([x, b.elementwise([y], (Step("recip", (0,)),), y.shape)], (Step("mul", (0, 1)),),
                             _out_shape(eqn))
    return b.elementwise([x, y], (Step("recip", (1,)), Step("mul", (0, 2))), _out_shape(eqn))


@rule(*_UNARY)
def unary(b, eqn, x):
    return b.elementwise([x], (Step(_UNARY[eqn.primitive.name], (0,)),), _out_shape(eqn))


@rule("erfc")
def erfc(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("erf", (0,)), Step("sub", (1, 2))), _out_shape(eqn))


# NOTE: the vector unit has exp and log, not expm1 and log1p: these keep the absolute error of one
# rounding of 1.0 (6e-8), not the relative accuracy of the fused functions near 0 -- as activations
# (ELU, SELU, softplus, mish) use them, next to values of order 1.
@rule("expm1")
def expm1(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("exp", (0,)), Step("sub", (2, 1))), _out_shape(eqn))


@rule("log1p")
def log1p(b, eqn, x):
    return b.elementwise([x, np.float32(1.0)], (Step("add", (0, 1)), Step("log", (2,))), _out_shape(eqn))


@rule("square")
def square(b, eqn, x):
    return b.elementwise([x], (Step("mul", (0, 0)),), _out_shape(eqn))


@rule("integer_pow")
def integer_pow(b, eqn, x):
    y = eqn.params["y"]
    if y == 0 or abs(y) > 8:
        raise LoweringError(f"integer_pow with exponent {y}")
    steps = [Step("copy", (0,))] if abs(y) == 1 else [Step("mul", (0, 0))]
    for _ in range(abs(y) - 2):
        steps.append(Step("mul", (len(steps), 0)))   # the previous step times the input
    if y < 0:
        steps.append(Step("recip", (len(steps),)))
    return b.elementwise([x], steps, _out_shape(eqn))


@rule("copy", "copy_p", "stop_gradient", "reduce_precision", "optimization_barrier")
def identity(b, eqn, *xs):
    return list(xs) if eqn.primitive.multiple_results else xs[0]


def _dtype_of(x) -> str:
    return x.dtype if isinstance(x, Value) else storage_dtype(np.asarray(x).dtype)


@rule("convert_element_type")
def convert_element_type(b, eqn, x):
    to = np.dtype(eqn.params["new_dtype"])
    src = eqn.invars[0].aval.dtype
    if to == np.bool_:    # x != 0, held as 0/1
        steps = (Step("cmp_ne", (0, 1)),) if _dtype_of(x) == "float32" else (Step("cmp_ne", (0, 1)),
                                                                               Step("to_f32", (2,)))
        return b.elementwise([x, np.zeros((), src)], steps, _out_shape(eqn))
    if storage_dtype(to) == _dtype_of(x):
        return x
    return b.elementwise([x], (Step("to_" + {"float32": "f32", "int32": "i32"}[storage_dtype(to)], (0,)),),
                         _out_shape(eqn))


_COMPARISONS = {"gt": ("cmp_gt", False), "ge": ("cmp_ge", False), "lt": ("cmp_gt", True), "le": ("cmp_ge", True),
                "eq": ("cmp_eq", False), "ne": ("cmp_ne", False)}


@rule(*_COMPARISONS)
def compare(b, eqn, x, y):
    func, swap = _COMPARISONS[eqn.primitive.name]
    steps = [Step(func, (1, 0) if swap else (0, 1))]
    if _dtype_of(x) == "int32":   # the result is a boolean, held as float32 0/1
        steps.append(Step("to_f32", (2,)))
    return b.elementwise([x, y], steps, _out_shape(eqn))


@rule("select_n")
def select_n(b, eqn, pred, *cases):
    if len(cases) != 2:
        raise LoweringError(f"select_n with {len(cases)} cases (equation `{eqn}`)")
    steps = [Step("select", (0, 1, 2))]
    if _dtype_of(cases[1]) == "int32" and _dtype_of(pred) == "float32":   # one type per vector instruction
        steps = [Step("to_i32", (0,)), Step("select", (3, 1, 2))]
    return b.elementwise([pred, *cases], steps, _out_shape(eqn))


@rule("and", "or", "not")
def logical(b, eqn, *xs):
    if eqn.invars[0].aval.dtype != np.bool_:
        raise LoweringError(f"bitwise {eqn.primitive.name} on integers (equation `{eqn}`)")
    if eqn.primitive.name == "not":   # booleans are 0/1
        return b.elementwise([np.float32(1.0), xs[0]], (Step("sub", (0, 1)),), _out_shape(eqn))
    return b.elementwise(list(xs), (Step("mul" if eqn.primitive.name == "and" else "max", (0, 1)),), _out_shape(eqn))


@rule("clamp")
def clamp(b, eqn, lo, x, hi):
    return b.elementwise([x, lo, hi], (Step("max", (0, 1)), Step("min", (3, 2))), _out_shape(eqn))


@rule("gather")
def gather(b, eqn, table, indices):
    """XLA gathers of whole slices by index (embedding lookups, take, advanced indexing,
    take_along_axis): the indexed dims of the table become one row dim, the index vectors one flat
    row number, and the rest is a GATHER of rows. A batching dim (take_along_axis' other axes) is an
    indexed dim whose index is the position along the indices' matching dim."""
    dn, sizes = eqn.params["dimension_numbers"], tuple(eqn.params["slice_sizes"])
    shape, ishape = np.shape(table), np.shape(indices)
    batching = tuple(dn.operand_batching_dims)
    indexed = tuple(dn.start_index_map) + batching
    rest = [d for d in range(len(shape)) if d not in indexed]
    if (sorted(dn.collapsed_slice_dims) != sorted(dn.start_index_map)
            or any(sizes[d] != 1 for d in indexed) or any(sizes[d] != shape[d] for d in rest)):
        raise LoweringError(f"gather of partial slices (equation `{eqn}`)")
    rows = math.prod(shape[d] for d in indexed)
    width = math.prod(shape[d] for d in rest)
    flat = reshape_value(b, transpose_value(b, table, list(indexed) + rest), (rows, width))
    batch = ishape[:-1]
    parts = [reshape_value(b, _slice_last(b, indices, k), batch) for k in range(len(dn.start_index_map))]
    parts += [np.broadcast_to(np.arange(batch[d], dtype=np.int32).reshape([-1 if a == d else 1 for a in range(
        len(batch))]), batch) for d in dn.start_indices_batching_dims]
    row = parts[0]
    for k in range(1, len(indexed)):   # row-major: row = ((i0 * d1) + i1) * d2 + i2 ...
        if isinstance(row, Value) or isinstance(parts[k], Value):
            row = b.elementwise([row, np.int32(shape[indexed[k]]), parts[k]],
                                (Step("mul", (0, 1)), Step("add", (3, 2))), batch)
        else:
            row = row * np.int32(shape[indexed[k]]) + parts[k]
    out = b.emit(OpKind.GATHER, [flat, row], (*batch, width))
    out = reshape_value(b, out, (*batch, *(shape[d] for d in rest)))
    # XLA puts the slice dims at offset_dims among the batch dims
    offset = list(dn.offset_dims)
    order = [d for d in range(len(batch) + len(rest)) if d not in offset]
    perm = [0] * (len(batch) + len(rest))
    for i, d in enumerate(order):
        perm[d] = i
    for i, d in enumerate(offset):
        perm[d] = len(batch) + i
    return transpose_value(b, out, perm)


def _slice_last(b, x, k):
    if not isinstance(x, Value):
        return np.asarray(x)[..., k]
    shape = x.shape
    return b.emit(OpKind.SLICE, [x], (*shape[:-1], 1), start=(0,) * (len(shape) - 1) + (k,),
                  limit=shape[:-1] + (k + 1,), step=(1,) * len(shape))


# --- scatter -------------------------------------------------------------------------------------
# A scatter with constant indices is a gather with a constant index map. The operand is cut into
# rows (the widest trailing block the scatter moves whole), then:
# - overwrite: each output row is one row of concat(operand rows, update rows): one GATHER;
# - combine (add, mul, min, max): layer j holds, for each output row, its j-th incoming update row
#   (or a row of the combiner's identity), gathered and combined with the operand elementwise: one
#   GATHER and one vector pass per layer, as many layers as the most updates one row receives --
#   one for index_add, index_put(accumulate=True) and scatter_add of distinct indices. (A matmul by a
#   constant 0/1 matrix would cost operand rows x update rows MACs and a constant of that size.)

_SCATTER_COMBINERS = {"scatter-add": ("add", 0), "scatter-mul": ("mul", 1), "scatter-min": ("min", np.inf),
                      "scatter-max": ("max", -np.inf)}


@rule("scatter", *_SCATTER_COMBINERS)
def scatter(b, eqn, operand, indices, updates):
    indices = b.constant_of(indices)
    if indices is None:
        raise LoweringError(f"{eqn.primitive.name} with indices computed from the model's inputs (equation `{eqn}`, "
                            f"in {b.scope or 'the top level'}): stagec lowers scatters with constant indices only")
    shape = tuple(eqn.invars[0].aval.shape)
    targets = _scatter_targets(eqn, indices)
    width = _row_width(shape, targets)
    n_rows = math.prod(shape) // width
    rows = reshape_value(b, operand, (n_rows, width))
    update_rows = reshape_value(b, updates, (targets.size // width, width))
    row_targets = targets[::width] // width   # a dropped row stays -1
    if eqn.primitive.name == "scatter":
        out = _overwrite(b, rows, update_rows, row_targets)
    else:
        out = _combine(b, *_SCATTER_COMBINERS[eqn.primitive.name], rows, update_rows, row_targets)
    return reshape_value(b, out, shape)


def _scatter_targets(eqn, indices) -> np.ndarray:
    """The flat operand position each update element (row-major) lands on, -1 where the scatter drops
    it: JAX's own transpose of the scatter (a gather) applied to the positions, counted from 1 in
    float32 (exact below 2**24)."""
    operand, _, updates = (v.aval for v in eqn.invars)
    if operand.size >= 2**24:
        raise LoweringError(f"{eqn.primitive.name} into {operand.size} elements (at most 2**24; equation `{eqn}`)")
    p = eqn.params

    def scatter_add(u):
        return lax.scatter_add(jnp.zeros(operand.shape, jnp.float32), indices, u, p["dimension_numbers"],
                               mode=p["mode"])
    _, transpose = jax.vjp(scatter_add, jnp.zeros(updates.shape, jnp.float32))
    (landed,) = transpose(np.arange(1, operand.size + 1, dtype=np.float32).reshape(operand.shape))
    return np.asarray(landed).astype(np.int64).ravel() - 1


def _row_width(shape, targets: np.ndarray) -> int:
    """The widest trailing block of the operand that every run of update elements fills whole."""
    for k in range(len(shape) + 1):
        width = math.prod(shape[k:])
        if targets.size % width:
            continue
        runs = targets.reshape(-1, width)
        whole = (runs[:, :1] % width == 0) & (runs == runs[:, :1] + np.arange(width)).all(1, keepdims=True)
        if (whole | (runs == -1).all(1, keepdims=True)).all():
            return width
    raise AssertionError("a width of 1 always fits")


def _overwrite(b, rows, update_rows, row_targets):
    n_rows = np.shape(rows)[0]
    source = np.arange(n_rows)   # output row i is row source[i] of concat(operand rows, update rows)
    landed = np.flatnonzero(row_targets >= 0)
    source[row_targets[landed]] = n_rows + landed
    if (source < n_rows).all():
        return rows
    if (source >= n_rows).all():   # every row overwritten: the operand is not read
        table, source = update_rows, source - n_rows
    else:
        table = b.emit(OpKind.CONCAT, [rows, update_rows], (n_rows + np.shape(update_rows)[0], np.shape(rows)[1]),
                       axis=0)
    return b.emit(OpKind.GATHER, [table, source.astype(np.int32)], np.shape(rows))


def _combine(b, func, identity, rows, update_rows, row_targets):
    n_rows, width = np.shape(rows)
    n_updates = np.shape(update_rows)[0]
    landed = np.flatnonzero(row_targets >= 0)
    order = landed[np.argsort(row_targets[landed], kind="stable")]
    target = row_targets[order]
    rank = np.arange(target.size) - np.searchsorted(target, target)   # among the updates to the same row
    layers = np.full((rank.max(initial=-1) + 1, n_rows), n_updates, np.int32)   # n_updates: the identity row
    layers[rank, target] = order
    dtype = _dtype_of(update_rows)
    if dtype == "int32" and np.isinf(identity):
        identity = np.iinfo(np.int32).min if identity < 0 else np.iinfo(np.int32).max
    table = b.emit(OpKind.CONCAT, [update_rows, np.full((1, width), identity, dtype)], (n_updates + 1, width), axis=0)
    out = rows
    for layer in layers:
        out = b.elementwise([out, b.emit(OpKind.GATHER, [table, layer], (n_rows, width))], (Step(func, (0, 1)),),
                            (n_rows, width))
    return out


# --- data movement -----------------------------------------------------------------------------

@rule("broadcast_in_dim")
def broadcast_in_dim(b, eqn, x):
    shape, dims = tuple(eqn.params["shape"]), tuple(eqn.params["broadcast_dimensions"])
    if np.shape(x) == shape:
        return x
    return b.emit(OpKind.BROADCAST, [x], shape, dims=dims)


def reshape_value(b, x, shape):
    shape = tuple(int(d) for d in shape)
    if np.shape(x) == shape:
        return x
    if not isinstance(x, Value):
        return np.reshape(x, shape)
    return b.emit(OpKind.RESHAPE, [x], shape)


def transpose_value(b, x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    if not isinstance(x, Value):
        return np.ascontiguousarray(np.transpose(x, perm))
    return b.emit(OpKind.TRANSPOSE, [x], tuple(x.shape[p] for p in perm), perm=perm)


@rule("reshape")
def reshape(b, eqn, x, *dyn):
    return reshape_value(b, x, eqn.params["new_sizes"])


@rule("squeeze", "expand_dims")
def squeeze(b, eqn, x):
    return reshape_value(b, x, _out_shape(eqn))


@rule("transpose")
def transpose(b, eqn, x):
    return transpose_value(b, x, eqn.params["permutation"])


@rule("slice")
def slice_(b, eqn, x):
    p = eqn.params
    step = tuple(p["strides"] or (1,) * len(p["start_indices"]))
    return b.emit(OpKind.SLICE, [x], _out_shape(eqn), start=tuple(p["start_indices"]),
                  limit=tuple(p["limit_indices"]), step=step)


@rule("pad")
def pad(b, eqn, x, value):
    config = [tuple(int(n) for n in axis) for axis in eqn.params["padding_config"]]   # jnp.pad gives numpy ints
    if any(interior for _, _, interior in config):
        raise LoweringError(f"pad with interior padding (equation `{eqn}`)")
    shape = np.shape(x)
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):   # negative padding crops: a slice first
        cropped = tuple(d + min(lo, 0) + min(hi, 0) for d, (lo, hi, _) in zip(shape, config, strict=True))
        x = b.emit(OpKind.SLICE, [x], cropped,
                   start=tuple(max(-lo, 0) for lo, _, _ in config),
                   limit=tuple(d - max(-hi, 0) for d, (_, hi, _) in zip(shape, config, strict=True)),
                   step=(1,) * len(shape))
    return b.emit(OpKind.PAD, [x], _out_shape(eqn), lo=tuple(max(lo, 0) for lo, _, _ in config),
                  hi=tuple(max(hi, 0) for _, hi, _ in config), value=float(np.asarray(value)))


@rule("concatenate")
def concatenate(b, eqn, *xs):
    return b.emit(OpKind.CONCAT, list(xs), _out_shape(eqn), axis=int(eqn.params["dimension"]))


# --- reductions and pooling --------------------------------------------------------------------

@rule("reduce_sum", "reduce_max", "reduce_min")
def reduce(b, eqn, x):
    return b.emit(OpKind.REDUCE, [x], _out_shape(eqn), func=eqn.primitive.name.split("_")[1],
                  axes=tuple(sorted(int(a) for a in eqn.params["axes"])))


@rule("cumsum")
def cumsum(b, eqn, x):
    """A running sum along an axis of length n: a MATMUL by the constant n x n 0/1 triangle (n MACs an
    element on the array), in float32 (integers, e.g. a mask's running count, are exact below 2**24)."""
    ax, shape = eqn.params["axis"], _out_shape(eqn)
    n = shape[ax]
    triangle = np.triu(np.ones((n, n), np.float32))   # out[j] = sum of x[i] for i <= j
    if eqn.params["reverse"]:
        triangle = triangle.T
    rest = [d for d in range(len(shape)) if d != ax]
    rows = reshape_value(b, transpose_value(b, x, rest + [ax]), (math.prod(shape[d] for d in rest), n))
    integer = _dtype_of(x) == "int32"
    if integer:
        rows = b.elementwise([rows], (Step("to_f32", (0,)),), np.shape(rows))
    out = b.emit(OpKind.MATMUL, [rows, triangle], np.shape(rows))
    if integer:
        out = b.elementwise([out], (Step("to_i32", (0,)),), np.shape(rows))
    out = reshape_value(b, out, tuple(shape[d] for d in rest) + (n,))
    return transpose_value(b, out, tuple(int(i) for i in np.argsort(rest + [ax])))


@rule("reduce_window_max", "reduce_window_sum")
def reduce_window(b, eqn, x):
    """Canonical POOL: the window on the last two dims, any leading dims."""
    p = eqn.params
    if any(d != 1 for d in p["base_dilation"]):
        raise LoweringError(f"reduce_window with base dilation (equation `{eqn}`)")
    window, strides, dilation = p["window_dimensions"], p["window_strides"], p["window_dilation"]
    padding = tuple(tuple(pd) for pd in p["padding"])
    rank, out = len(x.shape), _out_shape(eqn)
    active = [d for d in range(rank) if window[d] != 1 or strides[d] != 1 or padding[d] != (0, 0)]
    if len(active) > 2:
        raise LoweringError(f"pooling over {len(active)} dims (equation `{eqn}`)")
    rest = [d for d in range(rank) if d not in active]
    perm = rest + active
    unit = (1,) * (2 - len(active))

    def param(values, default):
        return (default,) * len(unit) + tuple(values[d] for d in active)

    xt = reshape_value(b, transpose_value(b, x, perm), tuple(x.shape[d] for d in rest) + unit
                       + tuple(x.shape[d] for d in active))
    y = b.emit(OpKind.POOL, [xt], tuple(out[d] for d in rest) + unit + tuple(out[d] for d in active),
               func=eqn.primitive.name.split("_")[-1], window=param(window, 1), strides=param(strides, 1),
               padding=param(padding, (0, 0)), dilation=param(dilation, 1))
    yt = reshape_value(b, y, tuple(out[d] for d in perm))
    return transpose_value(b, yt, tuple(int(i) for i in np.argsort(perm)))


# --- matrix unit -------------------------------------------------------------------------------

@rule("dot_general")
def dot_general(b, eqn, lhs, rhs):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = np.shape(lhs), np.shape(rhs)
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    batch = [ls[d] for d in lb]
    m, k, n = (math.prod(ls[d] for d in lfree), math.prod(ls[d] for d in lc), math.prod(rs[d] for d in rfree))
    bsz = (math.prod(batch),) if batch else ()
    a = reshape_value(b, transpose_value(b, lhs, list(lb) + lfree + list(lc)), bsz + (m, k))
    w = reshape_value(b, transpose_value(b, rhs, list(rb) + list(rc) + rfree), bsz + (k, n))
    y = b.emit(OpKind.MATMUL, [a, w], bsz + (m, n))
    return reshape_value(b, y, _out_shape(eqn))


@rule("conv_general_dilated")
def conv(b, eqn, x, w):
    p = eqn.params
    dn = p["dimension_numbers"]
    nsp = len(p["window_strides"])
    if nsp not in (1, 2):
        raise LoweringError(f"{nsp}-D convolution (equation `{eqn}`)")
    if any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
        raise LoweringError(f"transposed or batch-grouped convolution (equation `{eqn}`)")
    x = transpose_value(b, x, dn.lhs_spec)
    w = transpose_value(b, w, dn.rhs_spec)
    stride, dilation, padding = tuple(p["window_strides"]), tuple(p["rhs_dilation"]), tuple(map(tuple, p["padding"]))
    if nsp == 1:   # 1-D convolution is 2-D with a unit height
        x = reshape_value(b, x, (*np.shape(x)[:2], 1, np.shape(x)[2]))
        w = reshape_value(b, w, (*np.shape(w)[:2], 1, np.shape(w)[2]))
        stride, dilation, padding = (1, *stride), (1, *dilation), ((0, 0), *padding)
    if np.shape(w)[2:] == (1, 1) and any(st > 1 for st in stride) and not any(map(any, padding)):
        # A strided 1x1 conv reads every s-th pixel: as a strided view of its input (free), its
        # loads fetch only those pixels instead of whole rows (ResNet's downsampling shortcuts).
        shape = np.shape(x)
        x = b.emit(OpKind.SLICE, [x], (*shape[:2], *(-(-d // st) for d, st in zip(shape[2:], stride, strict=True))),
                   start=(0,) * 4, limit=tuple(shape), step=(1, 1, *stride))
        stride = (1, 1)
    out_spec_shape = _out_shape(eqn)
    canon = [out_spec_shape[d] for d in dn.out_spec]
    if nsp == 1:
        canon = [canon[0], canon[1], 1, canon[2]]
    y = b.emit(OpKind.CONV, [x, w], canon, stride=stride, padding=padding, dilation=dilation,
               groups=int(p["feature_group_count"]))
    if nsp == 1:
        y = reshape_value(b, y, [canon[0], canon[1], canon[3]])
    return transpose_value(b, y, tuple(int(i) for i in np.argsort(dn.out_spec)))
