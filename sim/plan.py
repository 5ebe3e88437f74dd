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
   reads and of the DRAM writes (or reads, for a store) it must follow.
4. Groups.  Nodes of one level with the same static signature (opcode,
   shapes, strides, pads) that read from the same producer groups are one
   group; it runs as one jitted function over all its members.

Programs outside this model (a read spanning two producers, a producer that
writes a non-contiguous region) raise PlanError, and the simulator falls back
to the reference interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagec.isa.access import is_dense
from stagec.isa.instructions import BINARY, REDUCTIONS, AccMode, DType, Opcode
from stagec.isa.program import Program
from stagec.isa.verify import MULTIPLE, const_bytes, verify

DRAM_CONST, DRAM_DATA = -1, -2


class PlanError(NotImplementedError):
    """The program is valid but outside what the batched executor handles."""


@dataclass(frozen=True)
class Read:
    """Where a group's members read one operand: producer group (or DRAM), row, element offset."""

    src: int                 # producer group id, or DRAM_CONST / DRAM_DATA
    rows: np.ndarray         # (T, J) rows of the producer group's output
    offs: np.ndarray         # (T, J) element offsets (DRAM: element address in that array)


@dataclass
class Group:
    id: int
    kind: str                        # load, store, matmul, vector
    level: int
    sig: tuple                       # static signature: the jit cache key
    reads: dict[str, Read]           # slot -> Read ('a','b','init','src1','src2','dram','src')
    out_len: int                     # elements per member's value (0 for stores)
    members: list[int] = field(default_factory=list)   # node ids
    dram: np.ndarray | None = None   # (T,) element bases (stores: where to write)


@dataclass
class Plan:
    groups: list[Group]
    data_origin: int                 # byte address of data element 0
    data_elems: int
    last_use: dict[int, int]         # group id -> index of the last group reading it


def _patterns(code, i):
    r = code[i]
    return tuple(tuple(int(s) for s in r[f"{o}_strides"]) for o in "xyz")


def _read_dims(op, n, slot):
    """Iteration dims of a read operand (matching isa.access)."""
    if op == Opcode.MATMUL:
        return {"x": (n[0], n[1], n[2]), "y": (n[2], n[3], 1), "z": (n[0], n[1], n[3])}[slot]
    return (n[0], n[1], n[2])


