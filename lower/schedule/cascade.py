"""Cascades: consecutive layers run depth-first, their intermediate tiles kept on chip.

A cascade is a chain of pointwise layers (a matmul, a 1x1 convolution of stride 1 without padding),
each feeding the next alone, possibly led by a depthwise convolution (an inverted residual block's
depthwise -> 1x1 projection; its halo comes from DRAM, so it needs no overlap), or with a depthwise
member after 1x1 ones (the first may be any convolution: a stem's), which then compute its input
windows (lower.schedule.halo: the spatial tiles are the depthwise's output's, the members ahead tile
its windows, recomputing the rows consecutive windows share or keeping them in a line buffer,
`Cascade.halo`; two depthwise members across a block boundary, their halos stacked).  Its nest walks
spatial tiles of the common output (`Cascade.tile`: rows x columns; a matmul's rows are its M); per
spatial tile each member runs its own nest's output-channel tiles (its TileMapping, whose spatial
tile is the cascade's), the first reading its halo from DRAM, the others the previous member's whole
result tile, held in the scratchpad (an "intermediate" buffer, double-buffered so the next spatial
tile's first member overlaps the last one's later members); only the last member STOREs.  Only the
first input, the weights and the last output touch DRAM.  The intermediate holds the producer's
output-channel tiles one after another, each a dense [rows][cols][its channels] block (its epilogue
writes it there; a COPY where it has none), so the consumer's channel tiles are the producer's
output-channel tiles.

A *chunked* cascade (DeFiNES' and Stream's channel-tiled depth-first) never holds an intermediate
whole: the `chunk_at` member's output-channel tiles (chunks) each pass through the members after it
before the next is computed, every depthwise one on that chunk's channels, and the last, a matrix
member of one output-channel tile (all its channels), accumulates its sums over the chunks as over
its input-channel tiles (a last depthwise member stores the chunk).  So an inverted residual block
whose expanded activation does not fit per spatial tile (14x14 and 7x7 blocks of 576 to 1152
channels) still runs depth-first, its intermediates one chunk wide; members before `chunk_at` run
once per spatial tile.  The same nest work prices it: only the intermediates' sizes and the last
member's output tile differ.

The cost is the members' nest work (lower.schedule.nest_work's matrix_work, window_work) with the
intermediate's STORE and LOAD taken out and the COPYs put in, composed into a latency as a pipeline
over spatial tiles: the busiest unit (LOAD and STORE queues, the DRAM channel, the vector unit, or
the array, which also waits for each non-last member's last tile: per spatial tile, or once where the
emitter software-pipelines the steps, every intermediate double-buffered), plus one step's
LOADs to fill, one tile's epilogue and STORE to drain, and the ramp: the first step's pass through
the members (each on its unit) less the busiest unit's period, which a cascade of few steps pays.
Written over an ops namespace like the nest (lower.schedule.nest.Exact; costmodel.smooth.Relaxed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

from stagec.isa.instructions import Space
from stagec.sim.energy import ActionCounts

from . import halo
from .buffers import Buffer, local_bytes, words
from .nest import DEPTHWISE, MATRIX, LayerShape, TileMapping
from .nest_cost import dma_cycles
from .nest_energy import actions
from .nest_work import matrix_buffers, matrix_work, waits, window_buffers, window_turn, window_work

MAX_MEMBERS = 3     # layers per cascade the mapper considers (its grid grows with each one's tile choices)
MAX_SPAN = 6        # ... across a block boundary (two depthwise members; expand, depthwise, project twice)


class CascadeRecord:
    """What a program's metadata records of a cascade of any kind (the report shows it): its layers,
    tile and the DRAM bytes it saves."""

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "tile": list(self.tile), "saved_bytes": self.saved_bytes}


@dataclass(frozen=True)
class Cascade(CascadeRecord):
    """Layers (node names, in order) run depth-first over spatial tiles of `tile` (rows, cols), each
    member's nest as `mappings` says, `chunk` the member whose output-channel tiles it walks one at a
    time where it is chunked (module doc), else None; `saved_bytes`: the DRAM traffic of the
    intermediates (a STORE and a LOAD each) that layer-by-layer would move."""

    layers: tuple[str, ...]
    tile: tuple[int, int]
    mappings: tuple[TileMapping, ...]
    saved_bytes: int
    chunk: int | None = None
    halo: str | None = None     # a halo cascade's strategy (lower.schedule.halo: RECOMPUTE or LINE), else None

    @property
    def line(self) -> int:
        """1 where the cascade keeps a line buffer (lower.schedule.halo), else 0 (cascade_cost's `line`)."""
        return int(self.halo == halo.LINE)

    def to_dict(self) -> dict:
        return {**super().to_dict(), **({"halo": self.halo} if self.halo else {})}

    def __str__(self) -> str:
        chunks = "" if self.chunk is None else f", chunks of {self.mappings[self.chunk].tile_o} channels"
        halos = "" if self.halo is None else f", halo {self.halo}"
        return (f"cascade {' -> '.join(self.layers)}: tile {self.tile[0]}x{self.tile[1]}{chunks}{halos}, "
                f"saves {self.saved_bytes / 1024:.1f} KiB of DRAM")


def chunk_at(Ls) -> int:
    """The member whose output-channel tiles a chunked cascade of members `Ls` walks one at a time: the
    last but one, or, where depthwise members (channel-wise) come before the last, the one ahead of
    them."""
    i = len(Ls) - 2
    while i > 0 and int(Ls[i].kind) == DEPTHWISE:
        i -= 1
    return i


def chunk_members(Ls, chunked) -> list:
    """Per member, 1 where a `chunked` cascade holds its intermediate one chunk at a time (from
    `chunk_at` to the last but one), else 0 (arrays where `chunked` is one)."""
    s = chunk_at(Ls)
    return [chunked * (s <= i < len(Ls) - 1) for i in range(len(Ls))]


def copies(L: LayerShape):
    """1 where a non-last member's output tiles reach the intermediate by a COPY out of the accumulator
    (it has no epilogue), 0 where its epilogue writes them there (lower.schedule.nest_work.epilogue_ops;
    a bf16 intermediate rounded by the epilogue's last step as it writes, isa.opcodes.ROUNDING)."""
    e = L.epilogue
    return (e.plain + e.hard == 0) * 1


def intermediate(L: LayerShape, m: TileMapping, chunk=0) -> Buffer:
    """A non-last member's result tiles, every channel (one output-channel tile where it holds a
    `chunk`), `out_itemsize` each (int8 or float32)."""
    item = L.out_itemsize
    channels = chunk * m.tile_o + (1 - chunk) * L.o
    return Buffer("intermediate", Space.SPAD, words(m.tile_oh * m.tile_ow * channels * item, item),
                  1 + m.double_buffer)


def member_buffers(Ls, ms, xp, chunked=0) -> list[list[Buffer]]:
    """Each member's buffers: its nest's (the first member's halo; the others read the intermediate;
    a depthwise member holds every channel tile's weights) and, but for the last, its intermediate (a
    chunk's where `chunked`); the member just ahead of a depthwise one, its masks (lower.schedule.halo)."""
    out = []
    ahead = [h - 1 for h in halo.halo_members(Ls)]
    chunk = chunk_members(Ls, chunked)
    for i, (L, m) in enumerate(zip(halo.ahead_shapes(Ls, ms, xp), ms, strict=True)):
        if L.kind == MATRIX:
            own = matrix_buffers(L, m, xp)
        else:
            resident = Buffer("weights", Space.SPAD, words(L.kh * L.kw * L.o * L.itemsize, L.itemsize))
            own = [resident if b.name == "weights" else b for b in window_buffers(L, m, xp)]
        # a depthwise member's halo: where a dot mapping turns the window channel-major (lower.codegen.window)
        own = [b if i == 0 or b.name != "halo" else dataclasses.replace(b, count=b.count * m.dot) for b in own
               if i == 0 or b.name != "halo" or L.kind != MATRIX]
        out.append(own + ([intermediate(L, m, chunk[i])] if i < len(Ls) - 1 else [])
                   + ([halo.mask_buffer(L, m)] if i in ahead else []))
    return out


def cascade_buffers(Ls, ms, xp, chunked=0) -> list[Buffer]:
    """Every buffer the cascade holds at once, named `member:buffer` (one Emitter.allocate)."""
    return [dataclasses.replace(b, name=f"{i}:{b.name}")
            for i, bs in enumerate(member_buffers(Ls, ms, xp, chunked)) for b in bs]


class CascadeCost(NamedTuple):
    """A cascade's cost: cycles, instructions, actions (sim.energy's), per-unit busy cycles
    ({load, store, channel, matrix, vector}), and its scratchpad and accumulator bytes."""

    cycles: object
    instructions: object
    actions: ActionCounts
    units: dict
    spad_bytes: object
    acc_bytes: object


def cascade_cost(Ls, ms, hw, ops, chunked=0, line=0) -> CascadeCost:
    """The cost of a cascade of members `Ls` (LayerShapes) mapped by `ms` (TileMappings sharing one
    spatial tile) on `hw`, `chunked` or not (module doc), its halo's rows in a `line` buffer (1;
    lower.schedule.halo) or recomputed (0).  Either switch is a number, a grid of 0 and 1 (the mapper's)
    or a relaxed weight in [0, 1] (costmodel.fusion's), the line buffer's a blend of the two row
    tilings (halo.ahead_rows)."""
    xp = ops.xp
    last = len(Ls) - 1
    given, Ls = Ls, halo.ahead_shapes(Ls, ms, xp, line)
    d = halo.depthwise_at(Ls)
    # each member ahead of a depthwise one tiles its window (its target's; a stacked halo's composed)
    wins = halo.targets(given, xp)
    rows = [None if dw is None else halo.ahead_rows(dw, ms[d].tile_oh, ops, line) for dw in wins]
    # their tile inputs (a residual add) read their windows' inside alone (lower.codegen.matrix.Epilogue)
    extents = [None if dw is None else halo.inside_extent(dw, ms[d], xp, line) for dw in wins]
    works = [(matrix_work if L.kind == MATRIX else window_work)(L, m, hw, ops, r, e)
             for L, m, r, e in zip(Ls, ms, rows, extents, strict=True)]
    # the member just ahead of each depthwise one masks its window's padding and copies its line
    # buffer's rows forward
    ahead = [h - 1 for h in halo.halo_members(Ls)]
    insides = {i: extents[i][0] * extents[i][1] for i in ahead}     # the elements the masks LOAD
    masks = [halo.mask_work(Ls[i], insides[i], works[i], hw, ops,
                            halo.inside_tiles(wins[i], ms[d].tile_oh, ms[d].tile_ow, ops, line)) for i in ahead]
    copies_ = [halo.copy_work(Ls[i], wins[i], ms[d].tile_oh, works[i], hw, ops, line) for i in ahead]
    vec_extra = {i: m[1][1] + c[1] for i, m, c in zip(ahead, masks, copies_, strict=True)}
    loads = tuple(sum(m[0][k] for m in masks) for k in range(2))
    store, startup, matrix, vector, step = works[-1].store, (0, 0), 0, 0, 0
    pipelined = _pipelined(ms)
    # the steps each member runs in: spatial tiles, a chunked cascade's chunks from its chunked member on
    spatial = Ls[-1].n * works[-1].dims.n_h * works[-1].dims.n_w
    chunks = 1 + chunked * (works[chunk_at(Ls)].dims.n_o - 1)
    instructions = loads[0] + sum(m[1][0] for m in masks) + sum(c[0] for c in copies_)
    acts = [halo.mask_actions(Ls[i], works[i], work) for i, work in zip(ahead, masks, strict=True)]
    acts += [halo.copy_actions(Ls[i], wins[i], ms[d].tile_oh, works[i], hw, ops, line) for i in ahead]
    for i, (L, m, w) in enumerate(zip(Ls, ms, works, strict=True)):
        on_array = (L.kind == MATRIX) * 1      # else a depthwise member: taps on the vector unit,
        window = w.halo if i == 0 else (0, 0)   # every weight loaded before the first tile
        weights = tuple(on_array * v for v in w.weights)
        loads = tuple(a + h + wt + e for a, h, wt, e in zip(loads, window, weights, w.extra, strict=True))
        startup = tuple(a + b + (1 - on_array) * c for a, b, c in zip(startup, w.startup, w.weights, strict=True))
        copy = copies(L) * (i < last)
        turned = (1 - on_array) * (i > 0) * m.dot   # a dot mapping's COPY turning each window
        turn_cycles, turn_elements = window_turn(L, w.dims, hw, ops)
        vec = (w.epilogue + copy * w.groups + (1 - on_array) * w.compute + vec_extra.get(i, 0)
               + turned * turn_cycles)
        # the next member's first MATMUL waits for this member's last output tile's vector work: on every
        # step unpipelined, else on the first alone
        tail = (i < last) * vec / xp.maximum(w.tiles, 1)
        matrix = (matrix + on_array * (w.compute + waits(L, m, w, hw))
                  + ((1 - pipelined) * L.n * w.dims.n_h * w.dims.n_w + pipelined) * tail)
        vector = vector + vec
        # one step's pass through the members (the last one's epilogue is the drain's)
        runs = spatial * (chunks if i >= chunk_at(Ls) else 1)
        step = step + ops.max(on_array * w.compute, (i < last) * vec) / runs
        instructions = (instructions + w.instructions - (i > 0) * w.halo[0] - (i < last) * (w.store[0] - copy * w.tiles)
                        + turned * w.halo[0])
        acts.append(_member_actions(L, m, w, hw, ops, i > 0, (i < last) * 1, copy, turned * turn_elements))
    units = {"load": dma_cycles(*loads, hw), "store": dma_cycles(*store, hw),
             "channel": (loads[1] + store[1]) / hw.dma_bandwidth_bytes_per_cycle, "matrix": matrix, "vector": vector}
    first, end = works[0], works[-1]
    fill = (dma_cycles(*first.halo, hw) / xp.maximum(first.halo_tiles, 1)
            + (Ls[0].kind == MATRIX) * dma_cycles(*first.weights, hw) / xp.maximum(first.steps, 1))
    drain = (end.epilogue + dma_cycles(*end.store, hw)) / xp.maximum(end.tiles, 1)
    busiest = ops.smax(*units.values())
    # a software pipeline: the first step passes through every member before the busiest unit's
    # steady period (its total over the steps) takes over, and that first pass is all the cost of a
    # cascade of few steps
    ramp = ops.max(step - busiest / (spatial * chunks), 0)
    spad, acc = local_bytes(cascade_buffers(given, ms, xp, chunked))
    total = ActionCounts(**{k: sum(a.get(k, 0) for a in acts) for k in acts[-1]})
    return CascadeCost(dma_cycles(*startup, hw) + fill + busiest + ramp + drain, instructions, total, units, spad,
                       acc)


def _pipelined(ms):
    """1 where every non-last member's intermediate is double-buffered: the emitter then runs member i on
    step s - i (lower.codegen.cascade), so each member reads a step's intermediate written a step
    before and no MATMUL waits on the member ahead's epilogues."""
    return math.prod(m.double_buffer for m in ms[:-1])


def _member_actions(L: LayerShape, m: TileMapping, w, hw, ops, reads_intermediate, writes_intermediate,
                    copy, turned) -> dict:
    """A member's actions as its own nest's, less the intermediate's DRAM LOAD (and the scratchpad write
    it makes, padding included) and STORE; the intermediate written to the scratchpad, by a COPY out of the accumulator
    (in the STORE's place: its vector ops) or by the epilogue's last step (which then writes no
    accumulator, and no STORE reads it).  (An epilogue with temporaries moves some more bytes between
    the two memories than this counts: a GELU's, about 3 intermediates' worth each way.)  `turned`: the
    elements a dot mapping's COPYs turn channel-major."""
    a = actions(L, m, w, hw, ops, L.kind).to_dict()
    out = L.n * L.oh * L.ow * L.o
    stored = w.store[1]
    a["dram_read_bytes"] = a["dram_read_bytes"] - reads_intermediate * w.halo[1]
    a["scratchpad_write_bytes"] = (a["scratchpad_write_bytes"] - reads_intermediate * w.halo_padded
                                   + writes_intermediate * stored)
    a["dram_write_bytes"] = a["dram_write_bytes"] - writes_intermediate * stored
    a["vector_ops"] = a["vector_ops"] + writes_intermediate * copy * out + turned
    a["scratchpad_read_bytes"] = a["scratchpad_read_bytes"] + turned * L.itemsize
    a["scratchpad_write_bytes"] = a["scratchpad_write_bytes"] + turned * L.itemsize
    direct = writes_intermediate * (1 - copy) * stored
    a["accumulator_read_bytes"] = a["accumulator_read_bytes"] - direct
    a["accumulator_write_bytes"] = a["accumulator_write_bytes"] - direct
    return a
