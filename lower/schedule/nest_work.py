"""What a loop nest (lower.schedule.nest) holds and does: tile counts, halos, buffers, DMA traffic, and each
unit's instructions and cycles, written once over an ops namespace (lower.schedule.nest.Exact, or
costmodel.smooth.Relaxed) for every nest kind.

The counts are the emitter's: one LOAD per input halo (per output row of a stacked mapping),
per weight tile (per channel tile when resident), per epilogue input; one MATMUL per kernel row
(per kernel tap when columns are dilated, per reduction step when stacked); one VECTOR per
window tap and per epilogue step; one STORE per output tile.  Every halo is assumed to read
the input (padding below the kernel's extent, as frameworks pad); a halo all padding (the
emitter fills it instead) is counted as a load.
"""

from __future__ import annotations

from typing import NamedTuple

from stagec.isa.instructions import MAX_COUNT, Space
from stagec.sim.costs import array_per_pe, lane_elements, lane_work, matmul_fold_cycles, tree_cycles

from .buffers import (
    EPILOGUE_TILES,
    Buffer,
    epilogue_vectors,
    held_itemsize,
    local_bytes,
    tile_buffers,
    words,
)
from .nest import DEPTHWISE, MATRIX, LayerShape, TileMapping, count, halo, stacked_edges, tile_line, tile_sum

ACC_ITEMSIZE = 4   # an array's sums: float32, or int32 for int8 operands (a widened window's too)


class Dims(NamedTuple):
    """A nest's tiles along rows, columns, output and input channels, each as (size, count) pairs,
    and the counts of each."""

    rows: list
    cols: list
    outs: list
    ins: list
    n_h: object
    n_w: object
    n_o: object
    n_c: object


class Folds(NamedTuple):
    """The array's folds summed over a nest's tiles (SCALE-Sim's, sim.costs): of a MATMUL's k over
    the rows (per channel tile), of its output channels over the columns and the rows (per
    output-channel tile), of its pixels over the rows (per spatial tile); transposed, of each
    tile's line (lower.schedule.nest.tile_line) over the columns, and the lines' length; and the
    steps its PEs take through a MATMUL's k (packed_steps), per channel tile: what output stationary
    streams."""

    k: object
    cols: object
    outs: object
    pixels: object
    lines: object
    line_cols: object
    k_steps: object


class Work(NamedTuple):
    """One run of a nest: the LOADs before the first tile (`startup`: resident weights, what the
    epilogue holds whole), in the pipeline (`halo`: input halos, `weights`: weight tiles, `extra`: the
    epilogue's per-tile inputs), the STOREs, as (instructions, bytes) each; MATMUL and VECTOR
    instructions; the cycles of the unit each reduction step computes on (`compute`: the array's
    MATMULs, or a window's taps on the vector unit) and of the vector unit after it (`epilogue`);
    and the structure the latency composes: reduction steps (an output tile's channel tiles, on
    the array), output tiles, the output tiles whose first step loads a halo; its tiles, the
    array's folds (zero for a window nest) and the vector unit's lane groups of one pass over the
    output tiles (what the latency and the actions are composed of)."""

    startup: tuple
    halo: tuple
    halo_padded: object
    weights: tuple
    extra: tuple
    store: tuple
    matmuls: object
    vectors: object
    compute: object
    epilogue: object
    steps: object
    tiles: object
    halo_tiles: object
    dims: Dims
    folds: Folds
    groups: object

    @property
    def loads(self) -> tuple:
        """(LOADs, bytes) of the pipeline."""
        return tuple(h + w + e for h, w, e in zip(self.halo, self.weights, self.extra, strict=True))

    @property
    def instructions(self):
        return self.startup[0] + self.loads[0] + self.store[0] + self.matmuls + self.vectors


def dims(L: LayerShape, m: TileMapping, ops, stacked=0, channel_tiles=True, rows=None) -> Dims:
    """The tiles of a nest: stacked rows whose kernel reaches into the padding are tiles of one row
    (lower.schedule.nest.row_tiles); without `channel_tiles` the input channels are one tile (a window op's
    channel tile is its output tile); `rows`, (size, count) pairs, where the rows are not tiles of
    `tile_oh` (a cascade's member ahead of a depthwise one, lower.schedule.halo.ahead_rows: its rows
    are those tiles, edges and all, the simulator joining a tile's differently padded row LOADs)."""
    if rows is None:
        top, bottom = stacked_edges(L, ops)
        edges = stacked * (top + L.oh - bottom)
        rows = ops.tiles(L.oh - edges, m.tile_oh) + [(1, edges)]
    cols, outs = ops.tiles(L.ow, m.tile_ow), ops.tiles(L.o, m.tile_o)
    ins = ops.tiles(L.c, m.tile_c) if channel_tiles else [(L.c, 1)]
    return Dims(rows, cols, outs, ins, count(rows), count(cols), count(outs), count(ins))


