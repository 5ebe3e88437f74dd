"""What a loop nest costs: its units' work (lower.schedule.nest_work) composed into a latency, with its
actions (lower.schedule.nest_energy), footprint and legality: `nest_cost`, what the mapper ranks and the
cost model relaxes.

The units are sim.timing's: in-order LOAD, MATRIX, VECTOR and STORE queues, one DRAM channel the
two DMA queues share, served in the order the DMAs start.  The composition:

  single-buffered: a step's LOADs wait for the last step's compute, so steps run in series;
      between output tiles, the transition: the next LOADs, the epilogue and its STORE overlap,
      on the shared channel, until the next tile's operands are in and its accumulator is free.
  double-buffered: a flow shop of reduction steps (LOADs, compute) and output tiles (epilogue,
      STORE): each step at its pace (the slower of its compute and its LOADs), a stall where a
      step's LOADs, issued when the compute two steps back ends, do not fit under a smaller
      step's (the next tile after a channel remainder, after the epilogue's LOADs, behind a
      STORE on the channel), with the first step's LOADs to fill and the last tile's epilogue and
      STORE to drain; or the slowest unit, or the cycle through an accumulator or result buffer.
Resident weights and the epilogue's whole vectors load first.  Written over an ops namespace
(lower.schedule.nest.Exact, costmodel.smooth.Relaxed), like the counts it composes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import jax

from stagec.sim.energy import ActionCounts

from .buffers import local_bytes
from .nest import DEPTHWISE, MATRIX, Exact, LayerShape, TileMapping, tile_grid
from .nest_energy import actions
from .nest_work import (
    Work,
    limits,
    matrix_buffers,
    matrix_work,
    step_compute,
    waits,
    window_buffers,
    window_work,
)


@dataclass(frozen=True)
class CostConstants:
    """The composition's free constants (fitted to the simulator by costmodel.calibrate).

    fill: share of its first step's LOADs and its last tile's epilogue and STORE a double-buffered
        pipeline pays to fill and drain;
    overlap: how much of a single-buffered nest's transition between output tiles overlaps (the
        next LOADs with the epilogue and STORE, on the shared channel) as modeled (1) or none (0);
    per_instruction: cycles of issue overhead per instruction.
    """

    fill: object = 1.0
    overlap: object = 1.0
    per_instruction: object = 0.0


jax.tree_util.register_dataclass(CostConstants, data_fields=[f.name for f in fields(CostConstants)], meta_fields=[])
DEFAULT_CONSTANTS = CostConstants()


def dma_cycles(dmas, nbytes, hw):
    """Cycles a DMA queue is busy with `dmas` instructions moving `nbytes` in all."""
    return dmas * hw.dma_latency_cycles + nbytes / hw.dma_bandwidth_bytes_per_cycle


class Jobs(NamedTuple):
    """A nest's work per job: a reduction step's halo (per halo pass) and weight LOADs, its compute;
    an output tile's epilogue LOADs, vector cycles (`epilogue`), those of them that free its
    accumulator (`release`) and its STORE.  DMAs as (queue cycles, channel cycles)."""

    halo: tuple
    weights: tuple
    compute: object
    extra: tuple
    epilogue: object
    release: object
    store: tuple


def jobs(w: Work, release, hw, xp) -> Jobs:
    bw = hw.dma_bandwidth_bytes_per_cycle
    steps, tiles = xp.maximum(w.steps, 1), xp.maximum(w.tiles, 1)
    passes = xp.maximum(w.halo_tiles * steps / tiles, 1)

    def per(dmas_bytes, n):
        return dma_cycles(*dmas_bytes, hw) / n, dmas_bytes[1] / bw / n

    return Jobs(per(w.halo, passes), per(w.weights, steps), w.compute / steps, per(w.extra, tiles),
                w.epilogue / tiles, release / tiles, per(w.store, tiles))


def transition(j: Jobs, halo, store_gates, release_reads_extra, hw, xp, overlap):
    """Cycles from a single-buffered nest's last MATMUL of an output tile to the next tile's first.
    The epilogue's LOADs, queued behind the tile's last step's, end first; then the next step's halo
    (where `halo`) and weights LOAD while the epilogue runs and the STORE follows it; the DRAM
    channel serves them in the order they start, and the next tile starts when its operands are in
    and its accumulator is free (the release done, after the epilogue's LOADs where
    `release_reads_extra`; the STORE done, where it reads it).  `overlap` (1: as modeled) blends in
    the same in series."""
    lat = hw.dma_latency_cycles
    start = xp.maximum(j.extra[0] - j.compute, 0)
    h_end = start + halo * j.halo[0]
    e_end = start + j.epilogue
    weights = j.weights[0] > 0
    store_first = e_end < h_end                       # the STORE starts while the halo is loading
    s_grant = xp.maximum(e_end + lat, h_end)
    w_end = xp.where(store_first, xp.maximum(h_end + lat, s_grant + j.store[1]), h_end + lat) + j.weights[1]
    w_end = xp.where(weights, w_end, h_end)
    s_end = xp.where(store_first | ~weights, s_grant, xp.maximum(e_end + lat, w_end)) + j.store[1]
    release = j.release + release_reads_extra * start
    overlapped = xp.maximum(w_end, xp.maximum(release, store_gates * s_end))
    in_series = start + halo * j.halo[0] + j.weights[0] + j.epilogue + store_gates * j.store[0]
    return overlap * overlapped + (1 - overlap) * in_series


def result_chain(j: Jobs, hw, xp):
    """Cycles per output tile of a single-buffered nest with one result (or turned) tile: its
    epilogue waits for the last tile's STORE, which waits on the DRAM channel for the next tile's
    epilogue LOADs (issued once the epilogue has read its inputs, half way through on average)."""
    return xp.maximum(j.epilogue + j.store[0], j.epilogue / 2 + hw.dma_latency_cycles + j.extra[1] + j.store[1])


def serial(w: Work, j: Jobs, store_gates, release_reads_extra, single_result, hw, xp, k: CostConstants):
    """A single-buffered nest: every step's LOADs wait for the last step's MATMULs, so steps run in
    series; between output tiles, the transition.  With one result (or turned) tile, each tile's
    epilogue waits for the last tile's STORE; and the DRAM channel moves everything."""
    first_halo = xp.minimum(w.halo_tiles, 1)
    inner = (w.steps - w.tiles) * (j.halo[0] * (w.halo_tiles == w.tiles) + j.weights[0])
    with_halo, without = transition(j, xp.asarray([1.0, 0.0]).reshape((2,) + (1,) * xp.ndim(j.halo[0])),
                                    store_gates, release_reads_extra, hw, xp, k.overlap)
    turns = (w.halo_tiles - first_halo) * with_halo + (w.tiles - w.halo_tiles - (1 - first_halo)) * without
    fill = j.halo[0] + j.weights[0]
    steps = fill + w.compute + inner + turns + j.epilogue + j.store[0]
    results = fill + w.compute / xp.maximum(w.tiles, 1) + w.tiles * result_chain(j, hw, xp)
    channel = hw.dma_latency_cycles + (w.loads[1] + w.store[1]) / hw.dma_bandwidth_bytes_per_cycle
    return xp.maximum(xp.maximum(steps, single_result * results), channel)


