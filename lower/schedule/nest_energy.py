"""What a loop nest does, counted as sim.energy counts it from the instruction stream: MACs, vector
element operations, scratchpad, accumulator and DRAM bytes read and written (one run of the nest).

The array's operand traffic is SCALE-Sim's (sim.energy): the streamed operand is read once per
column fold, the held one once per MATMUL (per row fold, output stationary), partial sums written
once per reduction fold; transposed, A is the weights and B the halo's lines.
"""

from __future__ import annotations

from stagec.sim.energy import ActionCounts

from .buffers import FP32
from .nest import MATRIX, LayerShape, TileMapping
from .nest_work import (
    Work,
    epilogue_ops,
    matmuls_per_step,
    taps_per_matmul,
)


def matrix_actions(L: LayerShape, m: TileMapping, w: Work, hw, ops) -> ActionCounts:
    xp = ops.xp
    tr, sa = m.transposed, m.single_acc
    d, f = w.dims, w.folds
    reduce = matmuls_per_step(L, m, xp) * taps_per_matmul(L, m, xp) * L.c   # summed over a tile's MATMULs
    pixels = L.n * L.oh * L.ow
    out = pixels * L.o
    wst = hw.weight_stationary
    macs = pixels * L.o * L.c * L.kh * L.kw + tr * reduce * L.o * (f.lines - pixels)
    a_reads = reduce * ((1 - tr) * pixels * f.cols + tr * L.o * f.line_cols)
    b_reads = reduce * ((1 - tr) * L.o * (wst * L.n * d.n_h * d.n_w + (1 - wst) * f.pixels)
                        + tr * f.lines * (wst * d.n_o + (1 - wst) * f.outs))
    products = (1 - tr) * pixels + tr * f.lines                  # accumulator elements per output channel
    c_writes = matmuls_per_step(L, m, xp) * products * L.o * (wst * f.k + (1 - wst) * d.n_c)
    epi_ops = epilogue_ops(L, m) * out
    # with one accumulator tile the epilogue's last op writes the scratchpad and the store reads it;
    # transposed, the COPY moves every tile there and the epilogue runs on it in the scratchpad
    moved = ((1 - tr) * sa + tr) * out * FP32
    epi_spad = tr * epi_ops * FP32
    turned = tr * out * FP32
    return ActionCounts(
        macs_int8=(L.itemsize == 1) * macs, macs_bf16=(L.itemsize == 2) * macs, macs_fp32=(L.itemsize == 4) * macs,
        vector_ops=epi_ops + tr * out,
        scratchpad_read_bytes=(a_reads + b_reads) * L.itemsize + moved + epi_spad,
        scratchpad_write_bytes=w.halo_padded - w.halo[1] + w.loads[1] + w.startup[1] + moved + epi_spad,
        accumulator_read_bytes=(c_writes - products * L.o + epi_ops + out) * FP32 - moved + turned - epi_spad,
        accumulator_write_bytes=(c_writes + epi_ops) * FP32 - moved + turned - epi_spad,
        dram_read_bytes=w.startup[1] + w.loads[1], dram_write_bytes=w.store[1])


def window_actions(L: LayerShape, m: TileMapping, w: Work, hw, ops) -> ActionCounts:
    out = L.n * L.oh * L.ow * L.o
    taps = L.kh * L.kw
    epi_ops = epilogue_ops(L, m) * out
    return ActionCounts(
        macs_int8=0 * out, macs_bf16=0 * out, macs_fp32=0 * out, vector_ops=taps * out + epi_ops,
        scratchpad_read_bytes=taps * out * FP32,
        scratchpad_write_bytes=w.halo_padded - w.halo[1] + w.loads[1] + w.startup[1],
        accumulator_read_bytes=((taps - 1) * out + epi_ops + out) * FP32,
        accumulator_write_bytes=(taps * out + epi_ops) * FP32,
        dram_read_bytes=w.startup[1] + w.loads[1], dram_write_bytes=w.store[1])


def actions(L: LayerShape, m: TileMapping, w: Work, hw, ops, kind) -> ActionCounts:
    """A nest's actions, its kind's (`kind`: lower.schedule.nest.KINDS' index, a number)."""
    return (matrix_actions if kind == MATRIX else window_actions)(L, m, w, hw, ops)
