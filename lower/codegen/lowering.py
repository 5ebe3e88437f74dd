"""Graph IR + layout + schedule -> Program: DRAM planning, one lowering rule per op kind.

A rule receives the context and its node; it reads its operands as DRAM views
(`ctx.tensor`), asks for constant weights in the layout it wants
(`ctx.weights`), and emits instructions through `ctx.em`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stagec.errors import LoweringError, TilingError
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import DType, Operand, encode
from stagec.isa.program import Layer, Program, Region, RegionKind, TensorRef
from stagec.rule_tables import registrar

from ..graph.graph_ir import Graph, Node, OpKind, Value, check_records, record_words
from ..schedule.buffers import epilogue_layout
from ..schedule.cascade import Cascade
from ..schedule.flash import FlashAttention
from ..schedule.flash_int8 import Int8Attention
from ..schedule.layout import Layout
from ..schedule.mapper import Schedule, node_problem
from ..schedule.rowwise import RowCascade, plans
from ..schedule.tensors import DTYPE_OF, DramRegion, DramTensor
from .cascade import Member, emit_cascade
from .emitter import Emitter
from .flash import emit_flash
from .flash_int8 import emit_int8_flash
from .matrix import as_conv, emit_conv
from .memory import Interval, align, allocate_by_liveness
from .rowwise import emit_rows
from .tokens import insert_tokens
from .vector import VECTOR_JOBS, vector_jobs
from .window import emit_window

LOWERINGS: dict[OpKind, Callable[[LowerContext, Node], None]] = {}


register = registrar(LOWERINGS)


@dataclass
class LowerContext:
    em: Emitter
    graph: Graph
    layout: Layout
    schedule: Schedule
    data_offsets: dict[int, int]

    def tensor(self, v: Value) -> DramTensor:
        pl = self.layout.placements[v.id]
        if pl.view.region == DramRegion.CONST:
            base = self.em.consts.place(("natural", pl.owner), self.graph.constants[pl.owner])
        else:
            base = self.data_offsets[pl.owner]
        return dataclasses.replace(pl.view, offset=pl.view.offset + base)

    def weights(self, v: Value, order) -> DramTensor:
        """A constant stored with its dims in `order` (the layout the rule streams best), else its view."""
        arr = self.graph.constants.get(v.id)
        return self.em.consts.tensor(v.id, arr, order) if arr is not None else self.tensor(v)

    def scalar(self, value: float, dtype: DType = DType.F32) -> DramTensor:
        """One constant element, placed in the constant blob."""
        return self.em.consts.scalar(value, dtype)

    def fill(self, dst: Operand, counts, value: float, dtype: DType = DType.F32) -> None:
        """Fill a local tile with a constant (a stride-0 LOAD of one constant element)."""
        scalar = self.scalar(value, dtype)
        self.em.load(DramTensor(scalar.region, scalar.offset, (1,), (0,), dtype), (0,), (0, 0, 0), counts, dst,
                     local=dtype)


def _extras(ctx: LowerContext, node: Node, first: int, shape) -> list[DramTensor]:
    """The epilogue's extra inputs broadcast to the output's shape (records: shape + their words; a clamp
    table, every word of it)."""
    records = record_words(node.attr("epilogue"))

    def view(k: int, v: Value) -> DramTensor:
        t, words = ctx.tensor(v), records.get(k + 1)
        if words == 0:   # a clamp table: one record of all its words
            t = DramTensor(t.region, t.address((0,) * t.rank), (math.prod(v.shape),), (1,), t.dtype)
            words = t.shape[0]
        return t.broadcast_to(tuple(shape) + ((words,) if words is not None else ()))
    return [view(k, v) for k, v in enumerate(node.inputs[first:])]


@register(OpKind.CONV)
def lower_conv(ctx: LowerContext, node: Node) -> None:
    kind, p, _ = node_problem(node)
    m = ctx.schedule[node.name].mapping
    x, out = ctx.tensor(node.inputs[0]), ctx.tensor(node.output)
    extras = _extras(ctx, node, 2, node.output.shape)
    epilogue = epilogue_layout(node)
    if kind == "depthwise":
        w = ctx.weights(node.inputs[1], (1, 2, 3, 0))     # [KH, KW, C]: a tap's channels contiguous
        emit_window(ctx.em, "depthwise", p, m, x, out, w, epilogue, extras, ctx.fill)
        return
    w = _conv_weights(ctx, node, m)
    g = node.attr("groups")
    for gi in range(g):
        def part(t, dim, size, gi=gi):
            start = [0] * t.rank
            limit = list(t.shape)
            start[dim], limit[dim] = gi * size, (gi + 1) * size
            return t.slice(start, limit, (1,) * t.rank)
        emit_conv(ctx.em, p, m, part(x, 1, p.c), part(w, 0, p.o), part(out, 1, p.o), epilogue,
                  [part(e, 1, p.o) for e in extras], ctx.fill, gi * p.o)


@register(OpKind.MATMUL)
def lower_matmul(ctx: LowerContext, node: Node) -> None:
    _, p, _ = node_problem(node)
    m = ctx.schedule[node.name].mapping
    a, b, out = ctx.tensor(node.inputs[0]), ctx.weights(node.inputs[1], None), ctx.tensor(node.output)
    extras = _extras(ctx, node, 2, node.output.shape)
    epilogue = epilogue_layout(node)
    batch = out.shape[:-2]
    for idx in np.ndindex(*batch):
        def pick(t, idx=idx):
            for i in idx:
                t = t.select(0, i)
            return t
        emit_conv(ctx.em, p, m, as_conv(pick(a), "x"), as_conv(pick(b), "w"), as_conv(pick(out), "x"),
                  epilogue, [as_conv(pick(e), "x") for e in extras], ctx.fill)


@register(OpKind.POOL)
def lower_pool(ctx: LowerContext, node: Node) -> None:
    _, p, _ = node_problem(node)
    m = ctx.schedule[node.name].mapping
    x, out = ctx.tensor(node.inputs[0]), ctx.tensor(node.output)
    for idx in np.ndindex(*x.shape[:-3]):
        xs, os = x, out
        for i in idx:
            xs, os = xs.select(0, i), os.select(0, i)
        emit_window(ctx.em, node.attr("func"), p, m, _unsqueeze(xs), _unsqueeze(os), fill=ctx.fill)


def _unsqueeze(t: DramTensor) -> DramTensor:
    return DramTensor(t.region, t.offset, (1,) + t.shape, (0,) + t.strides, t.dtype)


@register(*VECTOR_JOBS)
def lower_vector(ctx: LowerContext, node: Node) -> None:
    """A vector node's nests (lower.codegen.vector.vector_jobs), each tiled as the schedule decided."""
    for job, m in zip(vector_jobs(ctx, node), ctx.schedule[node.name].mappings, strict=True):
        job.emit(ctx.em, m)