def valid_extent(dim, out, pairs, tile, stride, ext, pad_lo, ops):
    """(Input rows (or columns) the halos of one pass over `pairs` (tiles of `tile` along an output
    dim of `out`) read, padding included): every halo's extent less what lies before the input
    (tile i starts at i * tile * stride - pad_lo) and past it."""
    n = count(pairs)
    halos = (out - n) * stride + n * ext                  # every tile's, (size - 1) * stride + ext
    k = ops.min(n, ops.cdiv(pad_lo, tile * stride))
    low = k * pad_lo - tile * stride * k * (k - 1) / 2
    # full tile j (from 1) ends j * tile * stride + over past the input; the remainder, at the last row
    over = ext - pad_lo - dim - stride
    full, part = pairs[0][1], pairs[1][1]
    j0 = ops.max(ops.fdiv(-over, tile * stride) + 1, 1)
    past = ops.max(full - j0 + 1, 0)
    high = past * over + tile * stride * (j0 + full) * past / 2 + part * ops.max(out * stride + over, 0)
    return halos - low - high, halos


def padding_rows(L: LayerShape, ops):
    """(Output rows whose kernel reaches above the input, of them those all above it; the first row whose
    kernel reaches below it, the rows all below it): output row r reads input rows r * sh - pad_top +
    (0 .. kh - 1)."""
    sh, pt = L.stride_h, L.pad_top
    above = ops.min(ops.cdiv(pt, sh), L.oh)
    empty_above = ops.min(ops.cdiv(ops.max(pt - L.kh + 1, 0), sh), L.oh)
    first = ops.max(ops.fdiv(pt + L.h - L.kh, sh) + 1, 0)
    empty_below = ops.max(L.oh - ops.cdiv(L.h + pt, sh), 0)
    return above, empty_above, first, empty_below


def kernel_rows(L: LayerShape, ops):
    """Kernel rows inside the input, summed over the output rows (what a stacked nest LOADs per column
    and channel): a row above the input (padding_rows) misses pad_top - r * sh of them, all kh where
    its kernel is all padding (a cascade's member ahead of a depthwise one computes the depthwise's
    padding rows too, lower.schedule.halo); one below, alike."""
    sh, pt, kh = L.stride_h, L.pad_top, L.kh
    above, empty_above, first, empty_below = padding_rows(L, ops)
    top = empty_above * kh + (above - empty_above) * pt - sh * (above * (above - 1)
                                                                  - empty_above * (empty_above - 1)) / 2
    last = L.oh - empty_below                   # rows first .. last - 1 read some of the input
    partial = ops.max(last - first, 0)
    bottom = empty_below * kh + partial * (kh - pt - L.h) + sh * partial * (first + last - 1) / 2
    return L.oh * kh - top - bottom


def empty_rows(L: LayerShape, ops):
    """Output rows whose kernel rows all lie in the padding (padding_rows): a stacked nest fills their halo
    rows with zeros, a broadcast LOAD of the halo's row (lower.codegen.matrix._load_stacked_rows)."""
    _, empty_above, _, empty_below = padding_rows(L, ops)
    return empty_above + empty_below


def epilogue_loads(L: LayerShape, d: Dims, tiles_out, per_tile_channels, inside=None):
    """(DMAs, bytes) of the epilogue's per-tile LOADs: each tile input's extent (the tile's along the
    axes it spans), and the channel vectors a tile at a time where `per_tile_channels`.  `inside`: the
    (rows, cols) of the output the tile inputs read, summed over the tiles, where not all of it (a
    cascade's member ahead of a depthwise one: its windows' inside, lower.schedule.halo.inside_extent)."""
    e = L.epilogue
    rows, cols = (L.oh, L.ow) if inside is None else inside
    extent = ((rows, d.n_h), (cols, d.n_w), (L.o, d.n_o))   # summed over the tiles: spanned, or one each
    nbytes = sum(b * L.n * extent[0][not p >> 2 & 1] * extent[1][not p >> 1 & 1] * extent[2][not p & 1]
                 for p, b in enumerate(e.tile_load_bytes))
    return (tiles_out * (e.tile_loads + per_tile_channels * e.channel_loads),
            nbytes + per_tile_channels * L.o * e.channel_load_bytes)


