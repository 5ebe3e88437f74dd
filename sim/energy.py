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
2014 45 nm figures by default, see isa/config.py) + leakage_mw x time.  The
formulas take `xp`, so energy is a differentiable JAX function of the energy
table, the leakage, the clock and (through the cycles) the bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax.numpy as jnp
import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import (
    BINARY,
    READS_DST,
    REDUCTIONS,
    REQUANT_RECORD_BYTES,
    AccMode,
    DType,
    Opcode,
    Space,
    VectorFunc,
)
from stagec.isa.program import Program

from .costs import ITEMSIZE
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
    """Count every action of every instruction (MATMUL operand traffic depends on the array shape)."""
    op = code["opcode"]
    n = code["n"].astype(np.int64)
    spaces = code["spaces"].astype(np.int64)
    space = {slot: spaces >> (2 * i) & 3 for i, slot in enumerate("xyz")}
    size_in, size_out = ITEMSIZE[code["dtype"]].astype(np.float64), ITEMSIZE[code["out_dtype"]].astype(np.float64)
    elems = (n[:, 0] * n[:, 1] * n[:, 2]).astype(np.float64)
    counts = {name: np.zeros(len(code)) for name in ACTIONS}
    reads, writes = [], []      # (mask, space, bytes) of local-memory traffic

    load, store, gather = op == Opcode.LOAD, op == Opcode.STORE, op == Opcode.GATHER
    pad = code["pad"].astype(np.int64)
    padded = np.prod(n[:, :3] + np.where(load[:, None], pad[:, 0::2] + pad[:, 1::2], 0), axis=1).astype(np.float64)
    counts["dram_read_bytes"] += np.where(load | gather, elems * size_in, 0)
    counts["dram_write_bytes"] += np.where(store, elems * size_in, 0)
    writes.append((load | gather, space["y"], padded * size_out))
    reads.append((store, space["y"], elems * size_out))
    reads.append((gather, space["z"], n[:, 0].astype(np.float64) * 4))   # the int32 row indices

    mm = op == Opcode.MATMUL
    m, k, nn = (n[:, 0] * n[:, 1]).astype(np.float64), n[:, 2].astype(np.float64), n[:, 3].astype(np.float64)
    col_folds = np.ceil(nn / hw.array_cols)
    accumulate = code["mode"] != AccMode.OVERWRITE
    if hw.dataflow == "weight_stationary":   # inputs re-streamed per column fold; partial sums per row fold
        row_folds = np.ceil(k / hw.array_rows)
        a_reads, b_reads = m * k * col_folds, k * nn
        c_writes, c_reads = m * nn * row_folds, m * nn * (row_folds - 1 + accumulate)
    else:                                    # outputs held: inputs per column fold, weights per row fold
        row_folds = np.ceil(m / hw.array_rows)
        a_reads, b_reads = m * k * col_folds, k * nn * row_folds
        c_writes, c_reads = m * nn, m * nn * accumulate
    for dtype, name in _MAC_MODE.items():
        counts[name] += np.where(mm & (code["dtype"] == dtype), m * k * nn, 0)
    reads += [(mm, space["x"], a_reads * size_in), (mm, space["y"], b_reads * size_in),
              (mm, space["z"], c_reads * size_out)]
    writes.append((mm, space["z"], c_writes * size_out))

    vec = op == Opcode.VECTOR
    func = code["func"]
    reduction = np.isin(func, list(REDUCTIONS))
    out = np.where(reduction, n[:, 0] * n[:, 1], elems).astype(np.float64)
    counts["vector_ops"] += np.where(vec, elems, 0)
    writes.append((vec, space["x"], out * size_out))
    reads.append((vec & (accumulate | np.isin(func, list(READS_DST))), space["x"], out * size_out))
    reads.append((vec, space["y"], _distinct(code, "y", n) * size_in))
    params = np.where(func == VectorFunc.REQUANT, REQUANT_RECORD_BYTES, size_in)
    reads.append((vec & np.isin(func, list(BINARY)), space["z"], _distinct(code, "z", n) * params))

    for direction, traffic in (("read", reads), ("write", writes)):
        for mask, where, nbytes in traffic:
            for memory, name in ((Space.SPAD, "scratchpad"), (Space.ACC, "accumulator")):
                counts[f"{name}_{direction}_bytes"] += np.where(mask & (where == memory), nbytes, 0)
    return ActionCounts(**counts)


def _distinct(code: np.ndarray, slot: str, n: np.ndarray) -> np.ndarray:
    """Distinct elements an operand pattern touches: the product of the dims it does not broadcast."""
    strides = code[f"{slot}_strides"]
    return np.prod(np.where(strides != 0, n[:, :3], 1), axis=1).astype(np.float64)


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
        "leakage": hw.leakage_mw * 1e-3 * seconds * 1e12,
    }


def area_mm2(hw: HardwareConfig) -> dict:
    """Area by component (mm^2) from the config's area table."""
    return {
        "array": hw.array_rows * hw.array_cols * hw.area_mm2_per_pe,
        "scratchpad": hw.scratchpad_bytes / 1024 * hw.area_mm2_per_sram_kib,
        "accumulator": hw.accumulator_bytes / 1024 * hw.area_mm2_per_sram_kib,
        "vector": hw.vector_lanes * hw.area_mm2_per_vector_lane,
        "fixed": hw.area_mm2_fixed,
    }


def counts_of(program: Program, hw: HardwareConfig | None = None) -> ActionCounts:
    """The program's per-instruction action counts on `hw` (cached for the program's own config)."""
    hw = program.hw if hw is None else hw
    key = ("action_counts", hw.array_rows, hw.array_cols, hw.dataflow)
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
