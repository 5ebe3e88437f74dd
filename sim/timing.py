"""Cycle timing from the real instruction stream: the start and end cycle of every instruction.

The machine: four in-order queues (LOAD, MATRIX, VECTOR, STORE) fed in program
order; VTA-style dependency tokens (an instruction that pops from queue q
waits until the instruction that pushed the matching token has finished;
tokens are FIFO per channel); one DRAM channel shared by the LOAD and STORE
queues.  Each instruction holds its queue from `start` to `end`:

    MATMUL, VECTOR: end = start + occupancy                  (formulas in sim.costs)
    LOAD, STORE:    grant = max(start + latency, channel free)  (first come, first served)
                    end = grant + bytes / bandwidth

`start` is the latest of: the previous instruction of its queue ending, and
every token it pops being pushed.

How it is computed without a per-instruction Python loop: a list scheduler in
one `lax.fori_loop` over runs (a run is a stretch of one queue's instructions
that only its first may wait in: a DMA alone, or a MATMUL/VECTOR that pops with
the ones after it that do not; inside a run, times are a cumulative sum).  Each
step looks at the four queue heads, takes the run that can start earliest, and
times it.  Steps therefore visit runs in order of start time, which is what lets
the DRAM channel be served first come, first served (a program-order walk would
make a LOAD wait for a STORE that comes before it in the program but is issued
later, and undo double buffering).  The step touches only scalars (dynamic
slices, no gathers), about 0.1 us on a CPU core.  Times are float32: exact for
integers below 2**24 cycles, a relative error near 1e-7 above.

Differentiable: `schedule` has a custom VJP.  Start times are maxima of end
times, so a gradient flows along the predecessor that set each maximum (the
critical path); the backward pass walks the steps in reverse, one scalar
scatter-add each.  `program_cycles(program, hw)` is a JAX function of the
config's continuous fields (`jax.grad` and `jax.vmap` over configs work).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from stagec.errors import TimingError
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import Queue
from stagec.isa.program import Program

from .costs import InstructionShapes, UnitParameters, instruction_shapes, unit_cycles, unit_parameters

QUEUES = len(Queue)
MIN_SIZE = 256     # the smallest padded program size: tiny programs share one compiled scheduler


@dataclass(frozen=True)
class ScheduleTables:
    """What waits for what, padded to `size` instructions and `runs` runs; index `size` (or `runs`) means
    "none".  A run is a stretch of one queue's instructions that only its first may wait in: a DMA alone,
    or a MATMUL/VECTOR that pops (or heads its queue) with the ones after it that do not pop."""

    producers: np.ndarray       # (size + 1, 3) int32: the instruction whose token each pop takes
    queue_prev: np.ndarray      # (size,) int32: the previous instruction of the same queue
    is_dma: np.ndarray          # (size,) bool
    run_of: np.ndarray          # (size + 1,) int32: the run of each instruction
    by_queue: np.ndarray        # (size,) int32: instructions queue by queue, so each run is contiguous
    run_starts: np.ndarray      # (size,) bool: in by_queue order, the first instruction of a run
    run_ends: np.ndarray        # (size,) bool: in by_queue order, the last instruction of a run
    run_order: np.ndarray       # (4, runs + 1) int32: each queue's runs in order
    run_count: np.ndarray       # (4,) int32
    run_first: np.ndarray       # (runs + 1,) int32: first instruction of each run
    run_last: np.ndarray        # (runs + 1,) int32: last instruction of each run
    run_waits: np.ndarray       # (runs + 1, 3) int32: where in the step's `times` each token's producer ends
    n: np.ndarray               # () int32: the real instruction count
    n_runs: np.ndarray          # () int32: the real run count


jax.tree_util.register_dataclass(ScheduleTables, data_fields=[f.name for f in fields(ScheduleTables)],
                                 meta_fields=[])
for _cls in (InstructionShapes, UnitParameters):
    jax.tree_util.register_dataclass(_cls, data_fields=[f.name for f in fields(_cls)], meta_fields=[])


@dataclass(frozen=True)
class TimingPlan:
    """The hardware-independent part of timing a program, computed once per program; `shapes` and
    `tables` are padded to a power of two and live on the JAX device."""

    queue: np.ndarray           # (n,) Queue of each instruction
    shapes: InstructionShapes
    tables: ScheduleTables


def timing_plan(code: np.ndarray) -> TimingPlan:
    """Queues, runs, token producers (FIFO per channel) and per-instruction shapes of an instruction stream."""
    shapes = instruction_shapes(code)
    n = len(code)
    size = _bucket(n)
    queue = shapes.queue
    own = (code["pop"].astype(np.int64) >> queue) & 1
    if own.any():
        i = int(np.flatnonzero(own)[0])
        raise TimingError(f"instruction {i} pops a token from its own queue ({Queue(queue[i]).name})")
    producers = np.full((size + 1, QUEUES - 1), size, np.int32)
    for src in range(QUEUES):
        for dst in range(QUEUES):
            if src != dst:
                pushes = np.flatnonzero((queue == src) & (code["push"] >> dst & 1).astype(bool))
                pops = np.flatnonzero((queue == dst) & (code["pop"] >> src & 1).astype(bool))
                _check_matching(pushes, pops, Queue(src).name)
                producers[pops, src - (src > dst)] = pushes[:len(pops)]
    members = [np.flatnonzero(queue == q) for q in range(QUEUES)]
    prev = np.full(size, size, np.int32)
    starts = shapes.is_dma | (code["pop"] != 0)
    for m in members:
        prev[m[1:]] = m[:-1]
        starts[m[:1]] = True
    first = np.flatnonzero(starts)                          # runs, numbered in program order
    runs = _bucket(len(first))
    numbered = np.where(starts, np.cumsum(starts) - 1, -1)
    run_of = np.full(size + 1, runs, np.int32)
    for m in members:
        run_of[m] = np.maximum.accumulate(numbered[m]) if len(m) else m
    by_queue = np.concatenate(members + [np.arange(n, size)]).astype(np.int32)
    run_starts = np.ones(size, bool)
    run_starts[1:n] = run_of[by_queue[1:n]] != run_of[by_queue[:n - 1]]
    run_ends = np.append(run_starts[1:], True)
    run_queue = queue[first]
    run_order = np.full((QUEUES, runs + 1), runs, np.int32)
    for q in range(QUEUES):
        mine = np.flatnonzero(run_queue == q)
        run_order[q, :len(mine)] = mine
    run_first = np.full(runs + 1, size, np.int32)
    run_first[:len(first)] = first
    run_last = np.full(runs + 1, size, np.int32)
    run_last[run_of[by_queue[:n]][run_ends[:n]]] = by_queue[:n][run_ends[:n]]
    # A producer's end is its run's end (a DMA, alone in its run) or its run's start plus its offset.
    is_dma = _pad(shapes.is_dma, size + 1)
    where = (3 * run_of + np.where(is_dma, 2, 0)).astype(np.int32)
    where[size] = 3 * runs + 2                              # "no producer": a slot that ends at 0
    tables = ScheduleTables(producers, prev, is_dma[:size], run_of, by_queue, run_starts, run_ends, run_order,
                            np.array([np.count_nonzero(run_queue == q) for q in range(QUEUES)], np.int32),
                            run_first, run_last, where[producers[run_first]], np.int32(n), np.int32(len(first)))
    padded = InstructionShapes(**{f.name: _pad(getattr(shapes, f.name), size) for f in fields(shapes)})
    return TimingPlan(queue, *jax.device_put((padded, tables)))


def _bucket(count: int) -> int:
    return max(MIN_SIZE, 1 << max(count - 1, 0).bit_length())


def _check_matching(pushes: np.ndarray, pops: np.ndarray, src: str) -> None:
    if len(pops) > len(pushes):
        raise TimingError(f"instruction {pops[len(pushes)]} pops a token from the {src} queue that no "
                          "instruction pushes")
    late = np.flatnonzero(pushes[:len(pops)] > pops)
    if len(late):
        i = late[0]
        raise TimingError(f"instruction {pops[i]} waits for a token from the {src} queue that instruction "
                          f"{pushes[i]}, later in program order, pushes: the queues could deadlock")


def _pad(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((size,) + a.shape[1:], a.dtype)
    out[:len(a)] = a
    return out


# --- the scheduler -------------------------------------------------------------------------------

def _segment_cumsum(x, t: ScheduleTables, reverse: bool = False):
    """Inclusive cumulative sum of `x` (by instruction) within each run; from the run's end if `reverse`.

    A scan with a scalar carry: a few ns per element, and it compiles fast (an associative scan's
    log-depth tree of slices costs seconds of XLA compile time at these sizes)."""
    def step(carry, item):
        first, value = item
        carry = jnp.where(first, value, carry + value)
        return carry, carry

    _, out = jax.lax.scan(step, jnp.zeros((), x.dtype), (t.run_ends if reverse else t.run_starts, x[t.by_queue]),
                          reverse=reverse)
    return jnp.zeros_like(x).at[t.by_queue].set(out)


def _forward(occupancy, transfer, t: ScheduleTables):
    """List scheduling of runs in order of start time: (start, grant, end) per instruction, the run order."""
    size, runs = occupancy.shape[-1], t.run_order.shape[-1] - 1
    busy = jnp.where(t.is_dma, 0.0, occupancy)              # MATMUL/VECTOR occupancy
    offset = _segment_cumsum(busy, t)                 # each instruction's end, from its run's start
    first = jnp.minimum(t.run_first, size - 1)
    run_busy = jnp.where(t.is_dma[first], occupancy[first], offset[jnp.minimum(t.run_last, size - 1)])
    run_transfer = jnp.where(t.is_dma[first], transfer[first], 0.0)
    wait_offset = jnp.append(offset, 0.0)[t.producers[t.run_first]]     # (runs + 1, 3)
    flat_order = t.run_order.reshape(-1)
    iota = jnp.arange(QUEUES)

    def step(k, state):
        head, queue_end, channel_free, times, order = state
        ready, heads = [], []
        for q in range(QUEUES):
            r = flat_order[q * (runs + 1) + head[q]]
            at, off = t.run_waits[r], wait_offset[r]
            waits = [times[at[j]] + off[j] for j in range(QUEUES - 1)]   # end of each token's producer
            ready.append(jnp.maximum(jnp.maximum(queue_end[q], waits[0]), jnp.maximum(waits[1], waits[2])))
            heads.append(r)
        ready = jnp.where(head >= t.run_count, jnp.inf, jnp.stack(ready))
        pick = iota == jnp.argmin(ready)
        start = ready.min()
        r = jnp.sum(jnp.where(pick, jnp.stack(heads), 0))
        dma = pick[Queue.LOAD] | pick[Queue.STORE]
        grant = jnp.where(dma, jnp.maximum(start + run_busy[r], channel_free), start)
        end = jnp.where(dma, grant + run_transfer[r], start + run_busy[r])
        times = jax.lax.dynamic_update_slice(times, jnp.stack([start, grant, end]), (3 * r,))
        order = jax.lax.dynamic_update_slice(order, r[None], (k,))
        return (head + pick, jnp.where(pick, end, queue_end), jnp.where(dma, end, channel_free), times, order)

    # Unscheduled runs end at +inf (nothing waiting on them is ready); slot `runs` is "no producer".
    times = jnp.full(3 * (runs + 1), jnp.inf, occupancy.dtype).at[3 * runs:].set(0.0)
    state = (jnp.zeros(QUEUES, jnp.int32), jnp.zeros(QUEUES, occupancy.dtype), jnp.zeros((), occupancy.dtype),
             times, jnp.full(runs, runs, jnp.int32))
    *_, times, order = jax.lax.fori_loop(0, t.n_runs, step, state)
    times = times.reshape(runs + 1, 3)[t.run_of[:size]]     # each instruction's run: start, grant, end
    start = jnp.where(t.is_dma, times[:, 0], times[:, 0] + offset - busy)
    end = jnp.where(t.is_dma, times[:, 2], times[:, 0] + offset)
    return start, jnp.where(t.is_dma, times[:, 1], start), end, order


@jax.custom_vjp
def schedule(occupancy, transfer, tables: ScheduleTables):
    """(start, grant, end) cycle of every instruction (padded entries are +inf).

    `occupancy` and `transfer` come from `sim.costs.unit_cycles`; `tables` from `timing_plan`.
    """
    return _forward(occupancy, transfer, tables)[:3]


def _schedule_fwd(occupancy, transfer, tables):
    start, grant, end, order = _forward(occupancy, transfer, tables)
    return (start, grant, end), (start, end, order, occupancy, tables)


def _schedule_bwd(res, cotangents):
    start, end, order, occupancy, t = res
    c_start, c_grant, c_end = cotangents
    size, runs = start.shape[-1], t.run_order.shape[-1] - 1
    end_or_zero = jnp.append(end, 0.0)
    first = t.run_first[:runs]
    # The predecessor that set each run's start: its queue's previous instruction or a token's producer.
    candidates = jnp.concatenate([jnp.append(t.queue_prev, size)[first][:, None], t.producers[first]], 1)
    parent = jnp.take_along_axis(candidates, jnp.argmax(end_or_zero[candidates], 1)[:, None], 1)[:, 0]
    # The DMA served just before each DMA on the channel (steps are in start order, as the channel is).
    steps = jnp.arange(runs)
    first_of_step = jnp.append(t.run_first, size)[order]
    dma_step = jnp.where((steps < t.n_runs) & jnp.append(t.is_dma, False)[first_of_step], steps, -1)
    _, before = jax.lax.scan(lambda last, k: (jnp.maximum(last, k), last), jnp.int32(-1), dma_step)
    channel_prev = jnp.full(runs, size, jnp.int32).at[order].set(
        jnp.where(before >= 0, first_of_step[jnp.maximum(before, 0)], size), mode="drop")
    dma = jnp.append(t.is_dma, False)[first]
    first_clipped = jnp.minimum(first, size - 1)
    bound = dma & (end_or_zero[channel_prev] > start[first_clipped] + occupancy[first_clipped])
    # Cotangent a MATMUL/VECTOR run's start gets from its own instructions' start, grant and end.
    own = jax.ops.segment_sum(c_start + c_grant + c_end, t.run_of[:size], runs + 1)
    run_slot = size + 1 + jnp.append(t.run_of, runs)           # acc: [instructions | runs]
    targets = jnp.stack([parent, run_slot[parent], channel_prev, run_slot[channel_prev]], 1)
    c_start_first, c_grant_first, c_end_first = (jnp.append(c, 0.0)[first] for c in (c_start, c_grant, c_end))

    def back(j, acc):   # reverse step order: every successor has added its share before a run is reached
        r = order[t.n_runs - 1 - j]
        through_grant = c_grant_first[r] + c_end_first[r] + acc[first[r]]          # a DMA's grant
        to_start = jnp.where(dma[r], c_start_first[r] + jnp.where(bound[r], 0.0, through_grant),
                             own[r] + acc[size + 1 + r])
        to_channel = jnp.where(bound[r], through_grant, 0.0)
        # NOTE: one scatter for all updates: in-place updates in a row make XLA copy `acc` every step.
        return acc.at[targets[r]].add(jnp.stack([to_start, to_start, to_channel, to_channel]))

    acc = jax.lax.fori_loop(0, t.n_runs, back, jnp.zeros(size + runs + 2, start.dtype))
    total_end = c_end + acc[:size]                              # all that flows into each instruction's end
    run_bound = jnp.append(bound, False)[t.run_of[:size]]
    through_grant = c_grant + total_end
    # A MATMUL/VECTOR instruction's occupancy delays its own end and everything after it in its run.
    later = (_segment_cumsum(total_end, t, reverse=True) + _segment_cumsum(c_start + c_grant, t, reverse=True)
             - (c_start + c_grant))
    d_occupancy = jnp.where(t.is_dma, jnp.where(run_bound, 0.0, through_grant), later)
    d_transfer = jnp.where(t.is_dma, total_end, 0.0)
    return d_occupancy, d_transfer, None


schedule.defvjp(_schedule_fwd, _schedule_bwd)


# --- programs --------------------------------------------------------------------------------------

def plan_of(program: Program) -> TimingPlan:
    """The program's timing plan, cached on the (immutable) program."""
    if "timing_plan" not in program.cache:
        program.cache["timing_plan"] = timing_plan(program.code)
    return program.cache["timing_plan"]


