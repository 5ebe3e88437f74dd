"""A cascade (lower.schedule.cascade) on the matrix unit: its members' nests interleaved per spatial tile.

Every member's buffers and the intermediates are allocated at once (the cascade's footprint,
lower.schedule.cascade.cascade_buffers).  Per spatial tile, the first member LOADs its halo from
DRAM; each member's output-channel tiles land in its intermediate (the epilogue writes a tile of
every channel there itself, else a COPY puts each tile at its channels), which is the next
member's input, read in place as its halo; the last member STOREs.  Each member's instructions
belong to its own layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schedule.buffers import EpilogueLayout
from ..schedule.cascade import cascade_buffers, member_buffers
from ..schedule.nest import ConvProblem, LayerShape, TileMapping, tiles
from ..schedule.tensors import DramTensor, local_type
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


def emit_cascade(em, members: list[Member], fill) -> None:
    Ls = [LayerShape.of(mb.kind, mb.problem, mb.epilogue.extras if mb.epilogue else ()) for mb in members]
    ms = [mb.mapping for mb in members]
    em.layer, em.layer_name = members[0].layer, members[0].name
    bases = em.allocate(cascade_buffers(Ls, ms, np))
    nests, epis, inter = [], [], []
    for i, (mb, bufs) in enumerate(zip(members, member_buffers(Ls, ms, np), strict=True)):
        em.layer, em.layer_name = mb.layer, mb.name
        own = {b.name: bases[f"{i}:{b.name}"] for b in bufs}
        inter.append(own.pop("intermediate", None))
        if mb.kind == "depthwise":
            nest = WindowNest(em, "depthwise", mb.problem, mb.mapping, mb.x, mb.w, mb.epilogue, fill, own)
        else:
            nest = _ConvNest(em, mb.problem, mb.mapping, mb.x if i == 0 else None, mb.w, mb.epilogue, fill, own)
        nests.append(nest)
        epis.append(nest.start(mb.extras))
    first, last = members[0], members[-1]
    p, (th_, tw_) = first.problem, (ms[0].tile_oh, ms[0].tile_ow)
    k = 0
    for n in range(p.n):
        for oh0, th in tiles(p.oh, th_):
            for ow0, tw in tiles(p.ow, tw_):
                inside = None
                for i, (mb, nest, epi) in enumerate(zip(members, nests, epis, strict=True)):
                    em.layer, em.layer_name = mb.layer, mb.name
                    into = None if mb is last else (inter[i][k % len(inter[i])], local_type(members[i + 1].w.dtype))
                    nest.spatial_tile(epi, n, oh0, th, ow0, tw, _store(em, last.out), inside, into)
                    inside = into and into[0]
                k += 1


def _store(em, out: DramTensor):
    def write(n, o0, oh0, ow0, counts, result):
        em.store(out, (n, o0, oh0, ow0), OUT_AXES, counts, result.operand(counts))
    return write
