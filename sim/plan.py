"""The simulator's plan: the instruction stream as batched dataflow.

Executing a tiled program one instruction at a time is hundreds of times
slower than the model.  The planner turns the verified stream into a short
list of *groups*, each executed as one batched gather -> compute -> (scatter):

1. Renaming.  Scratchpad and accumulator are renamed away: every instruction
   that writes local memory produces a fresh value, and every local read is
   resolved (by the verifier's walk) to the one instruction that produced it,
   at an element offset into that value.  Write-after-read and
   write-after-write hazards on local memory disappear, as in register
   renaming; program order semantics are kept (the verifier proved the
   queues' token order equal to it).
2. Chains.  A run of accumulating instructions into the same accumulator
   region (the taps and channel tiles of a convolution, the window of a pool)
   becomes one node whose result is a reduction over the chain.
3. Levels.  A node's level is one more than the levels of the values it
   reads and of the DRAM writes (or reads, for a store) it must follow.  A
   chain stops where a member's operands come from another level, as they
   must come from one producer group.
4. Groups.  Nodes of one level with the same static signature (opcode,
   shapes, strides, pads, types) that read from the same producer groups are
   one group; it runs as one jitted function over all its members.

DRAM holds one array per element type; a read of DRAM bytes last written as
another type is outside the model.  A read may span several producers only
where they are consecutive rows of one group laid out one after another (a
stacked conv's per-row LOADs): it reads them as one value.  Programs outside
it (other spanning reads, a producer writing a non-contiguous region, bf16)
raise PlanError, and the simulator falls back to the reference interpreter.
REQUANT reads its z operand as records: each element of its pattern is
REQUANT_RECORD_BYTES of int32 words, so that read's offsets count words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagec.errors import PlanError
from stagec.isa.access import is_dense
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
from stagec.isa.verify import MULTIPLE, const_bytes, verify

DRAM_CONST, DRAM_DATA = -1, -2
RECORD_WORDS = REQUANT_RECORD_BYTES // DType.I32.itemsize


@dataclass(frozen=True)
class Read:
    """Where a group's members read one operand: producer group (or DRAM), row, element offset."""

    src: int                 # producer group id, or DRAM_CONST / DRAM_DATA
    rows: np.ndarray         # (T, J) rows of the producer group's output
    offs: np.ndarray         # (T, J) element offsets (DRAM: element address in that array)
    spanned: np.ndarray      # (T, J) producer rows the read covers from `rows` on (plan.value_ref)


@dataclass
class Group:
    id: int
    kind: str                        # load, gather, store, matmul, vector
    level: int
    sig: tuple                       # static signature: the jit cache key
    reads: dict[str, Read]           # slot -> Read ('a','b','init','src1','src2','idx','src')
    out_len: int                     # elements per member's value (0 for stores)
    members: list[int] = field(default_factory=list)   # node ids
    dram: np.ndarray | None = None   # (T,) DRAM element bases
    instructions: list[int] = field(default_factory=list)   # first instruction of each member


@dataclass
class Plan:
    groups: list[Group]
    data_origin: int                 # byte address where the data part of DRAM starts
    data_bytes: int
    dtypes: frozenset                # element types held in DRAM


def _patterns(code, i):
    r = code[i]
    return tuple(tuple(int(s) for s in r[f"{o}_strides"]) for o in "xyz")


def offsets(strides, dims) -> np.ndarray:
    s0, s1, s2 = (int(s) for s in strides)
    d0, d1, d2 = (int(d) for d in dims)
    return (np.arange(d0)[:, None, None] * s0 + np.arange(d1)[None, :, None] * s1
            + np.arange(d2)[None, None, :] * s2).reshape(-1)


def _written_type(code, i) -> DType:
    return DType(int(code["out_dtype"][i]))


