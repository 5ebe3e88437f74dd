"""Halos in a cascade (lower.schedule.cascade): layers ahead of a depthwise convolution compute its
input windows, so that an inverted residual block (1x1 expand -> depthwise -> 1x1
project) runs as one cascade and its expanded activation never leaves the chip.

The cascade's spatial tiles are then tiles of the depthwise's output.  Per tile, the members ahead of
the depthwise (1x1 convolutions of stride 1; the first, any convolution) fill the depthwise's input
window (its halo) over the depthwise's padded input, so the depthwise reads the window in place from
the intermediate, padding included.  Consecutive windows along a column share `overlap` rows (kernel
extent - stride), and two strategies handle them, chosen by cost (lower.schedule.cascade_map):

- recompute (RECOMPUTE): every tile's members ahead compute its whole window, the shared rows and
  columns again where the neighbouring tiles need them;
- line buffer (LINE, DeFiNES' fully cached along rows): the tiles walk each column strip top to
  bottom, the members ahead compute only a window's new rows (the first window of a strip whole),
  and the shared rows are copied forward, one vector COPY per channel tile, from the previous window
  (the other of the intermediate's two buffers) to the top of this one.  Copy-forward rather than a
  ring of rows: an operand is affine (base and strides, isa.instructions), so a ring's wrap would
  split every depthwise tap; the COPY moves `overlap` rows, where recomputing them costs their MACs,
  epilogue and mask.  The line buffer is the window's top rows, in the intermediate the recompute
  strategy holds anyway: the footprint is the same.  Columns shared by neighbouring strips are still
  recomputed; a chunked cascade (its intermediate one chunk of channels at a time) recomputes rows too.

A 1x1 layer's result at a padding position is its bias through its activation, not zero, so the
member just ahead multiplies each result tile by a mask (`MASK`: 1 inside the input, 0 in the
padding), LOADed per spatial tile of that member (its rows only) as a constant 1.0 the DMA pads with
zeros, where the tile reaches into the padding (`inside_tiles`: not the others); the scratchpad only
ever receives dense writes.

Priced as the nest prices a layer: a member ahead runs as a 1x1 layer over its windows laid side by
side (`ahead_shape`), the window being its mapping's tile (`window_tile`): rows, the sum of every row
tile's window rows (line buffer: one window's rows over the whole column, in row tiles of
`ahead_rows`), of which padding the first window's rows above the input and the last one's below it
(so the halo bytes it LOADs from DRAM are the nest's own count); columns alike.  A cascade's first
member may be any convolution of the matrix unit (k x k, strided, padded: MobileNetV2's stem conv ahead
of its depthwise), its input per window its own halo of the window (`ahead_shape`: the windows' halos
side by side, padded before the first and past the last by what they read of the padding, its own and
the windows'; exact where no other window reads padding, as the last but one does ahead of a last
window too short to reach past the input); it keeps a line buffer only with its kernel rows stacked
(`line_buffers`: its halo a LOAD per output row, so its row tiles of unequal rows read what the nest
counts).  Written
over an ops namespace like the nest (lower.schedule.nest.Exact; costmodel.smooth.Relaxed).

Across an inverted residual block's boundary a cascade holds two depthwise members (`halo_members`):
the halos stack.  The spatial tiles are the last depthwise's output's; the members from the first
depthwise on compute the last one's windows, and the members ahead of the first compute the windows
of those windows: the two depthwise convolutions composed into one window (`compose`: kernel extent,
stride and padding of the pair; `targets`, each member's window).  The first depthwise computes its
output over the second's padding too (its `ahead_shape` over the second's windows, as a k x k lead's),
which the mask of the member just ahead of the second zeroes; each member just ahead of a depthwise
masks its own window.  A line buffer keeps both windows' shared rows: each member just ahead of a
depthwise one copies its window's forward, the members between compute new rows only, the first
depthwise reading its window's rows below the shared ones (lower.codegen.halo.computed).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from stagec.isa.instructions import Space

from .buffers import Buffer, words
from .nest import DEPTHWISE, Exact, LayerShape, count, halo, stacks
from .nest_work import lane_groups

MASK = "mask"      # the member just ahead of the depthwise: a mask per spatial tile (double-buffered)
RECOMPUTE = "recompute"     # the halo strategies (module doc)
LINE = "line buffer"


def halo_members(Ls) -> list:
    """The indices of a cascade's depthwise members after its first: each has the members before it
    compute its input windows (two across an inverted residual block's boundary)."""
    return [i for i, L in enumerate(Ls) if i and int(L.kind) == DEPTHWISE]


def depthwise_at(Ls) -> int:
    """The index of a cascade's last depthwise member after its first (whose output tiles are the
    cascade's spatial tiles), 0 if it has none."""
    return (halo_members(Ls) or [0])[-1]


def compose(a: LayerShape, b: LayerShape, xp) -> LayerShape:
    """Depthwise `a` then depthwise `b` as one window over a's input (stacked halos): a window of b's
    input is computed by a from a's halo of it, so the members ahead of `a` compute b's windows'
    windows.  Its padding: a's below b's, scaled by a's stride; past the end as far as b's last
    window reaches (what lies beyond a's own padding feeds only b's padding, which the mask zeroes)."""
    ext_h, ext_w = ((b.kh - 1) * b.dilation_h) * a.stride_h + (a.kh - 1) * a.dilation_h + 1, \
        ((b.kw - 1) * b.dilation_w) * a.stride_w + (a.kw - 1) * a.dilation_w + 1
    sh, sw = a.stride_h * b.stride_h, a.stride_w * b.stride_w
    top, left = b.pad_top * a.stride_h + a.pad_top, b.pad_left * a.stride_w + a.pad_left
    return dataclasses.replace(a, kh=ext_h, kw=ext_w, stride_h=sh, stride_w=sw, dilation_h=1, dilation_w=1,
                               pad_top=top, pad_left=left,
                               pad_bottom=xp.maximum((b.oh - 1) * sh + ext_h - top - a.h, 0),
                               pad_right=xp.maximum((b.ow - 1) * sw + ext_w - left - a.w, 0))


def targets(Ls, xp) -> list:
    """Per member, the depthwise window it computes: the halo_members after it composed (`compose`),
    None for the last depthwise member and those after it."""
    out = []
    for i in range(len(Ls)):
        after = [Ls[d] for d in halo_members(Ls) if d > i]
        out.append(functools.reduce(lambda b, a: compose(a, b, xp), after[-2::-1], after[-1]) if after else None)
    return out


def overlap(dw: LayerShape):
    """Rows two consecutive windows of depthwise `dw` share: its kernel's extent less its stride."""
    return (dw.kh - 1) * dw.dilation_h + 1 - dw.stride_h


def pointwise(L: LayerShape):
    """Whether a matrix-unit member reads its input's pixels as its output's (a matmul, a 1x1 convolution of
    stride 1 without padding); any other convolution leads a cascade, ahead of a depthwise one.  (Of
    arrays too: the relaxed cost's traced shapes.)"""
    return ((L.kh == 1) & (L.kw == 1) & (L.stride_h == 1) & (L.stride_w == 1) & (L.pad_top == 0)
            & (L.pad_bottom == 0) & (L.pad_left == 0) & (L.pad_right == 0))


def line_buffers(Ls, stacked=0):
    """Whether a cascade of members `Ls` may keep a line buffer: a depthwise member after its first whose
    consecutive windows share rows, and a pointwise first member, or a k x k one `stacked`
    (TileMapping.stacked: its halo LOADed a row at a time, so row tiles of unequal rows read what the
    nest counts; unstacked, they re-read unequal overlaps of its input, which the nest's halo count,
    over equal tiles, does not price); across a block boundary, every window the members ahead compute
    shares rows too (`targets`).  Of arrays too (map_cascade's grid, costmodel.fusion's relaxed choice)."""
    if not depthwise_at(Ls):
        return False
    shares = pointwise(Ls[0]) | (stacked & stacks(Ls[0]))
    for w in targets(Ls, np):
        shares = shares & (overlap(w) > 0) if w is not None else shares
    return shares


def halos(Ls) -> tuple:
    """The halo strategies a cascade of members `Ls` may take (map_cascade's grid weighs each): none (None)
    without a depthwise member after its first; recompute, and the line buffer where `line_buffers`
    (a k x k first member's stacked)."""
    return (RECOMPUTE, LINE) if line_buffers(Ls, 1) else (RECOMPUTE,) if depthwise_at(Ls) else (None,)


def new_rows(dw: LayerShape, th, ops) -> list:
    """A line buffer's new rows per column strip after the first window, as (size, count) tiles, for
    output tiles of th rows: (oh - th) * stride rows in tiles of th * stride (fewer for the last)."""
    return ops.tiles((dw.oh - th) * dw.stride_h, th * dw.stride_h)


def ahead_rows(dw: LayerShape, th, ops, line) -> list:
    """The row tiles, as (size, count) pairs, a member ahead of `dw` computes for its output tiles of th
    rows: recomputing, every window whole (the windows' rows in tiles of a window); line-buffered,
    per column strip the first window whole, then each next window's `new_rows`; each's counts
    weighted by 1 - `line` and `line` (the nest's work is linear in its tiles' counts), so that a
    relaxed `line` prices a blend of the two."""
    window = halo(dw, th, 1)[0]
    recompute = ops.tiles(windows(dw, th, 1)[0][0], window)
    return ([(size, (1 - line) * n) for size, n in recompute]
            + [(size, line * n) for size, n in [(window, 1), *new_rows(dw, th, ops)]])


def line_reads_input(dw: LayerShape, th):
    """Whether a line buffer over output tiles of th rows (an array) has every window's new rows read
    some input row: the last tile of a strip can add only rows of the padding below the input, which
    nothing would LOAD (map_cascade does not take such a tiling)."""
    (step, full), (part, last) = new_rows(dw, th, Exact)
    end = (dw.oh - 1) * dw.stride_h + (dw.kh - 1) * dw.dilation_h + 1
    return (full + last == 0) | (end - np.where(last, part, step) < dw.pad_top + dw.h)


def window_tile(dw: LayerShape, th, tw) -> tuple:
    """The tile of a member ahead of depthwise `dw` for an output tile of th x tw: its input window."""
    return halo(dw, th, tw)


def extent(out, tile, stride, ext, pad_lo):
    """(The windows' total extent along one dim, the padding the first one reads before the input, where
    the last one ends in the input's coordinates: past its end where it reads padding there), for tiles
    of `tile` over an output dim of `out` (integer arithmetic: the tile counts of the nest's exact
    namespace)."""
    full = out // tile
    rem = out - full * tile
    total = full * ((tile - 1) * stride + ext) + (rem > 0) * ((rem - 1) * stride + ext)
    return total, pad_lo, (out - 1) * stride + ext - pad_lo


def _reads(total, before, end, dim, stride, ext, pad, xp) -> tuple:
    """(Input extent, padding before it, padding past it) along one dim of a member ahead (`stride`,
    kernel extent `ext`, padding `pad` over an input of `dim`) whose output is windows of `total`, the
    first starting `before` ahead of the depthwise's input, the last ending at `end` in it: its own halo
    of the windows laid side by side (a 1x1's: the windows themselves)."""
    lo = before * stride + pad
    hi = xp.maximum((end - 1) * stride - pad + ext - dim, 0)
    return (total - 1) * stride + ext - lo - hi, lo, hi


def windows(dw: LayerShape, th, tw, line=0) -> tuple:
    """extent's (total, padding before, end) of the windows of depthwise `dw`'s output tiles of th x tw,
    rows and columns; `line`-buffered (1): the rows one window's over the whole column; a relaxed
    `line` weighs the two row totals (the padding and the end are the same for both)."""
    ext = (dw.kh - 1) * dw.dilation_h + 1
    rows = extent(dw.oh, th, dw.stride_h, ext, dw.pad_top)
    buffered = extent(dw.oh, dw.oh, dw.stride_h, ext, dw.pad_top)[0]
    return (((1 - line) * rows[0] + line * buffered, *rows[1:]),
            extent(dw.ow, tw, dw.stride_w, (dw.kw - 1) * dw.dilation_w + 1, dw.pad_left))


def inside_extent(dw: LayerShape, m, xp, line=0) -> tuple:
    """The windows' rows and columns (totals over the windows) inside `dw`'s input (`m` its mapping): their
    product what the masks LOAD per image and channel, and what an epilogue's tile input (a residual add)
    of a member ahead reads (the padding's zeros not read)."""
    (rows, top, end_h), (cols, left, end_w) = windows(dw, m.tile_oh, m.tile_ow, line)
    return rows - top - xp.maximum(end_h - dw.h, 0), cols - left - xp.maximum(end_w - dw.w, 0)


def ahead_shape(L: LayerShape, dw: LayerShape, th, tw, xp, line=0) -> LayerShape:
    """A member ahead of depthwise `dw` as the nest prices it (module doc), the cascade's tile th x tw,
    `line`-buffered (1) or not (0): its output the windows side by side, its input what that reads (a
    k x k first member's: its own halo of each window)."""
    (rows, top, end_h), (cols, left, end_w) = windows(dw, th, tw, line)
    h, pad_top, pad_bottom = _reads(rows, top, end_h, L.h, L.stride_h, (L.kh - 1) * L.dilation_h + 1, L.pad_top, xp)
    w, pad_left, pad_right = _reads(cols, left, end_w, L.w, L.stride_w, (L.kw - 1) * L.dilation_w + 1, L.pad_left,
                                    xp)
    return dataclasses.replace(L, h=h, w=w, pad_top=pad_top, pad_bottom=pad_bottom, pad_left=pad_left,
                               pad_right=pad_right)


def ahead_shapes(Ls, ms, xp, line=0) -> list:
    """`Ls` with the members ahead of a depthwise (if any) as ahead_shape prices them, each over its
    `targets` window (applied again, the same
    output tiles and buffers: member_buffers applies it to what cascade_cost did)."""
    d = depthwise_at(Ls)
    return [ahead_shape(L, dw, ms[d].tile_oh, ms[d].tile_ow, xp, line) if dw is not None else L
            for L, dw in zip(Ls, targets(Ls, xp), strict=True)]


def mask_buffer(L: LayerShape, m) -> Buffer:
    """The member just ahead's masks (`L` that member): one window (its tile) of its result's elements
    (the MUL's operands share one type), per buffer set."""
    item = L.out_itemsize
    return Buffer(MASK, Space.SPAD, words(m.tile_oh * m.tile_ow * item, item), 1 + m.double_buffer)


def _padded_tiles(out, tile, stride, ext, pad_lo, dim, ops) -> tuple:
    """(Tiles, those whose windows start in the padding before the input, those whose windows end in
    the padding past it) along one dim of output tiles of `tile` over `out` (kernel extent `ext`)."""
    n = ops.cdiv(out, tile)
    before = ops.cdiv(ops.cdiv(pad_lo, stride), tile)
    inside = ops.min(ops.max(ops.fdiv(dim + pad_lo - ext, stride) + 1, 0), out)   # outputs whose windows end inside
    return n, before, (inside < out) * (n - ops.fdiv(inside, tile))


def _inside(pairs, lo, hi, ops) -> list:
    """Of tiles as (size, count) pairs (Exact.tiles': the full ones, then the remainder), those with an
    index in [lo, hi)."""
    (size, full), (rem, last) = pairs
    return [(size, ops.max(ops.min(hi, full) - lo, 0)), (rem, last * (lo <= full) * (full < hi))]


def inside_tiles(dw: LayerShape, th, tw, ops, line=0) -> tuple:
    """(Rows, columns) as (size, count) pairs of the tiles a member ahead of `dw` computes wholly inside
    dw's input, for output tiles of th x tw (their windows' rows and columns: the member's tiles, as
    ahead_rows'): their masks would be all ones, so the emitter skips them
    (lower.codegen.halo.mask_padding); the spatial tiles of both are.  `line`-buffered, a strip's
    tiles below its first compute new rows (`new_rows`), never in the padding above."""
    ext_h, ext_w = (dw.kh - 1) * dw.dilation_h + 1, (dw.kw - 1) * dw.dilation_w + 1
    n_h, top, bottom = _padded_tiles(dw.oh, th, dw.stride_h, ext_h, dw.pad_top, dw.h, ops)
    n_w, left, right = _padded_tiles(dw.ow, tw, dw.stride_w, ext_w, dw.pad_left, dw.w, ops)
    out_rows = ops.tiles(dw.oh, th)
    windows_h = [((s - 1) * dw.stride_h + ext_h, c) for s, c in out_rows]
    recompute = _inside(windows_h, top, n_h - bottom, ops)
    # a strip's first tile computes its window whole, the others their new rows
    first = _inside(windows_h, 0, (dw.pad_top == 0) * (n_h - bottom > 0), ops)
    new = _inside([(s * dw.stride_h, c) for s, c in out_rows], 1, n_h - bottom, ops)
    rows = [(s, (1 - line) * c) for s, c in recompute] + [(s, line * c) for s, c in first + new]
    cols = _inside([((s - 1) * dw.stride_w + ext_w, c) for s, c in ops.tiles(dw.ow, tw)], left, n_w - right, ops)
    return rows, cols


def mask_work(L: LayerShape, inner, w, hw, ops, inside) -> tuple:
    """(LOADs, bytes) of the masks and the MULs' (instructions, vector cycles, elements) of the member
    just ahead (`L` its ahead_shape, `w` its Work, `inner` the windows' elements inside the input:
    inside_extent's product, `inside` the tiles whose windows lie inside: inside_tiles'): a LOAD per
    spatial tile of the mask's inside, a MUL per output tile, in the result's type (int8: four a lane
    with sub-word packing), none for a tile inside."""
    (rows, cols), d, bits = inside, w.dims, 8 * L.out_itemsize
    skipped = L.n * count(rows) * count(cols)
    skipped_elements = L.n * sum(s * c for s, c in rows) * sum(s * c for s, c in cols)
    groups = lane_groups(L, d, hw, ops, bits) - lane_groups(L, d._replace(rows=rows, cols=cols), hw, ops, bits)
    return ((L.n * d.n_h * d.n_w - skipped, (L.n * inner - skipped_elements) * L.out_itemsize),
            (w.tiles - skipped * d.n_o, groups, (L.n * L.oh * L.ow - skipped_elements) * L.o))


def mask_actions(L: LayerShape, w, work) -> dict:
    """The masks' action counts (sim.energy's), of their `work` (mask_work's): their LOADs (the inside
    from DRAM, the window written), the MULs (the result tile read and written back, the mask,
    broadcast over the channels, read once per channel tile)."""
    (_, loaded), (_, _, elements) = work
    item = L.out_itemsize
    written = elements / L.o * item      # the masks' windows, each written once
    return {"dram_read_bytes": loaded, "vector_ops": elements, "scratchpad_write_bytes": written + elements * item,
            "scratchpad_read_bytes": elements * item + w.dims.n_o * written}


def copy_work(L: LayerShape, dw: LayerShape, th, w, hw, ops, line) -> tuple:
    """(COPYs, vector cycles, elements) of a `line` buffer's rows copied forward (module doc; none where
    `line` is 0; `L` the member just ahead's ahead_shape, `w` its Work, th the cascade's tile rows): per
    channel tile of every window but a strip's first (one a tile of `new_rows`), `overlap` rows of the
    window's columns, at the elements' width."""
    d = w.dims
    again = line * count(new_rows(dw, th, ops))
    rows = d._replace(rows=[(overlap(dw), again)])
    return (L.n * again * d.n_w * d.n_o, lane_groups(L, rows, hw, ops, 8 * L.out_itemsize),
            L.n * again * overlap(dw) * L.ow * L.o)


def copy_actions(L: LayerShape, dw: LayerShape, th, w, hw, ops, line) -> dict:
    """The copies' action counts (sim.energy's): each element read and written once in the scratchpad."""
    *_, elements = copy_work(L, dw, th, w, hw, ops, line)
    moved = elements * L.out_itemsize
    return {"vector_ops": elements, "scratchpad_read_bytes": moved, "scratchpad_write_bytes": moved}