def held_loads(L: LayerShape, per_tile_channels):
    """(DMAs, bytes) of what the epilogue LOADs once for the whole nest: scalars, channel vectors."""
    e = L.epilogue
    held = 1 - per_tile_channels
    return e.scalar_loads + held * e.channel_loads, e.scalar_load_bytes + held * L.o * e.channel_load_bytes


def one_spatial_tile(L: LayerShape, m: TileMapping, xp):
    """Whether a matrix-unit nest has one spatial tile: it then loads its input halo once (one
    buffer, when the channels are not tiled either) and visits each output-channel tile once, so
    its per-channel epilogue vectors are loaded a tile at a time, double-buffered like the weights,
    instead of whole."""
    return (L.n == 1) & (m.tile_oh >= L.oh) & (m.tile_ow >= L.ow) & (xp.asarray(m.stacked) == 0)


def _reloads(d: Dims, xp):
    """Halo passes per spatial tile: one shared by every output-channel tile when the input channels
    are one tile, else one per (output, input) channel tile."""
    split = xp.clip(d.n_c - 1, 0, 1)
    return 1 + (d.n_o - 1) * split, 1 + (d.n_o * d.n_c - 1) * split


def matrix_halos(L: LayerShape, m: TileMapping, d: Dims, ops):
    """(LOADs, bytes, bytes with the padding the DMA fills) of a matrix-unit nest's input halos: per
    spatial tile, one shared by every output-channel tile when the input channels are one tile,
    else one per (output, input) channel tile; a stacked halo is a LOAD per output row of the
    kernel rows inside the input (of zeros, the row's whole halo, where none is: empty_rows)."""
    st = m.stacked
    ih_ext, iw_ext = halo(L, 1, 1)
    rows, padded_rows = valid_extent(L.h, L.oh, ops.tiles(L.oh, m.tile_oh), m.tile_oh, L.stride_h, ih_ext,
                                     L.pad_top, ops)
    cols, padded_cols = valid_extent(L.w, L.ow, d.cols, m.tile_ow, L.stride_w, iw_ext, L.pad_left, ops)
    reload, passes = _reloads(d, ops.xp)
    per_column = L.n * L.c * reload * L.itemsize
    return (L.n * (st * L.oh + (1 - st) * d.n_h) * d.n_w * passes,
            per_column * ((1 - st) * rows * cols + st * (kernel_rows(L, ops) * cols
                                                          + empty_rows(L, ops) * L.kh * padded_cols)),
            per_column * ((1 - st) * padded_rows + st * L.oh * L.kh) * padded_cols)


def matrix_work(L: LayerShape, m: TileMapping, hw, ops, rows=None, inside=None) -> Work:
    """The matrix-unit nest (lower.codegen.matrix.emit_conv), its row tiles `rows` where given (dims), its
    epilogue's tile inputs read `inside` where given (epilogue_loads)."""
    xp = ops.xp
    res = m.weights_resident
    d = dims(L, m, ops, m.stacked, rows=rows)
    f = folds(L, m, d, hw, ops)
    groups = lane_groups(L, d, hw, ops)
    n_sp = L.n * d.n_h * d.n_w
    tiles_out = n_sp * d.n_o
    steps = tiles_out * d.n_c
    one = one_spatial_tile(L, m, xp) * 1
    halo_dmas, halo_bytes, padded = matrix_halos(L, m, d, ops)
    w_bytes = L.kh * L.kw * L.c * L.o * L.itemsize
    epi_dmas, epi_bytes = epilogue_loads(L, d, tiles_out, one, inside)
    held_dmas, held_bytes = held_loads(L, one)
    per_step = matmuls_per_step(L, m, xp)
    e = L.epilogue
    halo_tiles = n_sp * (1 + (d.n_o - 1) * ops.xp.clip(d.n_c - 1, 0, 1))
    return Work(startup=(res * d.n_c + held_dmas, res * w_bytes + held_bytes), halo=(halo_dmas, halo_bytes),
                halo_padded=padded, weights=((1 - res) * steps, (1 - res) * n_sp * w_bytes),
                extra=(epi_dmas, epi_bytes),
                store=(tiles_out, L.n * L.oh * L.ow * L.o * L.out_itemsize),
                matmuls=steps * per_step, vectors=tiles_out * (epilogue_ops(L, m) + m.transposed),
                compute=per_step * array_cycles(L, m, d, f, hw),
                epilogue=epilogue_cycles(L, d, groups, hw, ops, epilogue_ops(L, m) - e.plain - e.hard)
                + m.transposed * groups,
                steps=steps, tiles=tiles_out, halo_tiles=halo_tiles, dims=d, folds=f, groups=groups)