class Pace(NamedTuple):
    """A double-buffered nest's steps: summed over them, the slower of each step's compute and its
    LOADs (`paced`: how fast steps alike follow one another); and (compute, LOADs) of an output
    tile's first and last step, where a step follows a smaller one across tiles (the halo of the
    next spatial tile, the next tile's full channel tile after a remainder) and stalls."""

    paced: object
    first: tuple
    before_last: tuple
    last: tuple
    first_halo: object


def matrix_pace(L: LayerShape, m: TileMapping, w: Work, hw, ops) -> Pace:
    xp = ops.xp
    d = w.dims
    lat, bw = hw.dma_latency_cycles, hw.dma_bandwidth_bytes_per_cycle
    st, res = m.stacked, m.weights_resident
    valid = w.halo[1] / xp.maximum(w.halo_padded, 1)        # the share of a halo the DMA reads
    halo_share = w.halo_tiles / xp.maximum(w.tiles, 1)      # steps that LOAD a halo

    def compute(th, tw, to, tc):
        return step_compute(L, m, th, tw, to, tc, hw, ops)

    def halo(th, tw, tc):
        rows = st * th * L.kh + (1 - st) * ((th - 1) * L.stride_h + (L.kh - 1) * L.dilation_h + 1)
        cols = (tw - 1) * L.stride_w + (L.kw - 1) * L.dilation_w + 1
        return (st * th + (1 - st)) * lat + rows * cols * tc * L.itemsize * valid / bw

    def weights(to, tc):
        return (1 - res) * (lat + L.kh * L.kw * tc * to * L.itemsize / bw)

    (th, tw, to, tc), weight = tile_grid(d.rows, d.cols, d.outs, d.ins)
    shape = xp.shape(weight)
    c, wt, h = (xp.broadcast_to(v, shape) for v in (compute(th, tw, to, tc), weights(to, tc), halo(th, tw, tc)))
    paced = halo_share * ops.max(c, h + wt) + (1 - halo_share) * ops.max(c, wt)
    part = d.ins[1][1]           # a remainder channel tile ends each output tile, or a full one
    first = c[0, 0, 0, 0], halo_share * h[0, 0, 0, 0] + wt[0, 0, 0, 0]
    last = tuple(part * v[0, 0, 0, 1] + (1 - part) * v[0, 0, 0, 0] for v in (c, halo_share * h + wt))
    before_last = tuple(xp.where(d.n_c > 1, f, la) for f, la in zip(first, last, strict=True))
    return Pace(L.n * xp.sum(weight * paced, axis=(0, 1, 2, 3)), first, before_last, last,
                halo_share * h[0, 0, 0, 0])


