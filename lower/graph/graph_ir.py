"""The graph IR: a few accelerator-meaningful ops over SSA values, on one screen.

    op           inputs                         attrs
    CONV         x[N,C,H,W], w[O,C/g,KH,KW], e* stride, padding ((lo,hi),(lo,hi)), dilation, groups, epilogue
    MATMUL       a[B,M,K], b[B,K,N], e*          epilogue              (B may be absent: a[M,K], b[K,N])
    ELEMENTWISE  i*   (numpy-broadcast to out)   expr
    REDUCE       x                               func (sum|max|min), axes
    POOL         x[...,H,W]                      func (max|sum), window, strides, padding, dilation
    GATHER       table[R,...], idx[...] (int32)  (rows of the table: an embedding lookup)
    BROADCAST    x                               dims (out axis of each input axis)      - a view
    RESHAPE      x                                                                       - a view if it can be
    TRANSPOSE    x                               perm                                    - a view
    SLICE        x                               start, limit, step                      - a view
    PAD          x                               lo, hi, value
    CONCAT       x*                              axis

Values are float32 or int32; booleans are float32 0/1 (a comparison's result);
int8 holds quantized tensors (lower.graph.quantize), whose CONV/MATMUL/POOL/REDUCE
accumulate in int32.  `expr` is a tuple of Steps; a step's argument k <
len(inputs) names input k, k >= len(inputs) names step k - len(inputs); the
last step is the result.  An `epilogue` is an expr whose input 0 is the
CONV/MATMUL result and whose other inputs are the node's trailing inputs `e*`:
it runs on the accumulator tile before the store, so the result never
round-trips through DRAM.  `requant(x, r)` takes int32 x to int8 (isa REQUANT):
r is an int32 constant of shape [..., 8] whose leading dims broadcast to x, one
record (multiplier, shift, zero point, saturation bounds, bias, three zeros) per element: an int8
conv's bias is its records' (TFLite adds the int32 bias before the fixed-point multiply).  `lut(x, t)`
takes int8 x to int8 t[x + 128] (isa LUT): t is one int8 table of 256 entries.
`rescale(x, r)` takes int8 or int32 x to int32 (isa RESCALE, TFLite Add's input scaling):
records (multiplier, shift, zero point, left shift, four zeros), x shifted left first, the result not
saturated to int8.  `clamp(x, r)` takes float32 x to min(max(x + bias, lo), hi) (isa CLAMP), a float
layer's bias and ReLU/ReLU6/hardtanh in one step (lower.graph.clamp): r is the layer's one float32 table
(lo, hi, 0, 0, then the biases) shaped as the bias with its channel axis CLAMP_HEADER_WORDS longer
(`clamp_table_parts`).  The second operands of all four are records (`RECORDS`): constants whose last dim
is the record's, but a clamp's table, one for the node.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import CLAMP_HEADER_WORDS, LUT_ENTRIES, REQUANT_RECORD_BYTES


class OpKind(enum.StrEnum):
    CONV = "conv"
    MATMUL = "matmul"
    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    POOL = "pool"
    GATHER = "gather"
    BROADCAST = "broadcast"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    PAD = "pad"
    CONCAT = "concat"


MATRIX_OPS = frozenset({OpKind.CONV, OpKind.MATMUL})
MOVEMENT_OPS = frozenset({OpKind.BROADCAST, OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.PAD,
                          OpKind.CONCAT})


@dataclass(frozen=True)
class Step:
    func: str                 # a VectorFunc name, lower case (add, mul, relu, exp, recip, cmp_gt, requant, ...),
    args: tuple[int, ...]     # or select(pred, on_false, on_true), to_f32, to_i32 (conversions), mul_i32


Expr = tuple[Step, ...]


@dataclass(frozen=True)
class Value:
    id: int
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"%{self.id}"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Node:
    op: OpKind
    inputs: tuple[Value, ...]
    output: Value
    attrs: tuple[tuple[str, object], ...] = ()
    name: str = ""

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)

    def with_attrs(self, **changes) -> Node:
        attrs = dict(self.attrs)
        attrs.update(changes)
        return Node(self.op, self.inputs, self.output, tuple(sorted(attrs.items())), self.name)


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    constants: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # Value.id -> ndarray

    def __reduce__(self):
        # NOTE: a mappingproxy does not pickle; a graph does (stagec.sweeps ships one to its workers)
        return _graph_of, (self.inputs, self.outputs, self.nodes, dict(self.constants))

    def fresh_ids(self) -> itertools.count:
        """Value ids no value of this graph has, for a pass's new values."""
        return itertools.count(1 + max([v.id for n in self.nodes for v in (*n.inputs, n.output)]
                                       + [v.id for v in self.inputs] + list(self.constants)))

    def __str__(self) -> str:
        lines = [f"graph({', '.join(f'{v}: {_ty(v)}' for v in self.inputs)}) {{"]
        for vid, arr in self.constants.items():
            lines.append(f"  %{vid} = const {_ty_of(arr)}")
        for n in self.nodes:
            attrs = " ".join(f"{k}={_fmt(v, n)}" for k, v in n.attrs)
            args = ", ".join(str(v) for v in n.inputs)
            lines.append(f"  {n.output} = {n.op.value}({args}) {attrs} : {_ty(n.output)}  # {n.name}".rstrip())
        lines.append(f"  return {', '.join(str(v) for v in self.outputs)}")
        lines.append("}")
        return "\n".join(lines)

    def consumers(self) -> dict[int, list[Node]]:
        uses: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                uses.setdefault(v.id, []).append(n)
        return uses

    def producer(self) -> dict[int, Node]:
        return {n.output.id: n for n in self.nodes}


