"""The verifier's dataflow walk: in program order, per memory granule, the last writer and the last
reader of each queue, and per instruction a vector clock of what its tokens guarantee has completed.
An access from one queue that conflicts with an earlier access from another queue must be ordered
by tokens, or the queues could run it in either order.

The walk also records, for each scratchpad/accumulator read, the instruction that produced the
value (the simulator executes the program as dataflow).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

import numpy as np

from stagec.errors import VerificationError

from .access import Access, dense_patterns, element_offsets
from .instructions import MEMORY_NAMES, Queue, Space
from .opcodes import queues_of
from .program import Program, RegionKind

MULTIPLE = -2   # producer of a read that spans several writers


@dataclass(frozen=True)
class Dataflow:
    """What the walk learned: each instruction's queue and the producer of each local read."""

    queue: np.ndarray                     # (N,) Queue of each instruction
    producer: dict[str, np.ndarray]       # slot -> (N,) producer index, -1 none, MULTIPLE
    granule: dict[Space, int]             # tracking granule (bytes) per memory
    spans: dict[tuple[str, int], tuple[int, ...]]   # (slot, i) -> the writers of a MULTIPLE read
    dram_end: int                         # end of the DRAM bytes the program touches (what a simulator holds)


def const_bytes(program: Program) -> int:
    return next((r.nbytes for r in program.regions if r.kind == RegionKind.CONST), 0)


# --- dataflow walk ----------------------------------------------------------------------------

class _Runs:
    """Run-length map of the last writer over granules: sorted, disjoint [start, end) runs.

    Dense writes keep it exact and small (a scratchpad holds a few dozen buffers), so most reads
    find their single producer by a bisection instead of a pass over every element.
    """

    def __init__(self):
        self.starts, self.ends, self.writers = [], [], []

    def single(self, a: int, b: int):
        """The one writer of all of [a, b), or None (several writers, a gap, or unknown)."""
        k = bisect_right(self.starts, a) - 1
        return self.writers[k] if k >= 0 and self.ends[k] >= b else None

    def covering(self, a: int, b: int):
        """Writers of the runs covering [a, b), or None where a part is not covered."""
        k, pos, found = bisect_right(self.ends, a), a, []
        while k < len(self.starts) and self.starts[k] < b:
            if self.starts[k] > pos:
                return None
            found.append(self.writers[k])
            pos = self.ends[k]
            k += 1
        return found if pos >= b else None

    def forget(self, a: int, b: int) -> int:
        """Drop coverage of [a, b) (keeping the parts of runs outside it); returns where [a, b) would go."""
        i = bisect_right(self.ends, a)
        j = i
        keep = []
        while j < len(self.starts) and self.starts[j] < b:
            s, e, w = self.starts[j], self.ends[j], self.writers[j]
            if s < a:
                keep.append((s, a, w))
            if e > b:
                keep.append((b, e, w))
            j += 1
        self.starts[i:j] = [k[0] for k in keep]
        self.ends[i:j] = [k[1] for k in keep]
        self.writers[i:j] = [k[2] for k in keep]
        return i + (1 if keep and keep[0][0] < a else 0)

    def assign(self, a: int, b: int, w: int) -> None:
        k = self.forget(a, b)
        self.starts.insert(k, a)
        self.ends.insert(k, b)
        self.writers.insert(k, w)


class _Memory:
    """Per-granule last writer and last reader per queue (instruction indices, -1 = none, -3 = the
    host), with the writer also kept as runs."""

    def __init__(self, nbytes: int, granule: int, base: int, initially_written: list[tuple[int, int]]):
        size = max(nbytes - base, 0) // granule
        self.granule, self.base = granule, base
        self.writer = np.full(size, -1, np.int32)
        self.runs = _Runs()
        for lo, hi in initially_written:
            g0, g1 = (lo - base) // granule, (hi - base) // granule
            self.writer[g0:g1] = -3
            self.runs.assign(g0, g1, -3)
        self.last_read = np.full((4, size), -1, np.int32)
        self.readers: set[int] = set()   # queues that ever read this memory


