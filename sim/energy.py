"""Energy and area: counts of every action, times the config's energy table, plus leakage.

Actions are counted per instruction from the instruction stream (no timing
needed): MACs by compute mode, scratchpad and accumulator bytes read and
written, DRAM bytes, vector-unit element operations.  The matrix unit's
operand traffic follows SCALE-Sim's access counts (`systolic_compute_{ws,os}.py`,
see sim.costs): an operand is re-read once per fold along the dimension it is
not held for, and partial sums go back to the accumulator once per reduction
fold.  A vector operand broadcast along a dimension (stride 0) is read once,
not once per use.

Energy (pJ) = sum of count x energy per action (config fields, Horowitz ISSCC
2014 45 nm figures by default, see isa/config.py) + static power x time: the leakage and the
DRAM interface's, which, like its area, is priced per byte/cycle of bandwidth (LPDDR PHY
figures, isa/config.py).  The
formulas take `xp`, so energy is a differentiable JAX function of the energy
table, the leakage, the clock and (through the cycles) the bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax.numpy as jnp
import numpy as np

from stagec.isa import opcodes
from stagec.isa.access import Access, accesses
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import ITEMSIZE, AccMode, DType, Space
from stagec.isa.opcodes import Array, Dma, Fields, Lanes, OpcodeDef
from stagec.isa.program import Program

from .costs import array_per_pe, packed_reduction
from .timing import program_cycles

ACTIONS = ("macs_int8", "macs_bf16", "macs_fp32", "vector_ops", "scratchpad_read_bytes", "scratchpad_write_bytes",
           "accumulator_read_bytes", "accumulator_write_bytes", "dram_read_bytes", "dram_write_bytes")
COMPONENTS = ("mac", "vector", "scratchpad", "accumulator", "dram", "leakage")
_MAC_MODE = {DType.I8: "macs_int8", DType.BF16: "macs_bf16", DType.F32: "macs_fp32"}


@dataclass(frozen=True)
class ActionCounts:
    """Per-instruction counts of each action (float64 arrays of one length), or totals (scalars)."""

    macs_int8: np.ndarray
    macs_bf16: np.ndarray
    macs_fp32: np.ndarray
    vector_ops: np.ndarray
    scratchpad_read_bytes: np.ndarray
    scratchpad_write_bytes: np.ndarray
    accumulator_read_bytes: np.ndarray
    accumulator_write_bytes: np.ndarray
    dram_read_bytes: np.ndarray
    dram_write_bytes: np.ndarray

    def by_group(self, group: np.ndarray, groups: int) -> list[ActionCounts]:
        """Totals per group (e.g. per layer: `group` = layer id of each instruction, -1 = none)."""
        keep = group >= 0
        sums = {name: np.bincount(group[keep], weights=getattr(self, name)[keep], minlength=groups)
                for name in ACTIONS}
        return [ActionCounts(**{name: float(sums[name][g]) for name in ACTIONS}) for g in range(groups)]

    def total(self) -> ActionCounts:
        return ActionCounts(**{name: float(np.sum(getattr(self, name))) for name in ACTIONS})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def action_counts(code: np.ndarray, hw: HardwareConfig) -> ActionCounts:
    """Count every action of every instruction, by the unit its opcode is charged on (isa.opcodes);
    MATMUL operand traffic depends on the array shape."""
    counts = {name: np.zeros(len(code)) for name in ACTIONS}
    slots = {(a.operand, a.write): a for a in accesses(code)}
    op = code["opcode"]
    for d in opcodes.OPCODES.values():
        rows = np.flatnonzero(op == d.opcode)
        if rows.size:
            _UNIT_ACTIONS[type(d.unit)](d, Fields(code[rows]), rows, slots, hw, counts)
    return ActionCounts(**counts)


def _local(counts: dict, rows: np.ndarray, space: np.ndarray, write: bool, nbytes: np.ndarray) -> None:
    """Add `nbytes` of local-memory traffic of instructions `rows` in memories `space`."""
    for memory, name in ((Space.SPAD, "scratchpad"), (Space.ACC, "accumulator")):
        counts[f"{name}_{'write' if write else 'read'}_bytes"][rows] += np.where(space == memory, nbytes, 0)


def _slot_traffic(d: OpcodeDef, rows: np.ndarray, slots: dict[tuple[str, bool], Access], counts: dict,
                  distinct: bool) -> None:
    """Each slot's elements (`distinct`: each distinct element, a broadcast one once) times their size."""
    for s in d.slots:
        a = slots.get((s.operand, s.write))
        if a is None:   # no instruction of the program makes this access
            continue
        valid = a.valid[rows]
        dims = a.dims[rows][valid]
        if distinct:
            dims = np.where(a.strides[rows][valid] != 0, dims, 1)
        nbytes = np.prod(dims, axis=1).astype(np.float64) * a.itemsize[rows][valid]
        _local(counts, rows[valid], a.space[rows][valid], s.write, nbytes)


def _dma_actions(d: OpcodeDef, f: Fields, rows, slots, hw, counts) -> None:
    counts["dram_write_bytes" if d.dram_slot.write else "dram_read_bytes"][rows] += d.unit.moved(f)
    _slot_traffic(d, rows, slots, counts, distinct=False)


