"""The simulator's plan: the instruction stream as batched dataflow.

Executing a tiled program one instruction at a time is hundreds of times
slower than the model.  The planner turns the verified stream into a short
list of *groups*, each executed as one batched gather -> compute -> (scatter):

1. Nodes (sim.nodes).  Scratchpad and accumulator are renamed away: every
   instruction that writes local memory produces a fresh value, and every
   local read is resolved to the one instruction that produced it, at an
   element offset into that value.  A read spanning the values of several
   instructions (a box its DMA split in two, a stacked conv's per-row LOADs)
   reads a *join*: those values laid out as local memory holds them, or,
   where they are consecutive rows of one group laid out one after another,
   those rows in place.  Write-after-read and write-after-write hazards on
   local memory disappear, as in register renaming; program order semantics
   are kept (the verifier proved the queues' token order equal to it).  A run
   of accumulating instructions into one region becomes one chain node, and
   every node gets a level (after the values and DRAM bytes it depends on).
2. Groups (here).  Nodes of one level with the same static signature (their
   opcode's kernel's record, sim.kernel: shapes, strides, pads, types) that
   read from the same producer groups are one group; it runs as one jitted
   function over all its members.

DRAM holds one array per element type; a read of DRAM bytes last written as
another type is outside the model.  Programs outside it (a producer writing a
non-contiguous region, a read spanning values of several types, an opcode
with no kernel) raise PlanError, and the simulator falls back to the
reference interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagec.errors import PlanError
from stagec.isa import opcodes
from stagec.isa.access import accesses
from stagec.isa.dataflow import const_bytes
from stagec.isa.instructions import DType
from stagec.isa.program import Program
from stagec.isa.verify import verify

from . import compute, dma, kernel  # noqa: F401 (dma's and compute's kernels register themselves)
from .boxes import box_positions
from .compute import Join
from .kernel import DRAM_CONST, DRAM_DATA, Kernel
from .nodes import Nodes


@dataclass(frozen=True)
class Read:
    """Where a group's members read one operand: producer group (or DRAM), row, element offset."""

    src: int                 # producer group id, or DRAM_CONST / DRAM_DATA
    rows: np.ndarray         # (T, J) rows of the producer group's output
    offs: np.ndarray         # (T, J) element offsets (DRAM: element address in that array)
    lo: np.ndarray           # (T, J) element offsets from `rows` on where the value read starts ...
    hi: np.ndarray           # ... and ends: its reads stay inside (a span, a union: more than a row)


@dataclass
class Group:
    id: int
    level: int
    sig: Kernel                      # its kernel's static signature: the jit cache key
    reads: dict[str, Read]           # slot -> Read (the kernel's slots; a join's 'p0', 'p1', ...)
    out_len: int                     # elements per member's value (0 for stores)
    members: list[int] = field(default_factory=list)   # node ids (a union's one member: -1)
    dram: np.ndarray | None = None   # (T,) DRAM element bases
    instructions: list[int] = field(default_factory=list)   # first instruction of each member (a join: -1)

    @property
    def kind(self) -> str:
        return self.sig.kind


@dataclass
class Plan:
    groups: list[Group]
    data_origin: int                 # byte address where the data part of DRAM starts
    data_bytes: int
    dtypes: frozenset                # element types held in DRAM


def build_plan(program: Program) -> Plan:
    if "plan" in program.cache:
        return program.cache["plan"]
    flow = verify(program)
    code = program.code
    data_origin = const_bytes(program)
    nodes = Nodes(program, flow, accesses(code), data_origin)
    plan = Plan(_Grouping(code, nodes, data_origin).run(), data_origin, max(flow.dram_end - data_origin, 0),
                frozenset(nodes.dram.types))
    program.cache["plan"] = plan
    return plan


