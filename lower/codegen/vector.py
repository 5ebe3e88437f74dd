"""Elementwise expressions, reductions, copies and gathers on the vector unit, tiled over DRAM views.

A vector node runs as one nest or several (a pad: a fill, then a copy of its input; a concat: a
copy per input), each a job (`Elementwise`, `Reduce`, `Gather`) over DRAM views of its operands.
`vector_jobs(views, node)` builds them, one rule per op kind, for the schedule stage (operands as
lower.schedule.layout places them, offsets relative to their buffers: `LayoutViews`) and for the emitter
(placed) alike.  What the schedule maps, `job.nest(...)` (lower.schedule.mapper.map_vector ranks its
tilings), depends on the operands' shapes and strides, not on where their buffers land;
`job.emit(em, m)` walks the tiles of the mapping the schedule chose.

An op's iteration space is its output shape, coalesced over every operand's
strides (so contiguous runs become long DMA bursts); the last three dims are
tiled, any further leading dims are looped over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import MAX_COUNT, AccMode, DType, Operand, Space, VectorFunc
from stagec.isa.opcodes import TRANSCENDENTAL
from stagec.rule_tables import registrar
from stagec.sim.costs import lane_elements

from ..graph.graph_ir import Expr, Node, OpKind, Step, record_words
from ..schedule.buffers import ElementwiseBuffers, GatherBuffers, ReduceBuffers, local_bytes, slot_offsets
from ..schedule.layout import ALWAYS_VIEWS, Layout, view_of
from ..schedule.nest import TileMapping, tiles
from ..schedule.tensors import DramTensor, coalesce
from . import tile_expr
from .emitter import ConstPool, local_type

COPY: Expr = (Step("copy", (0,)),)
_REDUCE = {"sum": (VectorFunc.RSUM, AccMode.ADD), "max": (VectorFunc.RMAX, AccMode.MAX),
           "min": (VectorFunc.RMIN, AccMode.MIN)}


@dataclass(frozen=True)
class VectorNest:
    """A vector-unit nest as the schedule maps it (lower.schedule.mapper.map_vector): tiles over `space`
    (3 dims), run `repeat` times (over the dims outside it), holding `buffers(t0, t1, t2, buffer
    sets)` (lower.schedule.buffers); per tile, `loads` LOADs of a whole tile, of `load_bytes` bytes per
    element over them all, `passes` vector cycles per lane group and one STORE of `store_bytes`
    bytes per element.  `what` names it in the schedule dump."""

    what: str
    space: tuple[int, int, int]
    repeat: int
    buffers: Callable
    loads: int = 1
    passes: float = 1.0
    load_bytes: int = 4
    store_bytes: int = 4

    def __str__(self) -> str:
        return f"{self.what} {'x'.join(map(str, self.space))}" + (f" x{self.repeat}" if self.repeat > 1 else "")

    def footprint(self, m: TileMapping):
        """(scratchpad, accumulator) bytes the nest holds under tilings `m` (numbers or arrays)."""
        return local_bytes(self.buffers(m.tile_oh, m.tile_ow, m.tile_o, 1 + m.double_buffer))


def _split3(shape, *strides):
    """(lead shape, lead strides per operand, inner 3-D shape, inner strides per operand)."""
    lead = max(len(shape) - 3, 0)
    fill = (1,) * (3 - len(shape[lead:]))
    inner = fill + tuple(shape[lead:])
    return (tuple(shape[:lead]), [s[:lead] for s in strides], inner,
            [(0,) * len(fill) + tuple(s[lead:]) for s in strides])


def _at(t: DramTensor, lead_idx, lead_strides, inner_strides) -> DramTensor:
    offset = t.offset + t.dtype.itemsize * sum(i * s for i, s in zip(lead_idx, lead_strides, strict=True))
    return DramTensor(t.region, offset, (1 << 30,) * 3, tuple(inner_strides), t.dtype)


# --- the jobs -----------------------------------------------------------------------------------

class _ElementwisePlan(NamedTuple):
    records: dict          # the inputs that are records (one for the whole tensor): their words
    data: list             # the other inputs, in order
    views: list            # each of those broadcast to the output's shape
    lead: tuple            # the coalesced iteration space: looped-over dims, the tiled 3-D one,
    lead_s: list           # and each operand's strides (the output's first) over both
    inner: tuple
    inner_s: list
    scalars: frozenset     # broadcast scalars (a constant of the expression), loaded once
    loaded: list           # positions in `data` of the inputs LOADed per tile
    expr: tile_expr.ExprPlan
    widths: list           # bytes per element of each tile slot: the loaded inputs', then the temporaries'
    buffers: ElementwiseBuffers


@dataclass(frozen=True)
class Elementwise:
    """out = expr(inputs...), inputs broadcast numpy-style to out's shape; records (one requant
    record or lut table for the whole tensor) and broadcast scalars are loaded once."""

    expr: Expr
    inputs: tuple[DramTensor, ...]
    out: DramTensor

    def _plan(self) -> _ElementwisePlan:
        inputs, out = self.inputs, self.out
        records = record_words(self.expr)
        data = [k for k in range(len(inputs)) if k not in records]
        views = [inputs[k].broadcast_to(out.shape) for k in data]
        shape, strides = coalesce(out.shape, out.strides, *[v.strides for v in views])
        lead, lead_s, inner, inner_s = _split3(shape, *strides)
        writable = frozenset(k for i, k in enumerate(data)
                             if all(inner_s[i + 1][d] or inner[d] == 1 for d in range(3)))
        # a broadcast scalar (a constant of the expression) is loaded once, not per tile
        scalars = frozenset(k for i, k in enumerate(data) if not any(inner_s[i + 1]) and not any(lead_s[i + 1]))
        p = tile_expr.plan(self.expr, len(inputs), writable)
        loaded = [i for i, k in enumerate(data) if k not in scalars]
        widths = tile_expr.slot_itemsizes(self.expr, p, [local_type(t.dtype) for t in inputs],
                                          [data[i] for i in loaded])
        return _ElementwisePlan(records, data, views, lead, lead_s, inner, inner_s, scalars, loaded, p, widths,
                                ElementwiseBuffers(sum(widths), tuple(inputs[k].dtype.itemsize * w
                                                                      for k, w in sorted(records.items())),
                                                   len(scalars)))

    def nest(self, hw, layer: str) -> VectorNest:
        p = self._plan()
        passes = _passes(self.expr, [local_type(t.dtype) for t in self.inputs], hw)
        return VectorNest("copy" if self.expr == COPY else "elementwise", p.inner, math.prod(p.lead), p.buffers,
                          len(p.loaded), passes, sum(self.inputs[p.data[i]].dtype.itemsize for i in p.loaded),
                          self.out.dtype.itemsize)

    def emit(self, em, m: TileMapping) -> None:
        inputs, out = self.inputs, self.out
        p = self._plan()
        bufs = 2 if m.double_buffer else 1
        bases = em.allocate(p.buffers(m.tile_oh, m.tile_ow, m.tile_o, bufs))
        record_tiles, at = {}, bases["records"][0] if p.records else 0
        for k, words in sorted(p.records.items()):   # one after another in the one records buffer
            record_tiles[k] = _load_record(em, at, inputs[k], words)
            at += words * inputs[k].dtype.itemsize
        record_tiles |= {k: _load_scalar(em, base, p.views[p.data.index(k)])
                         for k, base in zip(sorted(p.scalars), bases["scalars"], strict=True)}
        slots = [[base + at for at in slot_offsets(p.widths, m.tile_oh * m.tile_ow * m.tile_o)]
                 for base in bases["tiles"]]
        in_buf = [dict(zip(p.loaded, at, strict=False)) for at in slots]
        tmp_buf = [at[len(p.loaded):] for at in slots]
        inner, n_in = p.inner, len(inputs)
        k = 0
        for idx in np.ndindex(*p.lead):
            dst = _at(out, idx, p.lead_s[0], p.inner_s[0])
            srcs = {i: _at(v, idx, p.lead_s[i + 1], p.inner_s[i + 1])
                    for i, v in enumerate(p.views) if p.data[i] not in p.scalars}
            for a0, t0 in tiles(inner[0], m.tile_oh):
                for a1, t1 in tiles(inner[1], m.tile_ow):
                    for a2, t2 in tiles(inner[2], m.tile_o):
                        counts, start, buf = (t0, t1, t2), (a0, a1, a2), k % bufs
                        k += 1
                        loaded = {}
                        for i, src in srcs.items():
                            extent = tuple(c if s else 1 for c, s in zip(counts, src.strides, strict=True))
                            tile = tile_expr.LocalTile(Space.SPAD, in_buf[buf][i], extent, local_type(src.dtype))
                            em.load(src, start, (0, 1, 2), extent, tile.operand(extent))
                            loaded[p.data[i]] = tile
                        args = [loaded[j] if j in loaded else record_tiles[j] for j in range(n_in)]
                        temps = [tile_expr.LocalTile(Space.SPAD, b, counts) for b in tmp_buf[buf]]
                        result = tile_expr.emit(em, self.expr, p.expr, args, temps, counts)
                        em.store(dst, start, (0, 1, 2), counts, result.operand(counts))


def _passes(expr: Expr, dtypes, hw) -> float:
    """Vector cycles per lane group of 32-bit elements of a tile that `expr` over inputs of `dtypes`
    costs (a select is a copy and a select; a copy may be none, counted as one), each step's over
    the elements a lane packs of it."""
    hard = {f.name.lower() for f in TRANSCENDENTAL}
    return sum((2 if s.func == "select" else hw.vector_cycles_per_transcendental if s.func in hard else 1)
               / float(lane_elements(bits, hw.vector_subword_packing))
               for s, bits in zip(expr, tile_expr.step_lane_bits(expr, dtypes), strict=True))


def _load_scalar(em, base: int, t: DramTensor) -> tile_expr.LocalTile:
    """LOAD a broadcast scalar operand (one element) into the scratchpad once."""
    tile = tile_expr.LocalTile(Space.SPAD, base, (1, 1, 1), local_type(t.dtype))
    em.load(_at(t, (), (), (0, 0, 0)), (0, 0, 0), (0, 1, 2), (1, 1, 1), tile.operand((1, 1, 1)))
    return tile


def _load_record(em, base: int, t: DramTensor, words: int) -> tile_expr.LocalTile:
    """LOAD the one record of an elementwise node (a requant record, a lut table: its words) into the
    scratchpad."""
    if t.size != words:
        raise ValueError(f"{em.layer_name}: an elementwise requant or lut takes one record of {words} words for the "
                         f"whole tensor, not {t.size} words")
    em.load(t.reshape((words,)), (0,), (None, None, 0), (1, 1, words),
            Operand(Space.SPAD, base, (0, 0, 1)))
    return tile_expr.LocalTile(Space.SPAD, base, (1, 1, 1), t.dtype)


class _ReducePlan(NamedTuple):
    kshape: tuple  # the kept dims, coalesced, and the input's and output's strides over them
    kx: tuple
    ko: tuple
    rshape: tuple  # the reduced dims, coalesced, and the input's strides over them
    rx: tuple
    klead: int     # how many kept dims are looped over (the last two are tiled)
    kin: tuple     # the tiled kept dims, and the input's and output's strides over them
    kin_x: tuple
    kin_o: tuple


@dataclass(frozen=True)
class Reduce:
    """out = reduce_func(x, axes); out has x's shape without `axes`.  An int8 sum's RSUM reads the int8
    tile and sums it in int32 (`out` is int32); int8 max and min stay int8."""

    func: str
    x: DramTensor
    axes: tuple[int, ...]
    out: DramTensor

    def _plan(self, layer: str) -> _ReducePlan:
        x, axes, out = self.x, self.axes, self.out
        widen = local_type(x.dtype) != local_type(out.dtype)   # float32 and bf16 both sum in float32
        if widen and not (x.dtype == DType.I8 and out.dtype == DType.I32):
            raise TypeError(f"{layer}: a reduction of {x.dtype.name} gives {x.dtype.name} or (int8 sums) "
                            f"int32, not {out.dtype.name}")
        kept = [d for d in range(x.rank) if d not in axes]
        kshape, (kx, ko) = coalesce(tuple(x.shape[d] for d in kept), tuple(x.strides[d] for d in kept),
                                    out.strides if out.rank else ())
        rshape, (rx,) = coalesce(tuple(x.shape[d] for d in axes), tuple(x.strides[d] for d in axes))
        klead = max(len(kshape) - 2, 0)
        kin = (1,) * (2 - len(kshape[klead:])) + tuple(kshape[klead:])
        kin_x = (0,) * (2 - len(kx[klead:])) + tuple(kx[klead:])
        kin_o = (0,) * (2 - len(ko[klead:])) + tuple(ko[klead:])
        return _ReducePlan(kshape, kx, ko, rshape, rx, klead, kin, kin_x, kin_o)

    def nest(self, hw, layer: str) -> VectorNest:
        p = self._plan(layer)
        return VectorNest(f"reduce {self.func}", p.kin + (p.rshape[-1],),
                          math.prod(p.kshape[:p.klead]) * math.prod(p.rshape[:-1]), self._buffers(),
                          passes=1, load_bytes=self.x.dtype.itemsize, store_bytes=self.out.dtype.itemsize)

    def _buffers(self) -> ReduceBuffers:
        return ReduceBuffers(local_type(self.x.dtype).itemsize, local_type(self.out.dtype).itemsize)

    def emit(self, em, m: TileMapping) -> None:
        x, out = self.x, self.out
        p = self._plan(em.layer_name)
        vfunc, acc_mode = _REDUCE[self.func]
        bufs = 2 if m.double_buffer else 1
        bases = em.allocate(self._buffers()(m.tile_oh, m.tile_ow, m.tile_o, bufs))
        in_buf, out_buf = bases["input"], bases["sums"]
        k = chunk = 0
        for kidx in np.ndindex(*p.kshape[:p.klead]):
            x_off = x.offset + x.dtype.itemsize * sum(i * s for i, s in zip(kidx, p.kx[:p.klead], strict=True))
            o_off = out.offset + out.dtype.itemsize * sum(i * s for i, s in zip(kidx, p.ko[:p.klead], strict=True))
            for a0, t0 in tiles(p.kin[0], m.tile_oh):
                for a1, t1 in tiles(p.kin[1], m.tile_ow):
                    buf = k % bufs
                    k += 1
                    dst = Operand(Space.SPAD, out_buf[buf], (t1, 1, 0))
                    first = True
                    for ridx in np.ndindex(*p.rshape[:-1]):
                        r_off = x.dtype.itemsize * sum(i * s for i, s in zip(ridx, p.rx[:-1], strict=True))
                        for a2, t2 in tiles(p.rshape[-1], m.tile_o):
                            src = DramTensor(x.region, x_off + r_off, (1 << 30,) * 3, p.kin_x + (p.rx[-1],), x.dtype)
                            tile = Operand(Space.SPAD, in_buf[chunk % bufs], (t1 * t2, t2, 1))
                            em.load(src, (a0, a1, a2), (0, 1, 2), (t0, t1, t2), tile)
                            chunk += 1
                            em.vector(vfunc, dst, tile, None, (t0, t1, t2),
                                      acc=AccMode.OVERWRITE if first else acc_mode, dtype=local_type(x.dtype),
                                      out_dtype=local_type(out.dtype))
                            first = False
                    o = DramTensor(out.region, o_off, (1 << 30,) * 3, p.kin_o + (0,), out.dtype)
                    em.store(o, (a0, a1, 0), (0, 1, 2), (t0, t1, 1), dst)


@dataclass(frozen=True)
class Gather:
    """out[i, ...] = table[indices[i], ...]: the indices into the scratchpad, then indirect DMA of
    the rows (the table's rows bound the indices, checked when they run)."""

    table: DramTensor
    indices: DramTensor
    out: DramTensor

    def _plan(self, layer: str) -> tuple[DramTensor, DramTensor, DramTensor]:
        """(the table as rows, the indices as a vector, out as rows)."""
        table, indices = self.table, self.indices
        rows = table.shape[0]
        if rows > MAX_COUNT:
            raise LoweringError(f"{layer}: a gather from a table of {rows} rows: GATHER indexes at most "
                                f"{MAX_COUNT} rows (its 16-bit row count)")
        views = (table.reshape((rows, table.size // rows)), indices.reshape((indices.size,)),
                 self.out.reshape((indices.size, table.size // rows)))
        if None in views:
            raise ValueError(f"{layer}: gather operands must be row-contiguous views")
        return views

    def nest(self, hw, layer: str) -> VectorNest:
        row, idx, _ = self._plan(layer)
        return VectorNest("gather", (idx.size, 1, row.shape[1]), 1, GatherBuffers(local_type(row.dtype).itemsize),
                          passes=0, load_bytes=row.dtype.itemsize, store_bytes=row.dtype.itemsize)

    def emit(self, em, m: TileMapping) -> None:
        row, idx, dst = self._plan(em.layer_name)
        width = row.shape[1]
        bufs = 2 if m.double_buffer else 1
        bases = em.allocate(GatherBuffers(local_type(row.dtype).itemsize)(m.tile_oh, m.tile_ow, m.tile_o, bufs))
        idx_buf, row_buf = bases["indices"], bases["rows"]
        k = 0
        for a0, t0 in tiles(idx.size, m.tile_oh):
            ib = idx_buf[k % bufs]
            em.load(idx, (a0,), (None, None, 0), (1, 1, t0), Operand(Space.SPAD, ib, (0, 0, 1)))
            for a2, t2 in tiles(width, m.tile_o):
                rb = row_buf[k % bufs]
                k += 1
                em.gather(row, (0, a2), t0, t2, Operand(Space.SPAD, rb, (t2, 0, 1)),
                          Operand(Space.SPAD, ib, (1, 0, 0)))
                em.store(dst, (a0, a2), (0, None, 1), (t0, 1, t2), Operand(Space.SPAD, rb, (t2, 0, 1)))


# --- a node's jobs ------------------------------------------------------------------------------

class LayoutViews:
    """A node's operands as lower.schedule.layout places them, offsets relative to their buffers, and its
    scalars as a program's constant pool holds them: what the schedule stage builds a node's jobs
    over (lower.codegen.lowering.LowerContext is the same for the emitter, placed)."""

    def __init__(self, layout: Layout):
        self.placements, self.consts = layout.placements, ConstPool()

    def tensor(self, v) -> DramTensor:
        return self.placements[v.id].view

    def scalar(self, value: float, dtype: DType) -> DramTensor:
        return self.consts.scalar(value, dtype)


VECTOR_JOBS: dict[OpKind, Callable] = {}
_rule = registrar(VECTOR_JOBS)


def vector_jobs(views, node: Node) -> list:
    """The nests a vector node runs, in order, over `views` (`tensor(value)`, `scalar(value, dtype)`)."""
    return VECTOR_JOBS[node.op](views, node)


@_rule(OpKind.ELEMENTWISE)
def _elementwise(views, node: Node) -> list:
    return [Elementwise(node.attr("expr"), tuple(views.tensor(v) for v in node.inputs), views.tensor(node.output))]


@_rule(OpKind.GATHER)
def _gather(views, node: Node) -> list:
    return [Gather(views.tensor(node.inputs[0]), views.tensor(node.inputs[1]), views.tensor(node.output))]


@_rule(OpKind.REDUCE)
def _reduce(views, node: Node) -> list:
    return [Reduce(node.attr("func"), views.tensor(node.inputs[0]), node.attr("axes"), views.tensor(node.output))]


@_rule(*ALWAYS_VIEWS, OpKind.RESHAPE)
def _view_copy(views, node: Node) -> list:
    """A view op that must materialize (a graph output, or a reshape no strides express)."""
    src, out = views.tensor(node.inputs[0]), views.tensor(node.output)
    if node.op == OpKind.RESHAPE:
        return [Elementwise(COPY, (src,), out.reshape(src.shape))]
    return [Elementwise(COPY, (view_of(node, src),), out)]


@_rule(OpKind.PAD)
def _pad(views, node: Node) -> list:
    """The fill of the whole output, then the copy of the input into it."""
    out = views.tensor(node.output)
    fill = Elementwise(COPY, (views.scalar(node.attr("value"), out.dtype),), out)
    lo, src = node.attr("lo"), views.tensor(node.inputs[0])
    inside = out.slice(lo, [a + d for a, d in zip(lo, src.shape, strict=True)], (1,) * out.rank)
    return [fill, Elementwise(COPY, (src,), inside)]


@_rule(OpKind.CONCAT)
def _concat(views, node: Node) -> list:
    """A copy of each input into its part of the output."""
    out, axis, at = views.tensor(node.output), node.attr("axis"), 0
    jobs = []
    for v in node.inputs:
        start, limit = [0] * out.rank, list(out.shape)
        start[axis], limit[axis] = at, at + v.shape[axis]
        jobs.append(Elementwise(COPY, (views.tensor(v),), out.slice(start, limit, (1,) * out.rank)))
        at += v.shape[axis]
    return jobs