def _conv_weights(ctx: LowerContext, node: Node, m) -> DramTensor:
    """A matrix-unit conv's weights as its mapping `m` reads them: [KH, KW, C, O], taps then k x n tiles;
    stacked, [KW, KH, C, O] (its k order), so a tile of output channels is one box a LOAD takes whole."""
    return ctx.weights(node.inputs[1], (3, 2, 1, 0) if m.stacked else (2, 3, 1, 0))


def _member(ctx: LowerContext, node: Node, layer: int) -> Member:
    """A cascade member (lower.codegen.cascade): a pointwise or depthwise CONV or a MATMUL of no batch, as
    conv views."""
    kind, p, _ = node_problem(node)
    x, out = ctx.tensor(node.inputs[0]), ctx.tensor(node.output)
    extras = _extras(ctx, node, 2, node.output.shape)
    if kind == "depthwise":
        w = ctx.weights(node.inputs[1], (1, 2, 3, 0))     # [KH, KW, C], as lower_conv has them
    elif node.op == OpKind.MATMUL:
        def pick(t):
            for _ in node.output.shape[:-2]:
                t = t.select(0, 0)
            return t
        w = as_conv(pick(ctx.weights(node.inputs[1], None)), "w")
        x, out = as_conv(pick(x), "x"), as_conv(pick(out), "x")
        extras = [as_conv(pick(e), "x") for e in extras]
    else:
        w = _conv_weights(ctx, node, ctx.schedule[node.name].mapping)
    return Member(layer, node.name, kind, p, ctx.schedule[node.name].mapping, x, w, out, epilogue_layout(node),
                  extras)