class NodeReads:
    """One node as its opcode's kernel describes it (sim.kernel.Kernel.describe): the fields of its
    first instruction, and the reads it declares, each (src, rows, offs, lo, hi) by slot."""

    def __init__(self, grouping: _Grouping, k: int):
        self._grouping, self._k = grouping, k
        nodes = grouping.nodes
        self.members = nodes.members[k]
        self.index = self.members[0]
        self._record = r = grouping.code[self.index]
        self.chain = len(self.members)
        self.n = tuple(int(v) for v in r["n"])
        self.pad = tuple(int(v) for v in r["pad"])
        self.mode, self.func, self.acc = int(r["mode"]), int(r["func"]), nodes.acc_mode[k]
        self.dtype, self.out_dtype = DType(int(r["dtype"])), DType(int(r["out_dtype"]))
        self.has_init = nodes.init[k] >= 0
        self.reads: dict[str, tuple] = {}

    def strides(self, operand: str) -> tuple[int, ...]:
        return tuple(int(s) for s in self._record[f"{operand}_strides"])

    def local(self, name: str, operand: str, dtype: DType) -> None:
        """Slot `name` reads, for each member, the value its `operand` reads (as `dtype`)."""
        g = self._grouping
        at = [(*g.nodes.sources(operand, j), int(g.code[f"{operand}_base"][j])) for j in self.members]
        self.reads[name] = g.read(at, dtype, self._level)

    def initial(self, operand: str) -> None:
        """Slot 'init' reads the value an accumulating node starts from, written at its `operand`."""
        if self.has_init:
            g = self._grouping
            self.reads["init"] = g.read([(g.nodes.init[self._k], int(self._record[f"{operand}_base"]))],
                                        self.out_dtype, self._level)

    def dram(self, operand: str, dtype: DType) -> int:
        """The DRAM side of a DMA: its element address in the constant blob or the data region."""
        base, origin = int(self._record[f"{operand}_base"]), self._grouping.data_origin
        space = DRAM_DATA if base >= origin else DRAM_CONST
        self.reads["dram"] = (space, [0], [(base - (origin if space == DRAM_DATA else 0)) // dtype.itemsize], [0], [0])
        return space

    def source(self, name: str) -> int | None:
        """The producer group slot `name` reads, or None."""
        return self.reads[name][0] if name in self.reads else None

    @property
    def _level(self) -> int:
        return int(self._grouping.nodes.level[self._k])


class _Grouping:
    """Nodes of one level and one signature, reading from the same producer groups, as one group."""

    def __init__(self, code: np.ndarray, nodes: Nodes, data_origin: int):
        self.code, self.nodes, self.data_origin = code, nodes, data_origin
        self.groups: list[Group] = []
        self.placed: dict[int, tuple[int, DType]] = {}   # node -> (local byte address, element type) of its value
        self.refs: dict[int, tuple[int, int, int]] = {}  # node -> (group, row, producer rows its value spans)
        self.unions: dict[tuple[int, ...], int] = {}     # producer groups -> the group laying out all their values

    def run(self) -> list[Group]:
        by_level: dict[int, list[int]] = {}
        for k, lv in enumerate(self.nodes.level):
            by_level.setdefault(int(lv), []).append(k)
        joins = self.nodes.joins
        for lv in sorted(by_level):
            nodes = by_level[lv]
            for batch in ([k for k in nodes if k not in joins], [k for k in nodes if k in joins]):   # joins last
                self._group_batch(lv, batch)
        return self.groups

    def _group_batch(self, lv: int, batch: list[int]) -> None:
        buckets: dict[tuple, list[tuple[int, dict, int]]] = {}
        for k in batch:
            described = self._describe(k)
            if described is not None:   # None: a join of one group's consecutive rows, read in place
                key, reads, length = described
                buckets.setdefault(key, []).append((k, reads, length))
        for (sig, _), entries in buckets.items():
            g = _group(len(self.groups), lv, sig, entries, self.nodes.members, self.refs)
            _check_reads(g, self.groups)
            self.groups.append(g)

    def _describe(self, k: int):
        """((signature, producer groups), reads, value length) of node k."""
        if k in self.nodes.joins:
            return self._describe_join(k)
        head = self.nodes.members[k][-1]
        if self.nodes.dst[head] is not None:
            self.placed[k] = (int(self.code[f"{self.nodes.dst[head]}_base"][head]),
                              DType(int(self.code["out_dtype"][head])))
        op = int(self.code["opcode"][head])
        if op not in kernel.KERNELS:
            raise PlanError(f"instruction {head}: the batched executor has no kernel for {opcodes.OPCODES[op].name}")
        node = NodeReads(self, k)
        sig, srcs, length = kernel.KERNELS[op].describe(node)
        return (sig, srcs), node.reads, length

    def value_ref(self, k: int, read_base: int, read_type: DType):
        """(group, row, element offset, rows spanned) of node k's value, read from read_base."""
        w_base, written = self.placed[k]
        if written != read_type or (read_base - w_base) % written.itemsize:
            raise PlanError(f"{self._node_name(k)} wrote {written.name} that is read as {read_type.name}")
        g, row, spanned = self.refs[k]
        return g, row, (read_base - w_base) // read_type.itemsize, spanned

    def read(self, at: list[tuple[int, int]], read_type: DType, lv: int):
        """(src group, rows, offs, lo, hi) of the values a node reads at `at` ((node, local byte address),
        one per chain member): from their group, or from the union of several (a chain whose
        operands come from groups alike in level and kind but not in shape)."""
        ref = [self.value_ref(k, base, read_type) for k, base in at]   # (group, row, offset, rows spanned)
        used = tuple(sorted({g for g, *_ in ref}))
        groups = self.groups
        if len(used) == 1:   # rows of one group, each offset from its row's start
            src, rows, lo = used[0], [r for _, r, _, _ in ref], [0] * len(ref)
        else:                # offsets into the union's one value
            if used not in self.unions:
                self.unions[used] = len(groups)
                groups.append(_union(len(groups), lv, [groups[g] for g in used], read_type))
            src, rows = self.unions[used], [0] * len(ref)
            start = {g: st for g, (st, _, _) in zip(used, groups[src].sig.layout, strict=True)}
            lo = [start[g] + r * groups[g].out_len for g, r, _, _ in ref]
        return (src, rows, [b + o for b, (_, _, o, _) in zip(lo, ref, strict=True)], lo,
                [b + n * groups[g].out_len for b, (g, _, _, n) in zip(lo, ref, strict=True)])

    def _describe_join(self, k: int):
        """Join node k: the values of its writers (instructions, in program order) as local memory
        holds them: each pasted at its address, a later writer's bytes over an earlier one's.  None
        where they are consecutive rows of one group laid out one after another (a stacked conv's
        per-row LOADs): the reader then reads them in place."""
        writers = self.nodes.joins[k]
        nodes = list(dict.fromkeys(int(self.nodes.node_of[w]) for w in writers))
        types = {self.placed[n][1] for n in nodes}
        if len(types) > 1:
            raise PlanError(f"a read spans the values of instructions {', '.join(map(str, writers))}, of several "
                            f"element types ({', '.join(sorted(t.name for t in types))})")
        (dtype,) = types
        pieces = [(self.placed[n][0], *self.refs[n][:2], self.groups[self.refs[n][0]].out_len)
                  for n in nodes]   # (base, group, row, length)
        base = min(p[0] for p in pieces)
        self.placed[k] = (base, dtype)
        by_address = sorted(pieces)
        step = by_address[0][3] * dtype.itemsize
        if all((b, g, r) == (base + j * step, by_address[0][1], by_address[0][2] + j)
               for j, (b, g, r, _) in enumerate(by_address)):
            self.refs[k] = (by_address[0][1], by_address[0][2], len(pieces))
            return None
        if any((b - base) % dtype.itemsize for b, *_ in pieces):
            raise PlanError(f"a read spans the values of instructions {', '.join(map(str, writers))}, which are "
                            f"not aligned to their {dtype.name} elements")
        layout = tuple(((b - base) // dtype.itemsize, 1, n) for b, _, _, n in pieces)
        length = max(o + n for o, _, n in layout)
        reads = {f"p{j}": (g, [r], [0], [0], [n]) for j, (_, g, r, n) in enumerate(pieces)}
        return (Join(dtype, length, layout), tuple(g for _, g, _, _ in pieces)), reads, length

    def _node_name(self, k: int) -> str:
        if k in self.nodes.joins:
            return f"instructions {', '.join(map(str, self.nodes.joins[k]))}"
        return f"instruction {self.nodes.members[k][-1]}"


def _group(gid: int, lv: int, sig: Kernel, entries: list, members: list, refs: dict) -> Group:
    """The group of one bucket's nodes (entries: (node, reads, value length)); records each node's row."""
    g = Group(gid, lv, sig, {}, entries[0][2])
    if sig.reads_dram:
        # Reads of one level see DRAM no store of that level changes: the same address (and
        # indices) means the same value, computed once (the compiler reloads weights per tile).
        first: dict[tuple, int] = {}
        unique = []
        for e in entries:
            key_ = tuple(tuple(v[2]) + tuple(v[1]) + (v[0],) for v in e[1].values())
            if key_ not in first:
                first[key_] = len(unique)
                unique.append(e)
            refs[e[0]] = (gid, first[key_], 1)
        entries = unique
    for row, (k, _, _) in enumerate(entries):
        refs[k] = (gid, row, 1)
        g.members.append(k)
        g.instructions.append(members[k][0] if members[k] else -1)
    for slot in entries[0][1]:
        src = entries[0][1][slot][0]
        g.reads[slot] = Read(src, *(np.array([e[1][slot][f] for e in entries], np.int64) for f in range(1, 5)))
    if "dram" in g.reads:
        g.dram = g.reads.pop("dram").offs[:, 0]
    return g


def _union(gid: int, lv: int, parts: list[Group], dtype: DType) -> Group:
    """A join of one member: every value of the groups `parts`, one group after another."""
    starts = np.cumsum([0] + [len(p.members) * p.out_len for p in parts]).tolist()
    layout = tuple((st, len(p.members), p.out_len) for st, p in zip(starts[:-1], parts, strict=True))
    g = Group(gid, lv, Join(dtype, starts[-1], layout), {}, starts[-1], [-1], instructions=[-1])
    for j, p in enumerate(parts):
        rows = np.arange(len(p.members))[None]
        g.reads[f"p{j}"] = Read(p.id, rows, np.zeros_like(rows), np.zeros_like(rows), np.full_like(rows, p.out_len))
    return g


def _check_reads(g: Group, groups: list[Group]) -> None:
    """Every local read must stay inside the producer's value (else renaming would be wrong)."""
    for slot, r in g.reads.items():
        if r.src < 0:
            continue
        rel = box_positions(g.sig.read_dims(slot))
        if (r.offs + rel.min() < r.lo).any() or (r.offs + rel.max() + 1 > r.hi).any():
            raise PlanError(f"group {g.id} ({g.kind}) reads past the value its producer wrote")
