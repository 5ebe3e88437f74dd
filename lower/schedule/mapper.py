"""The schedule: a mapping (tile sizes, switches) for every nest of every op, decided here once.

A node runs as loop nests: a conv-shaped node (conv, matmul, pooling) one, over output tiles
(lower.schedule.nest); a vector node (elementwise, reduction, copy, gather) one or several, over its
coalesced iteration space (lower.codegen.vector).  `make_schedule` maps each, and the emitter walks the
tiles of the mapping it finds in the Schedule; the `schedule` dump shows every one.

A conv-shaped nest's default mapping is lower.schedule.nest_map's search (a grid of candidate tilings
ranked by the nest's own cost); a vector nest's, a grid ranked by a pipeline estimate (map_vector).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from stagec.errors import InputError, TilingError
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import MAX_COUNT

from ..codegen.vector import LayoutViews, VectorNest, vector_jobs
from ..graph.graph_ir import OpKind
from .buffers import NO_EXTRAS, Extras, epilogue_extras
from .cascade import Cascade
from .cascade_map import choose_cascades
from .flash import choose_flash
from .flash_int8 import choose_int8_flash
from .layout import Layout
from .nest import SWITCHES, TILE_FIELDS, ConvProblem, LayerShape, TileMapping, conflicts
from .nest_cost import dma_cycles
from .nest_map import Candidates, fits, footprint, grid_axes, map_conv, map_window
from .rowwise import choose_rows
from .search import INSTRUCTION_CHARGE, tile_sizes
from .tensors import DTYPE_OF

VECTOR_SWITCHES = ("double_buffer",)   # the switches a vector-unit nest has (lower.codegen.vector): tiles, c=1


def _vector_estimate(nest: VectorNest, m: TileMapping, hw: HardwareConfig):
    """(scratchpad bytes, accumulator bytes, estimated cycles) of tilings `m` (numbers or arrays)
    of a vector-unit nest: what map_vector ranks and a caller's mapping is checked by."""
    d0, d1, d2 = nest.space
    loads, passes = nest.loads, nest.passes
    tile = m.tile_oh * m.tile_ow * m.tile_o
    spad, acc = nest.footprint(m)
    tiles = -(-d0 // m.tile_oh) * -(-d1 // m.tile_ow) * -(-d2 // m.tile_o)
    load = dma_cycles(loads, tile * nest.load_bytes, hw)
    store = dma_cycles(1, tile * nest.store_bytes, hw)
    vec = passes * np.ceil(tile / hw.vector_lanes)
    channel = tile * (nest.load_bytes + nest.store_bytes) / hw.dma_bandwidth_bytes_per_cycle
    busiest = np.maximum(np.maximum(load, store), np.maximum(vec, channel))
    cost = (np.where(m.double_buffer == 1, tiles * busiest + load + vec + store, tiles * (load + vec + store))
            + INSTRUCTION_CHARGE * tiles * (loads + 1 + np.ceil(passes)) - 1e-6 * m.tile_o)
    return spad, acc, cost


def map_vector(nest: VectorNest, hw: HardwareConfig, layer: str = "vector") -> TileMapping:
    """Tiles of a vector-unit nest (lower.codegen.vector.VectorNest: elementwise, reduce, copy, gather) over
    its 3-D iteration space, ranked by a pipeline estimate: the busiest of load queue, store queue,
    DRAM channel and vector unit, plus one tile's load, passes and store (the pipeline's fill and
    drain), so a tensor is cut into enough tiles to overlap, plus a charge per instruction (compile
    time, and issue); long innermost runs break ties (DMA bursts)."""
    m = grid_axes(*(tile_sizes(d) for d in nest.space), [1],
              *(s.grid if s.name in VECTOR_SWITCHES else (0,) for s in SWITCHES))
    spad, acc, cost = _vector_estimate(nest, m, hw)
    grid = Candidates(ConvProblem(1, 1, 1, 1, 1), m, True, spad, acc, cost)
    fit = grid.fit(hw)
    if not fit.any():
        raise grid.nothing_fits(hw, layer)
    return grid.candidate(int(np.flatnonzero(fit)[np.argmin(grid.values[0][fit])]))


# --- the schedule stage -----------------------------------------------------------------------

class ConvNest(NamedTuple):
    """A node that runs as a convolution: its kind, 'matrix' (conv/matmul on the array),
    'depthwise' or 'pool' (vector unit, per channel), its problem, and its epilogue's buffers
    (lower.schedule.buffers.Extras)."""

    kind: str
    problem: ConvProblem
    extras: Extras

    def __str__(self) -> str:
        p = self.problem
        return f"{self.kind} {p.oh}x{p.ow}x{p.o} ({p.kh}x{p.kw} over {p.c})"

    def footprint(self, m: TileMapping) -> tuple[int, int]:
        """(scratchpad, accumulator) bytes the nest holds under `m`."""
        return footprint(self.kind, self.problem, m, self.extras)


def node_problem(node) -> ConvNest | None:
    """The ConvNest (kind, problem, epilogue buffers) of a node that runs as a convolution, else None."""
    x = node.inputs[0]
    itemsize, out_itemsize = DTYPE_OF[x.dtype].itemsize, DTYPE_OF[node.output.dtype].itemsize
    # widened on copies per tile: the vector unit sums int8 in int32 and computes on bf16 in float32
    widens = x.dtype in ("int8", "bfloat16")
    if node.op == OpKind.CONV:
        (n, c, h, w), (o, cg, kh, kw) = x.shape, node.inputs[1].shape
        g = node.attr("groups")
        kind = "depthwise" if cg == 1 and o == g else "matrix"
        return ConvNest(kind, ConvProblem(n, c if kind == "depthwise" else cg, h, w,
                                          o if kind == "depthwise" else o // g, kh, kw, node.attr("stride"),
                                          node.attr("padding"), node.attr("dilation"), itemsize,
                                          kind == "depthwise" and widens, out_itemsize), epilogue_extras(node))
    if node.op == OpKind.MATMUL:
        (m, k), nn = x.shape[-2:], node.inputs[1].shape[-1]
        problem = ConvProblem(1, k, 1, m, nn, itemsize=itemsize, out_itemsize=out_itemsize)
        return ConvNest("matrix", problem, epilogue_extras(node))
    if node.op == OpKind.POOL:
        *_, c, h, w = x.shape
        (kh, kw), stride = node.attr("window"), node.attr("strides")
        return ConvNest("pool", ConvProblem(1, c, h, w, c, kh, kw, stride, node.attr("padding"),
                                            node.attr("dilation"), itemsize,
                                            widens and (x.dtype == "bfloat16" or node.attr("func") != "max"),
                                            out_itemsize), NO_EXTRAS)
    return None


def layer_nests(node, views, hw: HardwareConfig) -> tuple:
    """The nests a node runs, in order: a conv-shaped node's ConvNest; a vector node's
    lower.codegen.vector.VectorNests (`views`: lower.codegen.vector.LayoutViews of the layout)."""
    found = node_problem(node)
    if found is not None:
        return (found,)
    return tuple(job.nest(hw, node.name) for job in vector_jobs(views, node))


def layer_label(node) -> str:
    """How errors name a layer: its name in the schedule dump and its op."""
    return f"{node.name} ({node.op.value})"


def default_mapping(kind: str, p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS,
                    layer: str = "conv", objective: str = "latency") -> TileMapping:
    """The grid search's mapping of a node of `kind` (see node_problem) for `objective`."""
    if kind == "matrix":
        return map_conv(p, hw, extras, layer, objective=objective)
    return map_window(p, hw, extras, kind == "depthwise", layer, objective=objective)


def _default(nest, hw: HardwareConfig, label: str, objective: str) -> TileMapping:
    if isinstance(nest, VectorNest):   # its DRAM traffic is its tensors' whatever the tiling: latency decides
        return map_vector(nest, hw, label)
    return default_mapping(nest.kind, nest.problem, hw, nest.extras, label, objective)


def _given(given, nests: tuple, label: str) -> tuple:
    """A caller's mappings of a layer's nests: one TileMapping for each, or a sequence of one per nest."""
    if isinstance(given, TileMapping):
        return (given,) * len(nests)
    if not isinstance(given, (tuple, list)):
        raise InputError(f"{label}: a mapping is a lower.schedule.nest.TileMapping (or a sequence of one per nest), "
                         f"not {type(given).__name__}")
    if len(given) != len(nests):
        raise TilingError(f"{label}: {len(given)} mappings for a layer of {len(nests)} nests "
                          f"({', '.join(map(str, nests))})")
    return tuple(given)


def _check(nest, m: TileMapping, hw: HardwareConfig, label: str) -> None:
    """A caller's mapping of a nest: tile sizes within an instruction's counts, switches the nest
    has (that do not conflict), and buffers that fit."""
    if not isinstance(m, TileMapping):
        raise InputError(f"{label}: a mapping is a lower.schedule.nest.TileMapping, not {type(m).__name__}")
    if not all(1 <= getattr(m, f) <= MAX_COUNT for f in TILE_FIELDS):
        raise TilingError(f"{label}: mapping {m} has a tile size outside 1..{MAX_COUNT}")
    _check_switches(nest, m, label)
    spad, acc = nest.footprint(m)
    problem = nest.problem if isinstance(nest, ConvNest) else ConvProblem(1, 1, 1, 1, 1)   # a vector nest: no halo
    if not fits(problem, spad, acc, m.tile_oh, m.tile_ow, hw):
        raise TilingError(f"{label}: mapping {m} needs {int(spad)} bytes of scratchpad (has "
                          f"{hw.scratchpad_bytes}) and {int(acc)} bytes of accumulator (has {hw.accumulator_bytes})")


def _check_switches(nest, m: TileMapping, label: str) -> None:
    """A conv-shaped nest has the switches that exist for its LayerShape and do not conflict; a
    vector nest VECTOR_SWITCHES alone, and no channel tile."""
    if isinstance(nest, VectorNest):
        have, allowed = f"a vector-unit nest, {nest}", VECTOR_SWITCHES
        if m.tile_c != 1:
            raise TilingError(f"{label}: mapping {m} tiles c, which {have} does not have: c=1")
    else:
        p, L = nest.problem, LayerShape.of(*nest)
        have = f"{nest.kind}, {p.kh}x{p.kw}, stride {p.stride}, dilation {p.dilation}"
        allowed = {s.name for s in SWITCHES if s.exists(L) and not conflicts(m, L)}
    for s in SWITCHES:
        if getattr(m, s.name) and s.name not in allowed:
            raise TilingError(f"{label}: mapping {m} is {s.label}, which needs {s.needs} (have {have})")


@dataclass(frozen=True)
class Tiling:
    """One node's tiling: the nests it runs, in order (a conv-shaped node's ConvNest; a vector
    node's lower.codegen.vector.VectorNests: a pad's two, a concat's one per input), and each one's mapping."""

    nests: tuple
    mappings: tuple[TileMapping, ...]

    @property
    def mapping(self) -> TileMapping:
        """The mapping of a node of one nest (a conv-shaped node)."""
        (m,) = self.mappings
        return m

    def lines(self, name: str) -> list[str]:
        """The schedule dump's lines of the node called `name`: a nest's mapping [the nest] each."""
        return [f"{f'{name}:' if k == 0 else ' ' * (len(name) + 1)} {m}  [{nest}]"
                for k, (nest, m) in enumerate(zip(self.nests, self.mappings, strict=True))]


@dataclass(frozen=True)
class Schedule:
    """The tiling of every node that emits instructions, in program order, and the cascades
    (lower.schedule.cascade) some of them run in, whose members' tilings are the cascade's."""

    tilings: tuple[tuple[str, Tiling], ...]
    cascades: tuple[Cascade, ...] = ()

    @functools.cached_property
    def _by_name(self) -> dict[str, Tiling]:
        return dict(self.tilings)

    @functools.cached_property
    def _cascade_of(self) -> dict[str, Cascade]:
        return {name: c for c in self.cascades for name in c.layers}

    def __getitem__(self, name: str) -> Tiling:
        return self._by_name[name]

    def cascade_of(self, name: str) -> Cascade | None:
        """The cascade layer `name` runs in, or None."""
        return self._cascade_of.get(name)

    def __str__(self) -> str:
        lines = [f"  {line}" for name, t in self.tilings for line in t.lines(name)]
        return "schedule {\n" + "\n".join(lines + [f"  {c}" for c in self.cascades]) + "\n}"


def make_schedule(graph, layout: Layout, hw: HardwareConfig, mappings: dict | None = None,
                  objective: str = "latency", fuse_layers: bool = True) -> Schedule:
    """The tiling of every node that emits instructions (lower.schedule.layout: a view op only where it
    copies): `mappings[node name]` where given (a TileMapping, for each of the node's nests, or a
    sequence of one per nest; checked to fit), else the default mapper's for `objective`; with
    `fuse_layers`, the cascades that lower `objective` (lower.schedule.cascade_map; attention's,
    lower.schedule.flash) among the layers the caller did not map."""
    mappings = dict(mappings or {})
    given = frozenset(mappings)
    views = LayoutViews(layout)
    out = []
    for node in graph.nodes:
        if not layout.emits(node):
            continue
        nests, label = layer_nests(node, views, hw), layer_label(node)
        if node.name in mappings:
            chosen = _given(mappings.pop(node.name), nests, label)
            for nest, m in zip(nests, chosen, strict=True):
                _check(nest, m, hw, label)
        else:
            chosen = tuple(_default(nest, hw, label, objective) for nest in nests)
        out.append((node.name, Tiling(nests, chosen)))
    if mappings:
        raise InputError(f"mappings for layers the schedule does not have: {sorted(mappings)} (the schedule dump "
                         f"names every layer it tiles)")
    if not fuse_layers or objective == "size":   # a cascade's live tiles are what "size" is short of
        return Schedule(tuple(out))
    tilings = dict(out)
    cascades = choose_cascades(graph, layout, tilings, hw, objective, given)
    for c in cascades:
        for name, m in zip(c.layers, c.mappings, strict=True):
            tilings[name] = Tiling(tilings[name].nests, (m,))
    flash = choose_flash(graph, layout, tilings, hw, objective, given)   # its members keep their tilings
    flash += choose_int8_flash(graph, layout, tilings, hw, objective, given)
    taken = given | {name for c in (*cascades, *flash) for name in c.layers}
    rows = choose_rows(graph, layout, tilings, views, hw, objective, taken, lambda n, m: _vector_estimate(n, m, hw)[2])
    return Schedule(tuple((name, tilings[name]) for name, _ in out), tuple(cascades) + tuple(flash) + tuple(rows))
