"""The planner's first phase: the instruction stream as dataflow nodes, each with a level.

Renaming: every instruction that writes local memory produces a fresh value, and every local read
is resolved (by the verifier's walk) to the one instruction that produced it.  A read spanning the
values of several instructions reads a *join* node, laid out as local memory holds them.

Chains: a run of instructions accumulating into the same region (the taps and channel tiles of a
convolution, the window of a pool) becomes one node.  A node's level is one more than the levels
of the values it reads and of the DRAM accesses it must follow; a chain only reads values of
finished nodes (a value read by anything but the chain's next member ends its chain), so levels
are known while chains grow.  Which operand an opcode produces, whether it accumulates, and which
of its operands is DRAM come from its definition (isa.opcodes).
"""

from __future__ import annotations

import numpy as np

from stagec.errors import PlanError
from stagec.isa import opcodes
from stagec.isa.access import Access, element_offsets
from stagec.isa.dataflow import MULTIPLE, Dataflow
from stagec.isa.instructions import AccMode, DType, Space
from stagec.isa.program import Program


class Nodes:
    """Nodes (single instructions, chains, joins) with their members, initial values and levels."""

    def __init__(self, program: Program, flow: Dataflow, accs: list[Access], data_origin: int):
        self.code, self.flow = program.code, flow
        defs = opcodes.OPCODES
        ops = self.code["opcode"].tolist()
        self.dst = [defs[o].local_write.operand if defs[o].local_write else None for o in ops]
        self.accumulates = [defs[o].mode is AccMode for o in ops]
        self.modes = self.code["mode"].tolist()
        reads = {a.operand: a.valid for a in accs if not a.write}
        self.reads_dst = [d is not None and d in reads and bool(reads[d][i]) for i, d in enumerate(self.dst)]
        self.dram = _DramTracker(program, data_origin, flow, accs)
        self.readers = self._readers()
        n = len(self.code)
        self.node_of = np.full(n, -1, np.int64)
        self.members: list[list[int]] = []   # a join node has none
        self.init: list[int] = []            # node whose value the node's initial dst value is, or -1
        self.acc_mode: list[int] = []
        self.level: list[int] = []
        self.joins: dict[int, tuple[int, ...]] = {}   # join node -> the instructions whose values it lays out
        self.join_of: dict[tuple[int, ...], int] = {}
        for i in range(n):
            self._add_joins(i)
            self._add(i)

    def _readers(self) -> np.ndarray:
        """How many reads each instruction's value has."""
        readers = np.zeros(len(self.code), np.int64)
        for p in self.flow.producer.values():
            np.add.at(readers, p[p >= 0], 1)
        for ws in self.flow.spans.values():
            np.add.at(readers, list(ws), 1)
        return readers

    def sources(self, operand: str, i: int) -> tuple[int, ...]:
        """The node whose value instruction i reads through `operand` (a join's for a spanning read), if any."""
        p = int(self.flow.producer[operand][i])
        if p == MULTIPLE:
            return (self.join_of[self.flow.spans[operand, i]],)
        return (int(self.node_of[p]),) if p >= 0 else ()

    def _new(self, first: list[int], init: int, mode: int, level: int) -> int:
        self.members.append(first)
        self.init.append(init)
        self.acc_mode.append(mode)
        self.level.append(level)
        return len(self.members) - 1

    def _add_joins(self, i: int) -> None:
        for operand in "xyz":
            ws = self.flow.spans.get((operand, i))
            if ws is not None and ws not in self.join_of:
                # run right after the groups of its latest producer's level
                self.join_of[ws] = self._new([], -1, 0, max(self.level[self.node_of[w]] for w in ws))
                self.joins[self.join_of[ws]] = ws

    def _add(self, i: int) -> None:
        mode = self.modes[i]
        start, dst = -1, self.dst[i]
        if self.accumulates[i] and mode != AccMode.OVERWRITE:
            p = int(self.flow.producer[dst][i])
            k = int(self.node_of[p]) if p >= 0 else -1
            if k >= 0 and self._continues(k, p, i, mode):
                self.members[k].append(i)
                self.node_of[i] = k
                self.acc_mode[k] = mode
                return
            start = next(iter(self.sources(dst, i)), -1)
        elif self.reads_dst[i]:
            start = next(iter(self.sources(dst, i)), -1)
        self.node_of[i] = len(self.members)
        self._new([i], start, mode if self.accumulates[i] else 0, self._level(i))

    def _continues(self, k: int, p: int, i: int, mode: int) -> bool:
        """Does instruction i, accumulating onto p's value, extend p's chain k?"""
        # NOTE: a chain's members read each operand from one producer group, so an operand made at
        # another level (a conv over a concat of tensors made at different depths) or laid out by a
        # join starts a new node, which accumulates onto the chain so far.
        return (self.members[k][-1] == p and self.readers[p] == 1 and self._same_shape(p, i)
                and self.acc_mode[k] in (AccMode.OVERWRITE, mode)
                and self._operand_sources(i) == self._operand_sources(self.members[k][0]))

    def _operand_sources(self, i: int) -> tuple:
        """(level, is a join) of the values instruction i reads, its accumulated destination aside."""
        return tuple((self.level[k], k in self.joins) for o in "xyz" if o != self.dst[i] for k in self.sources(o, i))

    def _level(self, i: int) -> int:
        lv = max((self.level[k] + 1 for o in "xyz" for k in self.sources(o, i)), default=0)
        return self.dram.access(i, lv)

    def _same_shape(self, p: int, i: int) -> bool:
        """Can instruction i continue the chain ending at p: same op, shape, strides, types, destination."""
        a, b = self.code[p], self.code[i]
        same = ("opcode", "func", "spaces", "dtype", "out_dtype", f"{self.dst[p]}_base")
        return bool(all(a[f] == b[f] for f in same) and (a["n"] == b["n"]).all()
                    and all((a[f"{o}_strides"] == b[f"{o}_strides"]).all() for o in "xyz"))


