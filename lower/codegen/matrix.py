"""Convolution and matmul on the matrix unit.

Every matrix-unit op is emitted as a 2-D convolution over NCHW views (a matmul
is the 1x1 convolution of a 1xM image).  Per output tile (rows x cols x out
channels) and input-channel tile:

    LOAD  input halo [ih, iw, c] (padding filled by the DMA, VTA-style)
    LOAD  weights [kh*kw, c, o]          (once, when they fit resident)
    MATMUL per tap: A = the halo window for that tap (im2col as an address
          pattern), B = the tap's weights, C += into the accumulator tile
then the fused epilogue on the accumulator tile, and one STORE.  A transposed mapping
(schedule.TileMapping) swaps A and B, so the output channels stream through the array, and
COPYs each accumulator tile back to (rows, cols, channels) before the epilogue; a stacked
one LOADs each output row's kernel rows side by side and runs one MATMUL over the whole kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import REQUANT_RECORD_BYTES, DType, Operand, Space, VectorFunc

from ..graph.graph_ir import RECORD_WORDS
from ..schedule.buffers import EPILOGUE_TILES, EPILOGUE_VECTORS, NO_EXTRAS, EpilogueLayout
from ..schedule.nest import ConvProblem, LayerShape, TileMapping, row_tiles, tile_line, tiles
from ..schedule.nest_work import matrix_buffers, one_spatial_tile
from ..schedule.tensors import DramTensor
from . import tile_expr
from .emitter import ACC_DTYPE

# Tile axes of an NCHW output: rows (H), cols (W), channels (O).
OUT_AXES = (2, 3, 1)


class Epilogue:
    """A fused epilogue (lower.schedule.buffers.EpilogueLayout) over its extra inputs (views broadcast to the
    output's NCHW shape; requant records [N, C, H, W, 4]), in the nest's buffers (`bases`, from
    Emitter.allocate).

    Channel vectors and scalars are loaded once for the whole nest, or, `channels_per_tile` (a
    nest of one spatial tile, lower.schedule.nest_work.one_spatial_tile), a channel tile (`tile_o` channels)
    per output tile into one of `bufs` copies; tile inputs are loaded per output tile into a tile
    buffer each (x `bufs`).
    """

    def __init__(self, em, layout: EpilogueLayout | None, extras: list[DramTensor], bases: dict[str, list[int]],
                 tile_o: int, channels: int, bufs: int, channels_per_tile: bool = False):
        self.layout, self.extras = layout, extras
        channels, copies = (tile_o, bufs) if channels_per_tile else (channels, 1)
        vectors = bases[EPILOGUE_VECTORS][0]
        self.vectors = {k: [vectors + at for at in offsets]   # input -> base of each copy
                        for k, offsets in (layout.vector_offsets(channels, copies) if layout else {}).items()}
        self.per_tile = channels_per_tile
        inputs = layout.inputs if layout else ()
        for k, i in enumerate(inputs):
            if i.kind == "scalar" or not channels_per_tile and i.kind == "channel":
                _load_channels(em, extras[k], i.record, 0, channels if i.kind == "channel" else 1, self.vectors[k][0])
        tiles = iter(bases[EPILOGUE_TILES])
        self.tile_buf = [{k: next(tiles) for k, i in enumerate(inputs) if i.kind == "tile"} for _ in range(bufs)]
        self.temp_buf = [[next(tiles) for _ in range(layout.plan.temps if layout else 0)] for _ in range(bufs)]

    def emit(self, em, acc_tile: tile_expr.LocalTile, n: int, o0: int, h0: int, w0: int, counts, buf: int,
             final: tile_expr.LocalTile | None = None):
        """Run the epilogue on `acc_tile` (holding output box counts at (n, o0, h0, w0)); return the result
        tile: `final` (a scratchpad tile) when given, which frees the accumulator tile before the store."""
        if not self.layout:
            if final is None:
                return acc_tile
            out = tile_expr.LocalTile(final.space, final.base, tuple(counts), acc_tile.dtype)
            em.vector(VectorFunc.COPY, out.operand(counts), acc_tile.operand(counts), None, counts,
                      dtype=acc_tile.dtype)
            return out
        args = [acc_tile]
        for k, (e, i) in enumerate(zip(self.extras, self.layout.inputs, strict=True)):
            if i.kind == "tile":
                extent = i.extent(counts)
                tile = tile_expr.LocalTile(Space.SPAD, self.tile_buf[buf][k], extent, e.dtype)
                em.load(e, (n, o0, h0, w0), OUT_AXES, extent, tile.operand(extent))
            elif i.kind == "scalar":
                tile = tile_expr.LocalTile(Space.SPAD, self.vectors[k][0], (1, 1, 1), e.dtype)
            elif self.per_tile:
                base = self.vectors[k][buf]
                _load_channels(em, e, i.record, o0, counts[2], base)
                tile = tile_expr.LocalTile(Space.SPAD, base, (1, 1, counts[2]), e.dtype)
            else:
                per = REQUANT_RECORD_BYTES if i.record else e.dtype.itemsize
                tile = tile_expr.LocalTile(Space.SPAD, self.vectors[k][0] + o0 * per, (1, 1, counts[2]), e.dtype)
            args.append(tile)
        temps = [tile_expr.LocalTile(Space.SPAD, b, tuple(counts)) for b in self.temp_buf[buf]]
        return tile_expr.emit(em, self.layout.expr, self.layout.plan, args, temps, counts, final)


def _load_channels(em, e: DramTensor, record: bool, o0: int, count: int, base: int) -> None:
    """LOAD channels o0 .. o0 + count of a per-channel epilogue input (a vector, or requant records;
    one of them for a scalar)."""
    if not record:
        em.load(e, (0, o0, 0, 0), OUT_AXES, (1, 1, count), Operand(Space.SPAD, base, (0, 0, 1)))
        return
    if count > 1 and (e.strides[1], e.strides[-1]) != (RECORD_WORDS, 1):   # rows and columns: see Epilogue
        raise ValueError(f"{em.layer_name}: requant records must be dense along the channels")
    words = count * RECORD_WORDS
    em.load(DramTensor(e.region, e.address((0, o0, 0, 0, 0)), (words,), (1,), DType.I32), (0,), (None, None, 0),
            (1, 1, words), Operand(Space.SPAD, base, (0, 0, 1)))


def emit_conv(em, p: ConvProblem, m: TileMapping, x: DramTensor, w: DramTensor, out: DramTensor,
              epilogue: EpilogueLayout | None = None, extras: list[DramTensor] = (),
              fill: Callable | None = None) -> None:
    """Emit a whole convolution; x [N,C,H,W], w [O,C,KH,KW], out [N,O,OH,OW] are DRAM views.  Float32
    operands accumulate in float32, int8 ones in int32 (the epilogue then sees an int32 tile)."""
    if x.dtype != w.dtype or x.dtype not in ACC_DTYPE:
        raise TypeError(f"{em.layer_name}: the array multiplies float32 or int8 operands, not {x.dtype.name} "
                        f"by {w.dtype.name}")
    if x.dtype.itemsize != p.itemsize:
        raise AssertionError(f"{em.layer_name}: internal error: {x.dtype.name} operands of a problem of "
                             f"{p.itemsize}-byte elements")
    acc_type = ACC_DTYPE[x.dtype]
    xb, wb = x.dtype.itemsize, w.dtype.itemsize
    bufs = 2 if m.double_buffer else 1
    (pt, _), (pl, _) = p.padding
    sh, sw = p.stride
    dh, dw = p.dilation
    shape = LayerShape.of("matrix", p, epilogue.extras if epilogue else NO_EXTRAS)
    one = bool(one_spatial_tile(shape, m, np))
    bases = em.allocate(matrix_buffers(shape, m, np))
    halo_buf = bases["halo"]
    taps = p.kh * p.kw
    # the weights' k order: (kernel row, kernel column, channel), stacked (kernel column, kernel row, channel).
    # Resident, they are held a channel tile after another, each [taps][channels of the tile][O], so
    # that a MATMUL's k (a kernel row's or the whole kernel's taps over the tile's channels) is one run
    w_axes = (3, 2, 1, 0) if m.stacked else (2, 3, 1, 0)
    w_counts = (p.kw, p.kh) if m.stacked else (p.kh, p.kw)
    c_tiles = tiles(p.c, m.tile_c)
    if m.weights_resident:
        wres = bases["weights"][0]
        for c0, tc in c_tiles:
            em.load_box(w, (0, c0, 0, 0), w_axes, (*w_counts, tc, p.o), Space.SPAD, wres + c0 * taps * p.o * wb)
    else:
        w_buf = bases["weights"]
    epi = Epilogue(em, epilogue, list(extras), bases, m.tile_o, p.o, bufs, one)
    acc_buf = bases["accumulator"]
    # one accumulator tile: the epilogue writes its result to the scratchpad, so the next tile's
    # MATMULs wait for the epilogue only, not the store; a transposed nest's COPY does that already
    final = tile_expr.LocalTile(Space.SPAD, bases["result"][0], (1, 1, 1)) if bases["result"] else None
    turned = bases["turned"]
    n_halo = n_w = n_out = 0

    def load_halo(n, oh0, th, ow0, tw, c0, tc):
        """LOAD the input window of an output tile; returns (base, iw) or None if all padding."""
        nonlocal n_halo
        ih, iw = p.halo(th, tw)
        r0, q0 = oh0 * sh - pt, ow0 * sw - pl
        top, left = max(0, -r0), max(0, -q0)
        bottom, right = max(0, r0 + ih - p.h), max(0, q0 + iw - p.w)
        if ih - top - bottom <= 0 or iw - left - right <= 0:
            return None
        if max(top, bottom, left, right) > 255:
            raise LoweringError(f"{em.layer_name}: padding of {max(top, bottom, left, right)} exceeds the DMA's 255")
        base = halo_buf[n_halo % len(halo_buf)]
        n_halo += 1
        if not m.stacked:
            em.load(x, (n, c0, r0 + top, q0 + left), (2, 3, 1), (ih - top - bottom, iw - left - right, tc),
                    Operand(Space.SPAD, base, (iw * tc, tc, 1)), pad=(top, bottom, left, right, 0, 0))
            return base, iw
        for r in range(th):   # output row r: [column][kernel row][channel]
            row = base + r * iw * p.kh * tc * xb
            first = r0 + r * sh
            above, below = max(0, -first), max(0, first + p.kh - p.h)
            if above + below >= p.kh:
                fill(Operand(Space.SPAD, row, (p.kh * tc, tc, 1)), (iw, p.kh, tc), 0.0, x.dtype)
                continue
            em.load(x, (n, c0, first + above, q0 + left), (3, 2, 1), (iw - left - right, p.kh - above - below, tc),
                    Operand(Space.SPAD, row, (p.kh * tc, tc, 1)), pad=(left, right, above, below, 0, 0))
        return base, iw

    for n in range(p.n):
        for oh0, th in row_tiles(p, m):
            for ow0, tw in tiles(p.ow, m.tile_ow):
                shared = load_halo(n, oh0, th, ow0, tw, 0, p.c) if len(c_tiles) == 1 else None
                line, pitch = tile_line(shape, th, tw)   # transposed: C[o][line position], else C[row][col][o]
                for o0, to in tiles(p.o, m.tile_o):
                    c_base = acc_buf[n_out % m.acc_buffers]
                    c_op = Operand(Space.ACC, c_base, (0, line, 1) if m.transposed else (tw * to, to, 1))
                    first = True
                    for c0, tc in c_tiles:
                        halo = shared if len(c_tiles) == 1 else load_halo(n, oh0, th, ow0, tw, c0, tc)
                        if halo is None:
                            continue
                        h_base, iw = halo
                        if m.weights_resident:
                            w_base, k_stride, tap_stride = wres + (c0 * taps * p.o + o0) * wb, p.o, tc * p.o
                        else:
                            w_base, k_stride, tap_stride = w_buf[n_w % bufs], to, tc * to
                            n_w += 1
                            em.load_box(w, (o0, c0, 0, 0), w_axes, (*w_counts, tc, to), Space.SPAD, w_base)
                        if m.stacked:   # k = (kernel column, kernel row, channel), contiguous in the halo
                            em.matmul(Operand(Space.SPAD, h_base, (iw * p.kh * tc, sw * p.kh * tc, 1)),
                                      Operand(Space.SPAD, w_base, (k_stride, 1, 0)), c_op, th, tw, taps * tc, to,
                                      accumulate=not first, dtype=x.dtype)
                            first = False
                            continue
                        # With unit column dilation a kernel row's taps are contiguous in the halo
                        # ((kw, c) -> kw * tc + c) and in the weights: one MATMUL of k = kw * tc.
                        fold = p.kw if dw == 1 else 1
                        for kh in range(p.kh):
                            for kw in range(0, p.kw, fold):
                                a_base = h_base + (kh * dh * iw * tc + kw * dw * tc) * xb
                                b_base = w_base + (kh * p.kw + kw) * tap_stride * wb
                                if m.transposed:   # A: the weights' transpose [o][k]; B: the halo's [k][line]
                                    em.matmul(Operand(Space.SPAD, b_base, (0, 1, k_stride)),
                                              Operand(Space.SPAD, a_base, (1, sw * tc, 0)), c_op, 1, to, fold * tc,
                                              line, accumulate=not first, dtype=x.dtype)
                                else:
                                    em.matmul(Operand(Space.SPAD, a_base, (sh * iw * tc, sw * tc, 1)),
                                              Operand(Space.SPAD, b_base, (k_stride, 1, 0)), c_op, th, tw,
                                              fold * tc, to, accumulate=not first, dtype=x.dtype)
                                first = False
                    if first:   # the whole receptive field is padding: the sum is zero
                        fill(c_op, (1, to, line) if m.transposed else (th, tw, to), 0.0, acc_type)
                    if not m.transposed:
                        acc_tile = tile_expr.LocalTile(Space.ACC, c_base, (th, tw, to), acc_type)
                    else:
                        acc_tile = tile_expr.LocalTile(Space.SPAD, turned[n_out % m.acc_buffers], (th, tw, to),
                                                       acc_type)
                        em.vector(VectorFunc.COPY, acc_tile.operand((th, tw, to)),
                                  Operand(Space.ACC, c_base, (pitch, 1, line)), None, (th, tw, to), dtype=acc_type)
                    result = epi.emit(em, acc_tile, n, o0, oh0, ow0, (th, tw, to), n_out % bufs, final)
                    em.store(out, (n, o0, oh0, ow0), OUT_AXES, (th, tw, to), result.operand((th, tw, to)))
                    n_out += 1


def as_conv(t: DramTensor, role: str) -> DramTensor:
    """A 2-D matmul operand as an NCHW conv view: a[M,K] -> x[1,K,1,M]; b[K,N] -> w[N,K,1,1];
    out[M,N] -> [1,N,1,M]; dims past the first two (a requant record's words) stay last."""
    (d0, d1, *dr), (s0, s1, *sr) = t.shape, t.strides
    if role == "w":
        return DramTensor(t.region, t.offset, (d1, d0, 1, 1, *dr), (s1, s0, 0, 0, *sr), t.dtype)
    return DramTensor(t.region, t.offset, (1, d1, 1, d0, *dr), (0, s1, 0, s0, *sr), t.dtype)