def build_plan(program: Program) -> Plan:
    if "plan" in program.cache:
        return program.cache["plan"]
    flow = verify(program)
    code = program.code
    N = len(code)
    op = code["opcode"]
    if N and ((code["dtype"] == DType.BF16) | (code["out_dtype"] == DType.BF16)).any():
        raise PlanError("bf16 is not simulated by the batched executor")
    n_arr = code["n"].astype(np.int64)
    mode = code["mode"]
    func = code["func"]
    producer = flow.producer

    def writers(slot: str, i: int) -> tuple[int, ...]:
        """The instructions whose values instruction i reads through `slot` (several: a span)."""
        p = int(producer[slot][i])
        return flow.spans[slot, i] if p == MULTIPLE else (p,) if p >= 0 else ()

    readers = np.zeros(N, np.int64)
    for slot in "xyz":
        p = producer[slot]
        np.add.at(readers, p[p >= 0], 1)
    for ws in flow.spans.values():
        np.add.at(readers, list(ws), 1)

    # --- nodes (single instructions, or chains accumulating into one region) and their levels ---
    # A chain only reads values of finished nodes (a value read by anything but the chain's next
    # member ends its chain), so levels are known while chains grow.
    data_origin = const_bytes(program)
    dram = _DramTracker(program, data_origin, flow.granule)
    node_of = np.full(N, -1, np.int64)
    members: list[list[int]] = []
    init: list[int] = []              # producer instruction of the node's initial dst value, or -1
    acc_mode: list[int] = []
    level: list[int] = []

    def operand_levels(i: int) -> tuple:
        """Levels of the values instruction i reads, its accumulated destination aside."""
        dst = "z" if op[i] == Opcode.MATMUL else "x"
        return tuple(level[node_of[p]] for s in "xyz" if s != dst for p in writers(s, i))

    def level_of(i: int) -> int:
        lv = max((level[node_of[p]] + 1 for s in "xyz" for p in writers(s, i) if node_of[p] != node_of[i]),
                 default=0)
        return dram.access(i, lv) if op[i] in (Opcode.LOAD, Opcode.GATHER, Opcode.STORE) else lv

    for i in range(N):
        o = op[i]
        computes = o in (Opcode.MATMUL, Opcode.VECTOR)
        if computes and mode[i] != AccMode.OVERWRITE:
            dst_slot = "z" if o == Opcode.MATMUL else "x"
            p = _single(producer, dst_slot, i)
            k = node_of[p] if p >= 0 else -1
            # NOTE: a chain's members read each operand from one producer group, so an operand made
            # at another level (a conv over a concat of tensors made at different depths) starts a
            # new node, which accumulates onto the chain so far.
            if (k >= 0 and members[k][-1] == p and readers[p] == 1 and _same_shape(code, p, i)
                    and acc_mode[k] in (AccMode.OVERWRITE, mode[i])
                    and operand_levels(i) == operand_levels(members[k][0])):
                members[k].append(i)
                node_of[i] = k
                acc_mode[k] = int(mode[i])
                continue
            init.append(p)
        elif o == Opcode.VECTOR and func[i] in READS_DST:
            init.append(_single(producer, "x", i))
        else:
            init.append(-1)
        node_of[i] = len(members)
        members.append([i])
        acc_mode.append(int(mode[i]) if computes else 0)
        level.append(level_of(i))
    n_nodes = len(members)

    # --- groups ---------------------------------------------------------------------------------
    group_of = np.full(n_nodes, -1, np.int64)
    row_of = np.full(n_nodes, -1, np.int64)
    groups: list[Group] = []

    def value_ref(ps: tuple[int, ...], read_base: int, read_type: DType):
        """(group, row, element offset, rows spanned) of the value read from read_base, produced by the
        instructions ps: one, or several whose values are consecutive rows of one group laid out one
        after another (a tile's MATMUL over the rows its per-row LOADs wrote), read as one."""
        refs = []
        for p in ps:
            k = node_of[p]
            head = members[k][-1]
            w_base = int(code["z_base"][head] if op[head] == Opcode.MATMUL else
                         code["y_base"][head] if op[head] in (Opcode.LOAD, Opcode.GATHER) else code["x_base"][head])
            written = _written_type(code, head)
            if written != read_type or (read_base - w_base) % written.itemsize:
                raise PlanError(f"instruction {p} wrote {written.name} that is read as {read_type.name}")
            refs.append((w_base, int(group_of[k]), int(row_of[k])))
        refs.sort()
        w_base, g, row = refs[0]
        step = groups[g].out_len * read_type.itemsize if len(refs) > 1 else 0
        if any((b, h, r) != (w_base + j * step, g, row + j) for j, (b, h, r) in enumerate(refs)):
            raise PlanError(f"a read spans the values of instructions {', '.join(map(str, ps))}, which are "
                            f"not consecutive rows of one group laid out one after another")
        return g, row, (read_base - w_base) // read_type.itemsize, len(refs)

    by_level: dict[int, list[int]] = {}
    for k in range(n_nodes):
        by_level.setdefault(int(level[k]), []).append(k)
    for lv in sorted(by_level):
        buckets: dict[tuple, list[tuple[int, dict, int]]] = {}
        for k in by_level[lv]:
            key, reads, length = _describe(members[k], init[k], acc_mode[k], code, n_arr, func, writers,
                                           value_ref, data_origin)
            buckets.setdefault(key, []).append((k, reads, length))
        for key, entries in buckets.items():
            g = Group(len(groups), key[0], lv, key[1], {}, entries[0][2])
            if g.kind in ("load", "gather"):
                # Reads of one level see DRAM no store of that level changes: the same address (and
                # indices) means the same value, computed once (the compiler reloads weights per tile).
                first: dict[tuple, int] = {}
                unique = []
                for e in entries:
                    key_ = tuple(tuple(v[2]) + tuple(v[1]) + (v[0],) for v in e[1].values())
                    if key_ not in first:
                        first[key_] = len(unique)
                        unique.append(e)
                    group_of[e[0]], row_of[e[0]] = g.id, first[key_]
                entries = unique
            for row, (k, _, _) in enumerate(entries):
                group_of[k], row_of[k] = g.id, row
                g.members.append(k)
                g.instructions.append(members[k][0])
            for slot in entries[0][1]:
                src = entries[0][1][slot][0]
                rows, offs, spanned = (np.array([e[1][slot][f] for e in entries], np.int64) for f in (1, 2, 3))
                g.reads[slot] = Read(src, rows, offs, spanned)
            if "dram" in g.reads:
                g.dram = g.reads.pop("dram").offs[:, 0]
            _check_reads(g, groups)
            groups.append(g)

    plan = Plan(groups, data_origin, max(program.dram_bytes - data_origin, 0), frozenset(dram.types))
    program.cache["plan"] = plan
    return plan


