"""Row cascades: a chain of vector layers over the same rows (a residual add -> layer norm's
statistics and normalization) run in one pass per block of rows, its intermediates never in DRAM.

A layer norm lowers to six vector layers (the row sum, the mean, the squared deviations, their row
sum, the inverse deviation, the normalization with its affine), led by the residual add that feeds
it: layer by layer the sum goes to DRAM and comes back three times, the deviations once.  Here
the layers are members of one cascade over an (R, C) space (R rows, the leading dims flattened;
C the last dim): each member an ELEMENTWISE whose result is full (R, C) or one per row (R, 1), or
a REDUCE (sum, max) over the last dim; each reads the earlier members' results (through views
that emit nothing) or values from outside, full, one per row, one per column (a layer norm's
weight and bias) or a scalar.  Per block of `tile[0]` rows the outside full and per-row values
are LOADed, every member computes its block in the scratchpad, and only the results read outside
the cascade (or returned) are STOREd: a pre-norm transformer's residual sum keeps its store, its
re-reads go.  float32, or an int8 graph's float islands and a bf16 graph (each value the layers keep bf16
rounded to bf16 where their STORE rounds it; int8 values read from outside and an island's last
member quantizing its result to int8, its one requant record loaded once).  The only difference
from the layers is a row's summation order, so an island's int8 result may land one step apart
where a float lies on a rounding boundary.

`row_cost` counts the instructions lower.codegen.rowwise issues and composes them like the timing
simulator, the units overlapping; `choose_rows` searches the row block under the scratchpad and
takes the cascade where its objective beats a lower bound of the layers' own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from stagec.isa.instructions import MAX_COUNT, REQUANT_RECORD_BYTES, DType, Space, VectorFunc
from stagec.sim.costs import vector_instruction_cycles
from stagec.sim.energy import ActionCounts, energy_pj

from ..codegen import tile_expr  # the emitter's own expression plan, so both count the same temporaries
from ..graph.graph_ir import RECORDS, OpKind, record_inputs
from .buffers import Buffer, local_bytes, words
from .cascade import CascadeRecord
from .nest_cost import dma_cycles
from .search import INSTRUCTION_CHARGE, objective_of, tile_sizes
from .tensors import DTYPE_OF, local_type

F32 = 4
EXTERNAL = ("full", "row", "col", "scalar", "record")   # how an outside value is read: per block, or once
FLOATS = ("float32", "bfloat16")


@dataclass(frozen=True)
class RowCascade(CascadeRecord):
    """Vector layers (`layers`, node names) over `dims` (rows R, columns C) run per block of tile[0] rows."""

    layers: tuple[str, ...]
    tile: tuple[int, int]
    dims: tuple[int, int]
    saved_bytes: int
    mappings: tuple = ()          # its members keep their own tilings: the cascade's tile is its own

    def __str__(self) -> str:
        return (f"cascade {' -> '.join(self.layers)}: rows, block {self.tile[0]} x {self.tile[1]}, saves "
                f"{self.saved_bytes / 1024:.1f} KiB of DRAM")


class Arg(NamedTuple):
    """A member's operand: `kind` 'member' (an earlier member's result, `value` its id) or one of
    EXTERNAL (`value` the Value the member reads)."""

    kind: str
    value: object


class Member(NamedTuple):
    """A node of the cascade, its operands and whether its result is full ('full') or per row ('row')."""

    node: object
    args: tuple[Arg, ...]
    out: str


class RowPlan(NamedTuple):
    """A cascade's members, dims, the outside values it reads (id -> (kind, Value), first read
    first) and the member results it stores (ids)."""

    dims: tuple[int, int]
    members: tuple[Member, ...]
    externals: dict
    stored: frozenset

    def count(self, kind: str) -> int:
        return sum(k == kind for k, _ in self.externals.values())

    def results(self, kind: str) -> list:
        return [m.node.output.id for m in self.members if m.out == kind]

    def temps(self) -> int:
        """Temporaries an elementwise member's expression needs, the most of any member (lower.codegen.tile_expr)."""
        return max([tile_expr.plan(m.node.attr("expr"), len(m.args), frozenset()).temps
                    for m in self.members if m.node.op == OpKind.ELEMENTWISE] or [0])