class _DramTracker:
    """Levels of DRAM accesses (a load after the stores it reads, a store after the loads and
    stores of the bytes it overwrites) and the element type of every data byte."""

    def __init__(self, program: Program, origin: int, flow: Dataflow, accs: list[Access]):
        self.origin = origin
        self.granule = flow.granule[Space.DRAM]
        self.accs = [a for a in accs if (a.valid & (a.space == Space.DRAM)).any()]
        size = -(-max(flow.dram_end - origin, 0) // self.granule)
        self.last_write = np.full(size, -1, np.int64)
        self.max_read = np.full(size, -1, np.int64)
        self.dtype = np.full(size, -1, np.int8)
        self.types = {t.dtype for t in (*program.inputs, *program.outputs)}
        for t in program.inputs:
            self.dtype[(t.offset - origin) // self.granule:(t.offset + t.nbytes - origin) // self.granule] = t.dtype

    def access(self, i: int, lv: int) -> int:
        """The level of instruction i given the level `lv` of the values it reads."""
        for a in self.accs:
            if a.valid[i] and a.space[i] == Space.DRAM and a.base[i] >= self.origin:   # the constant blob: read-only
                lv = self._access(i, a, lv)
        return lv

    def _access(self, i: int, a: Access, lv: int) -> int:
        dtype = DType(int(a.dtype[i]))
        self.types.add(dtype)
        per = dtype.itemsize // self.granule
        g = (int(a.base[i]) - self.origin) // self.granule + element_offsets(a.strides[i], a.dims[i]) * per
        g = (g[:, None] + np.arange(per)).reshape(-1) if per > 1 else g
        lv = max(lv, int(self.last_write[g].max()) + 1)
        if a.write:
            lv = max(lv, int(self.max_read[g].max()) + 1)
            self.last_write[g] = lv
            self.dtype[g] = dtype
        else:
            if (self.dtype[g] != dtype).any():
                raise PlanError(f"instruction {i} reads DRAM as {dtype.name} that was written as another type")
            np.maximum.at(self.max_read, g, lv)
        return lv
