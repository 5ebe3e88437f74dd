"""The default mapper of one conv-shaped nest (a conv, matmul, depthwise conv or pooling): a small grid of
candidate tile sizes per dim (powers of two, the whole dim, balanced splits) crossed with every switch,
what fits the scratchpad and accumulator, ranked by the nest's own cost (lower.schedule.nest_cost: what
the cost model relaxes) plus a charge per instruction.  What fits is the buffers lower.schedule.nest_work
and lower.schedule.buffers list for the nest, the buffers the emitter then allocates; when nothing fits,
the TilingError names the layer, the memory, the bytes the smallest tiling needs there and its capacity.
lower.schedule.mapper maps every nest of a graph with it.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import fields

import numpy as np

from stagec.errors import InputError, TilingError
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import MAX_COUNT
from stagec.sim.energy import energy_pj

from .buffers import NO_EXTRAS, Extras
from .nest import MATRIX, SWITCHES, TILE_FIELDS, ConvProblem, Exact, LayerShape, TileMapping, conflicts
from .nest_cost import bound, nest_cost
from .nest_work import footprint as nest_footprint
from .nest_work import matmul_k
from .search import INSTRUCTION_CHARGE, OBJECTIVES, objective_of, tile_sizes

FIRST_COMPOSED = 256       # candidates map_nest composes the latency of before it prunes by the bound


def grid_axes(*values) -> TileMapping:
    """A TileMapping grid: each field's candidate values along an axis of its own."""
    shape = [1] * len(values)
    return TileMapping(*(np.asarray(v).reshape(shape[:i] + [-1] + shape[i + 1:]) for i, v in enumerate(values)))


