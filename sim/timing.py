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
one `lax.fori_loop`.  Each step looks at the four queue heads, takes the one
that can start earliest, and times it.  Steps therefore visit instructions in
order of start time, which is what lets the DRAM channel be served first come,
first served (a program-order walk would make a LOAD wait for a STORE that comes
before it in the program but is issued later, and undo double buffering).  The
step touches only scalars (dynamic slices, no gathers), about 0.1 us on a CPU
core.  Times are float32: exact for integers below 2**24 cycles, a relative
error near 1e-7 above.

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

from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import Queue
from stagec.isa.program import Program

from .costs import InstructionShapes, instruction_shapes, unit_cycles

QUEUES = len(Queue)
MIN_SIZE = 256     # the smallest padded program size: tiny programs share one compiled scheduler


class TimingError(ValueError):
    """The token pattern cannot be timed (a pop with no push, or one that waits for a later push)."""


@dataclass(frozen=True)
class ScheduleTables:
    """What waits for what, padded to `size` instructions; index `size` means "none"."""

    queue_order: np.ndarray     # (4, size + 1) int32: each queue's instructions in program order
    queue_count: np.ndarray     # (4,) int32
    producers: np.ndarray       # (size + 1, 3) int32: the instruction whose token each pop takes
    queue_prev: np.ndarray      # (size,) int32: the previous instruction of the same queue
    is_dma: np.ndarray          # (size,) bool
    n: np.ndarray               # () int32: the real instruction count


jax.tree_util.register_dataclass(ScheduleTables, data_fields=[f.name for f in fields(ScheduleTables)],
                                 meta_fields=[])
jax.tree_util.register_dataclass(InstructionShapes, data_fields=[f.name for f in fields(InstructionShapes)],
                                 meta_fields=[])


@dataclass(frozen=True)
class TimingPlan:
    """The hardware-independent part of timing a program, computed once per program; `shapes` and
    `tables` are padded to a power of two and live on the JAX device."""

    queue: np.ndarray           # (n,) Queue of each instruction
    shapes: InstructionShapes
    tables: ScheduleTables


def timing_plan(code: np.ndarray) -> TimingPlan:
    """Queues, token producers (FIFO per channel) and per-instruction shapes of an instruction stream."""
    shapes = instruction_shapes(code)
    n = len(code)
    size = max(MIN_SIZE, 1 << max(n - 1, 0).bit_length())
    queue = shapes.queue
    order = np.full((QUEUES, size + 1), size, np.int32)
    prev = np.full(size, size, np.int32)
    for q in range(QUEUES):
        members = np.flatnonzero(queue == q)
        order[q, :len(members)] = members
        prev[members[1:]] = members[:-1]
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
    tables = ScheduleTables(order, np.array([np.count_nonzero(queue == q) for q in range(QUEUES)], np.int32),
                            producers, prev, _pad(shapes.is_dma, size), np.int32(n))
    padded = InstructionShapes(**{f.name: _pad(getattr(shapes, f.name), size) for f in fields(shapes)})
    return TimingPlan(queue, *jax.device_put((padded, tables)))


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

