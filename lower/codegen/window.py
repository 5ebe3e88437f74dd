"""Depthwise convolution and pooling on the vector unit: one vector op per window tap.

Channels stay separate (no reduction across them), so instead of a dense conv
padded with zeros on the array, each tap is an elementwise op over an output
tile [rows, cols, channels] that reads a strided window of the input halo:

    depthwise:  acc (+)= halo_window(tap) * weights[tap, channels]
    max pool:   acc max= halo_window(tap)        (padding is -inf)
    sum pool:   acc  += halo_window(tap)

An int8 depthwise mapped `dot` (lower.schedule.nest.TileMapping) holds its halo channel-major
([channel][row][column]: the DMA lays it out so, or in a cascade a COPY turns the window) and its weights
[channel][tap], so that a kernel row's taps over an output are a run of kw int8 in both; an RDOT per
output row and kernel row sums them (the same int32 sums, int8 packed in the lanes):

    dot:        acc[row] (+)= sum over kw of halo[channels, row * sh + kh, cols * sw + kw] * weights[channels, kh, kw]
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import AccMode, Operand, PadValue, Space, VectorFunc

from ..schedule.buffers import NO_EXTRAS, EpilogueLayout
from ..schedule.nest import ConvProblem, LayerShape, TileMapping, tiles
from ..schedule.nest_work import window_buffers
from ..schedule.tensors import DramTensor
from . import tile_expr
from .emitter import ACC_DTYPE
from .matrix import Epilogue

_REDUCE = {"sum": (VectorFunc.COPY, AccMode.ADD, PadValue.ZERO),
           "max": (VectorFunc.COPY, AccMode.MAX, PadValue.NEG_INF),
           "depthwise": (VectorFunc.MUL, AccMode.ADD, PadValue.ZERO)}


def emit_window(em, kind: str, p: ConvProblem, m: TileMapping, x: DramTensor, out: DramTensor,
                w: DramTensor | None = None, epilogue: EpilogueLayout | None = None, extras=(), fill=None) -> None:
    """x [N,C,H,W] -> out [N,C,OH,OW] (p.c == p.o); w [C,1,KH,KW] for depthwise.  An int8 max pool
    stays int8; int8 sums and products run in int32, bf16 ones in float32 (p.widened, decided by the
    schedule): each tap's COPY or MUL reads the halo (and weights) as loaded and converts them itself."""
    nest = WindowNest(em, kind, p, m, x, w, epilogue, fill)
    epi = nest.epilogue(extras)
    for c0, tc in tiles(p.o, m.tile_o):
        w_base = nest.load_weights(c0, tc)
        for n in range(p.n):
            for oh0, th in tiles(p.oh, m.tile_oh):
                for ow0, tw in tiles(p.ow, m.tile_ow):
                    result = nest.tile(epi, n, oh0, th, ow0, tw, c0, tc, w_base)
                    em.store(out, (n, c0, oh0, ow0), (2, 3, 1), (th, tw, tc), result.operand((th, tw, tc)))


