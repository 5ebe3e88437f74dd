"""Elementwise expressions, reductions and copies on the vector unit, tiled over DRAM views.

An op's iteration space is its output shape, coalesced over every operand's
strides (so contiguous runs become long DMA bursts); the last three dims are
tiled, any further leading dims are looped over.
"""

from __future__ import annotations

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import MAX_COUNT, AccMode, DType, Operand, Space, VectorFunc
from stagec.isa.opcodes import TRANSCENDENTAL

from ..graph.graph_ir import RECORD_WORDS, Expr, Step, record_inputs
from ..schedule.buffers import elementwise_buffers, gather_buffers, reduce_buffers
from ..schedule.mapper import map_vector
from ..schedule.nest import tiles
from ..schedule.tensors import DramTensor, coalesce
from . import tile_expr

COPY: Expr = (Step("copy", (0,)),)
_REDUCE = {"sum": (VectorFunc.RSUM, AccMode.ADD), "max": (VectorFunc.RMAX, AccMode.MAX),
           "min": (VectorFunc.RMIN, AccMode.MIN)}


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


def emit_elementwise(em, expr: Expr, inputs: list[DramTensor], out: DramTensor) -> None:
    """out = expr(inputs...), inputs broadcast numpy-style to out's shape; requant records (one
    record for the whole tensor) and broadcast scalars are loaded once."""
    records = record_inputs(expr)
    data = [k for k in range(len(inputs)) if k not in records]
    views = [inputs[k].broadcast_to(out.shape) for k in data]
    shape, strides = coalesce(out.shape, out.strides, *[v.strides for v in views])
    lead, lead_s, inner, inner_s = _split3(shape, *strides)
    n_in = len(inputs)
    writable = frozenset(k for i, k in enumerate(data) if all(inner_s[i + 1][d] or inner[d] == 1 for d in range(3)))
    # a broadcast scalar (a constant of the expression) is loaded once, not per tile
    scalars = {k for i, k in enumerate(data) if not any(inner_s[i + 1]) and not any(lead_s[i + 1])}
    p = tile_expr.plan(expr, n_in, writable)
    loaded = [i for i, k in enumerate(data) if k not in scalars]
    buffers = elementwise_buffers(len(loaded), p.temps, len(records), len(scalars))
    m = map_vector(inner, buffers, em.hw, em.layer_label, loads=len(loaded), passes=_passes(expr, em.hw))
    bufs = 2 if m.double_buffer else 1
    bases = em.allocate(buffers(m.tile_oh, m.tile_ow, m.tile_o, bufs))
    record_tiles = {k: _load_record(em, base, inputs[k])
                    for k, base in zip(sorted(records), bases["records"], strict=True)}
    record_tiles |= {k: _load_scalar(em, base, views[data.index(k)])
                     for k, base in zip(sorted(scalars), bases["scalars"], strict=True)}
    tiles_at = iter(bases["tiles"])
    in_buf = [{i: next(tiles_at) for i in loaded} for _ in range(bufs)]
    tmp_buf = [[next(tiles_at) for _ in range(p.temps)] for _ in range(bufs)]
    k = 0
    for idx in np.ndindex(*lead):
        dst = _at(out, idx, lead_s[0], inner_s[0])
        srcs = {i: _at(v, idx, lead_s[i + 1], inner_s[i + 1]) for i, v in enumerate(views) if data[i] not in scalars}
        for a0, t0 in tiles(inner[0], m.tile_oh):
            for a1, t1 in tiles(inner[1], m.tile_ow):
                for a2, t2 in tiles(inner[2], m.tile_o):
                    counts, start, buf = (t0, t1, t2), (a0, a1, a2), k % bufs
                    k += 1
                    loaded = {}
                    for i, src in srcs.items():
                        extent = tuple(c if s else 1 for c, s in zip(counts, src.strides, strict=True))
                        tile = tile_expr.LocalTile(Space.SPAD, in_buf[buf][i], extent, src.dtype)
                        em.load(src, start, (0, 1, 2), extent, tile.operand(extent))
                        loaded[data[i]] = tile
                    args = [loaded[j] if j in loaded else record_tiles[j] for j in range(n_in)]
                    temps = [tile_expr.LocalTile(Space.SPAD, b, counts) for b in tmp_buf[buf]]
                    result = tile_expr.emit(em, expr, p, args, temps, counts)
                    em.store(dst, start, (0, 1, 2), counts, result.operand(counts))