def _forward(occupancy, transfer, t: ScheduleTables):
    """List scheduling in order of start time: (start, grant, end) per instruction, and the step order."""
    size = occupancy.shape[-1]
    flat_order = t.queue_order.reshape(-1)
    iota = jnp.arange(QUEUES)

    def step(k, state):
        head, queue_end, channel_free, times, order = state
        ready, heads = [], []
        for q in range(QUEUES):
            i = flat_order[q * (size + 1) + head[q]]
            prod = t.producers[i]
            waits = [times[3 * prod[j] + 2] for j in range(QUEUES - 1)]   # end of each token's producer
            ready.append(jnp.maximum(jnp.maximum(queue_end[q], waits[0]), jnp.maximum(waits[1], waits[2])))
            heads.append(i)
        ready = jnp.where(head >= t.queue_count, jnp.inf, jnp.stack(ready))
        pick = iota == jnp.argmin(ready)
        start = ready.min()
        i = jnp.sum(jnp.where(pick, jnp.stack(heads), 0))
        dma = pick[Queue.LOAD] | pick[Queue.STORE]
        grant = jnp.where(dma, jnp.maximum(start + occupancy[i], channel_free), start)
        end = jnp.where(dma, grant + transfer[i], start + occupancy[i])
        times = jax.lax.dynamic_update_slice(times, jnp.stack([start, grant, end]), (3 * i,))
        order = jax.lax.dynamic_update_slice(order, i[None], (k,))
        return (head + pick, jnp.where(pick, end, queue_end), jnp.where(dma, end, channel_free), times, order)

    # Unscheduled instructions end at +inf (nothing waiting on them is ready); slot `size` is "no producer".
    times = jnp.full(3 * (size + 1), jnp.inf, occupancy.dtype).at[3 * size:].set(0.0)
    state = (jnp.zeros(QUEUES, jnp.int32), jnp.zeros(QUEUES, occupancy.dtype), jnp.zeros((), occupancy.dtype),
             times, jnp.full(size, size, jnp.int32))
    *_, times, order = jax.lax.fori_loop(0, t.n, step, state)
    times = times.reshape(size + 1, 3)[:size]
    return times[:, 0], times[:, 1], times[:, 2], order


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
    size = start.shape[-1]
    end_or_zero = jnp.append(end, 0.0)
    # The predecessor that set each start: the queue's previous instruction or a token's producer.
    candidates = jnp.concatenate([t.queue_prev[:, None], t.producers[:size]], 1)
    parent = jnp.take_along_axis(candidates, jnp.argmax(end_or_zero[candidates], 1)[:, None], 1)[:, 0]
    # The DMA served just before each DMA on the channel (steps are in start order, as the channel is).
    steps = jnp.arange(size)
    dma_step = jnp.where((steps < t.n) & t.is_dma[jnp.minimum(order, size - 1)], steps, -1)
    before = jnp.concatenate([jnp.array([-1]), jax.lax.associative_scan(jnp.maximum, dma_step)[:-1]])
    channel_prev = jnp.full(size, size, jnp.int32).at[order].set(
        jnp.where(before >= 0, order[jnp.maximum(before, 0)], size), mode="drop")
    channel_bound = t.is_dma & (end_or_zero[channel_prev] > start + occupancy)

    def back(j, acc):   # reverse step order: every successor of i has added its share to acc[i]
        i = order[t.n - 1 - j]
        through_grant = c_grant[i] + acc[i]
        bound = channel_bound[i]
        to_start = c_start[i] + jnp.where(bound, 0.0, through_grant)
        # NOTE: one scatter for both updates: two in-place updates in a row make XLA copy `acc` every step.
        return acc.at[jnp.stack([parent[i], channel_prev[i]])].add(
            jnp.stack([to_start, jnp.where(bound, through_grant, 0.0)]))

    acc = jax.lax.fori_loop(0, t.n, back, jnp.append(c_end, 0.0))[:size]
    through_grant = c_grant + acc
    d_occupancy = jnp.where(t.is_dma, jnp.where(channel_bound, 0.0, through_grant), acc)
    d_transfer = jnp.where(t.is_dma, acc, 0.0)
    return d_occupancy, d_transfer, None


schedule.defvjp(_schedule_fwd, _schedule_bwd)


# --- programs --------------------------------------------------------------------------------------

def plan_of(program: Program) -> TimingPlan:
    """The program's timing plan, cached on the (immutable) program."""
    if "timing_plan" not in program.cache:
        program.cache["timing_plan"] = timing_plan(program.code)
    return program.cache["timing_plan"]


@jax.jit
def _times(hw: HardwareConfig, shapes: InstructionShapes, tables: ScheduleTables):
    occupancy, transfer = unit_cycles(shapes, hw, jnp)
    return schedule(occupancy.astype(jnp.float32), transfer.astype(jnp.float32), tables)


def program_times(program: Program, hw: HardwareConfig | None = None):
    """(start, grant, end) of every instruction as JAX arrays: differentiable in `hw`'s continuous fields."""
    plan = plan_of(program)
    hw = program.hw if hw is None else hw
    start, grant, end = _times(hw, plan.shapes, plan.tables)
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


def timeline(program: Program, hw: HardwareConfig | None = None) -> Timeline:
    """Time `program` on `hw` (default: the config it was compiled for)."""
    start, grant, end = (np.asarray(a, np.float64) for a in program_times(program, hw))
    return Timeline(plan_of(program).queue, start, grant, end)
