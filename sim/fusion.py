"""The batched executor's grouping and fusion policy: how a group reads each operand, how a
matmul group's members form blocks, and which groups run inside the function of their one reader.

A load from the data region that one compute group reads whole runs inside that group's function
(when no store between overwrites its bytes), so XLA reads the DRAM box straight into the layout
the compute wants; so does a vector op that one compute group reads whole (one pass instead of two).
Only values read whole are fused: XLA would recompute a fused producer for every element a gather
picks (a convolution's taps).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from stagec.isa.access import element_offsets

from .boxes import as_slices, box_positions, grid
from .kernel import DRAM_CONST


def how_to_read(g, slot: str, plan, rows: np.ndarray, offs: np.ndarray):
    """How group g reads `slot` at rows/offs: 'whole' (the producer's output as is), ('box', ...)
    (slices of an affine grid of boxes), 'rows' (whole rows) or 'gather'."""
    producer = plan.groups[g.reads[slot].src]
    dims = g.sig.read_dims(slot)
    rel = box_positions(dims)
    whole = rel.size == producer.out_len and (rel == np.arange(rel.size)).all() and not offs.any()
    if whole and rows.size == len(producer.members) and (rows.reshape(-1) == np.arange(rows.size)).all():
        return "whole"
    bases = grid((rows * producer.out_len + offs).reshape(-1))
    slices = as_slices((*bases, *dims), unique=False) if bases is not None else None
    if slices is not None:
        return ("box", (*bases, *dims), *slices)
    return "rows" if whole and rows.shape[1] == 1 else "gather"


def matmul_blocks(g):
    """(A reads (B*S,), B reads (B*O,), sel, (S, O)): a matmul group's members' (A read, B read)
    pairs as B blocks, each a full S x O grid (a tiled loop nest: spatial tiles x output-channel
    tiles, one block per attention head), with sel each member's place in the blocks' products.
    Members with no such structure are T blocks of 1 x 1."""
    a, b = g.reads["a"], g.reads["b"]
    _, ia, inv_a = np.unique(np.concatenate([a.rows, a.offs], 1), axis=0, return_index=True, return_inverse=True)
    _, ib, inv_b = np.unique(np.concatenate([b.rows, b.offs], 1), axis=0, return_index=True, return_inverse=True)
    pairs = list(zip(inv_a.reshape(-1).tolist(), inv_b.reshape(-1).tolist(), strict=True))
    partners: dict[int, list[int]] = {}
    for x, y in pairs:
        partners.setdefault(x, []).append(y)
    blocks: dict[tuple, list[int]] = {}   # the A reads that pair with one set of B reads
    for x, ys in partners.items():
        blocks.setdefault(tuple(sorted(ys)), []).append(x)
    shapes = {(len(xs), len(ys)) for ys, xs in blocks.items()}
    b_reads = [y for ys in blocks for y in ys]
    if len(shapes) != 1 or len(b_reads) != len(set(b_reads)) or len(set(pairs)) != len(pairs):
        t = len(pairs)
        return np.arange(t), np.arange(t), np.arange(t), (1, 1)
    (s, o), = shapes
    place = {}
    for bi, (ys, xs) in enumerate(blocks.items()):
        for si, x in enumerate(xs):
            for oi, y in enumerate(ys):
                place[x, y] = (bi * s + si) * o + oi
    sel = np.array([place[p] for p in pairs])
    return (ia[[x for xs in blocks.values() for x in xs]], ib[b_reads], sel, (s, o))


def fused_producers(plan, partial: set[int]) -> tuple[set[int], set[int]]:
    """(loads inlined into their reader, vector groups deferred into their reader); `partial`: the
    groups some reader reads only in part."""
    fusable = _fusable(plan, partial)
    inlined = _inlined_loads(plan, fusable)
    # a vector op that reads an inlined load is not deferred: the load's store check ends at its reader
    deferred = {src for src in fusable if plan.groups[src].kind == "vector"
                and not any(r.src in inlined for r in plan.groups[src].reads.values())}
    return inlined, deferred


def _fusable(plan, partial: set[int]) -> dict[int, int]:
    """group id -> the one compute group (matmul or vector) that reads its value, and reads it
    whole (not in `partial`): such a value can be computed inside its reader's function."""
    readers: dict[int, set[int]] = {}
    for g in plan.groups:
        for r in g.reads.values():
            if r.src >= 0:
                readers.setdefault(r.src, set()).add(g.id)
    return {src: c for src, rs in readers.items() if len(rs) == 1 and src not in partial
            for c in rs if plan.groups[c].kind in ("matmul", "vector")}


def dram_extent(g) -> tuple[int, int]:
    """The first and last DRAM element a load or store group touches."""
    rel = element_offsets(g.sig.dram_strides, g.sig.n[:3])
    return int(g.dram.min() + rel.min()), int(g.dram.max() + rel.max())


def _inlined_loads(plan, fusable: dict[int, int]) -> set[int]:
    """Loads of the data region that run inside the function of the one group reading them: XLA
    then reads the DRAM box straight into the layout the compute wants (P @ V's probabilities: a
    tile stack that the matmul would transpose back).  Only where no store between the two writes
    the bytes the load reads, so that reading later reads the same values."""
    stores = {g.id: (g.sig.dtype, *dram_extent(g)) for g in plan.groups if g.kind == "store"}
    inlined = set()
    for src, c in fusable.items():
        g = plan.groups[src]
        if g.kind != "load" or g.sig.space == DRAM_CONST:
            continue
        lo, hi = dram_extent(g)
        if not any(s in stores and stores[s][0] == g.sig.dtype and lo <= stores[s][2] and stores[s][1] <= hi
                   for s in range(src + 1, c)):
            inlined.add(src)
    return inlined


@functools.cache
def with_producers(fn, producers: tuple):
    """fn with the values at positions `producers` ((position, producer's function), ...) computed
    inside it, from the producer's own arguments given there as a tuple."""
    def run(*args):
        args = list(args)
        for pos, producer in producers:
            args[pos] = producer(*args[pos])
        return fn(*args)
    return jax.jit(run)