@jax.jit
def _times(params: UnitParameters, shapes: InstructionShapes, tables: ScheduleTables):
    occupancy, transfer = unit_cycles(shapes, params, jnp)
    return schedule(occupancy.astype(jnp.float32), transfer.astype(jnp.float32), tables)


def program_times(program: Program, hw: HardwareConfig | None = None):
    """(start, grant, end) of every instruction as JAX arrays: differentiable in `hw`'s continuous fields."""
    plan = plan_of(program)
    hw = program.hw if hw is None else hw
    params = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), unit_parameters(hw))
    start, grant, end = _times(params, plan.shapes, plan.tables)
    n = len(plan.queue)
    return start[:n], grant[:n], end[:n]


def program_cycles(program: Program, hw: HardwareConfig | None = None):
    """Total cycles of `program` on `hw` (default: the config it was compiled for), a JAX scalar.

    >>> import jax, stagec
    >>> from stagec.models import hand_keypoint_net
    >>> program = stagec.compile(*hand_keypoint_net())
    >>> grad = jax.grad(program_cycles, argnums=1)(program, program.hw)
    >>> bool(grad.dma_bandwidth_bytes_per_cycle < 0)     # more bandwidth, fewer cycles
    True
    """
    _, _, end = program_times(program, hw)
    return jnp.max(end, initial=0.0)


@dataclass(frozen=True)
class Timeline:
    """When every instruction ran.  Arrays are indexed by instruction; `grant` is when a DMA got the
    DRAM channel (equal to `start` for MATMUL and VECTOR)."""

    queue: np.ndarray
    start: np.ndarray
    grant: np.ndarray
    end: np.ndarray

    @property
    def cycles(self) -> float:
        return float(self.end.max(initial=0.0))

    def busy_cycles(self) -> np.ndarray:
        """(4,) cycles each queue's unit spent running instructions."""
        return np.bincount(self.queue, weights=self.end - self.start, minlength=QUEUES)

    def dram_transfers(self) -> np.ndarray:
        """The DMAs in the order the DRAM channel served them (each holds it from grant to end)."""
        dma = np.flatnonzero((self.queue == Queue.LOAD) | (self.queue == Queue.STORE))
        return dma[np.argsort(self.grant[dma], kind="stable")]


def timeline(program: Program, hw: HardwareConfig | None = None) -> Timeline:
    """Time `program` on `hw` (default: the config it was compiled for)."""
    start, grant, end = (np.asarray(a, np.float64) for a in program_times(program, hw))
    return Timeline(plan_of(program).queue, start, grant, end)