def _passes(expr: Expr, hw) -> float:
    """Vector cycles per lane group of a tile that `expr` costs (a select is a copy and a select;
    a copy may be none, counted as one)."""
    hard = {f.name.lower() for f in TRANSCENDENTAL}
    return sum(2 if s.func == "select" else hw.vector_cycles_per_transcendental if s.func in hard else 1
               for s in expr)


def _load_scalar(em, base: int, t: DramTensor) -> tile_expr.LocalTile:
    """LOAD a broadcast scalar operand (one element) into the scratchpad once."""
    tile = tile_expr.LocalTile(Space.SPAD, base, (1, 1, 1), t.dtype)
    em.load(_at(t, (), (), (0, 0, 0)), (0, 0, 0), (0, 1, 2), (1, 1, 1), tile.operand((1, 1, 1)))
    return tile


def _load_record(em, base: int, t: DramTensor) -> tile_expr.LocalTile:
    """LOAD the one requant record of an elementwise node (its words) into the scratchpad."""
    if t.size != RECORD_WORDS:
        raise ValueError(f"{em.layer_name}: an elementwise requant takes one record for the whole tensor, "
                         f"not {t.size // RECORD_WORDS}")
    em.load(t.reshape((RECORD_WORDS,)), (0,), (None, None, 0), (1, 1, RECORD_WORDS),
            Operand(Space.SPAD, base, (0, 0, 1)))
    return tile_expr.LocalTile(Space.SPAD, base, (1, 1, 1), t.dtype)


