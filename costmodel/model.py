"""The closed-form cost of one layer: latency, energy and footprint as JAX functions of
(layer, mapping, hardware, constants, smooth).

It models the loop nest lower.matrix / lower.window emit (DESIGN.md's schedule stage), in the
style of Timeloop/MAESTRO: count each unit's work from the tile sizes, then compose the units.

  counts   tiles per dim (full ones and a remainder), DMAs and their bytes per queue (halo
           reloads per output-channel tile when the reduction is split, weights per tile or
           once when resident), MATMUL cycles with SCALE-Sim's per-fold formula (sim.costs),
           vector lane groups of the taps and the fused epilogue, stores.
  overlap  double-buffered: the busiest of the load queue, store queue, DRAM channel, array
           and vector unit, plus one output tile's pipeline fill and drain (its stages in series
           less the busiest unit's share); single-buffered:
           the stages in series, less the next tile's load overlapping this tile's epilogue
           and store.  Resident weights and per-channel epilogue vectors load first.
  energy   the same action counts sim.energy takes from the instruction stream, times the
           config's energy table, plus leakage over the latency.
  capacity lower.buffers' buffer lists (the one definition mapper, emitter and tuner share),
           as a violation to penalize.

Loop order: lower.matrix emits one nest (batch, rows, cols, output channels, input channels);
the reuse it can trade is weight residency (all weights loaded once and reused by every output
tile, vs. a weight tile per output tile), the loop-order choice the model and tuner make.

Every discrete step goes through costmodel.smooth, so `smooth=0` is the exact model and
`smooth>0` its relaxation; the five switches of a mapping (double buffering, weight
residency, a single accumulator tile, transposed operands, stacked kernel rows) enter linearly,
so probabilities between 0 and 1 mix the candidates' costs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace

import jax
import jax.numpy as jnp

from stagec.lower.buffers import FP32, Extras, conv_buffers, local_bytes, one_spatial_tile, tile_line, window_buffers
from stagec.lower.schedule import MAX_HALO
from stagec.sim.costs import matmul_fold_cycles
from stagec.sim.energy import ActionCounts, energy_pj

from . import smooth as sm
from .hardware import HardwarePoint
from .problem import KINDS, LayerShape, MappingArrays

MATRIX, DEPTHWISE, POOL = (KINDS.index(k) for k in ("matrix", "depthwise", "pool"))


@dataclass(frozen=True)
class CostConstants:
    """The model's free constants (fitted to the simulator by costmodel.calibrate).

    fill: share of one output tile's stage sum a double-buffered pipeline pays to fill and drain;
    overlap: share of the next load a single-buffered nest hides under the epilogue and store;
    per_instruction: cycles of issue overhead per instruction.
    """

    fill: object = 1.0
    overlap: object = 1.0
    per_instruction: object = 0.0


jax.tree_util.register_dataclass(CostConstants, data_fields=[f.name for f in fields(CostConstants)], meta_fields=[])
DEFAULT_CONSTANTS = CostConstants()


@dataclass(frozen=True)
class LayerCost:
    """One layer's cost: cycles, energy (pJ), scratchpad/accumulator bytes it occupies,
    `violation` (0 when legal: the relative overshoot of every capacity limit, summed),
    and the instruction count."""

    cycles: object
    energy_pj: object
    spad_bytes: object
    acc_bytes: object
    violation: object
    instructions: object


jax.tree_util.register_dataclass(LayerCost, data_fields=[f.name for f in fields(LayerCost)], meta_fields=[])


def _problem(L: LayerShape):
    """The attributes lower.schedule's footprints read, from a LayerShape (an fp32 layer: no int8
    halos widened to int32)."""
    return SimpleNamespace(stride=(L.stride_h, L.stride_w), dilation=(L.dilation_h, L.dilation_w), kh=L.kh,
                           kw=L.kw, c=L.c, o=L.o, n=L.n, oh=L.oh, ow=L.ow, itemsize=FP32, widened=False)


def _tile_sum(f, *dims):
    """sum over the tile grid of f(sizes...): dims are (sizes, counts) pairs from smooth.tile_sizes."""
    grids = jnp.meshgrid(*(d[0] for d in dims), indexing="ij")
    weights = jnp.meshgrid(*(d[1] for d in dims), indexing="ij")
    w = 1.0
    for x in weights:
        w = w * x
    return jnp.sum(w * f(*grids))


def _valid_extent(size, out, tiles, stride, dilation, k, pad_lo):
    """Input rows (or columns) the halo LOADs of one tile row read in all, padding excluded:
    every tile's halo, less the padding before the first and past the last."""
    ext = (k - 1) * dilation + 1
    halos = _tile_sum(lambda t: (t - 1) * stride + ext, tiles)
    overflow = jnp.maximum(0.0, (out - 1) * stride - pad_lo + ext - size)
    return jnp.maximum(halos - pad_lo - overflow, 1.0), halos


