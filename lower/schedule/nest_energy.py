"""What a loop nest does, counted as sim.energy counts it from the instruction stream: MACs, vector
element operations, scratchpad, accumulator and DRAM bytes read and written (one run of the nest).

The array's operand traffic is SCALE-Sim's (sim.energy): the streamed operand is read once per
column fold, the held one once per MATMUL (per row fold, output stationary), partial sums written
once per reduction fold; transposed, A is the weights and B the halo's lines.
"""

from __future__ import annotations

from stagec.sim.energy import ActionCounts

from .nest import MATRIX, LayerShape, TileMapping
from .nest_work import (
    ACC_ITEMSIZE,
    Work,
    epilogue_ops,
    matmuls_per_step,
    taps_per_matmul,
    window_acc_itemsize,
    window_steps,
)


def epilogue_bytes(L: LayerShape, m: TileMapping, out):
    """(read, written) bytes of the epilogue's VECTOR instructions over `out` elements, each at its
    own element type (an int8 result is one byte), with a single accumulator tile's COPY out of it
    where there is no epilogue (lower.schedule.nest_work.epilogue_ops)."""
    e = L.epilogue
    copy = (1 - m.transposed) * m.single_acc * (e.plain + e.hard == 0)
    return out * (e.read_bytes + copy * ACC_ITEMSIZE), out * (e.write_bytes + copy * L.out_itemsize)


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
    epi_read, epi_write = epilogue_bytes(L, m, out)
    # with one accumulator tile the epilogue's last op writes the scratchpad and the store reads it;
    # transposed, the COPY moves every tile there and the epilogue runs on it in the scratchpad
    moved = (1 - tr) * sa + tr
    result = (1 - tr) * sa * out * L.out_itemsize
    turned = tr * out * ACC_ITEMSIZE
    stored = out * L.out_itemsize
    return ActionCounts(
        macs_int8=(L.itemsize == 1) * macs, macs_bf16=(L.itemsize == 2) * macs, macs_fp32=(L.itemsize == 4) * macs,
        vector_ops=epi_ops + tr * out,
        scratchpad_read_bytes=(a_reads + b_reads) * L.itemsize + moved * stored + tr * epi_read,
        scratchpad_write_bytes=w.halo_padded - w.halo[1] + w.loads[1] + w.startup[1] + result + turned
        + tr * epi_write,
        accumulator_read_bytes=(c_writes - products * L.o) * ACC_ITEMSIZE + (1 - tr) * epi_read + turned
        + (1 - moved) * stored,
        accumulator_write_bytes=c_writes * ACC_ITEMSIZE + (1 - tr) * epi_write - result,
        dram_read_bytes=w.startup[1] + w.loads[1], dram_write_bytes=w.store[1])


def window_actions(L: LayerShape, m: TileMapping, w: Work, hw, ops) -> ActionCounts:
    """A window nest's: each tap reads the halo as loaded and accumulates in the sums' type (a dot
    mapping's RDOTs, a kernel row's taps at once)."""
    out = L.n * L.oh * L.ow * L.o
    taps = L.kh * L.kw
    steps = window_steps(L, m)
    acc = window_acc_itemsize(L)
    epi_read, epi_write = epilogue_bytes(L, m, out)
    return ActionCounts(
        macs_int8=0 * out, macs_bf16=0 * out, macs_fp32=0 * out,
        vector_ops=taps * out + epilogue_ops(L, m) * out,
        scratchpad_read_bytes=taps * out * L.itemsize,
        scratchpad_write_bytes=w.halo_padded - w.halo[1] + w.loads[1] + w.startup[1],
        accumulator_read_bytes=(steps - 1) * out * acc + epi_read + out * L.out_itemsize,
        accumulator_write_bytes=steps * out * acc + epi_write,
        dram_read_bytes=w.startup[1] + w.loads[1], dram_write_bytes=w.store[1])


def actions(L: LayerShape, m: TileMapping, w: Work, hw, ops, kind) -> ActionCounts:
    """A nest's actions, its kind's (`kind`: lower.schedule.nest.KINDS' index, a number)."""
    return (matrix_actions if kind == MATRIX else window_actions)(L, m, w, hw, ops)