class _DramTracker:
    """Levels of DRAM accesses (a load after the stores it reads, a store after the loads and
    stores of the bytes it overwrites) and the element type of every data byte."""

    def __init__(self, program: Program, origin: int, granule: dict):
        self.code, self.origin = program.code, origin
        self.granule = granule[Space.DRAM]
        size = max(program.dram_bytes - origin, 0) // self.granule
        self.last_write = np.full(size, -1, np.int64)
        self.max_read = np.full(size, -1, np.int64)
        self.dtype = np.full(size, -1, np.int8)
        self.types = set()
        for t in (*program.inputs, *program.outputs):
            self.types.add(t.dtype)
        for t in program.inputs:
            self.dtype[(t.offset - origin) // self.granule:(t.offset + t.nbytes - origin) // self.granule] = t.dtype

    def access(self, i: int, lv: int) -> int:
        r = self.code[i]
        base = int(r["x_base"])
        if base < self.origin:   # the constant blob: read-only
            return lv
        dtype = DType(int(r["dtype"]))
        self.types.add(dtype)
        n = r["n"].astype(np.int64)
        dims = (n[3], n[1], n[2]) if r["opcode"] == Opcode.GATHER else n[:3]   # a gather may read any row
        per = dtype.itemsize // self.granule
        g = (base - self.origin) // self.granule + offsets(r["x_strides"], dims) * per
        g = (g[:, None] + np.arange(per)).reshape(-1) if per > 1 else g
        lv = max(lv, int(self.last_write[g].max()) + 1)
        if r["opcode"] == Opcode.STORE:
            lv = max(lv, int(self.max_read[g].max()) + 1)
            self.last_write[g] = lv
            self.dtype[g] = dtype
        else:
            if (self.dtype[g] != dtype).any():
                raise PlanError(f"instruction {i} reads DRAM as {dtype.name} that was written as another type")
            np.maximum.at(self.max_read, g, lv)
        return lv


def _single(producer, slot: str, i: int) -> int:
    """The one producer of a value instruction i accumulates onto (-1: none)."""
    p = int(producer[slot][i])
    if p == MULTIPLE:
        raise PlanError(f"instruction {i} accumulates onto a local region written by several instructions")
    return p


def _same_shape(code, p, i) -> bool:
    """Can instruction i continue the chain ending at p: same op, shape, strides, types, destination."""
    a, b = code[p], code[i]
    dst = "z_base" if a["opcode"] == Opcode.MATMUL else "x_base"
    return bool(a["opcode"] == b["opcode"] and a["func"] == b["func"] and (a["n"] == b["n"]).all()
                and a["spaces"] == b["spaces"] and a["dtype"] == b["dtype"] and a["out_dtype"] == b["out_dtype"]
                and _patterns(code, p) == _patterns(code, i) and a[dst] == b[dst])


def _describe(mem, init_p, acc, code, n_arr, func, writers, value_ref, data_origin):
    """(bucket key (kind, signature, producer groups), reads {slot: (src, rows[J], offs[J], spanned[J])},
    value length)."""
    i = mem[0]
    o = int(code["opcode"][i])
    n = tuple(int(v) for v in n_arr[i])
    pats = _patterns(code, i)
    dt, odt = DType(int(code["dtype"][i])), DType(int(code["out_dtype"][i]))
    reads = {}

    def local(slot_name, isa_slot, read_type):
        rows, offs, spanned, src = [], [], [], None
        for j in mem:
            g, r, off, n = value_ref(writers(isa_slot, j), int(code[f"{isa_slot}_base"][j]), read_type)
            src = g if src is None else src
            if g != src:   # members of one chain read from different producer groups
                raise PlanError(f"instruction {mem[0]}: a chain reads operand {isa_slot} from several producer groups")
            rows.append(r)
            offs.append(off)
            spanned.append(n)
        reads[slot_name] = (src, rows, offs, spanned)

    def initial(isa_slot):
        """The value an accumulating instruction starts from, written at its destination."""
        if init_p >= 0:
            g, r, off, n_ = value_ref((init_p,), int(code[f"{isa_slot}_base"][i]), odt)
            reads["init"] = (g, [r], [off], [n_])

    def dram_base(base: int, dtype: DType):
        space = DRAM_DATA if base >= data_origin else DRAM_CONST
        reads["dram"] = (space, [0], [(base - (data_origin if space == DRAM_DATA else 0)) // dtype.itemsize], [1])
        return space

    if o == Opcode.LOAD:
        pad = tuple(int(p) for p in code["pad"][i])
        space = dram_base(int(code["x_base"][i]), dt)
        dims = (n[0] + pad[0] + pad[1], n[1] + pad[2] + pad[3], n[2] + pad[4] + pad[5])
        if not is_dense(pats[1], dims):
            raise PlanError(f"instruction {i}: LOAD writes a non-contiguous local region")
        sig = (n[:3], pats[0], pad, int(code["mode"][i]), space, dt)
        return ("load", sig, ()), reads, dims[0] * dims[1] * dims[2]
    if o == Opcode.GATHER:
        local("idx", "z", DType.I32)
        space = dram_base(int(code["x_base"][i]), dt)
        if not is_dense(pats[1], n[:3]):
            raise PlanError(f"instruction {i}: GATHER writes a non-contiguous local region")
        sig = (n, pats[0], pats[2][0], space, dt)
        return ("gather", sig, (reads["idx"][0],)), reads, n[0] * n[1] * n[2]
    if o == Opcode.STORE:
        local("src", "y", odt)
        dram_base(int(code["x_base"][i]), dt)
        sig = (n[:3], pats[0], pats[1], dt)
        return ("store", sig, (reads["src"][0],)), reads, 0
    if o == Opcode.MATMUL:
        local("a", "x", dt)
        local("b", "y", dt)
        initial("z")
        if not is_dense(pats[2], (n[0], n[1], n[3])):
            raise PlanError(f"instruction {i}: MATMUL writes a non-contiguous accumulator region")
        sig = (len(mem), n, pats[0], pats[1][:2], pats[2], init_p >= 0, dt, odt)
        srcs = (reads["a"][0], reads["b"][0], reads["init"][0] if init_p >= 0 else None)
        return ("matmul", sig, srcs), reads, n[0] * n[1] * n[3]
    # VECTOR
    f = int(func[i])
    if f == VectorFunc.REQUANT and acc != AccMode.OVERWRITE:
        raise PlanError(f"instruction {i}: REQUANT with an accumulate mode")
    local("src1", "y", dt)
    if f in BINARY:
        local("src2", "z", dt)
    initial("x")
    dims = (n[0], n[1], 1) if f in REDUCTIONS else n[:3]
    if not is_dense(pats[0], dims):
        raise PlanError(f"instruction {i}: vector op writes a non-contiguous local region")
    sig = (len(mem), f, acc, n[:3], pats[0], pats[1], pats[2] if f in BINARY else None, init_p >= 0, dt, odt)
    srcs = tuple(reads[s][0] if s in reads else None for s in ("src1", "src2", "init"))
    return ("vector", sig, srcs), reads, dims[0] * dims[1] * dims[2]


def _check_reads(g: Group, groups: list[Group]) -> None:
    """Every local read must stay inside the producer's value (else renaming would be wrong)."""
    for slot, r in g.reads.items():
        if r.src < 0:
            continue
        rel = read_pattern(g, slot)
        if (r.offs + rel.min() < 0).any() or (r.offs + rel.max() + 1 > r.spanned * groups[r.src].out_len).any():
            raise PlanError(f"group {g.id} ({g.kind}) reads past the value its producer wrote")


def read_dims(g: Group, slot: str) -> tuple[tuple[int, int], ...]:
    """A read's element offsets as a box, ((count, stride), ...) outermost first, in the order the
    compute consumes them."""
    s = g.sig
    if g.kind == "store":
        n, _, local, _ = s
        return _dims(local, n)
    if g.kind == "gather":
        n, _, index_stride, _, _ = s
        return _dims((index_stride, 0, 0), (n[0], 1, 1))
    if g.kind == "matmul":
        _, (m1, m0, k, n), pa, pb, pc, *_ = s
        if slot == "a":
            return _dims(pa, (m1, m0, k))
        if slot == "b":
            return _dims((*pb, 0), (k, n, 1))
        return _dims(pc, (m1, m0, n))
    _, f, _, n, pd, p1, p2, *_ = s
    if slot == "src1":
        return _dims(p1, n)
    if slot == "src2" and f == VectorFunc.REQUANT:   # records of RECORD_WORDS int32 words
        return (*((c, st * RECORD_WORDS) for c, st in _dims(p2, n)), (RECORD_WORDS, 1))
    if slot == "src2":
        return _dims(p2, n)
    return _dims(pd, (n[0], n[1], 1) if f in REDUCTIONS else n)


def _dims(strides, counts) -> tuple[tuple[int, int], ...]:
    return tuple((int(c), int(st)) for c, st in zip(counts, strides, strict=True))


def box_positions(dims) -> np.ndarray:
    """The element offsets of a box ((count, stride), ...), outermost first."""
    pos = np.zeros(1, np.int64)
    for c, st in dims:
        pos = (pos[:, None] + np.arange(c) * st).reshape(-1)
    return pos


def read_pattern(g: Group, slot: str) -> np.ndarray:
    """Element offsets of a read, in the order the compute consumes them."""
    return box_positions(read_dims(g, slot))
