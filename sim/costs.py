"""How long one instruction takes: the per-instruction duration formulas, for numpy or jax.numpy.

These are the formulas the timing simulator (`sim.timing`) charges each
instruction and the ones an analytical cost model should reuse, so the two
agree by construction.  Every function takes `xp` (numpy or jax.numpy): with
numpy they give exact host numbers, with jax.numpy they trace, so gradients
flow through the continuous hardware fields.

Matrix unit (per MATMUL tile of M x K times K x N on an R x C array), after
SCALE-Sim (A. Samajdar et al., "A Systematic Methodology for Characterizing
Scalability of DNN Accelerators using SCALE-Sim", ISPASS 2020; code at
github.com/scalesim-project, `scalesim/compute/systolic_compute_{ws,os}.py`):

  weight stationary: a K x N weight fold sits in the array (rows along the
      reduction, columns along output channels) and the M input rows stream
      through.  ceil(K/R) * ceil(N/C) folds, each 2R + C + M - 2 cycles:
      R to preload the weights, M streamed rows, R + C - 2 of skew fill and drain.
  output stationary: each PE holds one output of an M x N fold while K streams
      through.  ceil(M/R) * ceil(N/C) folds, each R + C + K - 2 cycles (SCALE-Sim's
      code: K operand cycles plus R + C - 2 of skew; the paper's closed form
      charges one more R per fold to shift the outputs out, the code overlaps it).

A fold that does not fill the array costs as much as one that does (unused PEs
idle), as in SCALE-Sim.

Each PE's datapath is 32 bits wide: with `array_subword_packing` it multiplies 32 / w operand
pairs of w bits a cycle along the reduction and sums them into its one accumulator, as a
vector lane packs (lane_elements): a dot-4 PE for int8, as Intel's VNNI (VPDPBUSD sums four
int8 products into each 32-bit lane) and Arm's SDOT, and dot-2 for bf16 (BFDOT).  A MATMUL's
reduction then steps ceil(K / p) times for p pairs a PE (packed_reduction): weight stationary,
a PE holds p weights, so a fold covers R * p of K; output stationary, K streams p a cycle.
The inputs' and weights' paths carry 32 bits an array row a cycle either way.

DMA (LOAD, GATHER, STORE): a fixed latency, then the bytes over the DRAM bandwidth.
The transfer is kept fractional (no ceiling), so cycles are differentiable in
the bandwidth.

Vector unit: ceil(elements / (lanes * per_lane)) lane groups, each one cycle, or
`vector_cycles_per_transcendental` for exp, log, rsqrt, ...; a reduction adds
ceil(log2(length)) cycles for the tree that combines the lanes.  Each lane is 32 bits wide;
with `vector_subword_packing` it takes 32 / w elements per cycle (per_lane), w the bits of the
instruction's widest operand (lane_bits): 4 int8, 2 bf16, 1 fp32/int32.  That is
how edge SIMD units count their lanes: a 128-bit Arm Helium (MVE) vector holds 16 x int8,
8 x int16/fp16 or 4 x int32/fp32 lanes, one operation per lane ("Helium registers", Arm's Helium
programmer's guide), and Arm's SDOT sums four int8 products into each 32-bit accumulator
(Arm's intrinsics reference, vdot_s32 / SDOT Vd.2S, Vn.8B, Vm.8B); a widening op (int8 ->
int32) yields only as many results per cycle as its 32-bit destination holds.  A widening
reduction (a dot reduction: RDOT, an int8 sum into int32) is SDOT's: each output's run takes
ceil(run / per_lane) dot steps of its lane, a run of 5 int8 padded to 8 (lane_work).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stagec.isa import opcodes
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import ITEMSIZE
from stagec.isa.opcodes import Array, Dma, Fields, Lanes, func_table, queues_of

# --- the formulas --------------------------------------------------------------------------------

def packed_reduction(k, per_pe=1, xp=np):
    """The steps of a MATMUL's reduction of length `k` on PEs that multiply `per_pe` operand pairs a
    cycle (lane_elements of its operands' bits): ceil(k / per_pe)."""
    return xp.ceil(xp.asarray(k) / per_pe)


def matmul_folds(m, k, n, rows: int, cols: int, dataflow: str, xp=np, per_pe=1):
    """Folds of an M x K x N matmul on a rows x cols array (SCALE-Sim's row_fold * col_fold), each PE
    multiplying `per_pe` operand pairs a cycle."""
    k = packed_reduction(k, per_pe, xp)
    if dataflow == "weight_stationary":
        return xp.ceil(k / rows) * xp.ceil(n / cols)
    if dataflow == "output_stationary":
        return xp.ceil(m / rows) * xp.ceil(n / cols)
    raise ValueError(f"unknown dataflow {dataflow!r}; expected weight_stationary or output_stationary")


def matmul_fold_cycles(m, k, n, rows: int, cols: int, dataflow: str, xp=np, per_pe=1):
    """Cycles of one fold (SCALE-Sim's per-fold demand-matrix length)."""
    k = packed_reduction(k, per_pe, xp)
    if dataflow == "weight_stationary":
        return 2 * rows + cols + m - 2
    if dataflow == "output_stationary":
        return rows + cols + k - 2
    raise ValueError(f"unknown dataflow {dataflow!r}; expected weight_stationary or output_stationary")


def matmul_cycles(m, k, n, rows: int, cols: int, dataflow: str, xp=np, per_pe=1):
    """Cycles of an M x K x N matmul tile on the array, each PE multiplying `per_pe` operand pairs a
    cycle: folds x per-fold cycles.

    >>> int(matmul_cycles(196, 576, 64, 32, 32, "weight_stationary"))   # 576/32 x 64/32 = 36 folds of 2*32+32+196-2
    10440
    >>> int(matmul_cycles(196, 576, 64, 32, 32, "weight_stationary", per_pe=4))   # int8: 576/128 -> 5 x 2 folds
    2900
    """
    return (matmul_folds(m, k, n, rows, cols, dataflow, xp, per_pe)
            * matmul_fold_cycles(m, k, n, rows, cols, dataflow, xp, per_pe))


def array_per_pe(itemsize, hw: HardwareConfig, xp=np):
    """Operand pairs a PE multiplies a cycle at operands of `itemsize` bytes on `hw`."""
    return lane_elements(8 * xp.asarray(itemsize), hw.array_subword_packing, xp)


def array_macs_per_cycle(hw: HardwareConfig, itemsize) -> int:
    """The array's peak MACs a cycle at operands of `itemsize` bytes (4 int8, 2 bf16, 1 fp32 a PE packed)."""
    return hw.peak_macs_per_cycle * int(array_per_pe(itemsize, hw))


def dma_transfer_cycles(nbytes, bandwidth_bytes_per_cycle, xp=np):
    """Cycles the DRAM channel is busy moving `nbytes` (fractional, hence differentiable)."""
    return xp.asarray(nbytes) / bandwidth_bytes_per_cycle


def dma_cycles(nbytes, hw: HardwareConfig, xp=np):
    """A DMA instruction alone: latency, then the transfer."""
    return hw.dma_latency_cycles + dma_transfer_cycles(nbytes, hw.dma_bandwidth_bytes_per_cycle, xp)


LANE_BITS = 32


def source_bits(func, dtype) -> np.ndarray:
    """Bits per element of a VECTOR instruction's widest source: its first's, or a streamed src2's (a
    record's words; a table read once does not count)."""
    func, dtype = np.asarray(func, np.int64), np.asarray(dtype, np.int64)
    streamed = (func_table("sources")[func] == 2) & (func_table("src2_once")[func] == 0)
    own = func_table("src2_dtype", -1)[func]
    return np.maximum(8 * ITEMSIZE[dtype], np.where(streamed, 8 * ITEMSIZE[np.where(own >= 0, own, dtype)], 0))


def dot_reduction(func, dtype, out_dtype) -> np.ndarray:
    """Whether a VECTOR instruction sums runs into a wider accumulator (int8 -> int32, as Arm's SDOT;
    bf16 -> float32, as BFDOT): each output one 32-bit lane's, which takes its run's elements a dot
    step at a time (lane_work)."""
    func = np.asarray(func, np.int64)
    out = 8 * ITEMSIZE[np.asarray(out_dtype, np.int64)]
    return func_table("reduction")[func].astype(bool) & (out > source_bits(func, dtype))


def lane_bits(func, dtype, out_dtype) -> np.ndarray:
    """Bits per element of a VECTOR instruction's widest operand, which sets how many of its elements a
    lane packs (lane_elements): its sources' (source_bits) and its destination's, but for a dot
    reduction (dot_reduction), whose lane packs its sources into one output.  A widening elementwise
    op runs at its result's width (int8 -> int32: one a lane)."""
    out = 8 * ITEMSIZE[np.asarray(out_dtype, np.int64)]
    return np.maximum(source_bits(func, dtype), np.where(dot_reduction(func, dtype, out_dtype), 0, out))


def lane_work(elements, per_lane, run=1, dot=False, xp=np):
    """Lane cycles of a vector instruction over `elements`, a lane taking `per_lane` of them a cycle; a
    dot reduction's (dot_reduction: over runs of `run`) its outputs times ceil(run / per_lane) dot steps
    each: Arm's SDOT sums four int8 a step, so a run of 5 takes two steps (padded to 8), one of 3 one.

    >>> float(lane_work(15, 4)), float(lane_work(15, 4, run=5, dot=True)), float(lane_work(9, 4, run=3, dot=True))
    (3.75, 6.0, 3.0)
    """
    run = xp.maximum(xp.asarray(run), 1)
    return xp.where(dot, elements / run * xp.ceil(run / per_lane), elements / per_lane)


def tree_cycles(run, xp=np):
    """Cycles of the tree that combines a reduction's lanes over runs of `run`: ceil(log2(run))."""
    return xp.where(xp.asarray(run) > 1, xp.ceil(xp.log2(xp.maximum(run, 1))), 0.0)


def lane_elements(bits, packing, xp=np):
    """Elements a 32-bit lane takes per cycle of an instruction whose widest operand has `bits` per
    element: 32 // bits with sub-word packing (`packing`: a bool, or 0/1), else one.

    >>> int(lane_elements(8, True)), int(lane_elements(16, True)), int(lane_elements(8, False))
    (4, 2, 1)
    """
    return xp.where(packing, LANE_BITS // xp.maximum(xp.asarray(bits), 8), 1)


def vector_cycles(elements, lanes: int, *, per_lane=1, transcendental=False, reduce_length=1, dot=False,
                  cycles_per_transcendental=1.0, xp=np):
    """Cycles of a vector instruction over `elements` (reductions: over runs of `reduce_length`), each
    of `lanes` lanes taking `per_lane` elements a cycle (lane_elements), a dot reduction's a dot step
    (lane_work).

    >>> int(vector_cycles(100, 16)), int(vector_cycles(100, 16, per_lane=4))
    (7, 2)
    """
    groups = xp.ceil(lane_work(xp.asarray(elements), per_lane, reduce_length, dot, xp) / lanes)
    per_group = xp.where(transcendental, cycles_per_transcendental, 1.0)
    return groups * per_group + tree_cycles(reduce_length, xp)


def vector_instruction_cycles(func, dtype, out_dtype, elements, hw: HardwareConfig, reduce_length=1) -> float:
    """Cycles of one VECTOR instruction of `func` from `dtype` to `out_dtype` over `elements` (a
    reduction's: runs of `reduce_length`) on `hw`, as unit_cycles charges it: its lanes packed by
    lane_bits, a dot reduction's steps by lane_work.  The predictions that price the instructions they
    will emit one by one (lower.schedule.rowwise, lower.schedule.flash_int8) use it, not a rule of their own."""
    func, dtype, out_dtype = int(func), int(dtype), int(out_dtype)
    return float(vector_cycles(elements, hw.vector_lanes,
                               per_lane=lane_elements(lane_bits(func, dtype, out_dtype), hw.vector_subword_packing),
                               transcendental=bool(func_table("transcendental")[func]), reduce_length=reduce_length,
                               dot=dot_reduction(func, dtype, out_dtype),
                               cycles_per_transcendental=hw.vector_cycles_per_transcendental))


# --- the formulas applied to an instruction stream -----------------------------------------------

@dataclass(frozen=True)
class InstructionShapes:
    """The static (hardware-independent) numbers of each instruction that the formulas need."""

    queue: np.ndarray            # (N,) Queue
    is_dma: np.ndarray           # (N,) charged as a DMA (LOAD, GATHER, STORE)
    dram_bytes: np.ndarray       # (N,) bytes a DMA moves over the DRAM channel
    matmul_mkn: np.ndarray       # (N, 3) M, K, N of each instruction on the array (0 elsewhere)
    matmul_bits: np.ndarray      # (N,) bits of its operands per element (0 elsewhere)
    is_matmul: np.ndarray
    vector_elements: np.ndarray  # (N,) elements an instruction on the vector unit processes
    vector_reduce: np.ndarray    # (N,) reduction length (1 for elementwise)
    vector_bits: np.ndarray      # (N,) bits of its widest operand per element (lane_bits; 0 elsewhere)
    vector_dot: np.ndarray       # (N,) bool: a dot reduction (dot_reduction)
    transcendental: np.ndarray   # (N,) bool
    is_vector: np.ndarray


def instruction_shapes(code: np.ndarray) -> InstructionShapes:
    """The shape numbers of each instruction, as its opcode's unit (isa.opcodes) gives them."""
    n = len(code)
    columns = {"dram_bytes": np.zeros(n, np.int64), "matmul_mkn": np.zeros((n, 3), np.int64),
               "matmul_bits": np.zeros(n, np.int64),
               "vector_elements": np.zeros(n, np.int64), "vector_reduce": np.ones(n, np.int64),
               "vector_bits": np.zeros(n, np.int64), "vector_dot": np.zeros(n, bool),
               "transcendental": np.zeros(n, bool), "is_dma": np.zeros(n, bool), "is_matmul": np.zeros(n, bool),
               "is_vector": np.zeros(n, bool)}
    op = code["opcode"]
    for d in opcodes.OPCODES.values():
        rows = np.flatnonzero(op == d.opcode)
        if rows.size:
            for name, value in _UNIT_SHAPES[type(d.unit)](d.unit, Fields(code[rows])).items():
                columns[name][rows] = value
    return InstructionShapes(queue=queues_of(op).astype(np.int32), **columns)


_UNIT_SHAPES = {
    Dma: lambda u, f: {"is_dma": True, "dram_bytes": u.moved(f)},
    Array: lambda u, f: {"is_matmul": True, "matmul_mkn": u.mkn(f), "matmul_bits": 8 * ITEMSIZE[f.field("dtype")]},
    Lanes: lambda u, f: {"is_vector": True, "vector_elements": u.elements(f), "vector_reduce": u.reduce_length(f),
                         "transcendental": u.transcendental(f),
                         "vector_bits": lane_bits(f.func, f.field("dtype"), f.field("out_dtype")),
                         "vector_dot": dot_reduction(f.func, f.field("dtype"), f.field("out_dtype"))},
}


@dataclass(frozen=True)
class UnitParameters:
    """The hardware fields the duration formulas read, all as values: with JAX arrays here, one compiled
    timing serves every array shape and dataflow (a HardwareConfig's structural fields are static)."""

    array_rows: object
    array_cols: object
    vector_lanes: object
    weight_stationary: object
    dma_bandwidth_bytes_per_cycle: object
    dma_latency_cycles: object
    vector_cycles_per_transcendental: object
    vector_subword_packing: object
    array_subword_packing: object


def unit_parameters(hw: HardwareConfig) -> UnitParameters:
    return UnitParameters(hw.array_rows, hw.array_cols, hw.vector_lanes, hw.dataflow == "weight_stationary",
                          hw.dma_bandwidth_bytes_per_cycle, hw.dma_latency_cycles,
                          hw.vector_cycles_per_transcendental, hw.vector_subword_packing, hw.array_subword_packing)


def unit_cycles(shapes: InstructionShapes, p: UnitParameters, xp=np):
    """(occupancy, transfer) per instruction, as the timing simulator charges them.

    occupancy: cycles a MATMUL or VECTOR instruction holds its unit; for a DMA, its latency.
    transfer: cycles a DMA holds the shared DRAM channel (0 for the rest).
    """
    m, k, n = (shapes.matmul_mkn[:, j] for j in range(3))
    per_pe = lane_elements(shapes.matmul_bits, p.array_subword_packing, xp)
    ws = matmul_cycles(m, k, n, p.array_rows, p.array_cols, "weight_stationary", xp, per_pe)
    os_ = matmul_cycles(m, k, n, p.array_rows, p.array_cols, "output_stationary", xp, per_pe)
    matrix = xp.where(shapes.is_matmul, xp.where(p.weight_stationary, ws, os_), 0.0)
    vector = vector_cycles(shapes.vector_elements, p.vector_lanes,
                           per_lane=lane_elements(shapes.vector_bits, p.vector_subword_packing, xp),
                           transcendental=shapes.transcendental,
                           reduce_length=shapes.vector_reduce, dot=shapes.vector_dot,
                           cycles_per_transcendental=p.vector_cycles_per_transcendental, xp=xp)
    occupancy = xp.where(shapes.is_dma, p.dma_latency_cycles, xp.where(shapes.is_vector, vector, matrix))
    transfer = dma_transfer_cycles(shapes.dram_bytes, p.dma_bandwidth_bytes_per_cycle, xp)
    return occupancy, transfer