def candidates(L: LayerShape) -> tuple[TileMapping, np.ndarray]:
    """The mapper's grid for a layer (tile sizes, then every switch of lower.schedule.nest.SWITCHES where it
    exists), and which of its points are candidates: no conflicting switches, a MATMUL's k within
    its 16-bit count."""
    fold = L.kw if L.dilation_w == 1 else 1   # MATMUL's k covers a kernel row: kw * tc <= the count limit
    m = grid_axes(tile_sizes(L.oh), tile_sizes(L.ow), tile_sizes(L.o),
              tile_sizes(L.c, MAX_COUNT // fold) if L.kind == MATRIX else [1],
              *(s.grid if s.exists(L) else (0,) for s in SWITCHES))
    # a single accumulator tile is a double-buffered nest's choice; resident weights, one channel tile
    ok = ~conflicts(m, L) & ((m.single_acc == 0) | (m.double_buffer == 1))
    ok = ok & ((m.weights_resident == 0) | (m.tile_c == L.c))
    return m, ok & (matmul_k(L, m, np) <= MAX_COUNT)


def _at(m: TileMapping, shape, idx) -> TileMapping:
    """The grid's points at flat indices `idx` of `shape`, as a TileMapping of arrays."""
    pos = np.unravel_index(idx, shape)
    # NOTE: a field varies along the grid's axes where its own shape is not 1: indexing those alone
    # is what indexing it broadcast to the whole grid gives, without building that index per field
    return TileMapping(*(_field_at(np.asarray(getattr(m, f.name)), shape, pos) for f in fields(m)))


def _field_at(v: np.ndarray, shape, pos) -> np.ndarray:
    lead = len(shape) - v.ndim
    axes = [a for a in range(v.ndim) if v.shape[a] != 1]
    if not axes:
        return np.broadcast_to(v.reshape(()), np.shape(pos[0]))
    flat = v.reshape([v.shape[a] for a in axes])
    return flat[tuple(pos[lead + a] for a in axes)]


def _candidate(m: TileMapping, shape, k: int) -> TileMapping:
    """The grid's point k, as a TileMapping of numbers."""
    point = _at(m, shape, k)
    return TileMapping(*(int(getattr(point, f)) for f in TILE_FIELDS),
                       *(bool(getattr(point, s.name)) for s in SWITCHES))


def fits(p: ConvProblem, spad, acc, th, tw, hw: HardwareConfig):
    """Which candidates fit the memories (and the DMA's halo limit)."""
    ih, iw = p.halo(th, tw)
    return (spad <= hw.scratchpad_bytes) & (acc <= hw.accumulator_bytes) & (np.maximum(ih, iw) <= MAX_COUNT)


def footprint(kind: str, p: ConvProblem, m: TileMapping, extras=NO_EXTRAS) -> tuple[int, int]:
    """(scratchpad, accumulator) bytes of one mapping of a node of `kind` (see node_problem)."""
    spad, acc = nest_footprint(LayerShape.of(kind, p, extras), m, np)
    return int(spad), int(acc)


class Candidates:
    """A grid flattened: which points are candidates, and their bytes of scratchpad and accumulator
    and halo extent, each a flat array over the grid's points."""

    def __init__(self, p: ConvProblem, m: TileMapping, ok, spad, acc, *values):
        self.shape = np.broadcast_shapes(*(np.shape(v) for v in (ok, spad, acc, m.tile_oh, m.tile_ow, *values)))
        self.p, self.m = p, m
        self.ok, self.spad, self.acc, *self.values = (np.broadcast_to(v, self.shape).reshape(-1)
                                                      for v in (ok, spad, acc, *values))
        self.halo_ok = np.broadcast_to(fits(p, 0, 0, m.tile_oh, m.tile_ow, HardwareConfig()), self.shape).reshape(-1)

    def fit(self, hw: HardwareConfig):
        return self.ok & self.halo_ok & (self.spad <= hw.scratchpad_bytes) & (self.acc <= hw.accumulator_bytes)

    def candidate(self, k: int) -> TileMapping:
        return _candidate(self.m, self.shape, k)

    def nothing_fits(self, hw: HardwareConfig, layer: str | None) -> TilingError:
        """The error when no candidate fits: the memory no tiling fits, the bytes the smallest tiling
        needs there (of those that fit the other memory, when there are any) and its capacity."""
        where = f"{layer}: " if layer else ""
        halo_ok = self.ok & self.halo_ok
        if not halo_ok.any():
            return TilingError(f"{where}no tiling fits the DMA: every tile's input halo spans over {MAX_COUNT} rows "
                               f"or columns")
        memories = (("scratchpad", self.spad, hw.scratchpad_bytes), ("accumulator", self.acc, hw.accumulator_bytes))
        for (memory, need, capacity), (other, other_need, other_capacity) in (memories, memories[::-1]):
            other_ok = halo_ok & (other_need <= other_capacity)
            if other_ok.any():   # else the other memory is the one no tiling fits
                k = int(np.argmin(np.where(other_ok, need, np.iinfo(np.int64).max)))
                among = f" (of those that fit the {other}'s {other_capacity} bytes)" \
                    if need[k] > need[halo_ok].min() else ""
                return TilingError(f"{where}no tiling fits the {memory}: the smallest tiling{among}, "
                                   f"{self.candidate(k)}, needs {int(need[k])} bytes of {memory}, which has {capacity}")
        raise AssertionError("unreachable: some candidate fits one memory or neither fits")


def map_conv(p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS, layer: str = "conv", with_cost: bool = False,
             objective: str = "latency"):
    """Default mapping on the matrix unit (see map_nest)."""
    return map_nest("matrix", p, hw, extras, layer, with_cost, objective)


def map_window(p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS, weighted: bool = True,
               layer: str = "window", with_cost: bool = False, objective: str = "latency"):
    """Default mapping of depthwise conv (`weighted`) / pooling on the vector unit (see map_nest)."""
    return map_nest("depthwise" if weighted else "pool", p, hw, extras, layer, with_cost, objective)


def map_nest(kind: str, p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS, layer: str = "conv",
             with_cost: bool = False, objective: str = "latency"):
    """Default mapping of a node of `kind` (see node_problem): the candidate tiling (sizes from a small
    grid per dim, every switch) that fits and minimizes `objective` (OBJECTIVES) of the nest's cycles
    (lower.schedule.nest_cost, exact) plus a charge per instruction (compile time and program size: of
    mappings about as fast, the one of fewer, longer instructions) and of its energy over those
    cycles (sim.energy: a mapping that re-reads weights from DRAM to keep the array a little busier
    is faster and costs DRAM energy) (`with_cost`: (mapping, its cycles))."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
    found = _map_nest(kind, p, hw, Extras(*extras), objective)
    if isinstance(found, TilingError):
        raise TilingError(f"{layer}: {found}")
    return found if with_cost else found[0]


CAPACITIES = ("scratchpad_bytes", "scratchpad_banks", "accumulator_bytes", "accumulator_banks")
_PRICING = HardwareConfig()     # the capacities a pricing key takes (any valid ones: see priced_on)


def priced_on(hw: HardwareConfig) -> HardwareConfig:
    """`hw` with the memories' capacities and banks of one fixed config: a nest's cycles, instructions,
    action counts and footprint depend on every other field, the capacities deciding only which
    tilings fit (tests/test_shared_pricing.py holds the nest to it), so configs that differ in their
    memories alone can share one pricing of a layer's candidates (shared_pricing)."""
    return hw.replace(**{f: getattr(_PRICING, f) for f in CAPACITIES})


@functools.lru_cache(maxsize=4096)
def _map_nest(kind: str, p: ConvProblem, hw: HardwareConfig, extras: Extras, objective: str):
    """map_nest's search, once per problem, config, epilogue and objective (networks repeat their layer
    shapes): (mapping, cycles), or the TilingError, its message without the layer's name.  Every
    candidate gets a cheap lower bound of its objective (lower.schedule.nest_cost.bound: of the
    cycles; energy is the exact action counts' over those cycles, whose leakage only grows with the
    true ones); the full cost is composed for the most promising ones, then for every other whose
    bound is below the best found: the same choice as composing it for all.  "size" minimizes
    cycles x local footprint (scratchpad plus accumulator bytes): the smallest footprint alone picks
    byte-sized tiles thousands of times slower, the product the tiling that gives up the least time
    per byte saved.  Its bound is loose at small tiles, so "size" composes only the FIRST_COMPOSED
    best by the bound (pruning the rest by it took minutes on MobileNetV2)."""
    priced = _priced(kind, p, priced_on(hw), extras, objective)
    grid = priced.grid
    fit = grid.fit(hw)
    if not fit.any():
        return grid.nothing_fits(hw, None)
    low = np.where(fit, grid.values[0], np.inf)
    # shared (shared_pricing), what was composed for other memories may fit these and need no more
    if objective == "size" or not priced.best(fit)[2] < np.inf:
        first = np.argpartition(low, FIRST_COMPOSED)[:FIRST_COMPOSED] if low.size > FIRST_COMPOSED \
            else np.arange(low.size)
        first = first[np.isfinite(low[first])]
        priced.compose(first)
        if objective == "size":
            fit = np.isin(np.arange(fit.size), first)
    if objective != "size":       # every other that fits and whose bound does not exceed the best so far
        priced.compose(np.flatnonzero(low <= priced.best(fit)[2]))
    k, cycles, _ = priced.best(fit)
    return grid.candidate(k), cycles


class _Priced:
    """A layer's candidates priced on a config but for its capacities (priced_on): their bounds, and
    the composed (cycles, objective) of those composed so far, by flat index."""

    def __init__(self, kind: str, p: ConvProblem, hw: HardwareConfig, extras: Extras, objective: str):
        self.L, self.hw, self.objective = LayerShape.of(kind, p, extras), hw, objective
        self.counted = objective in ("energy", "edp")
        m, ok = candidates(self.L)
        cycles, instructions, spad, acc, *counts = bound(self.L, m, hw, self.counted)
        charged = cycles + INSTRUCTION_CHARGE * instructions
        energy = sum(energy_pj(counts[0], charged, hw).values()) if self.counted else 0
        self.grid = Candidates(p, m, ok, spad, acc, _value(charged, energy, spad + acc, objective))
        self.index, self.cycles, self.value = (np.zeros(0, t) for t in (np.int64, np.float64, np.float64))

    def compose(self, idx):
        """Compose the cost of the candidates at flat indices `idx` not composed yet."""
        new = np.setdiff1d(idx, self.index)
        if not new.size:
            return
        cost = nest_cost(self.L, _at(self.grid.m, self.grid.shape, new), self.hw, Exact)
        charged = cost.cycles + INSTRUCTION_CHARGE * cost.instructions
        energy = sum(energy_pj(cost.actions, charged, self.hw).values()) if self.counted else 0
        value = _value(charged, energy, self.grid.spad[new] + self.grid.acc[new], self.objective)
        self.index, self.cycles, self.value = (np.concatenate([a, np.broadcast_to(v, new.shape)]) for a, v in
                                               ((self.index, new), (self.cycles, cost.cycles), (self.value, value)))

    def best(self, fit) -> tuple[int, float, float]:
        """(flat index, cycles, objective) of the cheapest composed candidate that fits (of equals, the
        first in grid order); objective inf where none does."""
        ok = fit[self.index]
        if not ok.any():
            return -1, np.inf, np.inf
        at = np.flatnonzero(ok)[np.lexsort((self.index[ok], self.value[ok]))[0]]
        return int(self.index[at]), float(self.cycles[at]), float(self.value[at])


_sharing: list = []      # shared_pricing's caches, innermost last


@contextlib.contextmanager
def shared_pricing(maxsize: int = 64):
    """Within it, map_nest prices a layer's candidates once per config but for its capacities
    (priced_on) and reuses that for configs that differ in their memories alone: codesign's exact
    search scores hundreds of such configs.  A layer's grid is up to ~17 MB, so `maxsize` are kept,
    and nothing once the block ends (a compile prices each layer on one config)."""
    _sharing.append(functools.lru_cache(maxsize)(_Priced))
    try:
        yield
    finally:
        _sharing.pop()


def _priced(*key) -> _Priced:
    return _sharing[-1](*key) if _sharing else _Priced(*key)


def random_mapping(kind: str, p: ConvProblem, hw: HardwareConfig, rng: np.random.Generator, extras=NO_EXTRAS,
                   layer: str = "conv") -> TileMapping:
    """A mapping drawn uniformly from the candidates of map_nest's grid that fit `hw`: the legal
    mapping space a random search samples (DOSA's random baseline draws hardware and mappings both)."""
    L = LayerShape.of(kind, p, Extras(*extras))
    m, ok = candidates(L)
    grid = Candidates(p, m, ok, *nest_footprint(L, m, np))
    fit = np.flatnonzero(grid.fit(hw))
    if not fit.size:
        raise TilingError(f"{layer}: {grid.nothing_fits(hw, None)}")
    return grid.candidate(int(rng.choice(fit)))


def _value(charged, energy, footprint, objective: str):
    """What _map_nest ranks by: compile's objective of the charged cycles and energy, or for "size"
    the charged cycles times the local footprint (bytes)."""
    return charged * footprint if objective == "size" else objective_of(charged, energy, objective)
