"""A cascade (lower.schedule.cascade) on the matrix unit: its members' nests interleaved per spatial tile.

Every member's buffers and the intermediates are allocated at once (the cascade's footprint,
lower.schedule.cascade.cascade_buffers).  Per spatial tile, the first member LOADs its halo from
DRAM; each member's output-channel tiles land in its intermediate (the epilogue writes a tile of
every channel there itself, else a COPY puts each tile at its channels), which is the next
member's input, read in place as its halo; the last member STOREs.  Each member's instructions
belong to its own layer.  Members after a depthwise one tile its output, the ones ahead its input
windows (lower.codegen.halo; with a line buffer the tiles walk each column strip top to bottom; two
depthwise members: those ahead of the first compute the windows of its windows, lower.schedule.halo.targets).  A
chunked cascade's steps are its spatial tiles' chunks: per chunk, the chunked member computes one
output-channel tile, the members after it take it on, the last adding it to its sums
(lower.schedule.cascade).  The steps are emitted software-pipelined
(emit_cascade), the members' channel tiles within a step interleaved (_interleave).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..schedule.buffers import EpilogueLayout
from ..schedule.cascade import cascade_buffers, member_buffers
from ..schedule.halo import MASK, depthwise_at, targets
from ..schedule.nest import ConvProblem, LayerShape, TileMapping, tiles
from ..schedule.tensors import DramTensor
from .halo import apply_mask, computed, copy_forward, load_mask, mask_padding, origin, padded, problem_of
from .matrix import OUT_AXES, _ConvNest
from .window import WindowNest


@dataclass(frozen=True)
class Member:
    """A cascade member as the emitter takes it: its layer (index, name), problem, mapping, conv-shaped
    DRAM views (x read by the first member alone, out written by the last alone), epilogue."""

    layer: int
    name: str
    kind: str                   # the nest's: "matrix", or "depthwise" (a cascade's first member alone)
    problem: ConvProblem
    mapping: TileMapping
    x: DramTensor
    w: DramTensor
    out: DramTensor
    epilogue: EpilogueLayout | None
    extras: list


def emit_cascade(em, members: list[Member], fill, chunk: int | None = None, line: int = 0) -> None:
    """Emit a cascade of `members`, chunked at member `chunk` where given (lower.schedule.cascade), its halo's
    shared rows in a `line` buffer (1) or recomputed (0; lower.schedule.halo)."""
    Ls = [LayerShape.of(mb.kind, mb.problem, mb.epilogue.extras if mb.epilogue else ()) for mb in members]
    ms = [mb.mapping for mb in members]
    d = depthwise_at(Ls)
    dw = members[d].problem
    # members ahead of a depthwise one compute its padded input windows (lower.codegen.halo; a stacked
    # halo's: the windows of the depthwise windows after them, composed)
    wins = [None if t is None else problem_of(t) for t in targets(Ls, np)]
    members = [dataclasses.replace(mb, problem=padded(mb.problem, t)) if t is not None else mb
               for mb, t in zip(members, wins, strict=True)]
    em.layer, em.layer_name = members[0].layer, members[0].name
    chunked = chunk is not None
    bases = em.allocate(cascade_buffers(Ls, ms, np, chunked))
    nests, epis, inter, masks = [], [], [], {}
    for i, (mb, bufs) in enumerate(zip(members, member_buffers(Ls, ms, np, chunked), strict=True)):
        em.layer, em.layer_name = mb.layer, mb.name
        own = {b.name: bases[f"{i}:{b.name}"] for b in bufs}
        inter.append(own.pop("intermediate", None))
        masks.update({i: own.pop(MASK)} if MASK in own else {})
        nests.append(_nest(em, mb, i == 0, fill, own))
        epis.append(nests[-1].start(mb.extras, origin=origin(wins[i])))
    last = members[-1]
    rows, cols = tiles(dw.oh, ms[d].tile_oh), tiles(dw.ow, ms[d].tile_ow)
    # a line buffer's tiles walk each column strip top to bottom, the window above the one before
    spatial = [(n, oh0, th, ow0, tw) for n in range(dw.n) for oh0, th in rows for ow0, tw in cols] if not line \
        else [(n, oh0, th, ow0, tw) for n in range(dw.n) for ow0, tw in cols for oh0, th in rows]
    parts = tiles(members[chunk].problem.o, ms[chunk].tile_o) if chunked else [None]
    steps = [(k, j) for k in range(len(spatial)) for j in range(len(parts))]

    def buffer(i: int, step: int) -> int:
        """Member i's intermediate at a step: one per chunk from the chunked member on, else per spatial tile."""
        return inter[i][(step if chunked and i >= chunk else steps[step][0]) % len(inter[i])]

    def run(i: int, step: int) -> Iterator[None]:
        """Member i's part of a step: its spatial tile, or of the tile's chunk only its share, yielding
        after each of its channel tiles."""
        (k, j), mb = steps[step], members[i]
        if chunked and i < chunk and j:   # members ahead of the chunked one run once per spatial tile
            return
        n, oh0, th, ow0, tw = spatial[k]
        em.layer, em.layer_name = mb.layer, mb.name
        # the next member reads its input as its weights' type (bf16 too: the array's and a depthwise's taps)
        into = None if mb is last else (buffer(i, step), members[i + 1].w.dtype)
        inside = buffer(i - 1, step) if i else None
        at = computed(wins[i], oh0, th, ow0, tw, line) if wins[i] is not None else (oh0, ow0, th, tw, 0)
        share = {} if not chunked or i < chunk else \
            {"ins": [parts[j]]} if mb is last and mb.kind == "matrix" else {"outs": [parts[j]]}
        if mb is last and mb.kind == "matrix" and not chunked:
            share["ahead"] = _ahead(mb)
        held = wins[i].halo(th, tw)[0] if wins[i] is not None else th    # the window's rows
        if i in masks and at[4]:   # the rows it shares with the window above (a line buffer's) copied forward
            copy_forward(em, buffer(i, step - 1), wins[i].halo(ms[d].tile_oh, tw)[0], into[0], held, at[3], at[4],
                         mb.problem.o, mb.mapping.tile_o, into[1])
        if i in masks or mb.kind == "depthwise" and i and wins[i] is not None:
            # the rows computed lie below the shared ones in the window (a stacked halo's first depthwise
            # reads its window's from there, at its stride)
            share["block"] = (held, at[4]) if i in masks else (wins[i - 1].halo(th, tw)[0],
                                                                at[4] * mb.problem.stride[0])
        yield from _as_layer(em, mb, nests[i].spatial_tile(epis[i], n, at[0], at[2], at[1], at[3],
                                                          _store(em, last.out), inside, into, **share))
        pads = mask_padding(wins[i], at) if i in masks else ()
        if any(pads):
            mask = masks[i][k % len(masks[i])]
            if not j:
                load_mask(em, pads, mask, at, into[1])
            o, tile_o = (parts[j][1],) * 2 if chunked and i >= chunk else (mb.problem.o, mb.mapping.tile_o)
            apply_mask(em, into[0], mask, at, held, o, tile_o, into[1])

    # Software-pipelined: step s runs member i on step s - i, so that each unit's in-order queue finds
    # the next step's work behind a step that waits on the other unit (an expand's next tile on the
    # array while the depthwise runs on the vector unit), in `_order`.  Member i writes step k's
    # intermediate while member i + 1 reads step k - 1's: the other of its two buffers.  Chunked,
    # member i runs step s - 2i: a chunk's vector work (a GELU, the depthwise) then runs while the
    # array computes the next chunk and takes in the one before, and no MATMUL waits on it.
    skew = int(all(len(b) > 1 for b in inter[:-1])) * (1 + chunked)
    for s in range(len(steps) + skew * (len(members) - 1)):
        _interleave([run(i, s - skew * i) for i in _order(members, chunked) if 0 <= s - skew * i < len(steps)])