def folds(L: LayerShape, m: TileMapping, d: Dims, hw, ops) -> Folds:
    r, c = hw.array_rows, hw.array_cols
    k = taps_per_matmul(L, m, ops.xp)
    xp = ops.xp
    per_pe = array_per_pe(L.itemsize, hw, xp)
    outs = tile_sum(lambda o: xp.stack([ops.cdiv(o, c), ops.cdiv(o, r)]), d.outs)
    spatial = L.n * tile_sum(lambda a, b: xp.stack([ops.cdiv(a * b, r), tile_line(L, a, b)[0] + 0 * a * b,
                                                     ops.cdiv(tile_line(L, a, b)[0], c) + 0 * a * b]), d.rows, d.cols)
    # k may vary along candidates the channel tiles do not (map_cascade's stacked axis), and tile_sum
    # broadcasts what its function closes over with its tiles' candidates
    ins = [(t + 0 * k, n) for t, n in d.ins]
    return Folds(tile_sum(lambda t: ops.cdiv(k * t, r * per_pe), ins), outs[0], outs[1], *spatial,
                 tile_sum(lambda t: packed_steps(k * t, per_pe, ops), ins))


def packed_steps(length, per_pe, ops):
    """A MATMUL's reduction of `length` as its PEs step it (sim.costs.packed_reduction): ceil(length /
    per_pe), and `length` itself where a PE takes one pair (a relaxed ceiling would move it)."""
    return ops.xp.where(per_pe > 1, ops.cdiv(length, per_pe), length)


def array_cycles(L: LayerShape, m: TileMapping, d: Dims, f: Folds, hw):
    """sim.costs' cycles of one reduction step's MATMUL, summed over every step: folds x (a fixed
    part + the streamed length), which is linear in the length, so the sum separates by dim."""
    r, c = hw.array_rows, hw.array_cols
    tr = m.transposed
    n_sp = L.n * d.n_h * d.n_w
    fixed_ws = matmul_fold_cycles(0, 0, 0, r, c, "weight_stationary")
    ws = f.k * ((1 - tr) * f.cols * (n_sp * fixed_ws + L.n * L.oh * L.ow) + tr * f.line_cols * (d.n_o * fixed_ws + L.o))
    fixed_os = matmul_fold_cycles(0, 0, 0, r, c, "output_stationary")
    os_ = ((1 - tr) * f.pixels * f.cols + tr * f.outs * f.line_cols) * (d.n_c * fixed_os + f.k_steps)
    return hw.weight_stationary * ws + (1 - hw.weight_stationary) * os_


def matmul_cycles(rows, k, n, per_pe, hw, ops):
    """sim.costs.matmul_cycles of a MATMUL streaming `rows` (weight stationary) or `k` (output
    stationary) through the array, its PEs taking `per_pe` operand pairs a cycle, with the nest's
    ceiling (relaxed in the cost model)."""
    r, c = hw.array_rows, hw.array_cols

    def ws():
        return ops.cdiv(k, r * per_pe) * ops.cdiv(n, c) * (matmul_fold_cycles(0, 0, 0, r, c, "weight_stationary")
                                                          + rows)

    def os_():
        return ops.cdiv(rows, r) * ops.cdiv(n, c) * (matmul_fold_cycles(0, 0, 0, r, c, "output_stationary")
                                                     + packed_steps(k, per_pe, ops))

    wst = hw.weight_stationary
    if isinstance(wst, bool):   # a config's dataflow (the mapper's grids): only its own formula, half the work
        return ws() if wst else os_()
    return wst * ws() + (1 - wst) * os_()


