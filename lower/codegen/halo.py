"""A cascade's halo (lower.schedule.halo) emitted: the members ahead of a depthwise member compute its
padded input window per spatial tile (`computed`: the whole window, or with a line buffer its new
rows, the rows before them copied forward by `copy_forward`), and the one just ahead zeroes the
padding of the rows it computes by a mask.

The mask is LOADed per spatial tile whose rows reach into the padding (`mask_padding`; a tile inside
the input has none), of the window's own type (int8, bf16 or float32): a constant 1
over the computed rows' inside, the DMA's padding zeros around it, one dense write of [rows][cols];
each of the member's result tiles (a channel tile of those rows, dense in the intermediate) is then
multiplied by it in place, the mask broadcast over the channels.  So the scratchpad only ever
receives dense writes, as the batched simulator requires, and the depthwise reads the whole window,
padding included, where it lies.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stagec.isa.instructions import DType, Operand, Space, VectorFunc

from ..schedule.halo import ahead_shape
from ..schedule.nest import ConvProblem, LayerShape, tiles
from ..schedule.tensors import DramTensor


def problem_of(L: LayerShape) -> ConvProblem:
    """The window LayerShape `L` (a depthwise member's, or stacked ones composed: lower.schedule.halo.targets)
    as the problem the halo's emission walks: its input, kernel extent, stride and padding."""
    return ConvProblem(L.n, L.c, L.h, L.w, L.o, L.kh, L.kw, (L.stride_h, L.stride_w),
                       ((L.pad_top, L.pad_bottom), (L.pad_left, L.pad_right)), (L.dilation_h, L.dilation_w))


def padded(p: ConvProblem, dw: ConvProblem) -> ConvProblem:
    """A member ahead of depthwise `dw` as emitted: its output dw's input padded as far as the windows
    read, its input extended by the padding that reads (lower.schedule.halo.ahead_shape of one window
    over the whole, so the nest's tiles agree with the shape the schedule priced: one spatial tile where
    that has one), the LOAD padding it; short of p's input where the windows end before it."""
    a = ahead_shape(LayerShape.of("matrix", p), LayerShape.of("depthwise", dw), dw.oh, dw.ow, np)
    return dataclasses.replace(p, h=int(a.h), w=int(a.w), padding=((int(a.pad_top), int(a.pad_bottom)),
                                                                   (int(a.pad_left), int(a.pad_right))))


def origin(dw: ConvProblem | None) -> tuple[int, int]:
    """The (row, col) in a member's output, as emitted, of its layer's first (Epilogue's origin): a member
    ahead of depthwise `dw` computes dw's padded input (`padded`), its layer's output inside the padding."""
    return (0, 0) if dw is None else (dw.padding[0][0], dw.padding[1][0])


def window(dw: ConvProblem, oh0: int, th: int, ow0: int, tw: int) -> tuple:
    """(row, col, rows, cols) in dw's padded input of the window of its output tile at (oh0, ow0)."""
    ih, iw = dw.halo(th, tw)
    return oh0 * dw.stride[0], ow0 * dw.stride[1], ih, iw


def computed(dw: ConvProblem, oh0: int, th: int, ow0: int, tw: int, line: bool) -> tuple:
    """(row, col, rows, cols) in dw's padded input that the members ahead compute for dw's output tile at
    (oh0, ow0), and the window's row where they start: the whole window, or with a `line` buffer below a
    strip's first tile the window's rows after those it shares with the one above (copy_forward's)."""
    r, q, ih, iw = window(dw, oh0, th, ow0, tw)
    shared = ih - th * dw.stride[0] if line and oh0 else 0
    return r + shared, q, ih - shared, iw, shared


def copy_forward(em, src: int, above: int, dst: int, here: int, iw: int, rows: int, o: int, tile_o: int,
                 dtype: DType) -> None:
    """COPY each channel tile's last `rows` rows of the window at `src` (of `above` rows) to the first rows of
    the window at `dst` (of `here` rows), both iw columns wide, channel tiles one after another."""
    for o0, to in tiles(o, tile_o):
        strides = (iw * to, to, 1)
        em.vector(VectorFunc.COPY, Operand(Space.SPAD, dst + o0 * here * iw * dtype.itemsize, strides),
                  Operand(Space.SPAD, src + (o0 * above + (above - rows) * to) * iw * dtype.itemsize, strides), None,
                  (rows, iw, to), dtype=dtype)


def mask_padding(dw: ConvProblem, at: tuple) -> tuple:
    """(top, bottom, left, right): how far the rows `at` (computed's) reach into dw's padding; all 0, the
    tile needs no mask (lower.schedule.halo.inside_tiles prices it so)."""
    r, q, ih, iw, _ = at
    (pt, _), (pl, _) = dw.padding
    return max(0, pt - r), max(0, r + ih - pt - dw.h), max(0, pl - q), max(0, q + iw - pl - dw.w)


def load_mask(em, pads: tuple, base: int, at: tuple, dtype: DType) -> None:
    """LOAD the mask of `dtype` (the window's) of the rows `at` (computed's) to `base`: 1 inside the
    depthwise's input, 0 in its padding, `pads` (mask_padding's) of it around."""
    _, _, ih, iw, _ = at
    top, bottom, left, right = pads
    one = em.consts.scalar(1.0, dtype)
    em.load(DramTensor(one.region, one.offset, (1,), (0,), dtype), (0,), (0, 0, 0),
            (ih - top - bottom, iw - left - right, 1), Operand(Space.SPAD, base, (iw, 1, 1)),
            pad=(top, bottom, left, right, 0, 0), local=dtype)


def apply_mask(em, inter: int, mask: int, at: tuple, held: int, o: int, tile_o: int, dtype: DType) -> None:
    """Multiply each channel tile of the rows `at` (computed's) of the window at `inter` (channel tiles one
    after another, each [held rows][cols][its channels] of `dtype`) by the mask at `mask`, in place.  The
    MUL keeps the type (isa.opcodes): x * 1 and x * 0 are exact in it, an int8 product's low byte being
    the product itself."""
    _, _, rows, iw, row0 = at
    for o0, to in tiles(o, tile_o):
        tile = Operand(Space.SPAD, inter + (o0 * held + row0 * to) * iw * dtype.itemsize, (iw * to, to, 1))
        em.vector(VectorFunc.MUL, tile, tile, Operand(Space.SPAD, mask, (iw, 1, 0)), (rows, iw, to), dtype=dtype,
                  out_dtype=dtype)
