"""Depthwise convolution and pooling on the vector unit: one vector op per window tap.

Channels stay separate (no reduction across them), so instead of a dense conv
padded with zeros on the array, each tap is an elementwise op over an output
tile [rows, cols, channels] that reads a strided window of the input halo:

    depthwise:  acc (+)= halo_window(tap) * weights[tap, channels]
    max pool:   acc max= halo_window(tap)        (padding is -inf)
    sum pool:   acc  += halo_window(tap)
"""

from __future__ import annotations

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
    func, acc_mode, pad_value = _REDUCE[kind]
    widen = bool(p.widened)
    if x.dtype.itemsize != p.itemsize or w is not None and w.dtype != x.dtype:
        raise AssertionError(f"{em.layer_name}: internal error: {x.dtype.name} operands of a problem of "
                             f"{p.itemsize}-byte elements")
    acc_type = ACC_DTYPE[x.dtype] if widen else x.dtype
    cb = x.dtype.itemsize
    bufs = 2 if m.double_buffer else 1
    (pt, _), (pl, _) = p.padding
    sh, sw = p.stride
    dh, dw = p.dilation
    shape = LayerShape.of("depthwise" if w is not None else "pool", p, epilogue.extras if epilogue else NO_EXTRAS)
    bases = em.allocate(window_buffers(shape, m, np))
    halo_buf = bases["halo"]
    w_buf = bases["weights"]
    epi = Epilogue(em, epilogue, list(extras), bases, m.tile_o, p.o, bufs, m.tile_oh * m.tile_ow * m.tile_o)
    acc_buf = bases["accumulator"]
    k = 0
    for c0, tc in tiles(p.o, m.tile_o):
        if w is not None:   # the channel tile's weights, [taps, tc], reused by every spatial tile
            w_base = w_buf[(c0 // m.tile_o) % bufs]
            em.load_box(w, (c0, 0, 0, 0), (2, 3, 0), (p.kh, p.kw, tc), Space.SPAD, w_base, local=w.dtype)
        for n in range(p.n):
            for oh0, th in tiles(p.oh, m.tile_oh):
                for ow0, tw in tiles(p.ow, m.tile_ow):
                    buf = k % bufs
                    k += 1
                    ih, iw = p.halo(th, tw)
                    r0, q0 = oh0 * sh - pt, ow0 * sw - pl
                    top, left = max(0, -r0), max(0, -q0)
                    bottom, right = max(0, r0 + ih - p.h), max(0, q0 + iw - p.w)
                    dst = Operand(Space.ACC, acc_buf[buf], (tw * tc, tc, 1))
                    if ih - top - bottom <= 0 or iw - left - right <= 0:
                        fill(dst, (th, tw, tc), 0.0 if pad_value == PadValue.ZERO else float("-inf"), acc_type)
                    else:
                        if max(top, bottom, left, right) > 255:
                            raise LoweringError(f"{em.layer_name}: padding exceeds the DMA's 255")
                        em.load(x, (n, c0, r0 + top, q0 + left), (2, 3, 1),
                                (ih - top - bottom, iw - left - right, tc),
                                Operand(Space.SPAD, halo_buf[buf], (iw * tc, tc, 1)),
                                pad=(top, bottom, left, right, 0, 0), pad_value=pad_value, local=x.dtype)
                        for t, (kh, kw) in enumerate((a, b) for a in range(p.kh) for b in range(p.kw)):
                            src = Operand(Space.SPAD, halo_buf[buf] + (kh * dh * iw * tc + kw * dw * tc) * cb,
                                          (sh * iw * tc, sw * tc, 1))
                            weight = Operand(Space.SPAD, w_base + t * tc * cb, (0, 0, 1)) if w is not None else None
                            em.vector(func, dst, src, weight, (th, tw, tc),
                                      acc=AccMode.OVERWRITE if t == 0 else acc_mode, dtype=x.dtype,
                                      out_dtype=acc_type)
                    acc_tile = tile_expr.LocalTile(Space.ACC, acc_buf[buf], (th, tw, tc), acc_type)
                    result = epi.emit(em, acc_tile, n, c0, oh0, ow0, (th, tw, tc), buf)
                    em.store(out, (n, c0, oh0, ow0), (2, 3, 1), (th, tw, tc), result.operand((th, tw, tc)))