def row_buffers(p: RowPlan, r: int) -> list[Buffer]:
    """What a row cascade holds: per block (two, so the next block's loads overlap), the outside
    full and per-row values, every member's result and the temporaries; the columns and scalars once."""
    c = p.dims[1]
    full = p.count("full") + len(p.results("full")) + p.temps()
    rounded = any(m.node.output.dtype == "bfloat16" for m in p.members)
    return [Buffer("full", Space.SPAD, r * c * F32, 2 * full),
            Buffer("row", Space.SPAD, r * F32, 2 * (p.count("row") + len(p.results("row")))),
            Buffer("col", Space.SPAD, c * F32, p.count("col")), Buffer("scalar", Space.SPAD, F32, p.count("scalar")),
            Buffer("record", Space.SPAD, REQUANT_RECORD_BYTES, p.count("record"), align=REQUANT_RECORD_BYTES),
            Buffer("round", Space.SPAD, words(r * c * 2, 2), int(rounded))]


def itemsize(v) -> int:
    return DTYPE_OF[v.dtype].itemsize


class RowCost(NamedTuple):
    """cycles, instructions, actions (sim.energy's), per-unit busy cycles, scratchpad bytes."""

    cycles: float
    instructions: int
    actions: ActionCounts
    units: dict
    spad_bytes: int


def block_work(p: RowPlan, q: int) -> dict:
    """One block of q rows: the bytes of each LOAD, vector (elements, function, dtype, out_dtype, reduced
    run) and the bytes of each STORE, as lower.codegen.rowwise emits them."""
    c = p.dims[1]
    width = {"full": q * c, "row": q}
    loads = [width[k] * itemsize(v) for k, v in p.externals.values() if k in ("full", "row")]
    held = {m.node.output.id: m.node.output for m in p.members}

    def local(a: Arg) -> DType:
        return local_type(DTYPE_OF[(held[a.value] if a.kind == "member" else a.value).dtype])
    vectors = []
    for m in p.members:
        if m.node.op == OpKind.REDUCE:   # float rows, held float32
            vectors.append((q * c, VectorFunc[f"R{m.node.attr('func').upper()}"], DType.F32, DType.F32, c))
        else:
            vectors += [(width[m.out], *ins, 1)
                        for ins in tile_expr.step_instructions(m.node.attr("expr"), [local(a) for a in m.args])]
        vectors += [(width[m.out], *ins, 1) for ins in tile_expr.ROUNDING] * (m.node.output.dtype == "bfloat16")
    stores = [width[m.out] * itemsize(m.node.output) for m in p.members if m.node.output.id in p.stored]
    return {"loads": loads, "vectors": vectors, "stores": stores}


def once_bytes(p: RowPlan) -> int:
    """The bytes of the columns, scalars and records read once."""
    size = {"col": p.dims[1], "scalar": 1}
    return sum(REQUANT_RECORD_BYTES if k == "record" else size[k] * itemsize(v)
               for k, v in p.externals.values() if k in ("col", "scalar", "record"))