def window_pace(L: LayerShape, m: TileMapping, w: Work, hw, ops) -> Pace:
    """A window nest's steps are its output tiles: a halo LOAD, the taps and epilogue on the vector unit."""
    xp = ops.xp
    per_tile = (w.compute + w.epilogue) / xp.maximum(w.tiles, 1)
    halo_q = dma_cycles(*w.halo, hw) / xp.maximum(w.tiles, 1)
    step = (per_tile, halo_q)
    return Pace(xp.maximum(w.tiles, 1) * ops.max(*step), step, step, step, halo_q)




def stall(pace: Pace, extra, release, ops):
    """(Cycles a double-buffered nest's first step of an output tile waits for, when it starts): its
    LOADs start when the MATMULs two steps back end, behind the last step's LOADs and the
    epilogue's (`extra`), and must end by the time the last step's MATMULs do (each step's pace:
    the slower of its compute and its LOADs); or, with a single accumulator tile, the epilogue
    freeing it (`release`).  Times from the end of the tile's last MATMUL."""
    (m2, l2), (m1, l1), (m0, l0) = pace.before_last, pace.last, pace.first
    late = ops.max(ops.max(l1 + extra - ops.max(m2, l2), 0) + l0 - ops.max(m1, l1), release)
    return ops.max(late + m0 - ops.max(m0, l0), 0), ops.max(late, 0)      # beyond the step's own pace


def store_stall(pace: Pace, start, j: Jobs, hw, ops):
    """Cycles an output tile's STORE stalls the next tile's steps: it starts after the epilogue,
    during some step's LOADs (steps start every pace from `start`), and the DRAM channel serves it
    before the LOADs that start after it: during the halo, before the weights; later, before the
    next step's LOADs.  A step stalls when its LOADs then end after its pace."""
    xp = ops.xp
    lat = hw.dma_latency_cycles
    m0, l0 = pace.first
    pace0 = ops.max(ops.max(m0, l0), 1)
    phase = xp.mod(j.epilogue + lat - start, pace0)
    during_halo = phase < pace.first_halo
    next_delay = ops.max(ops.max(phase, l0) + j.store[1] - pace0 - lat, 0)
    ends = xp.where(during_halo, l0 + ops.max(j.store[1] - lat, 0), l0 + next_delay)
    return ops.max(ends - pace0, 0)


def pipelined(w: Work, j: Jobs, pace: Pace, single_acc, waits, single_result, hw, ops, k: CostConstants):
    """A double-buffered nest, a flow shop of reduction steps (LOADs, compute) and output tiles
    (epilogue, STORE): the steps at their pace, with a stall where one follows a smaller one across
    output tiles, or the slowest unit's total, each with the stages before it of the first job and
    after it of the last; or the cycle through the accumulator pair, a tile's MATMULs waiting for
    the STORE two tiles back."""
    xp = ops.xp
    tiles = xp.maximum(w.tiles, 1)
    load_q = dma_cycles(*w.loads, hw)
    store_q = dma_cycles(*w.store, hw)
    channel = (w.loads[1] + w.store[1]) / hw.dma_bandwidth_bytes_per_cycle
    fill = k.fill * pace.first[1]
    drain = k.fill * (j.epilogue + j.store[0])
    per_tile = w.compute / tiles
    first, start = stall(pace, j.extra[0], single_acc * j.release, ops)
    steps = pace.paced + (tiles - 1) * (first + store_stall(pace, start, j, hw, ops))
    acc_pair = (w.compute + w.epilogue + store_q) / 2
    results = single_result * (w.epilogue + store_q)       # each tile's epilogue waits for the last STORE
    return ops.smax(fill + steps + drain, load_q + j.compute + drain, fill + w.compute + waits + drain,
                    fill + per_tile + w.epilogue + j.store[0], fill + per_tile + j.epilogue + store_q,
                    hw.dma_latency_cycles + channel, fill + acc_pair, fill + per_tile + results)