def value_names(graph: Graph) -> dict[int, str]:
    """Value id -> the name a pass gives what it adds for the value: its node's, or for the graph's
    inputs `input` (one) or `input<i>`, so that two inputs' QUANTIZE nodes are named apart."""
    inputs = {v.id: "input" if len(graph.inputs) == 1 else f"input{i}" for i, v in enumerate(graph.inputs)}
    return inputs | {n.output.id: n.name for n in graph.nodes}


def check_graph(graph: Graph, after: str) -> None:
    """That `graph` is well formed after pass `after`: every value defined once, before its readers (an
    input, a constant or an earlier node's result), and every node named apart (the schedule and the
    program key layers by name).  A pass that breaks this is a compiler bug: an internal error naming
    the pass, rather than a KeyError or a wrong layer's tiling several stages later."""
    defined = {v.id for v in graph.inputs} | set(graph.constants)
    names = set()
    for n in graph.nodes:
        missing = [v for v in n.inputs if v.id not in defined]
        if missing:
            raise AssertionError(f"internal error: after {after}, {n.name} reads {missing[0]}, which nothing "
                                 f"before it defines")
        if n.output.id in defined:
            raise AssertionError(f"internal error: after {after}, {n.name} defines {n.output} a second time")
        if n.name in names:
            raise AssertionError(f"internal error: after {after}, two nodes are named {n.name}")
        defined.add(n.output.id)
        names.add(n.name)
    missing = [v for v in graph.outputs if v.id not in defined]
    if missing:
        raise AssertionError(f"internal error: after {after}, the graph returns {missing[0]}, which nothing defines")


def _graph_of(inputs, outputs, nodes, constants: dict) -> Graph:
    return Graph(inputs, outputs, nodes, MappingProxyType(constants))


def format_expr(expr: Expr, n_inputs: int) -> str:
    def ref(k):
        return f"i{k}" if k < n_inputs else f"t{k - n_inputs}"
    return "{" + "; ".join(f"t{j}={s.func}({','.join(ref(a) for a in s.args)})" for j, s in enumerate(expr)) + "}"


def _ty(v: Value) -> str:
    return f"{v.dtype}[{','.join(map(str, v.shape))}]"


def _ty_of(a: np.ndarray) -> str:
    return f"{a.dtype}[{','.join(map(str, a.shape))}]"