def _emit_rows(ctx: LowerContext, cascade: RowCascade, nodes: list[Node], layers: list[int]) -> None:
    """A row cascade, its plan found again as the schedule found it (lower.schedule.rowwise.plans), the
    layers around it left out."""
    others = frozenset(n.name for n in ctx.graph.nodes) - set(cascade.layers)
    (plan,) = [p for p in plans(ctx.graph, ctx.layout, others)
               if tuple(m.node.name for m in p.members) == cascade.layers]
    emit_rows(ctx, cascade, plan, layers)


def _emit_chain(ctx: LowerContext, cascade: Cascade, nodes: list[Node], layers: list[int]) -> None:
    emit_cascade(ctx.em, [_member(ctx, n, i) for n, i in zip(nodes, layers, strict=True)], ctx.fill, cascade.chunk,
                 cascade.line)


# Each kind of cascade's emitter (ctx, cascade, its nodes, their layer indices), and whether it runs at
# the cascade's last layer (attention: by then V, its last input, is computed; rows alike) or its first.
CASCADE_EMITTERS = {Cascade: (_emit_chain, False), FlashAttention: (emit_flash, True),
                    Int8Attention: (emit_int8_flash, True), RowCascade: (_emit_rows, True)}


# --- the driver -------------------------------------------------------------------------------

def plan_dram(graph: Graph, layout: Layout, schedule: Schedule):
    """Data-region offsets: inputs, then outputs, then intermediates reusing space by liveness.
    A cascade's members interleave tile by tile, so each member runs, for liveness, over the whole
    span of its cascade: a member's output must not take the space of an input a later tile of an
    earlier member still reads."""
    span = _cascade_spans(graph, schedule)
    index = {n.output.id: span.get(n.name, (i, i))[0] for i, n in enumerate(graph.nodes)}
    last = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[layout.placements[v.id].owner] = max(last.get(layout.placements[v.id].owner, i),
                                                      span.get(n.name, (i, i))[1])
    offsets, at = {}, 0
    fixed = [v.id for v in graph.inputs] + [v.id for v in graph.outputs]
    nbytes = {vid: pl.view.size * pl.view.dtype.itemsize for vid, pl in layout.placements.items() if pl.owner == vid}
    for vid in fixed:
        offsets[vid] = at
        at = align(at + nbytes[vid])
    arena = at
    intervals = [Interval(str(vid), size, index[vid], last.get(vid, index[vid]))
                 for vid, size in nbytes.items() if vid not in fixed and vid in index
                 and layout.placements[vid].view.region == DramRegion.DATA]
    placed, peak = allocate_by_liveness(intervals)
    offsets.update({int(k): arena + off for k, off in placed.items()})
    total = sum(iv.size for iv in intervals)
    return offsets, arena, peak, total


def _cascade_spans(graph: Graph, schedule: Schedule) -> dict[str, tuple[int, int]]:
    """Layer name -> (first, last) node index of the cascade it runs in."""
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    spans = {}
    for cascade in schedule.cascades:
        steps = [position[name] for name in cascade.layers]
        spans.update({name: (min(steps), max(steps)) for name in cascade.layers})
    return spans