def _dram_end(p: Program, accs: list[Access]) -> int:
    """The end of the DRAM bytes the program touches: the walk and the simulators hold those, not all
    of dram_bytes (which a file may declare as large as the hardware's DRAM)."""
    ends = [len(p.constants), *(t.offset + t.nbytes for t in (*p.inputs, *p.outputs))]
    for a in accs:
        rows = a.valid & (a.space == Space.DRAM)
        if rows.any():
            ends.append(int(a.extent()[1][rows].max()))
    return min(-(-max(ends) // 64) * 64, p.dram_bytes)   # whole 64-byte lines, as the compiler lays DRAM out


def _granule_views(a: Access, granule: dict, base: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per instruction, the (shape, byte strides, byte offset) that view a per-granule int32 array
    as the granules access `a` touches: the pattern's dims and then the granules of one element.
    np.ndarray over the memory array takes them as they are (negative strides too) and checks
    the bounds, at a tenth of as_strided's cost: the walk builds one such view per non-trivial access."""
    gran = np.array([granule[s] for s in Space])[a.space]
    per = a.itemsize // gran
    strides = np.concatenate([a.strides * per[:, None], np.ones((len(per), 1), np.int64)], 1) * 4
    # a dim of stride 0 revisits the same granules: one step of it touches them all
    shape = np.where(strides == 0, 1, np.concatenate([a.dims, per[:, None]], 1))
    offset = (a.base - np.array([base[s] for s in Space])[a.space]) // gran * 4
    return shape, strides, offset


class DataflowWalk:
    """Walks the stream in program order; for each instruction reports the latest earlier
    instruction of every other queue it conflicts with (read-after-write, write-after-write,
    write-after-read on any memory), and the producer of each local read."""

    def __init__(self, p: Program, accs: list[Access]):
        n = len(p.code)
        self.queue = queues_of(p.code["opcode"])
        consts = const_bytes(p)
        self.granule = {}
        for space in Space:
            sizes = [a.itemsize[a.valid & (a.space == space)] for a in accs]
            sizes = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
            self.granule[space] = int(sizes.min()) if sizes.size else 4
        inputs = [(t.offset, t.offset + t.nbytes) for t in p.inputs]
        self.dram_end = _dram_end(p, accs)
        self.mems = {Space.DRAM: _Memory(self.dram_end, self.granule[Space.DRAM], consts, inputs),
                     Space.SPAD: _Memory(p.hw.scratchpad_bytes, self.granule[Space.SPAD], 0, []),
                     Space.ACC: _Memory(p.hw.accumulator_bytes, self.granule[Space.ACC], 0, [])}
        self.mem_of = [self.mems[s] for s in sorted(Space)]   # by the int in `entries`
        self.queue_list = self.queue.tolist()
        # Every (instruction, access) pair, sorted by instruction with reads (incl. accumulate) before
        # the write they feed, and the granule extent of each, as plain lists: step() only indexes.
        parts = []
        for k, a in enumerate(accs):
            lo, hi = a.extent()
            const_read = (a.space == Space.DRAM) & (a.base < consts) & (not a.write)   # the blob is read-only
            rows = np.flatnonzero(a.valid & ~const_read)
            gran = np.array([self.granule[s] for s in Space])[a.space[rows]]
            start = np.where(a.space[rows] == Space.DRAM, consts, 0)
            parts.append(np.stack([rows, np.full(len(rows), k), np.full(len(rows), int(a.write)), a.space[rows],
                                   (lo[rows] - start) // gran, -(-(hi[rows] - start) // gran),
                                   dense_patterns(a.strides, a.dims)[rows]], 1))
        table = np.concatenate(parts) if parts else np.zeros((0, 7), np.int64)
        table = table[np.lexsort((table[:, 2], table[:, 0]))]
        self.accs = accs
        self.geometry = [_granule_views(a, self.granule, {s: m.base for s, m in self.mems.items()}) for a in accs]
        self.entries = table[:, 1:].tolist()
        self.first = np.searchsorted(table[:, 0], np.arange(n + 1)).tolist()
        self.producer = {slot: np.full(n, -1, np.int64) for slot in "xyz"}
        self.spans = {}

    def step(self, i: int) -> list[int]:
        """Conflicts of instruction i: latest conflicting index per queue (4 entries), -1 none."""
        q = int(self.queue[i])
        needs = [-1, -1, -1, -1]
        mems, queue = self.mem_of, self.queue_list
        # A DRAM write's earlier writers are STOREs, on its own queue (in order already): they go unlisted.
        for k, write, space, g0, g1, dense in self.entries[self.first[i]:self.first[i + 1]]:
            mem = mems[space]
            if not write:
                mem.readers.add(q)
                single = mem.runs.single(g0, g1)
                if single is not None:   # one producer covers the whole extent: exact, no element pass
                    writers = (single,)
                    # NOTE: the read is recorded over its extent: sound (a later write waits for every
                    # reader that may have touched its bytes), at worst one token more than needed.
                    mem.last_read[q, g0:g1] = i
                else:
                    w = self._view(mem.writer, k, i)
                    lo, hi = int(w.min()), int(w.max())
                    if lo == -1 or (lo < -1 < hi and (w == -1).any()):
                        a = self.accs[k]
                        raise VerificationError(f"reads {MEMORY_NAMES[Space(space)]} byte "
                                                f"{self._unwritten(a, i, mem):#x}, which nothing wrote", i, a.operand)
                    # only STOREs write DRAM, so its latest writer is the one to wait for
                    writers = (lo,) if lo == hi else (hi,) if space == Space.DRAM else np.unique(w).tolist()
                    self._view(mem.last_read[q], k, i)[...] = i
                if space != Space.DRAM:
                    slot = self.accs[k].operand
                    self.producer[slot][i] = writers[0] if len(writers) == 1 else MULTIPLE
                    if len(writers) > 1:
                        self.spans[slot, i] = tuple(writers)
            elif dense:
                writers = () if space == Space.DRAM else mem.runs.covering(g0, g1)
                if writers is None:
                    writers = np.unique(mem.writer[g0:g1]).tolist()
                if mem.readers:
                    for r, latest in enumerate(mem.last_read[:, g0:g1].max(axis=1).tolist()):
                        if r != q and latest > needs[r]:
                            needs[r] = latest
                mem.writer[g0:g1] = i
                mem.runs.assign(g0, g1, i)
            else:
                w = self._view(mem.writer, k, i)
                writers = () if space == Space.DRAM else np.unique(w).tolist()
                for r in mem.readers:
                    if r != q:
                        needs[r] = max(needs[r], int(self._view(mem.last_read[r], k, i).max()))
                w[...] = i
                mem.runs.forget(g0, g1)
            for w in writers:
                if w >= 0 and w > needs[queue[w]]:
                    needs[queue[w]] = w
        needs[q] = -1   # same queue: in order
        return needs

    def _view(self, arr: np.ndarray, k: int, i: int) -> np.ndarray:
        """`arr` (one int32 per granule) restricted to what access k of instruction i touches."""
        shape, strides, offset = self.geometry[k]
        return np.ndarray(shape[i].tolist(), np.int32, arr, int(offset[i]), strides[i].tolist())

    def result(self) -> Dataflow:
        return Dataflow(queue=self.queue, producer=self.producer, granule=self.granule, spans=self.spans,
                        dram_end=self.dram_end)

    def check_outputs_written(self, outputs) -> None:
        """Every byte of every output is stored by the program (or is an input's): a simulator
        would otherwise return whatever DRAM held."""
        dram = self.mems[Space.DRAM]
        for t in outputs:
            g0, g1 = (t.offset - dram.base) // dram.granule, -(-(t.offset + t.nbytes - dram.base) // dram.granule)
            unwritten = np.flatnonzero(dram.writer[g0:g1] == -1)
            if unwritten.size:
                byte = dram.base + (g0 + int(unwritten[0])) * dram.granule
                raise VerificationError(f"output '{t.name}' byte {byte:#x} is never written by the program")

    @staticmethod
    def _unwritten(a: Access, i: int, mem: _Memory) -> int:
        """Byte address of the first unwritten granule an access reads (for the error message)."""
        per = int(a.itemsize[i]) // mem.granule
        g = element_offsets(a.strides[i], a.dims[i]) * per + (int(a.base[i]) - mem.base) // mem.granule
        g = (g[:, None] + np.arange(per)).reshape(-1)
        return mem.base + int(g[np.flatnonzero(mem.writer[g] == -1)[0]]) * mem.granule


def check_dataflow(p: Program, accs: list[Access]) -> Dataflow:
    """The token and dataflow rules: tokens balanced, no race between queues, no read of unwritten
    memory, every output written."""
    walk = DataflowWalk(p, accs)
    queue, n = walk.queue, len(p.code)
    fifo = {(s, d): deque() for s in range(4) for d in range(4)}
    done = np.full((n, 4), -1, np.int64)          # vector clock at completion
    last_in_queue = [-1] * 4
    push, pop = p.code["push"], p.code["pop"]
    for i in range(n):
        q = int(queue[i])
        start = done[last_in_queue[q]].copy() if last_in_queue[q] >= 0 else np.full(4, -1, np.int64)
        for s in range(4):
            if pop[i] >> s & 1:
                if not fifo[(s, q)]:
                    raise VerificationError(f"waits for a token from the {Queue(s).name} queue that no earlier "
                                            "instruction pushed (tokens unbalanced)", i, "pop")
                start = np.maximum(start, done[fifo[(s, q)].popleft()])
        needs = np.array(walk.step(i), np.int64)
        late = needs > start
        if late.any():
            r = int(np.flatnonzero(late)[0])
            raise VerificationError(f"conflicts with instruction {int(needs[r])} ({Queue(r).name} queue) on memory "
                                    "they both access, and no token orders the two (race)", i)
        start[q] = i
        done[i] = start
        last_in_queue[q] = i
        for d in range(4):
            if push[i] >> d & 1:
                fifo[(q, d)].append(i)
    walk.check_outputs_written(p.outputs)
    for (_, d), left in fifo.items():
        if left:
            raise VerificationError(f"{len(left)} token(s) pushed to the {Queue(d).name} queue are never popped "
                                    "(tokens unbalanced)", left[0], "push")
    return walk.result()