CONVERSIONS = {"to_f32": "float32", "to_i32": "int32"}
# result type not the first's; mul_i32: int8 x int8 -> int32 (MUL's widening form)
RESULT_DTYPES = {**CONVERSIONS, "requant": "int8", "lut": "int8", "rescale": "int32", "mul_i32": "int32"}
VECTOR_FUNC_OF = {**dict.fromkeys(CONVERSIONS, "copy"), "mul_i32": "mul"}   # steps not named as their VectorFunc
RECORD_WORDS = REQUANT_RECORD_BYTES // 4             # int32 words of one requant or rescale record
RECORDS = {"requant": RECORD_WORDS, "rescale": RECORD_WORDS, "lut": LUT_ENTRIES,   # steps reading records: words
           "clamp": 0}   # 0: one table, the whole value
RECORD_DTYPES = {"requant": "int32", "rescale": "int32", "lut": "int8", "clamp": "float32"}


def storage_dtype(dtype) -> str:
    """How a JAX element type is held: floats as float32, booleans as float32 0/1, integers as int32."""
    dt = np.dtype(dtype)
    if dt == np.bool_ or dt == np.float32:
        return "float32"
    if np.issubdtype(dt, np.integer):
        return "int32"
    raise LoweringError(f"element type {dt} is not lowered yet (float32, int32 and bool are)")


def expr_dtype(expr: Expr, input_dtypes) -> list[str]:
    """The dtype of every input and step value of an expr."""
    dtypes = list(input_dtypes)
    for s in expr:
        dtypes.append(RESULT_DTYPES.get(s.func) or dtypes[s.args[2] if s.func == "select" else s.args[0]])
    return dtypes


def record_words(expr: Expr) -> dict[int, int]:
    """{expr argument read as records (a requant's or a lut's second argument): words per record}."""
    return {s.args[1]: RECORDS[s.func] for s in expr or () if s.func in RECORDS}


def record_inputs(expr: Expr) -> frozenset[int]:
    """The expr arguments read as records (`record_words`)."""
    return frozenset(record_words(expr))


def check_records(node: Node) -> None:
    """Each record operand of `node`'s expr or epilogue is what its step reads: int32 requant records
    [..., RECORD_WORDS]; one int8 lut table of exactly 256 entries (isa LUT reads one table per instruction);
    one float32 clamp table, a header and one bias or more along its one axis longer than 1."""
    expr, first = (node.attr("epilogue"), 1) if node.op in MATRIX_OPS else (node.attr("expr"), 0)
    for s in expr or ():
        if s.func not in RECORDS or s.args[1] >= expr_inputs(node) or (s.args[1] == 0 and first):
            continue
        v = node.inputs[s.args[1] + first]
        shape = (LUT_ENTRIES,) if s.func == "lut" else v.shape[:-1] + (RECORDS[s.func],)
        if s.func == "clamp":
            shape = clamp_table_shape(v.shape)
        if v.dtype != RECORD_DTYPES[s.func] or v.shape != shape:
            what = "a lut table" if s.func == "lut" else f"{s.func} records"
            raise LoweringError(f"{node.name}: {what} must be {RECORD_DTYPES[s.func]}[{','.join(map(str, shape))}], "
                                f"not {_ty(v)}")


def clamp_table_shape(shape) -> tuple:
    """`shape` as a clamp table's must be (its one axis longer than 1 at least CLAMP_HEADER_WORDS + 1 long):
    itself where it is one, else the shape it comes nearest (what check_records names)."""
    shape = tuple(shape) or (1,)
    axis = int(np.argmax(shape))
    return tuple(max(d, CLAMP_HEADER_WORDS + 1) if k == axis else 1 for k, d in enumerate(shape))


def clamp_table_parts(xp, table):
    """(lo, hi, biases) of a clamp table: lo, hi, 0, 0, then the biases along its one axis longer than 1
    (the bias's channel axis, broadcasting as the bias did; one 0 without a bias)."""
    axis = int(np.argmax(table.shape))
    flat = table.reshape(-1)
    return flat[0], flat[1], xp.take(table, np.arange(CLAMP_HEADER_WORDS, table.shape[axis]), axis=axis)


def expr_inputs(node: Node) -> int:
    """How many inputs an expr attribute of `node` refers to (an epilogue's input 0 is the accumulator)."""
    return len(node.inputs) if node.op == OpKind.ELEMENTWISE else len(node.inputs) - 1


def _fmt(v, node: Node) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], Step):
        return format_expr(v, expr_inputs(node))
    return str(v).replace(" ", "")
