"""The reference interpreter: one instruction at a time, on byte-addressed memories.

Slow and obvious on purpose: it is the executable definition of the ISA
(program order, which the verifier proves equal to any token-respecting
concurrent order) that the vectorized executor is tested against.  Each
instruction runs its opcode's reference semantics (isa.opcodes), on the
operand slots isa.access resolves.
"""

from __future__ import annotations

import numpy as np

from stagec.isa import opcodes
from stagec.isa.access import Access, accesses, element_offsets
from stagec.isa.instructions import DType, Space
from stagec.isa.opcodes import decode
from stagec.isa.program import Program
from stagec.isa.verify import verify


class _Memories:
    def __init__(self, program: Program):
        self.bytes = {Space.DRAM: np.zeros(verify(program).dram_end, np.uint8),
                      Space.SPAD: np.zeros(program.hw.scratchpad_bytes, np.uint8),
                      Space.ACC: np.zeros(program.hw.accumulator_bytes, np.uint8)}
        self.bytes[Space.DRAM][:len(program.constants)] = np.frombuffer(program.constants, np.uint8)

    def view(self, space, dtype: DType):
        mem = self.bytes[Space(space)]
        size = dtype.itemsize
        return mem[:len(mem) - len(mem) % size].view(dtype.numpy)


class _Values:
    """Instruction `index`'s operand slots, read and written by role as its semantics name them."""

    def __init__(self, mem: _Memories, slots: dict[tuple[str, bool], Access], d: opcodes.OpcodeDef, index: int):
        self.mem, self.slots, self.d, self.index = mem, slots, d, index

    def _access(self, role: str, write: bool) -> tuple[Access, DType, int, tuple[int, int, int]]:
        a = self.slots[self.d.slot(role, write).operand, write]
        i = self.index
        return a, DType(int(a.dtype[i])), int(a.words[i]), tuple(int(v) for v in a.dims[i])

    def dims(self, role: str) -> tuple[int, int, int]:
        return self._access(role, True)[3]

    def read(self, role: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The slot's elements over its dims ((dims..., words) for records); `rows`: only those
        positions of dim 0, in that order."""
        a, dtype, words, dims = self._access(role, False)
        idx = self._offsets(a, dims, rows)
        shape = ((len(rows),) + dims[1:]) if rows is not None else dims
        if words > 1:   # records: strides count records of `words` elements
            idx = idx[:, None] * words + np.arange(words)
            shape = (*shape, words)
        return self.mem.view(a.space[self.index], dtype)[a.base[self.index] // dtype.itemsize + idx].reshape(shape)

    def write(self, role: str, values: np.ndarray) -> None:
        a, dtype, _, dims = self._access(role, True)
        idx = a.base[self.index] // dtype.itemsize + self._offsets(a, dims, None)
        self.mem.view(a.space[self.index], dtype)[idx] = np.asarray(values, dtype.numpy).reshape(-1)

    def _offsets(self, a: Access, dims, rows) -> np.ndarray:
        s = a.strides[self.index]
        if rows is None:
            return element_offsets(s, dims)
        inner = element_offsets((0, s[1], s[2]), (1, *dims[1:]))
        return (np.asarray(rows, np.int64)[:, None] * int(s[0]) + inner).reshape(-1)


def execute(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `program` on host arrays, instruction by instruction; return its outputs."""
    mem = _Memories(program)
    for ref, value in zip(program.inputs, inputs, strict=True):
        data = np.ascontiguousarray(value, ref.dtype.numpy).reshape(ref.shape)
        mem.bytes[Space.DRAM][ref.offset:ref.offset + ref.nbytes] = data.view(np.uint8).reshape(-1)
    slots = {(a.operand, a.write): a for a in accesses(program.code)}
    for index, record in enumerate(program.code):
        ins = decode(record)
        d = opcodes.OPCODES[ins.opcode]
        d.semantics(ins, _Values(mem, slots, d, index))
    dram = mem.bytes[Space.DRAM]
    return [dram[t.offset:t.offset + t.nbytes].view(t.dtype.numpy).reshape(t.shape).copy() for t in program.outputs]