def build_plan(program: Program) -> Plan:
    if "plan" in program.cache:
        return program.cache["plan"]
    flow = verify(program)
    code = program.code
    N = len(code)
    op = code["opcode"]
    if N and not ((code["dtype"] == DType.F32) & (code["out_dtype"] == DType.F32)).all():
        raise PlanError("the batched executor runs fp32 programs")
    n_arr = code["n"].astype(np.int64)
    mode = code["mode"]
    func = code["func"]
    producer = flow.producer
    for slot in "xyz":
        if (producer[slot] == MULTIPLE).any():
            i = int(np.flatnonzero(producer[slot] == MULTIPLE)[0])
            raise PlanError(f"instruction {i} reads a local region written by several instructions")

    readers = np.zeros(N, np.int64)
    for slot in "xyz":
        p = producer[slot]
        np.add.at(readers, p[p >= 0], 1)

    # --- nodes: single instructions, or chains accumulating into one region ---------------------
    node_of = np.full(N, -1, np.int64)
    members: list[list[int]] = []
    init: list[int] = []              # producer instruction of the chain's initial value, or -1
    acc_mode: list[int] = []
    for i in range(N):
        o = op[i]
        if o in (Opcode.MATMUL, Opcode.VECTOR) and mode[i] != AccMode.OVERWRITE:
            dst_slot = "z" if o == Opcode.MATMUL else "x"
            p = int(producer[dst_slot][i])
            k = node_of[p] if p >= 0 else -1
            if (k >= 0 and members[k][-1] == p and readers[p] == 1 and _same_shape(code, p, i)
                    and acc_mode[k] in (AccMode.OVERWRITE, mode[i])):
                members[k].append(i)
                node_of[i] = k
                acc_mode[k] = int(mode[i])
                continue
            init.append(p)
        else:
            init.append(-1)
        node_of[i] = len(members)
        members.append([i])
        acc_mode.append(int(mode[i]) if o in (Opcode.MATMUL, Opcode.VECTOR) else 0)

    # --- levels ---------------------------------------------------------------------------------
    data_origin = const_bytes(program)
    data_elems = max(program.dram_bytes - data_origin, 0) // 4
    last_write = np.full(data_elems, -1, np.int64)
    max_read = np.full(data_elems, -1, np.int64)
    n_nodes = len(members)
    level = np.zeros(n_nodes, np.int64)
    order = sorted(range(n_nodes), key=lambda k: members[k][-1])
    for k in order:
        lv = 0
        for i in members[k]:
            for slot in "xyz":
                p = int(producer[slot][i])
                if p >= 0 and node_of[p] != k:
                    lv = max(lv, level[node_of[p]] + 1)
        i = members[k][0]
        if op[i] in (Opcode.LOAD, Opcode.STORE):
            base = int(code["x_base"][i])
            if base >= data_origin:
                idx = (base - data_origin) // 4 + _offsets(code["x_strides"][i], n_arr[i, :3])
                lv = max(lv, int(last_write[idx].max()) + 1)
                if op[i] == Opcode.STORE:
                    lv = max(lv, int(max_read[idx].max()) + 1)
                    last_write[idx] = lv
                else:
                    np.maximum.at(max_read, idx, lv)
        level[k] = lv

    # --- groups ---------------------------------------------------------------------------------
    group_of = np.full(n_nodes, -1, np.int64)
    row_of = np.full(n_nodes, -1, np.int64)
    groups: list[Group] = []

    def value_ref(p: int, read_base: int):
        """(group, row, element offset) of the value produced by instruction p, read from read_base."""
        k = node_of[p]
        head = members[k][-1]
        w_base = int(code["z_base"][head] if op[head] == Opcode.MATMUL else
                     code["y_base"][head] if op[head] == Opcode.LOAD else code["x_base"][head])
        return int(group_of[k]), int(row_of[k]), (read_base - w_base) // 4

    by_level: dict[int, list[int]] = {}
    for k in range(n_nodes):
        by_level.setdefault(int(level[k]), []).append(k)
    for lv in sorted(by_level):
        buckets: dict[tuple, list[tuple[int, dict]]] = {}
        for k in by_level[lv]:
            key, reads, length = _describe(k, members[k], init[k], acc_mode[k], code, n_arr, func, producer,
                                           value_ref, data_origin)
            buckets.setdefault(key, []).append((k, reads, length))
        for key, entries in buckets.items():
            g = Group(len(groups), key[0], lv, key[1], {}, entries[0][2])
            if g.kind == "load":
                # Loads of one level read DRAM no store of that level changes: the same address
                # means the same value, computed once (the compiler reloads weights per tile).
                first: dict[int, int] = {}
                unique = []
                for e in entries:
                    base = e[1]["dram"][2][0]
                    if base not in first:
                        first[base] = len(unique)
                        unique.append(e)
                    group_of[e[0]], row_of[e[0]] = g.id, first[base]
                entries = unique
            for row, (k, _, _) in enumerate(entries):
                group_of[k], row_of[k] = g.id, row
                g.members.append(k)
            for slot in entries[0][1]:
                src = entries[0][1][slot][0]
                rows = np.array([e[1][slot][1] for e in entries], np.int64)
                offs = np.array([e[1][slot][2] for e in entries], np.int64)
                g.reads[slot] = Read(src, rows, offs)
            if g.kind in ("load", "store"):
                g.dram = g.reads.pop("dram").offs[:, 0]
            _check_reads(g, groups)
            groups.append(g)

    last_use = {}
    for g in groups:
        for r in g.reads.values():
            if r.src >= 0:
                last_use[r.src] = g.id
    plan = Plan(groups, data_origin, data_elems, last_use)
    program.cache["plan"] = plan
    return plan


def _offsets(strides, dims):
    s0, s1, s2 = (int(s) for s in strides)
    d0, d1, d2 = (int(d) for d in dims)
    return (np.arange(d0)[:, None, None] * s0 + np.arange(d1)[None, :, None] * s1
            + np.arange(d2)[None, None, :] * s2).reshape(-1)


def _same_shape(code, p, i) -> bool:
    """Can instruction i continue the chain ending at p: same op, shape, strides, destination."""
    a, b = code[p], code[i]
    dst = "z_base" if a["opcode"] == Opcode.MATMUL else "x_base"
    return bool(a["opcode"] == b["opcode"] and a["func"] == b["func"] and (a["n"] == b["n"]).all()
                and a["spaces"] == b["spaces"] and _patterns(code, p) == _patterns(code, i) and a[dst] == b[dst])