def step_compute(L: LayerShape, m: TileMapping, th, tw, to, tc, hw, ops):
    """Cycles of one reduction step's MATMULs over an output tile of th x tw x to and tc channels:
    the pixels streamed past to output channels, or transposed the channels past the tile's line."""
    k = taps_per_matmul(L, m, ops.xp) * tc
    per_pe = array_per_pe(L.itemsize, hw, ops.xp)
    plain = matmul_cycles(th * tw, k, to, per_pe, hw, ops)
    turned = matmul_cycles(to, k, tile_line(L, th, tw)[0], per_pe, hw, ops)
    return matmuls_per_step(L, m, ops.xp) * ((1 - m.transposed) * plain + m.transposed * turned)


def epilogue_ops(L: LayerShape, m: TileMapping):
    """VECTOR instructions per output tile after the MATMULs: the epilogue's steps, or with a single
    accumulator tile and no epilogue a COPY out of it (a transposed tile's turning COPY apart)."""
    e = L.epilogue
    return e.plain + e.hard + (1 - m.transposed) * m.single_acc * (e.plain + e.hard == 0)


def lane_groups(L: LayerShape, d: Dims, hw, ops, bits=32):
    """Lane groups of one pass over every output tile of an instruction whose widest operand has `bits`
    per element: sum of ceil(th * tw * to / (lanes * elements a lane packs))."""
    lanes = hw.vector_lanes * lane_elements(bits, hw.vector_subword_packing, ops.xp)
    return L.n * tile_sum(lambda a, b, o: ops.cdiv(a * b * o, lanes), d.rows, d.cols, d.outs)


def epilogue_cycles(L: LayerShape, d: Dims, groups, hw, ops, copy=0):
    """Vector cycles of the epilogue's steps (and `copy`, 1 for a COPY out of a single accumulator tile)
    over one pass of the output tiles (`groups`: lane_groups at 32 bits): each step's lane groups at the
    elements a lane packs of it (Extras.subword)."""
    e, hard = L.epilogue, hw.vector_cycles_per_transcendental
    p16, h16, p8, h8 = e.subword
    return (groups * (e.plain + copy - p16 - p8 + (e.hard - h16 - h8) * hard)
            + lane_groups(L, d, hw, ops, 16) * (p16 + h16 * hard) + lane_groups(L, d, hw, ops, 8) * (p8 + h8 * hard))


def window_halos(L: LayerShape, d: Dims, m: TileMapping, ops):
    """(LOADs, bytes, bytes with the padding the DMA fills) of a window nest's halos: one per output tile."""
    ih_ext, iw_ext = halo(L, 1, 1)
    rows, padded_rows = valid_extent(L.h, L.oh, d.rows, m.tile_oh, L.stride_h, ih_ext, L.pad_top, ops)
    cols, padded_cols = valid_extent(L.w, L.ow, d.cols, m.tile_ow, L.stride_w, iw_ext, L.pad_left, ops)
    per_column = L.n * L.o * L.itemsize
    return L.n * d.n_h * d.n_w * d.n_o, per_column * rows * cols, per_column * padded_rows * padded_cols


def window_work(L: LayerShape, m: TileMapping, hw, ops, rows=None, inside=None) -> Work:
    """The vector-unit nest of a depthwise conv or a pooling (lower.codegen.window.emit_window): per channel
    tile its weights, per output tile its halo, a VECTOR per kernel tap (which widens int8 or bf16
    elements itself), the epilogue and a STORE; its row tiles `rows` where given (dims), its epilogue's
    tile inputs read `inside` where given (epilogue_loads)."""
    xp = ops.xp
    d = dims(L, m, ops, channel_tiles=False, rows=rows)
    tiles_out, halo_bytes, padded = window_halos(L, d, m, ops)
    weighted = (L.kind == DEPTHWISE) * 1
    taps = L.kh * L.kw
    epi_dmas, epi_bytes = epilogue_loads(L, d, tiles_out, 0, inside)
    held_dmas, held_bytes = held_loads(L, 0)
    e = L.epilogue
    groups = lane_groups(L, d, hw, ops)
    # each tap runs at its sum's width: a widening int8 or bf16 MUL into int32 or float32, one per lane;
    # an int8 max pool, four
    tap_groups = lane_groups(L, d, hw, ops, 8 * window_acc_itemsize(L))
    dot = m.dot
    rdots, dot_cycles = dot_work(L, d, hw, ops)
    return Work(startup=(held_dmas, held_bytes), halo=(tiles_out, halo_bytes), halo_padded=padded,
                weights=(weighted * d.n_o, weighted * taps * L.o * L.itemsize), extra=(epi_dmas, epi_bytes),
                store=(tiles_out, L.n * L.oh * L.ow * L.o * L.out_itemsize), matmuls=xp.zeros_like(groups),
                vectors=tiles_out * ((1 - dot) * taps + e.plain + e.hard) + dot * rdots,
                compute=(1 - dot) * tap_groups * taps + dot * dot_cycles,
                epilogue=epilogue_cycles(L, d, groups, hw, ops),
                steps=tiles_out, tiles=tiles_out, halo_tiles=tiles_out, dims=d,
                folds=Folds(*(xp.zeros_like(groups),) * len(Folds._fields)), groups=groups)