def row_cost(p: RowPlan, r: int, hw) -> RowCost:
    """The cost of plan `p` in blocks of r rows, as lower.codegen.rowwise emits it (module doc)."""
    rows, c = p.dims
    once, n_once = once_bytes(p), p.count("col") + p.count("scalar") + p.count("record")
    t = dict.fromkeys(("vector", "ops", "loads", "read", "stores", "written", "instructions"), 0.0)
    for q, times in ((r, rows // r), (rows % r, 1)):
        if q == 0 or times == 0:
            continue
        w = block_work(p, q)
        for elements, func, dtype, out_dtype, run in w["vectors"]:
            t["vector"] += times * vector_instruction_cycles(func, dtype, out_dtype, elements, hw, run)
            t["ops"] += times * elements
        t["loads"] += times * len(w["loads"])
        t["read"] += times * sum(w["loads"])
        t["stores"] += times * len(w["stores"])
        t["written"] += times * sum(w["stores"])
        t["instructions"] += times * (len(w["loads"]) + len(w["vectors"]) + len(w["stores"]))
    loads, read = t["loads"] + n_once, t["read"] + once
    acts = ActionCounts(macs_int8=0.0, macs_bf16=0.0, macs_fp32=0.0, vector_ops=t["ops"],
                        scratchpad_read_bytes=2 * t["ops"] * F32 + t["written"],
                        scratchpad_write_bytes=t["ops"] * F32 + read, accumulator_read_bytes=0.0,
                        accumulator_write_bytes=0.0, dram_read_bytes=read, dram_write_bytes=t["written"])
    units = {"load": dma_cycles(loads, read, hw), "store": dma_cycles(t["stores"], t["written"], hw),
             "channel": (read + t["written"]) / hw.dma_bandwidth_bytes_per_cycle, "vector": t["vector"]}
    first = block_work(p, min(r, rows))
    fill = dma_cycles(len(first["loads"]), sum(first["loads"]) + once, hw)
    drain = dma_cycles(len(first["stores"]), sum(first["stores"]), hw)
    spad, _ = local_bytes(row_buffers(p, r))
    return RowCost(fill + max(units.values()) + drain, int(loads - t["loads"] + t["instructions"]), acts, units,
                   int(spad))


# --- which layers ---------------------------------------------------------------------------------

def _shape_kind(shape, out_shape) -> str | None:
    """How a value of `shape` reads against an output of `out_shape` (its last dim C, the rows before)."""
    shape, out_shape = tuple(shape), tuple(out_shape)
    if math.prod(shape) == 1:
        return "scalar"
    if shape == out_shape:
        return "full" if out_shape[-1] > 1 else "row"
    if shape == out_shape[:-1] + (1,) and out_shape[-1] > 1:
        return "row"
    if shape[-1] == out_shape[-1] > 1 and math.prod(shape) == shape[-1] and len(shape) <= len(out_shape):
        return "col"
    return None


def _member(node, dims, source, internal: dict) -> Member | None:
    """`node` as a member of a cascade over `dims` whose results so far are `internal` (id -> 'full'
    or 'row'), `source(v)` the value v views (through views that emit nothing) and every value it
    depends on through ops that emit nothing; else None."""
    rows, c = dims
    shape = node.output.shape
    if node.op == OpKind.REDUCE:
        x = node.inputs[0]
        if (x.dtype not in FLOATS or node.output.dtype not in FLOATS or node.attr("func") not in ("sum", "max")
                or tuple(node.attr("axes")) != (len(x.shape) - 1,)
                or x.shape[-1] != c or math.prod(x.shape) != rows * c or math.prod(shape) != rows):
            return None
        arg = _arg(x, x.shape, source, internal)
        return Member(node, (arg,), "row") if arg is not None and arg.kind in ("member", "full") else None
    if node.op != OpKind.ELEMENTWISE or any(s.func in RECORDS and s.func != "requant" or s.func in ("select", "copy")
                                            for s in node.attr("expr")):
        return None
    records = record_inputs(node.attr("expr"))
    if any(v.dtype not in (*FLOATS, "int8") for k, v in enumerate((*node.inputs, node.output)) if k not in records):
        return None
    out = "full" if shape[-1] == c and math.prod(shape) == rows * c else "row" if math.prod(shape) == rows else None
    if out is None or (out == "row" and shape[-1] != 1):
        return None
    args = tuple(_record(v, source, internal) if k in records else _arg(v, shape, source, internal)
                 for k, v in enumerate(node.inputs))
    if any(a is None for a in args) or (out == "row" and any(a.kind in ("full", "col") for a in args)):
        return None
    if any(a.kind == "member" and internal[a.value] != ("full" if _shape_kind(v.shape, shape) == "full" else "row")
           for a, v in zip(args, node.inputs, strict=True)):
        return None
    return Member(node, args, out)


def _arg(v, out_shape, source, internal: dict) -> Arg | None:
    kind = _shape_kind(v.shape, out_shape)
    s, upstream = source(v)
    if s.id in internal:     # an earlier member's result, viewed as it is (not broadcast to more elements)
        return Arg("member", s.id) if kind in ("full", "row") and math.prod(s.shape) == math.prod(v.shape) else None
    # an outside value is loaded block by block: one that views a member's result otherwise (a
    # transpose) would read rows of blocks not yet computed
    return None if kind is None or upstream & internal.keys() else Arg(kind, v)


def _record(v, source, internal: dict) -> Arg | None:
    """A requant's records, one record for every element (loaded once), else None."""
    s, upstream = source(v)
    return Arg("record", v) if math.prod(v.shape[:-1]) == 1 and not ({s.id} | upstream) & internal.keys() else None


def plans(graph, layout, excluded=frozenset()) -> list[RowPlan]:
    """The maximal runs of consecutive emitted members (module doc), each after the first reading an
    earlier one's result, with at least one REDUCE and two members."""
    uses, producer = graph.consumers(), graph.producer()
    outputs = {v.id for v in graph.outputs}

    def view(n) -> bool:
        return n is not None and n.op in (OpKind.RESHAPE, OpKind.BROADCAST) and not layout.emits(n)

    def source(v):
        """(the value `v` views through reshapes and broadcasts, every value it views through any op
        that emits nothing)."""
        seen, todo = set(), [v]
        while todo:
            u = todo.pop()
            p = producer.get(u.id)
            seen.add(u.id)
            todo += [] if p is None or layout.emits(p) else [w for w in p.inputs if w.id not in seen]
        p = producer.get(v.id)
        while view(p):
            v, p = p.inputs[0], producer.get(p.inputs[0].id)
        return v, seen

    def readers(v) -> set:
        """The emitted nodes reading `v` through views ('' for a graph output)."""
        out, todo = set(), [v]
        while todo:
            v = todo.pop()
            out |= {""} if v.id in outputs else set()
            for n in uses.get(v.id, ()):
                todo += [n.output] if view(n) else []
                out |= set() if view(n) else {n.name}
        return out

    found, run, dims = [], [], None
    for node in (n for n in graph.nodes if layout.emits(n)):
        internal = {m.node.output.id: m.out for m in run}
        m = _member(node, dims, source, internal) if run and node.name not in excluded else None
        if m is not None and any(a.kind == "member" for a in m.args):
            run.append(m)
            continue
        found.append(run)
        run, dims = [], _dims(node)
        first = _member(node, dims, source, {}) if dims and node.name not in excluded else None
        run = [first] if first is not None else []
    found.append(run)
    out = []
    for run in found:
        if len(run) < 2 or not any(m.node.op == OpKind.REDUCE for m in run):
            continue
        names = {m.node.name for m in run}
        externals = {a.value.id: (a.kind, a.value) for m in run for a in m.args if a.kind != "member"}
        stored = frozenset(m.node.output.id for m in run if readers(m.node.output) - names)
        out.append(RowPlan(_dims(run[0].node), tuple(run), externals, stored))
    return out


def _dims(node) -> tuple[int, int] | None:
    """(rows, columns) of the space a node would lead: its input's (a reduce) or its result's."""
    shape = node.inputs[0].shape if node.op == OpKind.REDUCE else node.output.shape
    # a row is one vector instruction's innermost count (16 bits)
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) and 1 < shape[-1] <= MAX_COUNT else None


def views_fit(p: RowPlan, tensor) -> bool:
    """Whether every value the cascade loads or stores views as (rows, C), (rows, 1), (1, C) or (1, 1)
    (`tensor(value)`: its DRAM view), so a block is one 3-D DMA."""
    return all(flat(tensor(v), kind, p.dims) is not None for kind, v in p.externals.values()) and all(
        flat(tensor(m.node.output), m.out, p.dims) is not None for m in p.members if m.node.output.id in p.stored)


def flat(t, kind: str, dims):
    """A DRAM view as the 2-D tensor its kind reads, or None where that needs a copy."""
    rows, c = dims
    return t.reshape({"full": (rows, c), "row": (rows, 1), "col": (1, c), "scalar": (1, 1),
                      "record": (1, math.prod(t.shape))}[kind])


def map_rows(p: RowPlan, hw, objective: str):
    """The row block of least objective that fits, with its (charged cycles, energy), or None."""
    best = None
    for r in tile_sizes(p.dims[0], MAX_COUNT):
        if local_bytes(row_buffers(p, int(r)))[0] > hw.scratchpad_bytes:
            continue
        cost = row_cost(p, int(r), hw)
        charged = cost.cycles + INSTRUCTION_CHARGE * cost.instructions
        energy = sum(energy_pj(cost.actions, charged, hw).values())
        value = objective_of(charged, energy, objective)
        if best is None or value < best[0]:
            best = (value, int(r), charged, energy)
    return best and best[1:]


def choose_rows(graph, layout, tilings: dict, views, hw, objective: str, excluded, estimate) -> list[RowCascade]:
    """The row cascades (`plans`) that fit and whose objective is below a lower bound of their layers'
    own: the mapper's estimate of each member's nests (`estimate(nest, mapping)`: charged cycles)
    and their DRAM traffic's energy.  A cascade that does not fit is never emitted: the layers run alone."""
    chosen = []
    for p in plans(graph, layout, excluded):
        if not views_fit(p, views.tensor):
            continue
        mapped = map_rows(p, hw, objective)
        if mapped is None:
            continue
        r, cycles, energy = mapped
        names = [m.node.name for m in p.members]
        alone = sum(float(estimate(n, m)) for name in names for n, m in zip(tilings[name].nests,
                                                                             tilings[name].mappings, strict=True))
        moved = sum(v.size * itemsize(v) for m in p.members for v in (*m.node.inputs, m.node.output))
        if objective_of(cycles, energy, objective) >= objective_of(alone, moved * hw.energy_pj_per_dram_byte,
                                                                   objective):
            continue
        saved = sum(2 * m.node.output.size * itemsize(m.node.output) for m in p.members
                    if m.node.output.id not in p.stored)
        chosen.append(RowCascade(tuple(names), (r, p.dims[1]), p.dims, saved))
    return chosen
