"""Which layers run as cascades (lower.schedule.cascade), and their tiles: decided by the cost.

A chain is a run of consecutive emitted pointwise layers (`member`; a depthwise one too, `follows`),
each one's result read by the next alone (not a graph output, no other reader).  Each segment of a
chain of up to MAX_MEMBERS layers (MAX_SPAN with two depthwise members: across a block boundary,
lower.schedule.halo's stacked halos, on a thinner grid) gets its best cascade tiling (`map_cascade`: a grid of spatial
tiles crossed with each member's output-channel tile and weight residency, chunked or not
(lower.schedule.cascade) and the halo strategy (lower.schedule.halo), what fits the scratchpad and
accumulator, ranked by compile's objective of the cascade's cost); a chain is then
cut into the segments of least total objective, a segment of one layer being the layer as the
default mapper tiled it.
A cascade that does not fit, or costs more, is thus split, never emitted illegally.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from stagec.isa.instructions import MAX_COUNT
from stagec.sim.energy import ActionCounts, energy_pj

from ..graph.graph_ir import OpKind
from .cascade import MAX_MEMBERS, MAX_SPAN, Cascade, cascade_cost, chunk_at
from .halo import (
    LINE,
    depthwise_at,
    halo_members,
    halos,
    line_buffers,
    line_reads_input,
    pointwise,
    targets,
    window_tile,
)
from .nest import MATRIX, Exact, LayerShape, TileMapping, dots, stacks
from .nest_cost import nest_cost
from .search import CASCADE_INSTRUCTION_CHARGE, objective_of, tile_sizes
from .tensors import DTYPE_OF

FUSED_DTYPES = ("float32", "int8", "bfloat16")   # intermediates the scratchpad holds as the next layer reads them
# the halo strategies map_cascade weighs (lower.schedule.halo), all where None; tests force one (a chain
# that cannot take the one forced is then not fused)
HALOS = None


def member(node, graph, nest) -> bool:
    """Whether a node (its first nest `nest`, the mapper's) can be a cascade's member: a matrix-unit
    matmul of constant weights and no batch, or a convolution of one group (pointwise, or any other
    leading a cascade ahead of a depthwise one: lower.schedule.halo), on FUSED_DTYPES operands; or a
    depthwise convolution of one such type in and out (leading one, or after the ones that compute its
    input windows)."""
    kind = getattr(nest, "kind", None)
    if kind == "depthwise":
        # its type in and out (an int8 graph's float depthwise conv may requantize its result: not a member)
        return node.inputs[0].dtype == node.output.dtype in FUSED_DTYPES
    if kind != "matrix" or node.inputs[0].dtype not in FUSED_DTYPES:
        return False
    if node.op == OpKind.MATMUL:
        return math.prod(node.output.shape[:-2]) == 1 and node.inputs[1].id in graph.constants
    return node.op == OpKind.CONV and node.attr("groups") == 1


def chains(graph, layout, tilings: dict, excluded) -> list[list]:
    """Maximal runs of consecutive emitted members, each one's output read by the next alone (through
    reshapes that are views, lower.schedule.layout, read by nothing else)."""
    uses, producer = graph.consumers(), graph.producer()
    outputs = {v.id for v in graph.outputs}

    def alone(v) -> bool:
        return len(uses.get(v.id, ())) == 1 and v.id not in outputs

    def source(v):
        """The value `v` views, through single-use reshapes that emit nothing."""
        p = producer.get(v.id)
        while p is not None and p.op == OpKind.RESHAPE and not layout.emits(p) and alone(p.inputs[0]):
            v = p.inputs[0]
            p = producer.get(v.id)
        return v

    runs, run = [], []
    for node in (n for n in graph.nodes if layout.emits(n)):
        ok = member(node, graph, tilings[node.name].nests[0]) and node.name not in excluded
        last = run[-1].output if run else None
        linked = (ok and run and alone(node.inputs[0]) and source(node.inputs[0]).id == last.id and alone(last)
                  and node.inputs[0].dtype == last.dtype
                  and follows(tilings[run[-1].name].nests[0], tilings[node.name].nests[0]))
        if linked:
            run.append(node)
            continue
        if len(run) > 1:
            runs.append(run)
        run = [node] if ok else []
    return runs + ([run] if len(run) > 1 else [])


def follows(before, nest) -> bool:
    """Whether nest `nest` can follow nest `before` in a cascade: a pointwise matrix-unit one over the same
    pixels after any but a k x k one, or a depthwise one over a matrix-unit one's result
    (lower.schedule.halo: that recomputes the depthwise's input windows)."""
    p, q = before.problem, nest.problem
    if nest.kind == "matrix":
        leads = before.kind == "matrix" and not pointwise(LayerShape.of("matrix", p))
        return not leads and pointwise(LayerShape.of("matrix", q)) and (p.n, p.oh, p.ow) == (q.n, q.oh, q.ow)
    return nest.kind == "depthwise" and before.kind == "matrix" and (p.n, p.oh, p.ow) == (q.n, q.h, q.w)


def _options(dim: int, cols: int) -> np.ndarray:
    """Output-channel tiles a member may take: the whole dim, multiples of the array's columns."""
    sizes = tile_sizes(dim)
    return sizes[(sizes == dim) | (sizes % cols == 0)]


def _charged(cycles, instructions, actions: ActionCounts, hw, objective: str):
    charged = cycles + CASCADE_INSTRUCTION_CHARGE * instructions
    energy = sum(energy_pj(actions, charged, hw).values())
    return charged, energy, objective_of(charged, energy, objective)


def _mappings(Ls, axes, double, stacked=0) -> list[TileMapping]:
    """Each member's mapping from `axes` (spatial tile, then per member its output-channel tile and
    weight residency (a depthwise member's: its dot mapping, lower.schedule.nest.TileMapping), then the
    last member's single accumulator tile and whether chunked; arrays of the grid, or the picked
    numbers), a k x k first member's kernel rows `stacked` or not.  A member's channel tiles are the
    one before's output-channel tiles (lower.schedule.cascade), a depthwise member's one (its nest's)
    and its output-channel tiles the one before's; a member ahead of a depthwise one tiles its input windows
    (lower.schedule.halo); chunked, the last matrix member's output tile is all its channels."""
    th, tw = axes[0], axes[1]
    outs = [axes[2 + 2 * i] for i in range(len(Ls))]
    for d in halo_members(Ls):
        outs[d] = outs[d - 1]
    if Ls[-1].kind == MATRIX:
        outs[-1] = axes[-1] * Ls[-1].o + (1 - axes[-1]) * outs[-1]   # numbers, grids or relaxed (costmodel.fusion)
    wins = targets(Ls, np)
    return [TileMapping(*(window_tile(wins[i], th, tw) if wins[i] is not None else (th, tw)), outs[i],
                        outs[i - 1] if i else L.c if L.kind == MATRIX else 1, double,
                        axes[3 + 2 * i] if L.kind == MATRIX else False, axes[-2] if i == len(Ls) - 1 else 0,
                        stacked=stacked if i == 0 else False, dot=False if L.kind == MATRIX else axes[3 + 2 * i])
            for i, L in enumerate(Ls)]


class Mapped(NamedTuple):
    """A cascade's tiling as map_cascade picks it: spatial tile, member mappings, the chunked member (or
    None), its halo strategy (or None), and its charged cycles, energy and objective."""

    tile: tuple
    mappings: tuple
    chunk: int | None
    halo: str | None
    cycles: float
    energy: float
    value: float


def map_cascade(nests, hw, objective: str) -> Mapped | None:
    """The cheapest cascade tiling of members `nests` (the mapper's ConvNests), or None when no tiling fits:
    one grid over both halo strategies (lower.schedule.halo; those of HALOS where set), a `line` axis."""
    Ls = [LayerShape.of(nest.kind, nest.problem, nest.extras) for nest in nests]
    strategies = [h for h in halos(Ls) if h is None or HALOS is None or h in HALOS]
    hs = halo_members(Ls)
    # a depthwise member leads or follows a matrix one; more than MAX_MEMBERS only across a block
    # boundary (two depthwise members: stacked halos)
    windowed = sum(L.kind != MATRIX for L in Ls)
    if (max(L.c for L in Ls) > MAX_COUNT or windowed > 2 or len(Ls) > MAX_MEMBERS and windowed < 2
            or not strategies or any(Ls[h - 1].kind != MATRIX for h in hs)):
        return None
    if not all(L.kind != MATRIX or pointwise(L) or not i and hs[:1] == [1] for i, L in enumerate(Ls)):
        return None     # a k x k convolution leads a cascade, just ahead of its first depthwise member
    d = depthwise_at(Ls)
    axes = [tile_sizes(Ls[d].oh), tile_sizes(Ls[d].ow)]
    for i, L in enumerate(Ls):   # output-channel tiles (a depthwise member's after the first: the one
        # ahead's), weight residency (a depthwise member's are whole, held throughout: its dot mapping);
        # a long cascade's members before the last: resident weights, three tiles at most (its grid)
        long = len(Ls) > MAX_MEMBERS and i < len(Ls) - 1
        sizes = _options(L.o, hw.array_cols)
        sizes = sizes[np.unique([0, len(sizes) // 2, len(sizes) - 1])] if long else sizes
        axes += [np.array([0]) if i in hs else sizes,
                 np.array([1] if long else [1, 0]) if L.kind == MATRIX else np.array([0, 1] if dots(L) else [0])]
    # the last member's single accumulator tile (a chunked one's holds every channel); chunked (its
    # last MATMULs' n is the o)
    axes += [np.array([0, 1] if Ls[-1].kind == MATRIX else [0]), np.array([0, 1] if Ls[-1].o <= MAX_COUNT else [0])]
    # the line axis first, so that a tie goes to recomputing, as it went when each strategy had a grid;
    # then a k x k first member's kernel rows stacked or not (what its line buffer needs: line_buffers)
    lines = np.array([int(h == LINE) for h in strategies])
    stack = np.array([0, 1] if stacks(Ls[0]) else [0])
    grid = [np.asarray(a).reshape([1] * i + [-1] + [1] * (len(axes) + 1 - i))
            for i, a in enumerate([lines, stack, *axes])]
    line, stacked, chunked = grid[0], grid[1], grid[-1]
    ms = _mappings(Ls, grid[2:], 1, stacked)
    cost = cascade_cost(Ls, ms, hw, Exact, chunked, line)
    charged, energy, value = _charged(cost.cycles, cost.instructions, cost.actions, hw, objective)
    shape = np.broadcast_shapes(*(np.shape(g) for g in grid))
    # a line buffer holds its rows' every channel (not chunked) and its windows' new rows read the input
    reads = [line_reads_input(w, grid[2]) for w in targets(Ls, np) if w is not None]    # each window buffered
    legal = (line == 0) | ((chunked == 0) & line_buffers(Ls, stacked) & np.logical_and.reduce(reads)) \
        if lines.any() else True
    fit = np.broadcast_to((cost.spad_bytes <= hw.scratchpad_bytes) & (cost.acc_bytes <= hw.accumulator_bytes)
                          & legal, shape)
    if not fit.any():
        return None
    value = np.where(fit, np.broadcast_to(value, shape), np.inf)
    at = np.unravel_index(int(np.argmin(value)), shape)
    pick = [int(a[i]) for a, i in zip(axes, at[2:], strict=True)]
    pick = [bool(v) if i > 2 and i % 2 or i == len(pick) - 2 else v for i, v in enumerate(pick)]   # the switches
    mappings = tuple(dataclasses.replace(m, tile_o=int(m.tile_o), single_acc=bool(m.single_acc))
                     for m in _mappings(Ls, pick, True, bool(stack[at[1]])))
    return Mapped((pick[0], pick[1]), mappings, chunk_at(Ls) if pick[-1] else None, strategies[at[0]],
                  float(np.broadcast_to(charged, shape)[at]), float(np.broadcast_to(energy, shape)[at]),
                  float(value[at]))


def layer_cost(nest, m: TileMapping, hw, objective: str):
    """(charged cycles, energy, objective) of a layer run alone as the default mapper tiled it."""
    L = LayerShape.of(nest.kind, nest.problem, nest.extras)
    cost = nest_cost(L, m, hw, Exact)
    return _charged(cost.cycles, cost.instructions, cost.actions, hw, objective)


def saved_bytes(nodes) -> int:
    """DRAM bytes the intermediates of a cascade of `nodes` would move layer by layer: a STORE and a LOAD."""
    return sum(2 * math.prod(n.output.shape) * DTYPE_OF[n.output.dtype].itemsize for n in nodes[:-1])


def choose_cascades(graph, layout, tilings: dict, hw, objective: str, excluded) -> list[Cascade]:
    """The cascades of least objective over every chain (module doc); `tilings`: node name -> the
    default mapper's Tiling, `excluded`: layers the caller mapped.  Each prefix of a chain keeps its
    cheapest cut by the objective of its summed cycles and energy (EDP is not a sum over segments)."""
    found = []
    for run in chains(graph, layout, tilings, excluded):
        nests = [tilings[node.name].nests[0] for node in run]
        alone = [layer_cost(nest, tilings[node.name].mapping, hw, objective)[:2]
                 for nest, node in zip(nests, run, strict=True)]
        best = [(0.0, 0.0, [])]          # best[j]: (cycles, energy, cascades) of run[:j]
        for j in range(1, len(run) + 1):
            cycles, energy, cut = best[j - 1]
            options = [(cycles + alone[j - 1][0], energy + alone[j - 1][1], cut)]
            for i in range(max(0, j - MAX_SPAN), j - 1):
                mapped = map_cascade(nests[i:j], hw, objective)
                if mapped is not None:
                    cascade = Cascade(tuple(n.name for n in run[i:j]), mapped.tile, mapped.mappings,
                                      saved_bytes(run[i:j]), mapped.chunk, mapped.halo)
                    options.append((best[i][0] + mapped.cycles, best[i][1] + mapped.energy,
                                    best[i][2] + [cascade]))
            best.append(min(options, key=lambda o: objective_of(o[0], o[1], objective)))
        found += best[-1][2]
    return found