def _nest(em, mb: Member, first: bool, fill, own: dict):
    """A member's nest in its buffers `own`: a depthwise one's on the vector unit, else the array's, which
    LOADs its input from DRAM where it is the `first`."""
    if mb.kind == "depthwise":
        return WindowNest(em, "depthwise", mb.problem, mb.mapping, mb.x, mb.w, mb.epilogue, fill, own)
    return _ConvNest(em, mb.problem, mb.mapping, mb.x if first else None, mb.w, mb.epilogue, fill, own)


def _order(members: list[Member], chunked: bool) -> list[int]:
    """The order a pipelined step runs its members in: a depthwise one first, then the others, the later
    first.  The vector unit's queue then opens each step with the depthwise's taps, which wait for
    nothing (their window was written a step before), rather than with the projection's epilogue, which
    waits for MATMULs that wait for the depthwise: the units overlap instead of taking turns (an int8
    block, where neither dominates, ran 1.3x its busiest unit).  Chunked, the later members first
    alone: the buffer member i writes was read by member i + 1 earlier in the same step."""
    return sorted(range(len(members)), key=lambda i: (members[i].kind == "matrix" or chunked, -i))


def _ahead(last: Member) -> int:
    """The output-channel tiles whose sums an unchunked cascade's last member runs ahead of its
    epilogues, which _interleave puts at the step's end: all of them where its accumulator holds their
    sums and the next step's beside them (its next MATMULs then wait for none of these epilogues),
    else 0 (each tile's epilogue right after its sums)."""
    o_tiles = len(tiles(last.problem.o, last.mapping.tile_o))
    return o_tiles * (2 * o_tiles <= last.mapping.acc_buffers)


def _interleave(runs: list[Iterator[str | None]]) -> None:
    """Emit a pipelined step's members' parts, `runs` (in `_order`), a channel tile of each in turn, so
    that each unit's queue alternates between the members: the expand's epilogues, which free its
    accumulator tiles for its next MATMULs, no longer queue behind every depthwise tile (where the
    expand has more output-channel tiles than accumulator buffers, the array waited out the
    depthwise's taps).  A run that yields "sums" (the last member's MATMULs, lower.codegen.matrix's
    `ahead`) resumes after the others: its epilogues, at the step's end, find its sums done rather
    than wait, with every unit's other work behind them, for its MATMULs over every input-channel
    tile."""
    live, parked = list(runs), []
    while live:
        for run in list(live):
            part = next(run, StopIteration)
            if part is not None:
                live.remove(run)
                parked += [run] if part == "sums" else []
    for run in parked:
        for _ in run:
            pass


def _as_layer(em, mb: Member, parts: Iterator) -> Iterator:
    """`parts` (a member's channel tiles) with its layer restored after each yield: _interleave runs the
    other members' tiles in between, which set theirs, and each instruction belongs to the layer current
    when it is emitted (the report's per-layer cycles and MACs)."""
    for part in parts:
        yield part
        em.layer, em.layer_name = mb.layer, mb.name


def _store(em, out: DramTensor):
    def write(n, o0, oh0, ow0, counts, result):
        em.store(out, (n, o0, oh0, ow0), OUT_AXES, counts, result.operand(counts))
    return write