def dot_work(L: LayerShape, d: Dims, hw, ops):
    """(RDOTs, their cycles) of a dot mapping (TileMapping.dot) over every output tile: one per output row
    and kernel row, summing each of its tw x to outputs' kw products in ceil(kw / 4) dot steps of a lane
    (sim.costs.lane_work, as SDOT), plus the tree of ceil(log2(kw)) cycles (sim.costs.tree_cycles)."""
    xp = ops.xp
    per_lane = lane_elements(8 * L.itemsize, hw.vector_subword_packing, xp)
    rows = L.n * tile_sum(lambda a, b, o: a, d.rows, d.cols, d.outs)
    return L.kh * rows, L.n * L.kh * tile_sum(
        lambda a, b, o: a * ops.cdiv(lane_work(b * o * L.kw, per_lane, L.kw, True, xp), hw.vector_lanes),
        d.rows, d.cols, d.outs) + L.kh * rows * tree_cycles(L.kw, xp)


def window_turn(L: LayerShape, d: Dims, hw, ops):
    """(cycles, elements) of a dot mapping's COPYs in a cascade, one per output tile, turning the window
    the member ahead wrote, [row][column][channel], channel-major (int8 to int8, four a lane)."""
    lanes = hw.vector_lanes * lane_elements(8 * L.itemsize, hw.vector_subword_packing, ops.xp)

    def window(a, b, o):
        ih, iw = halo(L, a, b)
        return ih * iw * o
    return (L.n * tile_sum(lambda a, b, o: ops.cdiv(window(a, b, o), lanes), d.rows, d.cols, d.outs),
            L.n * tile_sum(window, d.rows, d.cols, d.outs))


def window_steps(L: LayerShape, m: TileMapping):
    """The VECTORs that write each output's sum: a MUL per tap, or a dot mapping's RDOT per kernel row."""
    return m.dot * L.kh + (1 - m.dot) * L.kh * L.kw


# --- the buffers it holds (lower.schedule.buffers) -----------------------------------------------

def matrix_buffers(L: LayerShape, m: TileMapping, xp) -> list[Buffer]:
    """A matrix-unit nest: input halos (one where the halo is loaded once: one spatial tile, the
    channels whole), weights (tiles, or all of them resident), the epilogue's vectors (whole, or a
    channel tile per buffer set in a nest of one spatial tile) and tiles, the result tile of
    `single_acc` or the turned tiles of `transposed`; accumulator tiles (one with `single_acc`), a
    transposed tile's as wide as its line."""
    th, tw, to, tc = (getattr(m, f) for f in ("tile_oh", "tile_ow", "tile_o", "tile_c"))
    st, tr, sa, res = m.stacked, m.transposed, m.single_acc, m.weights_resident
    bufs = 1 + m.double_buffer
    acc_bufs = bufs - m.double_buffer * sa
    ih, iw = halo(L, th, tw)
    one = one_spatial_tile(L, m, xp)
    elements = th * tw * to
    halo_rows = st * th * L.kh + (1 - st) * ih   # stacked: each output row's kernel rows
    return [
        Buffer("halo", Space.SPAD, words(halo_rows * iw * tc * L.itemsize, L.itemsize),
               xp.where(one & (tc >= L.c), 1, bufs)),
        Buffer("weights", Space.SPAD, words(L.kh * L.kw * (res * L.c * L.o + (1 - res) * tc * to) * L.itemsize,
                                            L.itemsize), res + (1 - res) * bufs),
        epilogue_vectors(L.epilogue, xp.where(one, bufs * to, L.o)),
        tile_buffers(EPILOGUE_TILES, L.epilogue.tile_bytes, elements, bufs),
        Buffer("result", Space.SPAD, words(elements * held_itemsize(L.out_itemsize), L.out_itemsize), sa * (1 - tr)),
        Buffer("turned", Space.SPAD, elements * ACC_ITEMSIZE, tr * acc_bufs),
        Buffer("accumulator", Space.ACC, (tr * tile_line(L, th, tw)[0] + (1 - tr) * th * tw) * to * ACC_ITEMSIZE,
               acc_bufs),
    ]