def lower_to_program(graph: Graph, layout: Layout, schedule: Schedule, hw: HardwareConfig,
                     metadata: dict | None = None) -> Program:
    em = Emitter(hw)
    offsets, arena, peak, total = plan_dram(graph, layout, schedule)
    ctx = LowerContext(em, graph, layout, schedule, offsets)
    layers = []
    emitted = [node for node in graph.nodes if layout.emits(node)]
    index = {node.name: i for i, node in enumerate(emitted)}
    for node in emitted:
        em.layer, em.layer_name = len(layers), node.name
        if node.op not in LOWERINGS:
            raise LoweringError(f"no lowering rule for graph op {node.op.value} ({node.name})")
        check_records(node)
        cascade = schedule.cascade_of(node.name)
        if cascade is None:
            LOWERINGS[node.op](ctx, node)
        else:
            emit, at_last = CASCADE_EMITTERS[type(cascade)]
            if node.name == cascade.layers[-1 if at_last else 0]:
                emit(ctx, cascade, [emitted[index[name]] for name in cascade.layers],
                     [index[name] for name in cascade.layers])
        mapping = str(schedule[node.name].mapping) if node_problem(node) else ""
        layers.append(Layer(node.name, node.op.value, [v.shape for v in node.inputs], node.output.shape,
                            node_macs(node), mapping))
    blob = em.consts.blob()
    data_base = align(len(blob))
    code = encode(em.instructions)
    reloc = np.array(em.relocate, bool)
    if len(code):
        code["x_base"][reloc] += data_base
    dram = data_base + arena + peak
    if dram > hw.dram_bytes:
        raise TilingError(f"the program does not fit DRAM: it needs {dram} bytes ({len(blob)} of weights, {arena} of "
                          f"inputs and outputs, {peak} of intermediates at their peak), the hardware has "
                          f"{hw.dram_bytes} (HardwareConfig.dram_bytes)")
    regions = [Region("weights", RegionKind.CONST, 0, len(blob))]
    inputs, outputs = [], []
    for kind, values, refs in ((RegionKind.INPUT, graph.inputs, inputs), (RegionKind.OUTPUT, graph.outputs, outputs)):
        for i, v in enumerate(values):
            ref = TensorRef(f"{kind.value}{i}", data_base + offsets[v.id], DTYPE_OF[v.dtype], v.shape)
            refs.append(ref)
            regions.append(Region(ref.name, kind, ref.offset, ref.nbytes))
    regions.append(Region("activations", RegionKind.INTERMEDIATE, data_base + arena, peak))
    meta = {"peak_activation_bytes": peak, "activation_bytes": total, "local_peak_bytes": em.local_peaks,
            "packed_weight_zeros": packed_weight_zeros(graph),
            **({"cascades": [c.to_dict() for c in schedule.cascades]} if schedule.cascades else {}),
            **(metadata or {})}
    program = Program(code=code, layer_ids=np.array(em.layer_ids, np.int32), layers=tuple(layers),
                      inputs=tuple(inputs), outputs=tuple(outputs), regions=tuple(regions), constants=blob,
                      dram_bytes=max(dram, data_base + 64), hw=hw, metadata=meta)
    return insert_tokens(program)


def packed_weight_zeros(graph) -> int:
    """Bytes of the zeros that packing depthwise convs (lower.schedule.pack) added to the weights."""
    return sum(graph.constants[n.inputs[1].id].nbytes * (n.attr("packed") - 1) // n.attr("packed")
               for n in graph.nodes if n.attr("packed"))


def node_macs(node: Node) -> int:
    """Useful multiply-accumulates of a CONV or MATMUL node (0 for the rest): a packed depthwise conv's
    (lower.schedule.pack) without the block-diagonal weights' zeros."""
    if node.op == OpKind.CONV:
        _, cg, kh, kw = node.inputs[1].shape
        return math.prod(node.output.shape) * cg * kh * kw // node.attr("packed", 1)
    if node.op == OpKind.MATMUL:
        return math.prod(node.output.shape) * node.inputs[0].shape[-1]
    return 0
