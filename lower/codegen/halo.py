"""A cascade's halo (lower.schedule.halo) emitted: the members ahead of a depthwise member compute its
padded input window per spatial tile, and the one just ahead zeroes the window's padding by a mask.

The mask is LOADed per spatial tile, of the window's own type (int8, bf16 or float32): a constant 1
over the window's inside, the DMA's padding zeros around it, one dense write of [rows][cols]; each
of the member's result tiles (a channel tile of the window, dense in the intermediate) is then
multiplied by it in place, the mask broadcast over the channels.  So the scratchpad only ever
receives dense writes, as the batched simulator requires, and the depthwise reads the whole window,
padding included, where it lies.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stagec.isa.instructions import DType, Operand, Space, VectorFunc

from ..schedule.halo import extent
from ..schedule.nest import ConvProblem, tiles
from ..schedule.tensors import DramTensor


def padded(p: ConvProblem, dw: ConvProblem, th: int, tw: int) -> ConvProblem:
    """A 1x1 member ahead of depthwise `dw` as emitted, for dw's output tiles of th x tw: over dw's input
    padded as far as the windows read (lower.schedule.halo.ahead_shape's padding, so the nest's
    tiles agree with the shape the schedule priced: one spatial tile where that has one), the LOAD
    padding it."""
    (pt, _), (pl, _) = dw.padding
    ext = [(k - 1) * d + 1 for k, d in zip((dw.kh, dw.kw), dw.dilation, strict=True)]
    _, _, bottom = extent(dw.oh, th, dw.stride[0], ext[0], pt, dw.h, np)
    _, _, right = extent(dw.ow, tw, dw.stride[1], ext[1], pl, dw.w, np)
    return dataclasses.replace(p, padding=((pt, int(bottom)), (pl, int(right))))


def window(dw: ConvProblem, oh0: int, th: int, ow0: int, tw: int) -> tuple:
    """(row, col, rows, cols) in dw's padded input of the window of its output tile at (oh0, ow0)."""
    ih, iw = dw.halo(th, tw)
    return oh0 * dw.stride[0], ow0 * dw.stride[1], ih, iw


def load_mask(em, dw: ConvProblem, base: int, oh0: int, th: int, ow0: int, tw: int, dtype: DType) -> None:
    """LOAD the window's mask of `dtype` (the window's) to `base`: 1 inside dw's input, 0 in its padding."""
    r, q, ih, iw = window(dw, oh0, th, ow0, tw)
    (pt, _), (pl, _) = dw.padding
    top, left = max(0, pt - r), max(0, pl - q)
    bottom, right = max(0, r + ih - pt - dw.h), max(0, q + iw - pl - dw.w)
    one = em.consts.scalar(1.0, dtype)
    em.load(DramTensor(one.region, one.offset, (1,), (0,), dtype), (0,), (0, 0, 0),
            (ih - top - bottom, iw - left - right, 1), Operand(Space.SPAD, base, (iw, 1, 1)),
            pad=(top, bottom, left, right, 0, 0), local=dtype)


def apply_mask(em, inter: int, mask: int, dw: ConvProblem, th: int, tw: int, o: int, tile_o: int,
               dtype: DType) -> None:
    """Multiply each channel tile of the window at `inter` ([rows][cols][its channels] of `dtype`, one
    after another) by the mask at `mask`, in place.  The MUL keeps the type (isa.opcodes): x * 1 and
    x * 0 are exact in it, an int8 product's low byte being the product itself."""
    ih, iw = dw.halo(th, tw)
    for o0, to in tiles(o, tile_o):
        tile = Operand(Space.SPAD, inter + o0 * ih * iw * dtype.itemsize, (iw * to, to, 1))
        em.vector(VectorFunc.MUL, tile, tile, Operand(Space.SPAD, mask, (iw, 1, 0)), (ih, iw, to), dtype=dtype,
                  out_dtype=dtype)