def latency(w: Work, pace: Pace, on_array, double_buffer, release, m: TileMapping, waits, hw, ops,
            k: CostConstants = DEFAULT_CONSTANTS):
    """Cycles of one run of a nest whose steps compute on the array (`on_array`, else the vector
    unit).  `release`: vector cycles after which an output tile's accumulator is free (a single
    accumulator tile's epilogue, a transposed tile's turning COPY; all of it otherwise; its STORE
    must end too where it reads the accumulator); `waits`: vector cycles the array waits for in
    all with a single accumulator tile."""
    xp = ops.xp
    sa, tr = on_array * m.single_acc, on_array * m.transposed
    j = jobs(w, release, hw, xp)
    startup = dma_cycles(*w.startup, hw)
    single_result = sa + tr - sa * tr
    return (startup + double_buffer * pipelined(w, j, pace, sa, waits, single_result, hw, ops, k)
            + (1 - double_buffer) * serial(w, j, (1 - sa) * (1 - tr), sa * (1 - tr), single_result, hw, xp, k)
            + k.per_instruction * w.instructions)


class NestCost(NamedTuple):
    """A nest's cost over all its runs: cycles, instructions, actions (sim.energy's), the work of
    one run (exact only), the scratchpad and accumulator bytes it holds, and how far it is from
    legal (0: legal; else the relative overshoot of every limit, summed)."""

    cycles: object
    instructions: object
    actions: ActionCounts
    work: Work
    spad_bytes: object
    acc_bytes: object
    violation: object


def _work(L: LayerShape, m: TileMapping, hw, ops, kind):
    """(Work, vector cycles the array waits for with a single accumulator tile, footprint)."""
    on_array = kind == MATRIX
    w = (matrix_work if on_array else window_work)(L, m, hw, ops)
    held = waits(L, m, w, hw) if on_array else 0
    return w, held, local_bytes(matrix_buffers(L, m, ops.xp) if on_array else window_buffers(L, m, ops.xp))


def bound(L: LayerShape, m: TileMapping, hw, counted: bool = False):
    """A lower bound of nest_cost's exact cycles (what every unit is busy for, and in a single-buffered
    nest the MATMULs after their LOADs), with the instructions and the footprint: what the mapper
    prunes its candidates with, before it composes the latency of the few that may win.  `counted`:
    also the nest's action counts, exact (they do not depend on the timing), for an energy bound."""
    w, held, (spad, acc) = _work(L, m, hw, Exact, L.kind)
    counts = (ActionCounts(**{k: L.repeat * v for k, v in actions(L, m, w, hw, Exact, L.kind).to_dict().items()}),) \
        if counted else ()
    on_array = L.kind == MATRIX
    busy = Exact.max(w.compute + held, dma_cycles(*w.loads, hw), dma_cycles(*w.store, hw),
               (w.loads[1] + w.store[1]) / hw.dma_bandwidth_bytes_per_cycle, w.epilogue + (1 - on_array) * w.compute)
    serial = w.compute + dma_cycles(*w.halo, hw) + dma_cycles(*w.weights, hw)
    cycles = dma_cycles(*w.startup, hw) + m.double_buffer * busy + (1 - m.double_buffer) * serial
    return L.repeat * cycles, L.repeat * w.instructions, spad, acc, *counts


def _kind_cost(L: LayerShape, m: TileMapping, hw, ops, constants: CostConstants, kind) -> NestCost:
    on_array = kind == MATRIX
    w, held, (spad, acc) = _work(L, m, hw, ops, kind)
    sa = m.single_acc if on_array else 0
    release = sa * held + (1 - sa) * w.epilogue
    pace = (matrix_pace if on_array else window_pace)(L, m, w, hw, ops)
    cycles = latency(w, pace, on_array * 1, m.double_buffer, release, m, held, hw, ops, constants)
    return NestCost(cycles, w.instructions, actions(L, m, w, hw, ops, kind).to_dict(), w, spad, acc, 0)


def nest_cost(L: LayerShape, m: TileMapping, hw, ops, constants: CostConstants = DEFAULT_CONSTANTS) -> NestCost:
    """The cost of a layer's nest under mapping `m` on `hw` (a HardwareConfig, or the cost model's
    HardwarePoint): exact with lower.schedule.nest.Exact, where L.kind is a number and only its kind's nest
    is evaluated; relaxed with costmodel.smooth.Relaxed, where L.kind may vary across a batch, so
    both nests are evaluated and each layer's kind taken."""
    xp = ops.xp
    if isinstance(L.kind, int):
        cost = _kind_cost(L, m, hw, ops, constants, L.kind)
    else:
        matrix, window = (_kind_cost(L, m, hw, ops, constants, kind)._replace(work=None)
                          for kind in (MATRIX, DEPTHWISE))
        cost = jax.tree.map(lambda a, b: xp.where(L.kind == MATRIX, a, b), matrix, window)
    violation = sum(xp.maximum(v, 0) for v in limits(L, m, cost.spad_bytes, cost.acc_bytes, hw, xp))
    runs = ActionCounts(**{name: L.repeat * v for name, v in cost.actions.items()})
    return cost._replace(cycles=L.repeat * cost.cycles, instructions=L.repeat * cost.instructions, actions=runs,
                         violation=violation)
