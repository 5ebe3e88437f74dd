"""Per-instruction costs and a first timing: busy cycles per unit.

Each instruction's cost comes from the hardware config: DMA = latency +
bytes / bandwidth; MATMUL = folds of the array, each paying weight preload,
fill and drain (SCALE-Sim's per-fold form); VECTOR = element groups over the
lanes, transcendental functions costing more.  The units overlap through the
queues, so the program takes at least the busiest unit's cycles and at most
the sum.
"""

from __future__ import annotations

import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import REDUCTIONS, TRANSCENDENTAL, DType, Opcode, Queue

_ITEMSIZE = np.zeros(256, np.int64)
for _d in DType:
    _ITEMSIZE[_d] = _d.itemsize


def dram_bytes(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes read from DRAM, bytes written to DRAM) per instruction."""
    n = code["n"].astype(np.int64)
    moved = n[:, 0] * n[:, 1] * n[:, 2] * _ITEMSIZE[code["dtype"]]
    op = code["opcode"]
    return np.where(op == Opcode.LOAD, moved, 0), np.where(op == Opcode.STORE, moved, 0)


def instruction_cycles(code: np.ndarray, hw: HardwareConfig) -> np.ndarray:
    op = code["opcode"]
    n = code["n"].astype(np.int64)
    read, write = dram_bytes(code)
    dma = hw.dma_latency_cycles + np.ceil((read + write) / hw.dma_bandwidth_bytes_per_cycle)
    r, c = hw.array_rows, hw.array_cols
    m, k, nn = n[:, 0] * n[:, 1], n[:, 2], n[:, 3]
    if hw.dataflow == "weight_stationary":   # a k x n fold of weights held, M rows streamed through
        folds = -(-k // r) * -(-nn // c)
        mm = folds * (2 * r + c + m - 2)
    else:                                    # an M x n fold of outputs held, k streamed through
        folds = -(-m // r) * -(-nn // c)
        mm = folds * (2 * r + c + k - 2)
    elems = n[:, 0] * n[:, 1] * n[:, 2]
    slow = np.isin(code["func"], list(TRANSCENDENTAL))
    vec = -(-elems // hw.vector_lanes) * np.where(slow, hw.vector_cycles_per_transcendental, 1.0)
    vec = vec + np.where(np.isin(code["func"], list(REDUCTIONS)), np.log2(np.maximum(n[:, 2], 1)), 0)
    return np.select([op == Opcode.LOAD, op == Opcode.STORE, op == Opcode.MATMUL, op == Opcode.VECTOR],
                     [dma, dma, mm.astype(np.float64), vec], 0.0)


def queue_of(code: np.ndarray) -> np.ndarray:
    table = np.zeros(256, np.int64)
    table[Opcode.LOAD], table[Opcode.STORE] = Queue.LOAD, Queue.STORE
    table[Opcode.MATMUL], table[Opcode.VECTOR] = Queue.MATRIX, Queue.VECTOR
    return table[code["opcode"]]