def _lanes_actions(d: OpcodeDef, f: Fields, rows, slots, hw, counts) -> None:
    counts["vector_ops"][rows] += d.unit.elements(f)
    _slot_traffic(d, rows, slots, counts, distinct=True)
    # a table (CLAMP's) is accessed whole, up to its last element read; the lanes read its lo and hi and
    # each distinct element of it: what its scratchpad reads cost
    table = opcodes.func_table("src2_table")[f.func].astype(bool)
    if table.any():
        z = slots["z", False]
        used = 2 + np.prod(np.where(f.strides("z") != 0, f.n[:, :3], 1), axis=1)
        _local(counts, rows[table], z.space[rows][table], False, (used - z.words[rows])[table] * 4.0)


def _array_actions(d: OpcodeDef, f: Fields, rows, slots, hw: HardwareConfig, counts) -> None:
    """MACs, and SCALE-Sim's operand traffic of slots a, b and c (see the module docstring)."""
    m, k, nn = d.unit.mkn(f).astype(np.float64).T
    size_in, size_out = ITEMSIZE[f.field("dtype")].astype(np.float64), ITEMSIZE[f.field("out_dtype")].astype(np.float64)
    col_folds = np.ceil(nn / hw.array_cols)
    accumulate = f.mode != AccMode.OVERWRITE
    if hw.dataflow == "weight_stationary":   # inputs re-streamed per column fold; partial sums per row fold
        row_folds = np.ceil(packed_reduction(k, array_per_pe(size_in, hw)) / hw.array_rows)
        a_reads, b_reads = m * k * col_folds, k * nn
        c_writes, c_reads = m * nn * row_folds, m * nn * (row_folds - 1 + accumulate)
    else:                                    # outputs held: inputs per column fold, weights per row fold
        row_folds = np.ceil(m / hw.array_rows)
        a_reads, b_reads = m * k * col_folds, k * nn * row_folds
        c_writes, c_reads = m * nn, m * nn * accumulate
    for dtype, name in _MAC_MODE.items():
        counts[name][rows] += np.where(f.field("dtype") == dtype, m * k * nn, 0)
    for role, write, nbytes in (("a", False, a_reads * size_in), ("b", False, b_reads * size_in),
                                ("c", False, c_reads * size_out), ("c", True, c_writes * size_out)):
        _local(counts, rows, f.space(d.slot(role, write).operand), write, nbytes)


_UNIT_ACTIONS = {Dma: _dma_actions, Lanes: _lanes_actions, Array: _array_actions}


def energy_pj(counts: ActionCounts, cycles, hw: HardwareConfig, xp=np) -> dict:
    """Energy by component (pJ): counts (totals) x the energy table, and leakage over `cycles`."""
    mac = (counts.macs_int8 * hw.energy_pj_per_mac_int8 + counts.macs_bf16 * hw.energy_pj_per_mac_bf16
           + counts.macs_fp32 * hw.energy_pj_per_mac_fp32)
    seconds = xp.asarray(cycles) / hw.clock_hz
    return {
        "mac": mac,
        "vector": counts.vector_ops * hw.energy_pj_per_vector_op,
        "scratchpad": (counts.scratchpad_read_bytes + counts.scratchpad_write_bytes) * hw.energy_pj_per_spad_byte,
        "accumulator": (counts.accumulator_read_bytes + counts.accumulator_write_bytes) * hw.energy_pj_per_acc_byte,
        "dram": (counts.dram_read_bytes + counts.dram_write_bytes) * hw.energy_pj_per_dram_byte,
        "leakage": static_mw(hw) * 1e-3 * seconds * 1e12,
    }


def static_mw(hw: HardwareConfig):
    """Static power (mW): the accelerator's leakage and its DRAM interface's, which grows with the
    bandwidth the interface provides."""
    return hw.leakage_mw + hw.dram_phy_mw_per_byte_per_cycle * hw.dma_bandwidth_bytes_per_cycle


def area_mm2(hw: HardwareConfig) -> dict:
    """Area by component (mm^2) from the config's area table."""
    return {
        "array": hw.array_rows * hw.array_cols * hw.area_mm2_per_pe,
        "scratchpad": hw.scratchpad_bytes / 1024 * hw.area_mm2_per_sram_kib,
        "accumulator": hw.accumulator_bytes / 1024 * hw.area_mm2_per_sram_kib,
        "vector": hw.vector_lanes * hw.area_mm2_per_vector_lane,
        "dram_interface": hw.dma_bandwidth_bytes_per_cycle * hw.area_mm2_per_dram_byte_per_cycle,
        "fixed": hw.area_mm2_fixed,
    }


def counts_of(program: Program, hw: HardwareConfig | None = None) -> ActionCounts:
    """The program's per-instruction action counts on `hw` (cached for the program's own config)."""
    hw = program.hw if hw is None else hw
    key = ("action_counts", hw.array_rows, hw.array_cols, hw.dataflow, hw.array_subword_packing)
    if key not in program.cache:
        program.cache[key] = action_counts(program.code, hw)
    return program.cache[key]


def program_energy_pj(program: Program, hw: HardwareConfig | None = None):
    """Total energy (pJ) of `program` on `hw`, a JAX scalar differentiable in the continuous fields.

    >>> import jax, stagec
    >>> from stagec.models import hand_keypoint_net
    >>> program = stagec.compile(*hand_keypoint_net())
    >>> grad = jax.grad(program_energy_pj, argnums=1)(program, program.hw)
    >>> bool(grad.energy_pj_per_dram_byte > 0)
    True
    """
    hw = program.hw if hw is None else hw
    parts = energy_pj(counts_of(program, hw).total(), program_cycles(program, hw), hw, jnp)
    return sum(parts.values())