def _rows_outside(L: LayerShape):
    """Kernel rows that fall in the top or bottom padding, summed over the output rows: output row r
    reads input rows r * sh - pad_top + (0 .. kh - 1) (undilated, as stacked mappings are)."""
    sh, pt = L.stride_h, L.pad_top
    above = jnp.minimum(jnp.ceil(pt / sh), L.oh)                  # rows r with r * sh < pt
    top = above * pt - sh * above * (above - 1.0) / 2.0
    first = jnp.maximum(jnp.floor((pt + L.h - L.kh) / sh) + 1.0, 0.0)   # rows reaching past the input
    below = jnp.maximum(L.oh - first, 0.0)
    bottom = below * (L.kh - pt - L.h) + sh * below * (first + L.oh - 1.0) / 2.0
    return top + bottom


def layer_cost(L: LayerShape, m: MappingArrays, hw: HardwarePoint, k: CostConstants = DEFAULT_CONSTANTS,
               smooth=0.0) -> LayerCost:
    """Cost of `L` under mapping `m` on `hw` (scalars; vmap for batches).  smooth=0: exact."""
    s = smooth
    matrix = L.kind == MATRIX
    oh, ow = L.oh, L.ow
    hs = sm.tile_sizes(oh, m.tile_oh, s)
    ws = sm.tile_sizes(ow, m.tile_ow, s)
    os_ = sm.tile_sizes(L.o, m.tile_o, s)
    # a window op's channel tile is its output tile (lower.window); the matrix unit's reduces
    cs = sm.tile_sizes(L.c, jnp.where(matrix, m.tile_c, L.c), s)
    n_h, n_w, n_o, n_c = (jnp.sum(d[1]) for d in (hs, ws, os_, cs))
    n_sp = L.n * n_h * n_w
    tiles_out = n_sp * n_o
    pixels = L.n * _tile_sum(lambda a, b: a * b, hs, ws)          # sum of m = th * tw over spatial tiles
    out_elems = pixels * _tile_sum(lambda o: o, os_)
    channels = _tile_sum(lambda c: c, cs)
    # stacked: the whole kernel in one MATMUL's k, a LOAD per output row.  lower.schedule.row_tiles
    # makes the rows whose kernel reaches into the padding tiles of one row; the row tiles here
    # are the upright ones (a ResNet stem at 4 rows a tile: 31 emitted, 28 counted)
    st = jnp.where(matrix, m.stacked, 0.0)
    # per MATMUL: k = fold * tile_c (a kernel row, or the whole kernel stacked), taps_mm of them per tile
    fold = st * L.kh * L.kw + (1.0 - st) * jnp.where(L.dilation_w == 1, L.kw, 1.0)
    taps_mm = st + (1.0 - st) * L.kh * jnp.ceil(L.kw / jnp.where(L.dilation_w == 1, L.kw, 1.0))
    taps = L.kh * L.kw
    db, res = m.double_buffer, jnp.where(matrix, m.weights_resident, 0.0)
    tr = jnp.where(matrix, m.transposed, 0.0)   # output channels streamed, a COPY turns each tile
    sa = jnp.where(matrix, m.single_acc, 0.0)   # one accumulator tile, the epilogue's result in the scratchpad
    bw, lat = hw.dma_bandwidth_bytes_per_cycle, hw.dma_latency_cycles

    # --- DMA: (instructions, bytes) per kind of transfer
    rows, rows_padded = _valid_extent(L.h, oh, hs, L.stride_h, L.dilation_h, L.kh, L.pad_top)
    cols, cols_padded = _valid_extent(L.w, ow, ws, L.stride_w, L.dilation_w, L.kw, L.pad_left)
    reload = jnp.where(matrix, 1.0 + (n_o - 1.0) * jnp.clip(n_c - 1.0, 0.0, 1.0), n_o)
    # stacked: every output row LOADs its kernel rows, those inside the input (lower.matrix)
    kernel_rows = L.oh * L.kh - _rows_outside(L)
    halo_n = (n_sp * (1.0 - st) + st * L.n * oh * n_w) * jnp.where(matrix, n_c, 1.0) * reload
    halo_b = L.n * ((1.0 - st) * rows + st * kernel_rows) * cols * jnp.where(matrix, channels * reload, L.o) * FP32
    w_all = taps * L.c * L.o * FP32
    w_n = jnp.where(matrix, (1.0 - res) * n_sp * n_o * n_c, jnp.where(L.kind == DEPTHWISE, n_o, 0.0))
    w_b = jnp.where(matrix, (1.0 - res) * n_sp * w_all, jnp.where(L.kind == DEPTHWISE, taps * L.o * FP32, 0.0))
    # per-channel epilogue vectors: loaded once, or a tile at a time by a nest of one spatial tile
    p = _problem(L)
    one = jnp.where(matrix & one_spatial_tile(p, m.tile_oh, m.tile_ow, st, jnp), 1.0, 0.0)
    ex_n = tiles_out * L.tile_loads + one * n_o * L.channel_extras
    ex_b = L.tile_loads * out_elems * FP32 + one * L.channel_extras * L.o * FP32
    first_n = res * n_c + (1.0 - one) * L.channel_extras   # resident weights: a LOAD per channel tile
    first_b = res * w_all + (1.0 - one) * L.channel_extras * L.o * FP32
    store_n, store_b = tiles_out, out_elems * FP32
    startup = first_n * lat + first_b / bw
    load_q = (halo_n + w_n + ex_n) * lat + (halo_b + w_b + ex_b) / bw
    store_q = store_n * lat + store_b / bw
    channel = (first_b + halo_b + w_b + ex_b + store_b) / bw

    # --- compute: SCALE-Sim folds on the array (sim.costs), lane groups on the vector unit
    r, c = hw.array_rows, hw.array_cols

    def ceil(x):
        return sm.ceil(x, s)

    # sim.costs' per-fold cycles with the streamed length (m for WS, k for OS) summed apart,
    # since it is linear: sum over matmuls of folds x (fixed + length)
    # transposed, B's columns are each tile's line through its halo (lower.schedule.tile_line)
    lines = L.n * _tile_sum(lambda a, b: tile_line(p, a, b)[0], hs, ws)
    line_folds = L.n * _tile_sum(lambda a, b: ceil(tile_line(p, a, b)[0] / c), hs, ws)
    col_folds = _tile_sum(lambda o: ceil(o / c), os_)
    k_folds = _tile_sum(lambda t: ceil(fold * t / r), cs)
    m_folds = L.n * _tile_sum(lambda a, b: ceil(a * b / r), hs, ws)
    o_folds = _tile_sum(lambda o: ceil(o / r), os_)
    fixed_ws = matmul_fold_cycles(0, 0, 0, r, c, "weight_stationary")
    fixed_os = matmul_fold_cycles(0, 0, 0, r, c, "output_stationary")
    ws_cycles = taps_mm * k_folds * ((1.0 - tr) * col_folds * (n_sp * fixed_ws + pixels)
                                     + tr * line_folds * (n_o * fixed_ws + L.o))
    os_cycles = taps_mm * ((1.0 - tr) * m_folds * col_folds + tr * o_folds * line_folds) * (
        n_c * fixed_os + fold * channels)
    array = jnp.where(matrix, hw.weight_stationary * ws_cycles + (1.0 - hw.weight_stationary) * os_cycles, 0.0)
    groups = L.n * _tile_sum(lambda a, b, o: ceil(a * b * o / hw.vector_lanes), hs, ws, os_)
    copy_out = (1.0 - tr) * sa * (L.epi_plain + L.epi_hard == 0)   # no epilogue: a COPY moves the tile out
    turn = tr * groups                                               # the COPY that turns a transposed tile
    epilogue = groups * (L.epi_plain + copy_out + L.epi_hard * hw.vector_cycles_per_transcendental) + turn
    window = jnp.where(matrix, 0.0, taps * groups)
    vector = window + epilogue

    # --- overlap
    steps = jnp.maximum(tiles_out, 1.0)
    compute = array + window
    stage = jnp.stack([load_q, compute, epilogue, store_q]) / steps
    # one accumulator tile: the next tile's MATMULs wait for this one's epilogue, or its COPY when
    # transposed (the last tile's is the pipeline's drain, counted below)
    waits = sa * ((1.0 - tr) * epilogue + turn) * (steps - 1.0) / steps
    busiest = sm.maximum(jnp.stack([load_q, store_q, channel, array + waits, vector]), s)
    # the busiest unit's pace, plus filling and draining: one tile's stages in series less the
    # busiest unit's share of it (a single tile is its stages in series)
    pipelined = busiest + k.fill * (jnp.sum(stage) - busiest / steps)
    # single-buffered, only the next tile's first load (its first reduction step's) can overlap
    first_load = stage[0] / jnp.where(matrix, n_c, 1.0)
    hidden = -sm.maximum(-jnp.stack([first_load, stage[2] + stage[3]]), s)
    serial = load_q + compute + epilogue + store_q - k.overlap * (steps - 1.0) * hidden
    instructions = first_n + halo_n + w_n + ex_n + store_n + jnp.where(
        matrix, n_sp * n_o * n_c * taps_mm, tiles_out * taps) + tiles_out * (L.epi_plain + L.epi_hard + copy_out + tr)
    cycles = L.repeat * (startup + db * pipelined + (1.0 - db) * serial + k.per_instruction * instructions)

    # --- energy: sim.energy's actions
    # MACs the array performs: transposed, the dropped line positions' too
    macs = jnp.where(matrix, L.n * oh * ow * L.o * L.c * taps, 0.0)
    macs = macs + tr * taps_mm * fold * channels * L.o * (lines - L.n * oh * ow)
    # the streamed operand (A) is read once per column fold, the held one (B) once per MATMUL (per
    # row fold, output stationary); transposed, A is the weights and B the halo's lines
    wst = hw.weight_stationary
    a_reads = taps_mm * fold * channels * ((1.0 - tr) * pixels * col_folds + tr * L.o * line_folds)
    b_reads = taps_mm * fold * channels * ((1.0 - tr) * L.o * (wst * n_sp + (1.0 - wst) * m_folds)
                                           + tr * lines * (wst * n_o + (1.0 - wst) * o_folds))
    products = (1.0 - tr) * pixels + tr * lines       # accumulator elements per output channel
    c_writes = taps_mm * products * L.o * (wst * k_folds + (1.0 - wst) * n_c)
    epi_ops = (L.epi_plain + L.epi_hard + copy_out) * out_elems
    # with one accumulator tile the epilogue's last op writes the scratchpad and the store reads it;
    # transposed, the COPY moves every tile there and the epilogue runs on it in the scratchpad
    moved = ((1.0 - tr) * sa + tr) * out_elems * FP32
    epi_spad = tr * epi_ops * FP32
    halo_padded = L.n * ((1.0 - st) * rows_padded + st * oh * L.kh) * cols_padded * jnp.where(
        matrix, channels * reload, L.o) * FP32
    spad_write = halo_padded + w_b + ex_b + first_b + moved + epi_spad
    spad_read = jnp.where(matrix, (a_reads + b_reads) * FP32, taps * out_elems * FP32) + moved + epi_spad
    acc_write = jnp.where(matrix, c_writes, taps * out_elems) * FP32 + epi_ops * FP32 - moved + tr * out_elems * FP32 \
        - epi_spad
    acc_read = (jnp.where(matrix, c_writes - products * L.o, (taps - 1) * out_elems) + epi_ops + out_elems) * FP32 \
        - moved + tr * out_elems * FP32 - epi_spad
    counts = ActionCounts(macs_int8=0.0, macs_bf16=0.0, macs_fp32=L.repeat * macs,
                          vector_ops=L.repeat * (jnp.where(matrix, 0.0, taps * out_elems) + epi_ops + tr * out_elems),
                          scratchpad_read_bytes=L.repeat * spad_read, scratchpad_write_bytes=L.repeat * spad_write,
                          accumulator_read_bytes=L.repeat * acc_read, accumulator_write_bytes=L.repeat * acc_write,
                          dram_read_bytes=L.repeat * (first_b + halo_b + w_b + ex_b),
                          dram_write_bytes=L.repeat * store_b)
    energy = sum(energy_pj(counts, cycles, hw, jnp).values())

    # --- capacity
    extras = Extras(L.tile_extras, L.channel_extras, L.fixed_bytes)
    spad_mx, acc_mx = (res * a + (1.0 - res) * b for a, b in zip(
        *(local_bytes(conv_buffers(p, m.tile_oh, m.tile_ow, m.tile_o, m.tile_c, db, resident, extras, sa, tr, st, jnp))
          for resident in (True, False)), strict=True))
    spad_win, acc_win = local_bytes(window_buffers(p, m.tile_oh, m.tile_ow, m.tile_o, db, extras, True, jnp))
    no_weights = local_bytes(window_buffers(p, m.tile_oh, m.tile_ow, m.tile_o, db, extras, False, jnp))[0]
    spad = jnp.where(matrix, spad_mx, jnp.where(L.kind == DEPTHWISE, spad_win, no_weights))
    acc = jnp.where(matrix, acc_mx, acc_win)
    halo = jnp.maximum((m.tile_oh - 1) * L.stride_h + (L.kh - 1) * L.dilation_h + 1,
                       (m.tile_ow - 1) * L.stride_w + (L.kw - 1) * L.dilation_w + 1)
    k_count = jnp.where(matrix, fold * m.tile_c, 1.0)   # a MATMUL's k is a 16-bit count
    over = jnp.stack([spad / hw.scratchpad_bytes, acc / hw.accumulator_bytes, halo / MAX_HALO,
                      k_count / MAX_HALO, m.tile_o / MAX_HALO]) - 1.0
    violation = jnp.sum(jnp.maximum(over, 0.0))
    return LayerCost(cycles, energy, spad, acc, violation, L.repeat * instructions)