def _describe(k, mem, init_p, acc, code, n_arr, func, producer, value_ref, data_origin):
    """(bucket key (kind, signature, producer groups), reads {slot: (src, rows[J], offs[J])}, value length)."""
    i = mem[0]
    o = int(code["opcode"][i])
    n = tuple(int(v) for v in n_arr[i])
    pats = _patterns(code, i)
    reads = {}

    def local(slot_name, isa_slot):
        rows, offs, src = [], [], None
        for j in mem:
            g, r, off = value_ref(int(producer[isa_slot][j]), int(code[f"{isa_slot}_base"][j]))
            src = g if src is None else src
            if g != src:   # members of one chain read from different producer groups
                src = None
                break
            rows.append(r)
            offs.append(off)
        if src is None:
            raise PlanError(f"instruction {mem[0]}: a chain reads operand {isa_slot} from several producer groups")
        reads[slot_name] = (src, rows, offs)

    if o == Opcode.LOAD:
        pad = tuple(int(p) for p in code["pad"][i])
        base = int(code["x_base"][i])
        space = DRAM_DATA if base >= data_origin else DRAM_CONST
        reads["dram"] = (space, [0], [(base - (data_origin if space == DRAM_DATA else 0)) // 4])
        dims = (n[0] + pad[0] + pad[1], n[1] + pad[2] + pad[3], n[2] + pad[4] + pad[5])
        if not is_dense(pats[1], dims):
            raise PlanError(f"instruction {i}: LOAD writes a non-contiguous local region")
        sig = (n[:3], pats[0], pad, int(code["mode"][i]), space)
        length = dims[0] * dims[1] * dims[2]
        return ("load", sig, ()), reads, length
    if o == Opcode.STORE:
        local("src", "y")
        base = int(code["x_base"][i])
        reads["dram"] = (DRAM_DATA, [0], [(base - data_origin) // 4])
        sig = (n[:3], pats[0], pats[1])
        return ("store", sig, (reads["src"][0],)), reads, 0
    if o == Opcode.MATMUL:
        local("a", "x")
        local("b", "y")
        if init_p >= 0:
            g, r, off = value_ref(init_p, int(code["z_base"][i]))
            reads["init"] = (g, [r], [off])
        if not is_dense(pats[2], (n[0], n[1], n[3])):
            raise PlanError(f"instruction {i}: MATMUL writes a non-contiguous accumulator region")
        sig = (len(mem), n, pats[0], pats[1][:2], pats[2], init_p >= 0)
        srcs = (reads["a"][0], reads["b"][0], reads["init"][0] if init_p >= 0 else None)
        return ("matmul", sig, srcs), reads, n[0] * n[1] * n[3]
    # VECTOR
    f = int(func[i])
    local("src1", "y")
    if f in BINARY:
        local("src2", "z")
    if init_p >= 0:
        g, r, off = value_ref(init_p, int(code["x_base"][i]))
        reads["init"] = (g, [r], [off])
    dims = (n[0], n[1], 1) if f in REDUCTIONS else n[:3]
    if not is_dense(pats[0], dims):
        raise PlanError(f"instruction {i}: vector op writes a non-contiguous local region")
    sig = (len(mem), f, acc, n[:3], pats[0], pats[1], pats[2] if f in BINARY else None, init_p >= 0)
    srcs = tuple(reads[s][0] if s in reads else None for s in ("src1", "src2", "init"))
    return ("vector", sig, srcs), reads, dims[0] * dims[1] * dims[2]


def _check_reads(g: Group, groups: list[Group]) -> None:
    """Every local read must stay inside the producer's value (else renaming would be wrong)."""
    for slot, r in g.reads.items():
        if r.src < 0:
            continue
        length = groups[r.src].out_len
        lo, hi = read_extent(g, slot)
        if (r.offs + lo < 0).any() or (r.offs + hi > length).any():
            raise PlanError(f"group {g.id} ({g.kind}) reads past the value its producer wrote")


def read_extent(g: Group, slot: str) -> tuple[int, int]:
    """[lo, hi) element span of one member's read pattern relative to its offset."""
    rel = read_pattern(g, slot)
    return int(rel.min()), int(rel.max()) + 1


def read_pattern(g: Group, slot: str) -> np.ndarray:
    """Element offsets of a read, in the order the compute consumes them."""
    s = g.sig
    if g.kind == "store":
        n, _, local = s
        return _offsets(local, n)
    if g.kind == "matmul":
        _, (m1, m0, k, n), pa, pb, pc, _ = s
        if slot == "a":
            return _offsets(pa, (m1, m0, k))
        if slot == "b":
            return _offsets((*pb, 0), (k, n, 1))
        return _offsets(pc, (m1, m0, n))
    _, f, _, n, pd, p1, p2, _ = s
    if slot == "src1":
        return _offsets(p1, n)
    if slot == "src2":
        return _offsets(p2, n)
    dims = (n[0], n[1], 1) if f in REDUCTIONS else n
    return _offsets(pd, dims)