def window_buffers(L: LayerShape, m: TileMapping, xp) -> list[Buffer]:
    """A depthwise or pooling nest: input halos and (depthwise) weights, the epilogue's vectors and
    tiles; accumulator tiles (int32 or float32, or int8 for an int8 max pool)."""
    th, tw, to = m.tile_oh, m.tile_ow, m.tile_o
    bufs = 1 + m.double_buffer
    weighted = (L.kind == DEPTHWISE) * 1
    ih, iw = halo(L, th, tw)
    taps = L.kh * L.kw
    acc_item = window_acc_itemsize(L)
    return [
        Buffer("halo", Space.SPAD, words(ih * iw * to * L.itemsize, L.itemsize), bufs),
        Buffer("weights", Space.SPAD, words(taps * to * L.itemsize, L.itemsize), bufs * weighted),
        epilogue_vectors(L.epilogue, L.o),
        tile_buffers(EPILOGUE_TILES, L.epilogue.tile_bytes, th * tw * to, bufs),
        Buffer("accumulator", Space.ACC, words(th * tw * to * acc_item, acc_item), bufs),
    ]


def window_acc_itemsize(L: LayerShape):
    """Bytes of a window nest's sums: int32 or float32 where int8 or bf16 widens (sums, products), else
    its elements' (an int8 max pool stays int8)."""
    return L.widened * ACC_ITEMSIZE + (1 - L.widened) * L.itemsize


def footprint(L: LayerShape, m: TileMapping, xp):
    """(scratchpad, accumulator) bytes of the nest's buffers, its kind's."""
    return local_bytes(matrix_buffers(L, m, xp) if L.kind == MATRIX else window_buffers(L, m, xp))


def matmuls_per_step(L: LayerShape, m: TileMapping, xp):
    """MATMULs per reduction step: one per kernel row (per tap, columns dilated), one stacked."""
    return m.stacked + (1 - m.stacked) * (L.kh * L.kw // xp.where(L.dilation_w == 1, L.kw, 1))


def matmul_k(L: LayerShape, m: TileMapping, xp):
    """A MATMUL's reduction, its taps over the channel tile (0 for a window op)."""
    return (L.kind == MATRIX) * taps_per_matmul(L, m, xp) * m.tile_c


def limits(L: LayerShape, m: TileMapping, spad, acc, hw, xp):
    """Each limit's relative overshoot (<= 0 where within): the memories, the halo's extent and a
    MATMUL's k and n (16-bit counts)."""
    ih, iw = halo(L, m.tile_oh, m.tile_ow)
    return (spad / hw.scratchpad_bytes - 1, acc / hw.accumulator_bytes - 1, xp.maximum(ih, iw) / MAX_COUNT - 1,
            matmul_k(L, m, xp) / MAX_COUNT - 1, m.tile_o / MAX_COUNT - 1)


def waits(L: LayerShape, m: TileMapping, w: Work, hw):
    """Vector cycles per run the array waits for before an output tile's accumulator is free again,
    with a single accumulator tile: the epilogue (whose last step writes the result to the
    scratchpad), or a transposed tile's turning COPY."""
    epilogue = w.epilogue - m.transposed * w.groups   # less the turning COPY
    return m.single_acc * ((1 - m.transposed) * epilogue + m.transposed * w.groups)


def taps_per_matmul(L: LayerShape, m: TileMapping, xp):
    """Kernel taps one MATMUL reduces over: a kernel row's (one tap's, columns dilated; the whole
    kernel's, stacked)."""
    return m.stacked * L.kh * L.kw + (1 - m.stacked) * xp.where(L.dilation_w == 1, L.kw, 1)