def emit_reduce(em, func: str, x: DramTensor, axes: tuple[int, ...], out: DramTensor) -> None:
    """out = reduce_func(x, axes); out has x's shape without `axes`.  An int8 sum widens each loaded
    tile to int32 (COPY) and sums in int32 (`out` is int32); int8 max and min stay int8."""
    vfunc, acc_mode = _REDUCE[func]
    widen = x.dtype != out.dtype
    if widen and not (x.dtype == DType.I8 and out.dtype == DType.I32):
        raise TypeError(f"{em.layer_name}: a reduction of {x.dtype.name} gives {x.dtype.name} or (int8 sums) "
                        f"int32, not {out.dtype.name}")
    kept = [d for d in range(x.rank) if d not in axes]
    xk = DramTensor(x.region, x.offset, tuple(x.shape[d] for d in kept), tuple(x.strides[d] for d in kept), x.dtype)
    kshape, (kx, ko) = coalesce(xk.shape, xk.strides, out.strides if out.rank else ())
    rshape, (rx,) = coalesce(tuple(x.shape[d] for d in axes), tuple(x.strides[d] for d in axes))
    klead = max(len(kshape) - 2, 0)
    kin = (1,) * (2 - len(kshape[klead:])) + tuple(kshape[klead:])
    kin_x = (0,) * (2 - len(kx[klead:])) + tuple(kx[klead:])
    kin_o = (0,) * (2 - len(ko[klead:])) + tuple(ko[klead:])
    buffers = reduce_buffers(widen)
    m = map_vector(kin + (rshape[-1],), buffers, em.hw, em.layer_label, passes=1 + widen)
    bufs = 2 if m.double_buffer else 1
    bases = em.allocate(buffers(m.tile_oh, m.tile_ow, m.tile_o, bufs))
    in_buf, out_buf = bases["input"], bases["sums"]
    wide_buf = bases["widened"] if widen else in_buf
    k = chunk = 0
    for kidx in np.ndindex(*kshape[:klead]):
        x_off = x.offset + x.dtype.itemsize * sum(i * s for i, s in zip(kidx, kx[:klead], strict=True))
        o_off = out.offset + out.dtype.itemsize * sum(i * s for i, s in zip(kidx, ko[:klead], strict=True))
        for a0, t0 in tiles(kin[0], m.tile_oh):
            for a1, t1 in tiles(kin[1], m.tile_ow):
                buf = k % bufs
                k += 1
                dst = Operand(Space.SPAD, out_buf[buf], (t1, 1, 0))
                first = True
                for ridx in np.ndindex(*rshape[:-1]):
                    r_off = x.dtype.itemsize * sum(i * s for i, s in zip(ridx, rx[:-1], strict=True))
                    for a2, t2 in tiles(rshape[-1], m.tile_o):
                        src = DramTensor(x.region, x_off + r_off, (1 << 30,) * 3, kin_x + (rx[-1],), x.dtype)
                        tile = Operand(Space.SPAD, in_buf[chunk % bufs], (t1 * t2, t2, 1))
                        em.load(src, (a0, a1, a2), (0, 1, 2), (t0, t1, t2), tile)
                        if widen:
                            wide = Operand(Space.SPAD, wide_buf[chunk % bufs], tile.strides)
                            em.vector(VectorFunc.COPY, wide, tile, None, (t0, t1, t2), dtype=x.dtype,
                                      out_dtype=out.dtype)
                            tile = wide
                        chunk += 1
                        em.vector(vfunc, dst, tile, None, (t0, t1, t2), acc=AccMode.OVERWRITE if first else acc_mode,
                                  dtype=out.dtype)
                        first = False
                o = DramTensor(out.region, o_off, (1 << 30,) * 3, kin_o + (0,), out.dtype)
                em.store(o, (a0, a1, 0), (0, 1, 2), (t0, t1, 1), dst)


def emit_gather(em, table: DramTensor, indices: DramTensor, out: DramTensor) -> None:
    """out[i, ...] = table[indices[i], ...]: the indices into the scratchpad, then indirect DMA of
    the rows (the table's rows bound the indices, checked when they run)."""
    rows = table.shape[0]
    if rows > MAX_COUNT:
        raise LoweringError(f"{em.layer_name}: a gather from a table of {rows} rows: GATHER indexes at most "
                            f"{MAX_COUNT} rows (its 16-bit row count)")
    row = table.reshape((rows, table.size // rows))
    idx = indices.reshape((indices.size,))
    dst = out.reshape((indices.size, table.size // rows))
    if row is None or idx is None or dst is None:
        raise ValueError(f"{em.layer_name}: gather operands must be row-contiguous views")
    width = row.shape[1]
    m = map_vector((indices.size, 1, width), gather_buffers, em.hw, em.layer_label, passes=0)
    bufs = 2 if m.double_buffer else 1
    bases = em.allocate(gather_buffers(m.tile_oh, m.tile_ow, m.tile_o, bufs))
    idx_buf, row_buf = bases["indices"], bases["rows"]
    k = 0
    for a0, t0 in tiles(indices.size, m.tile_oh):
        ib = idx_buf[k % bufs]
        em.load(idx, (a0,), (None, None, 0), (1, 1, t0), Operand(Space.SPAD, ib, (0, 0, 1)))
        for a2, t2 in tiles(width, m.tile_o):
            rb = row_buf[k % bufs]
            k += 1
            em.gather(row, (0, a2), t0, t2, Operand(Space.SPAD, rb, (t2, 0, 1)), Operand(Space.SPAD, ib, (1, 0, 0)))
            em.store(dst, (a0, a2), (0, None, 1), (t0, 1, t2), Operand(Space.SPAD, rb, (t2, 0, 1)))