class WindowNest:
    """A depthwise conv's or a pooling's nest on the vector unit, emitted a tile at a time: its buffers
    (Emitter.allocate of the nest's list, or `bases` where a cascade allocated them, lower.codegen.cascade,
    its weights then one buffer holding every channel tile's), and the running count of output tiles
    that picks each one's halo and accumulator buffer."""

    def __init__(self, em, kind: str, p: ConvProblem, m: TileMapping, x: DramTensor, w: DramTensor | None,
                 epilogue: EpilogueLayout | None, fill, bases: dict | None = None):
        self.em, self.kind, self.p, self.m, self.x, self.w = em, kind, p, m, x, w
        self.layout, self.fill = epilogue, fill
        self.func, self.acc_mode, self.pad_value = _REDUCE[kind]
        self.widen = bool(p.widened)
        if x.dtype.itemsize != p.itemsize or w is not None and w.dtype != x.dtype:
            raise AssertionError(f"{em.layer_name}: internal error: {x.dtype.name} operands of a problem of "
                                 f"{p.itemsize}-byte elements")
        self.acc_type = ACC_DTYPE[x.dtype] if self.widen else x.dtype
        self.bufs = 2 if m.double_buffer else 1
        self.resident = bases is not None
        shape = LayerShape.of("depthwise" if w is not None else "pool", p, epilogue.extras if epilogue else NO_EXTRAS)
        self.bases = em.allocate(window_buffers(shape, m, np)) if bases is None else bases
        self.k = 0

    def epilogue(self, extras, origin: tuple[int, int] = (0, 0)) -> Epilogue:
        m = self.m
        return Epilogue(self.em, self.layout, list(extras), self.bases, m.tile_o, self.p.o, self.bufs,
                        m.tile_oh * m.tile_ow * m.tile_o, origin=origin, fill=self.fill)

    def start(self, extras, origin: tuple[int, int] = (0, 0)) -> Epilogue:
        """A cascade's depthwise member (lower.codegen.cascade): every channel tile's weights LOADed once,
        into the one buffer that holds them all; its Epilogue (`origin`: Epilogue's)."""
        self.w_bases = {c0: self.load_weights(c0, tc) for c0, tc in tiles(self.p.o, self.m.tile_o)}
        return self.epilogue(extras, origin)

    def spatial_tile(self, epi: Epilogue, n, oh0, th, ow0, tw, write, inside=None, into=None, outs=None,
                     block=None) -> Iterator[None]:
        """A spatial tile's channel tiles (those of `outs` where given: a chunked cascade's chunk), as
        lower.codegen.matrix's nest runs them in a cascade, yielding after each: each written by write(n,
        c0, oh0, ow0, counts, result), or, `into` = (base, type), by its epilogue into the scratchpad
        there, channel tiles one after another.  `inside`: the scratchpad base of the input windows,
        padding included, channel tiles one after another (lower.codegen.halo), or None: DRAM; `block`:
        (rows each channel tile holds there, the row the tile's halo starts at) where that is more than
        its halo (a line-buffered window below its shared rows), else (its halo's rows, 0)."""
        c_tiles = tiles(self.p.o, self.m.tile_o) if outs is None else outs
        ih, iw = self.p.halo(th, tw)
        held, row0 = block or (ih, 0)
        for c0, tc in c_tiles:
            final, at = None, c0 - c_tiles[0][0]
            if into is not None:
                base, dtype = into
                final = tile_expr.LocalTile(Space.SPAD, base + at * th * tw * dtype.itemsize, (th, tw, tc), dtype)
            window = None if inside is None else inside + (at * held + row0 * tc) * iw * self.x.dtype.itemsize
            result = self.tile(epi, n, oh0, th, ow0, tw, c0, tc, self.w_bases[c0], final, window)
            if into is None:
                write(n, c0, oh0, ow0, (th, tw, tc), result)
            yield

    def load_weights(self, c0: int, tc: int) -> int | None:
        """LOAD a channel tile's weights, [taps, tc] (a dot mapping's [tc, taps]); their base."""
        p, w, em = self.p, self.w, self.em
        if w is None:
            return None
        at = c0 * p.kh * p.kw * w.dtype.itemsize if self.resident else 0
        slot = 0 if self.resident else (c0 // self.m.tile_o) % self.bufs
        w_base = self.bases["weights"][slot] + at
        axes, counts = ((0, 2, 3), (tc, p.kh, p.kw)) if self.m.dot else ((2, 3, 0), (p.kh, p.kw, tc))
        em.load_box(w, (c0, 0, 0, 0), axes, counts, Space.SPAD, w_base, local=w.dtype)
        return w_base

    def tile(self, epi: Epilogue, n, oh0, th, ow0, tw, c0, tc, w_base, final=None, inside=None) -> tile_expr.LocalTile:
        """An output tile: its halo LOADed (padding by the DMA; read in place at `inside`, padding included,
        where a cascade computed it: the base of this channel tile's window), a VECTOR per tap, the
        epilogue; the result tile (`final`, a scratchpad tile, where given)."""
        p, em, cb = self.p, self.em, self.x.dtype.itemsize
        (pt, _), (pl, _) = p.padding
        (sh, sw), (dh, dw) = p.stride, p.dilation
        buf = self.k % self.bufs
        self.k += 1
        halo_buf = self.bases.get("halo")
        acc_buf = self.bases["accumulator"]
        ih, iw = p.halo(th, tw)
        r0, q0 = oh0 * sh - pt, ow0 * sw - pl
        top, left = max(0, -r0), max(0, -q0)
        bottom, right = max(0, r0 + ih - p.h), max(0, q0 + iw - p.w)
        dst = Operand(Space.ACC, acc_buf[buf], (tw * tc, tc, 1))
        base = inside
        if base is None and (ih - top - bottom <= 0 or iw - left - right <= 0):
            self.fill(dst, (th, tw, tc), 0.0 if self.pad_value == PadValue.ZERO else float("-inf"), self.acc_type)
        else:
            dot = self.m.dot
            if base is None:
                if max(top, bottom, left, right) > 255:
                    raise LoweringError(f"{em.layer_name}: padding exceeds the DMA's 255")
                base = halo_buf[buf]
                counts, pad = (ih - top - bottom, iw - left - right, tc), (top, bottom, left, right, 0, 0)
                axes, strides = (2, 3, 1), (iw * tc, tc, 1)
                if dot:   # channel-major
                    axes, strides, counts, pad = (1, 2, 3), (ih * iw, iw, 1), counts[2:] + counts[:2], pad[4:] + pad[:4]
                em.load(self.x, (n, c0, r0 + top, q0 + left), axes, counts, Operand(Space.SPAD, base, strides),
                        pad=pad, pad_value=self.pad_value, local=self.x.dtype)
            elif dot:   # the window in place, [row][column][channel], turned channel-major
                em.vector(VectorFunc.COPY, Operand(Space.SPAD, halo_buf[buf], (ih * iw, iw, 1)),
                          Operand(Space.SPAD, base, (1, iw * tc, tc)), None, (tc, ih, iw), dtype=self.x.dtype,
                          out_dtype=self.x.dtype)
                base = halo_buf[buf]
            if dot:
                self._dot(dst, base, w_base, th, tw, tc)
            for t, (kh, kw) in enumerate(() if dot else ((a, b) for a in range(p.kh) for b in range(p.kw))):
                src = Operand(Space.SPAD, base + (kh * dh * iw * tc + kw * dw * tc) * cb,
                              (sh * iw * tc, sw * tc, 1))
                weight = Operand(Space.SPAD, w_base + t * tc * cb, (0, 0, 1)) if self.w is not None else None
                em.vector(self.func, dst, src, weight, (th, tw, tc),
                          acc=AccMode.OVERWRITE if t == 0 else self.acc_mode, dtype=self.x.dtype,
                          out_dtype=self.acc_type)
        acc_tile = tile_expr.LocalTile(Space.ACC, acc_buf[buf], (th, tw, tc), self.acc_type)
        return epi.emit(em, acc_tile, n, c0, oh0, ow0, (th, tw, tc), buf, final, typed=final is not None)

    def _dot(self, dst: Operand, base: int, w_base: int, th, tw, tc) -> None:
        """A dot mapping's taps: per output row and kernel row, an RDOT of the row's channels x columns
        over runs of kw in the channel-major halo at `base` and the weights, [channel][tap], at `w_base`."""
        p, em, cb = self.p, self.em, self.x.dtype.itemsize
        (sh, sw), dh = p.stride, p.dilation[0]
        ih, iw = p.halo(th, tw)
        for r in range(th):
            row = Operand(Space.ACC, dst.base + r * tw * tc * self.acc_type.itemsize, (tc, 1, 0))
            for kh in range(p.kh):
                em.vector(VectorFunc.RDOT, row,
                          Operand(Space.SPAD, base + (r * sh + kh * dh) * iw * cb, (sw, ih * iw, 1)),
                          Operand(Space.SPAD, w_base + kh * p.kw * cb, (0, p.kh * p.kw, 1)), (tw, tc, p.kw),
                          acc=AccMode.OVERWRITE if kh == 0 else AccMode.ADD, dtype=self.x.dtype,
                          out_dtype=self.acc_type)
