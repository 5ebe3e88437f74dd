"""The reference interpreter: one instruction at a time, on byte-addressed memories.

Slow and obvious on purpose: it is the executable definition of the ISA
(program order, which the verifier proves equal to any token-respecting
concurrent order) that the vectorized executor is tested against.
"""

from __future__ import annotations

import numpy as np

from stagec.errors import SimulationError
from stagec.isa.access import element_offsets
from stagec.isa.instructions import (
    REQUANT_RECORD_BYTES,
    AccMode,
    DType,
    Opcode,
    Operand,
    PadValue,
    Space,
    VectorFunc,
    decode,
)
from stagec.isa.program import Program
from stagec.isa.semantics import ACCUMULATE, VECTOR_FUNCS, convert, pad_value, requantize
from stagec.isa.verify import verify


class _Memories:
    def __init__(self, program: Program):
        self.bytes = {Space.DRAM: np.zeros(verify(program).dram_end, np.uint8),
                      Space.SPAD: np.zeros(program.hw.scratchpad_bytes, np.uint8),
                      Space.ACC: np.zeros(program.hw.accumulator_bytes, np.uint8)}
        self.bytes[Space.DRAM][:len(program.constants)] = np.frombuffer(program.constants, np.uint8)

    def _view(self, space, dtype: DType):
        mem = self.bytes[Space(space)]
        size = dtype.itemsize
        return mem[:len(mem) - len(mem) % size].view(dtype.numpy)

    def read(self, operand, dims, dtype: DType) -> np.ndarray:
        idx = operand.base // dtype.itemsize + element_offsets(operand.strides, dims)
        return self._view(operand.space, dtype)[idx].reshape(dims)

    def read_records(self, operand, dims, words: int) -> np.ndarray:
        """int32 records of `words` words each; strides count records."""
        idx = operand.base // 4 + element_offsets(operand.strides, dims) * words
        return self._view(operand.space, DType.I32)[idx[:, None] + np.arange(words)].reshape(*dims, words)

    def write(self, operand, dims, dtype: DType, values: np.ndarray) -> None:
        idx = operand.base // dtype.itemsize + element_offsets(operand.strides, dims)
        self._view(operand.space, dtype)[idx] = np.asarray(values, dtype.numpy).reshape(-1)


def check_gather_indices(index: int, rows: np.ndarray, bound: int) -> None:
    bad = np.flatnonzero((rows < 0) | (rows >= bound))
    if bad.size:
        raise SimulationError(f"instruction {index} (GATHER): index {int(rows[bad[0]])} at position {int(bad[0])} is "
                              f"outside the table's {bound} rows; the gather did not run")


def _check_dtype(ins):
    if DType.BF16 in (ins.dtype, ins.out_dtype):
        raise SimulationError("bf16 arithmetic is not simulated yet")


def execute(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `program` on host arrays, instruction by instruction; return its outputs."""
    mem = _Memories(program)
    for ref, value in zip(program.inputs, inputs, strict=True):
        data = np.ascontiguousarray(value, ref.dtype.numpy).reshape(ref.shape)
        mem.bytes[Space.DRAM][ref.offset:ref.offset + ref.nbytes] = data.view(np.uint8).reshape(-1)
    for index, record in enumerate(program.code):
        ins = decode(record)
        _check_dtype(ins)
        n = ins.n
        if ins.opcode == Opcode.LOAD:
            p = ins.pad
            box = np.full((n[0] + p[0] + p[1], n[1] + p[2] + p[3], n[2] + p[4] + p[5]),
                          pad_value(PadValue(ins.mode), ins.out_dtype), ins.out_dtype.numpy)
            box[p[0]:p[0] + n[0], p[2]:p[2] + n[1], p[4]:p[4] + n[2]] = mem.read(ins.x, n[:3], ins.dtype)
            mem.write(ins.y, box.shape, ins.out_dtype, box)
        elif ins.opcode == Opcode.GATHER:
            rows = mem.read(ins.z, (n[0], 1, 1), DType.I32).reshape(-1)
            check_gather_indices(index, rows, n[3])
            for i0, row in enumerate(rows):
                src = Operand(ins.x.space, ins.x.base + int(row) * ins.x.strides[0] * ins.dtype.itemsize, ins.x.strides)
                dst = Operand(ins.y.space, ins.y.base + i0 * ins.y.strides[0] * ins.dtype.itemsize, ins.y.strides)
                mem.write(dst, (1, n[1], n[2]), ins.dtype, mem.read(src, (1, n[1], n[2]), ins.dtype))
        elif ins.opcode == Opcode.STORE:
            mem.write(ins.x, n[:3], ins.dtype, mem.read(ins.y, n[:3], ins.out_dtype))
        elif ins.opcode == Opcode.MATMUL:
            m1, m0, k, nn = n
            a = mem.read(ins.x, (m1, m0, k), ins.dtype).reshape(m1 * m0, k)
            b = mem.read(ins.y, (k, nn, 1), ins.dtype).reshape(k, nn)
            if ins.out_dtype == DType.I32:   # two's-complement wraparound, as the hardware adder
                prod = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
            else:
                prod = (a.astype(np.float32) @ b.astype(np.float32)).astype(ins.out_dtype.numpy)
            prod = prod.reshape(m1, m0, nn)
            if ins.mode == AccMode.ADD:
                prod = mem.read(ins.z, (m1, m0, nn), ins.out_dtype) + prod
            mem.write(ins.z, (m1, m0, nn), ins.out_dtype, prod)
        elif ins.func == VectorFunc.REQUANT:
            x = mem.read(ins.y, n[:3], DType.I32)
            records = mem.read_records(ins.z, n[:3], REQUANT_RECORD_BYTES // 4)
            mem.write(ins.x, n[:3], DType.I8, requantize(x, *(records[..., k] for k in range(3))))
        else:
            func = VectorFunc(ins.func)
            args = [mem.read(o, n[:3], ins.dtype) for o in (ins.y, ins.z) if o is not None]
            if func == VectorFunc.SELECT:
                result = np.where(args[0] != 0, args[1], mem.read(ins.x, n[:3], ins.out_dtype))
            else:
                result = convert(VECTOR_FUNCS[func](*args), ins.out_dtype)
            dims = result.shape
            if ins.mode != AccMode.OVERWRITE:
                result = ACCUMULATE[AccMode(ins.mode)](mem.read(ins.x, dims, ins.out_dtype), result)
            mem.write(ins.x, dims, ins.out_dtype, result)
    dram = mem.bytes[Space.DRAM]
    return [dram[t.offset:t.offset + t.nbytes].view(t.dtype.numpy).reshape(t.shape).copy() for t in program.outputs]
