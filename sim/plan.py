"""The simulator's plan: the instruction stream as batched dataflow.

Executing a tiled program one instruction at a time is hundreds of times
slower than the model.  The planner turns the verified stream into a short
list of *groups*, each executed as one batched gather -> compute -> (scatter):

1. Renaming.  Scratchpad and accumulator are renamed away: every instruction
   that writes local memory produces a fresh value, and every local read is
   resolved (by the verifier's walk) to the one instruction that produced it,
   at an element offset into that value.  A read spanning the values of
   several instructions (a box its DMA split in two, a stacked conv's per-row
   LOADs) reads a *join*: those values laid out as local memory holds them,
   or, where they are consecutive rows of one group laid out one after
   another, those rows in place.  Write-after-read and
   write-after-write hazards on local memory disappear, as in register
   renaming; program order semantics are kept (the verifier proved the
   queues' token order equal to it).
2. Chains.  A run of accumulating instructions into the same accumulator
   region (the taps and channel tiles of a convolution, the window of a pool)
   becomes one node whose result is a reduction over the chain.
3. Levels.  A node's level is one more than the levels of the values it
   reads and of the DRAM writes (or reads, for a store) it must follow.  A
   chain stops where a member's operands come from another level or a join,
   as they must come from one producer group.
4. Groups.  Nodes of one level with the same static signature (opcode,
   shapes, strides, pads, types) that read from the same producer groups are
   one group; it runs as one jitted function over all its members.

DRAM holds one array per element type; a read of DRAM bytes last written as
another type is outside the model.  Programs outside it (a producer writing a
non-contiguous region, a read spanning values of several types, bf16) raise
PlanError, and the simulator falls back to the reference interpreter.
REQUANT reads its z operand as records: each element of its pattern is
REQUANT_RECORD_BYTES of int32 words, so that read's offsets count words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stagec.errors import PlanError
from stagec.isa.access import is_dense
from stagec.isa.instructions import REQUANT_RECORD_BYTES, AccMode, DType, Opcode, Space, VectorFunc
from stagec.isa.opcodes import VECTOR_FUNCS
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
    lo: np.ndarray           # (T, J) element offsets from `rows` on where the value read starts ...
    hi: np.ndarray           # ... and ends: its reads stay inside (a span, a union: more than a row)


@dataclass
class Group:
    id: int
    kind: str                        # load, gather, store, matmul, vector, join
    level: int
    sig: tuple                       # static signature: the jit cache key
    reads: dict[str, Read]           # slot -> Read ('a','b','init','src1','src2','idx','src'; a join's 'p0'...)
    out_len: int                     # elements per member's value (0 for stores)
    members: list[int] = field(default_factory=list)   # node ids (a union's one member: -1)
    dram: np.ndarray | None = None   # (T,) DRAM element bases
    instructions: list[int] = field(default_factory=list)   # first instruction of each member (a join: -1)


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

    readers = np.zeros(N, np.int64)
    for slot in "xyz":
        p = producer[slot]
        np.add.at(readers, p[p >= 0], 1)
    for ws in flow.spans.values():
        np.add.at(readers, list(ws), 1)

    # --- nodes (single instructions, chains accumulating into one region, joins) and their levels ---
    # A chain only reads values of finished nodes (a value read by anything but the chain's next
    # member ends its chain), so levels are known while chains grow.  A read spanning several
    # producers reads a join node: their values laid out as local memory holds them.
    data_origin = const_bytes(program)
    dram = _DramTracker(program, data_origin, flow)
    node_of = np.full(N, -1, np.int64)
    members: list[list[int]] = []     # a join node has none
    init: list[int] = []              # node whose value the node's initial dst value is, or -1
    acc_mode: list[int] = []
    level: list[int] = []
    joins: dict[int, tuple[int, ...]] = {}   # join node -> the instructions whose values it lays out
    join_of: dict[tuple[int, ...], int] = {}

    def sources(slot: str, i: int) -> tuple[int, ...]:
        """The node whose value instruction i reads through `slot` (a join's for a spanning read), if any."""
        p = int(producer[slot][i])
        return (join_of[flow.spans[slot, i]],) if p == MULTIPLE else (int(node_of[p]),) if p >= 0 else ()

    def add_node(first: list[int], init_k: int, mode_: int, lv: int) -> int:
        members.append(first)
        init.append(init_k)
        acc_mode.append(mode_)
        level.append(lv)
        return len(members) - 1

    def operand_sources(i: int) -> tuple:
        """(level, is a join) of the values instruction i reads, its accumulated destination aside."""
        dst = "z" if op[i] == Opcode.MATMUL else "x"
        return tuple((level[k], k in joins) for s in "xyz" if s != dst for k in sources(s, i))

    def level_of(i: int) -> int:
        lv = max((level[k] + 1 for s in "xyz" for k in sources(s, i)), default=0)
        return dram.access(i, lv) if op[i] in (Opcode.LOAD, Opcode.GATHER, Opcode.STORE) else lv

    for i in range(N):
        for slot in "xyz":
            ws = flow.spans.get((slot, i))
            if ws is not None and ws not in join_of:
                # run right after the groups of its latest producer's level
                join_of[ws] = add_node([], -1, 0, max(level[node_of[w]] for w in ws))
                joins[join_of[ws]] = ws
        o = op[i]
        computes = o in (Opcode.MATMUL, Opcode.VECTOR)
        start = -1
        if computes and mode[i] != AccMode.OVERWRITE:
            dst_slot = "z" if o == Opcode.MATMUL else "x"
            p = int(producer[dst_slot][i])
            k = node_of[p] if p >= 0 else -1
            # NOTE: a chain's members read each operand from one producer group, so an operand made
            # at another level (a conv over a concat of tensors made at different depths) or laid out
            # by a join starts a new node, which accumulates onto the chain so far.
            if (k >= 0 and members[k][-1] == p and readers[p] == 1 and _same_shape(code, p, i)
                    and acc_mode[k] in (AccMode.OVERWRITE, mode[i])
                    and operand_sources(i) == operand_sources(members[k][0])):
                members[k].append(i)
                node_of[i] = k
                acc_mode[k] = int(mode[i])
                continue
            start = next(iter(sources(dst_slot, i)), -1)
        elif o == Opcode.VECTOR and VECTOR_FUNCS[func[i]].reads_dst:
            start = next(iter(sources("x", i)), -1)
        node_of[i] = len(members)
        add_node([i], start, int(mode[i]) if computes else 0, level_of(i))
    n_nodes = len(members)

    # --- groups ---------------------------------------------------------------------------------
    groups: list[Group] = []
    placed: dict[int, tuple[int, DType]] = {}   # node -> (local byte address, element type) of its value
    refs: dict[int, tuple[int, int, int]] = {}  # node -> (group, row, producer rows its value spans)
    unions: dict[tuple[int, ...], int] = {}     # producer groups -> the group laying out all their values

    def value_ref(k: int, read_base: int, read_type: DType):
        """(group, row, element offset, rows spanned) of node k's value, read from read_base."""
        w_base, written = placed[k]
        if written != read_type or (read_base - w_base) % written.itemsize:
            raise PlanError(f"{_node_name(k, members, joins)} wrote {written.name} that is read as {read_type.name}")
        g, row, spanned = refs[k]
        return g, row, (read_base - w_base) // read_type.itemsize, spanned

    def read(at: list[tuple[int, int]], read_type: DType, lv: int):
        """(src group, rows, offs, lo, hi) of the values a node reads at `at` ((node, local byte address),
        one per chain member): from their group, or from the union of several (a chain whose
        operands come from groups alike in level and kind but not in shape)."""
        ref = [value_ref(k, base, read_type) for k, base in at]   # (group, row, offset, rows spanned)
        used = tuple(sorted({g for g, *_ in ref}))
        if len(used) == 1:   # rows of one group, each offset from its row's start
            src, rows, lo = used[0], [r for _, r, _, _ in ref], [0] * len(ref)
        else:                # offsets into the union's one value
            if used not in unions:
                unions[used] = len(groups)
                groups.append(_union(len(groups), lv, [groups[g] for g in used], read_type))
            src, rows = unions[used], [0] * len(ref)
            start = {g: st for g, (st, _, _) in zip(used, groups[src].sig[2], strict=True)}
            lo = [start[g] + r * groups[g].out_len for g, r, _, _ in ref]
        return (src, rows, [b + o for b, (_, _, o, _) in zip(lo, ref, strict=True)], lo,
                [b + n * groups[g].out_len for b, (g, _, _, n) in zip(lo, ref, strict=True)])

    def describe(k: int):
        if k in joins:
            return _describe_join(k, joins[k], node_of, placed, refs, groups)
        head = members[k][-1]
        placed[k] = (_dst_base(code, head), _written_type(code, head))
        return _describe(members[k], init[k], acc_mode[k], code, n_arr, func, sources,
                         lambda at, read_type: read(at, read_type, int(level[k])), data_origin)

    by_level: dict[int, list[int]] = {}
    for k in range(n_nodes):
        by_level.setdefault(int(level[k]), []).append(k)
    for lv in sorted(by_level):
        nodes = by_level[lv]
        for batch in ([k for k in nodes if k not in joins], [k for k in nodes if k in joins]):   # joins last
            buckets: dict[tuple, list[tuple[int, dict, int]]] = {}
            for k in batch:
                described = describe(k)
                if described is None:   # a join of one group's consecutive rows: read in place
                    continue
                key, reads, length = described
                buckets.setdefault(key, []).append((k, reads, length))
            for key, entries in buckets.items():
                g = _group(len(groups), lv, key, entries, members, refs)
                _check_reads(g, groups)
                groups.append(g)

    plan = Plan(groups, data_origin, max(flow.dram_end - data_origin, 0), frozenset(dram.types))
    program.cache["plan"] = plan
    return plan


def _group(gid: int, lv: int, key: tuple, entries: list, members: list, refs: dict) -> Group:
    """The group of one bucket's nodes (entries: (node, reads, value length)); records each node's row."""
    g = Group(gid, key[0], lv, key[1], {}, entries[0][2])
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
    g = Group(gid, "join", lv, (dtype, starts[-1], layout), {}, starts[-1], [-1], instructions=[-1])
    for j, p in enumerate(parts):
        rows = np.arange(len(p.members))[None]
        g.reads[f"p{j}"] = Read(p.id, rows, np.zeros_like(rows), np.zeros_like(rows), np.full_like(rows, p.out_len))
    return g


def _node_name(k: int, members: list, joins: dict) -> str:
    return f"instructions {', '.join(map(str, joins[k]))}" if k in joins else f"instruction {members[k][-1]}"


def _dst_base(code, i: int) -> int:
    """The local byte address instruction i writes its value at."""
    o = code["opcode"][i]
    return int(code["z_base"][i] if o == Opcode.MATMUL else
               code["y_base"][i] if o in (Opcode.LOAD, Opcode.GATHER) else code["x_base"][i])


def _describe_join(k: int, writers: tuple[int, ...], node_of, placed: dict, refs: dict, groups: list[Group]):
    """Join node k: the values of `writers` (instructions, in program order) as local memory holds them:
    each pasted at its address, a later writer's bytes over an earlier one's.  None where they are
    consecutive rows of one group laid out one after another (a stacked conv's per-row LOADs): the
    reader then reads them in place; else (bucket key, reads {slot: (src, rows, offs, lo, hi)}, length)."""
    nodes = list(dict.fromkeys(int(node_of[w]) for w in writers))
    types = {placed[n][1] for n in nodes}
    if len(types) > 1:
        raise PlanError(f"a read spans the values of instructions {', '.join(map(str, writers))}, of several "
                        f"element types ({', '.join(sorted(t.name for t in types))})")
    (dtype,) = types
    pieces = [(placed[n][0], *refs[n][:2], groups[refs[n][0]].out_len) for n in nodes]   # (base, group, row, len)
    base = min(p[0] for p in pieces)
    placed[k] = (base, dtype)
    by_address = sorted(pieces)
    step = by_address[0][3] * dtype.itemsize
    if all((b, g, r) == (base + j * step, by_address[0][1], by_address[0][2] + j)
           for j, (b, g, r, _) in enumerate(by_address)):
        refs[k] = (by_address[0][1], by_address[0][2], len(pieces))
        return None
    if any((b - base) % dtype.itemsize for b, *_ in pieces):
        raise PlanError(f"a read spans the values of instructions {', '.join(map(str, writers))}, which are not "
                        f"aligned to their {dtype.name} elements")
    layout = tuple(((b - base) // dtype.itemsize, 1, n) for b, _, _, n in pieces)
    length = max(o + n for o, _, n in layout)
    reads = {f"p{j}": (g, [r], [0], [0], [n]) for j, (_, g, r, n) in enumerate(pieces)}
    return ("join", (dtype, length, layout), tuple(g for _, g, _, _ in pieces)), reads, length


class _DramTracker:
    """Levels of DRAM accesses (a load after the stores it reads, a store after the loads and
    stores of the bytes it overwrites) and the element type of every data byte."""

    def __init__(self, program: Program, origin: int, flow):
        self.code, self.origin = program.code, origin
        self.granule = flow.granule[Space.DRAM]
        size = -(-max(flow.dram_end - origin, 0) // self.granule)
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


def _same_shape(code, p, i) -> bool:
    """Can instruction i continue the chain ending at p: same op, shape, strides, types, destination."""
    a, b = code[p], code[i]
    dst = "z_base" if a["opcode"] == Opcode.MATMUL else "x_base"
    return bool(a["opcode"] == b["opcode"] and a["func"] == b["func"] and (a["n"] == b["n"]).all()
                and a["spaces"] == b["spaces"] and a["dtype"] == b["dtype"] and a["out_dtype"] == b["out_dtype"]
                and _patterns(code, p) == _patterns(code, i) and a[dst] == b[dst])


def _describe(mem, init_k, acc, code, n_arr, func, sources, read, data_origin):
    """(bucket key (kind, signature, producer groups), reads {slot: (src, rows[J], offs[J], lo[J], hi[J])},
    value length)."""
    i = mem[0]
    o = int(code["opcode"][i])
    n = tuple(int(v) for v in n_arr[i])
    pats = _patterns(code, i)
    dt, odt = DType(int(code["dtype"][i])), DType(int(code["out_dtype"][i]))
    reads = {}

    def local(slot_name, isa_slot, read_type):
        reads[slot_name] = read([(*sources(isa_slot, j), int(code[f"{isa_slot}_base"][j])) for j in mem], read_type)

    def initial(isa_slot):
        """The value an accumulating instruction starts from, written at its destination."""
        if init_k >= 0:
            reads["init"] = read([(init_k, int(code[f"{isa_slot}_base"][i]))], odt)

    def dram_base(base: int, dtype: DType):
        space = DRAM_DATA if base >= data_origin else DRAM_CONST
        reads["dram"] = (space, [0], [(base - (data_origin if space == DRAM_DATA else 0)) // dtype.itemsize], [0], [0])
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
        sig = (len(mem), n, pats[0], pats[1][:2], pats[2], init_k >= 0, dt, odt)
        srcs = (reads["a"][0], reads["b"][0], reads["init"][0] if init_k >= 0 else None)
        return ("matmul", sig, srcs), reads, n[0] * n[1] * n[3]
    # VECTOR
    f = int(func[i])
    if f == VectorFunc.REQUANT and acc != AccMode.OVERWRITE:
        raise PlanError(f"instruction {i}: REQUANT with an accumulate mode")
    vf = VECTOR_FUNCS[f]
    local("src1", "y", dt)
    if vf.sources == 2:
        local("src2", "z", dt)
    initial("x")
    dims = (n[0], n[1], 1) if vf.reduction else n[:3]
    if not is_dense(pats[0], dims):
        raise PlanError(f"instruction {i}: vector op writes a non-contiguous local region")
    sig = (len(mem), f, acc, n[:3], pats[0], pats[1], pats[2] if vf.sources == 2 else None, init_k >= 0, dt, odt)
    srcs = tuple(reads[s][0] if s in reads else None for s in ("src1", "src2", "init"))
    return ("vector", sig, srcs), reads, dims[0] * dims[1] * dims[2]


def _check_reads(g: Group, groups: list[Group]) -> None:
    """Every local read must stay inside the producer's value (else renaming would be wrong)."""
    for slot, r in g.reads.items():
        if r.src < 0:
            continue
        rel = read_pattern(g, slot)
        if (r.offs + rel.min() < r.lo).any() or (r.offs + rel.max() + 1 > r.hi).any():
            raise PlanError(f"group {g.id} ({g.kind}) reads past the value its producer wrote")


def read_dims(g: Group, slot: str) -> tuple[tuple[int, int], ...]:
    """A read's element offsets as a box, ((count, stride), ...) outermost first, in the order the
    compute consumes them."""
    s = g.sig
    if g.kind == "join":
        return ((s[2][int(slot[1:])][2], 1),)
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
    return _dims(pd, (n[0], n[1], 1) if VECTOR_FUNCS[f].reduction else n)


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
