"""The batched executor: runs a Plan (sim.plan) group by group, each group one jitted function.

Each group's function comes from its kernel (sim.kernel: one per opcode, in sim.dma and
sim.compute, and the joins), cached by the group's static signature, so a shape met once (in this
program or an earlier one) is never compiled again; the dynamic parts (which rows, at which
offsets, which DRAM addresses) are arguments.  Some groups run inside the function of their one
reader (sim.fusion).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import ReferenceFallbackWarning
from stagec.isa.instructions import DType
from stagec.isa.program import Program

from . import reference
from .fusion import fused_producers, how_to_read, with_producers
from .kernel import Prepared, compiled
from .plan import Group, PlanError, build_plan


@dataclass(frozen=True)
class Step:
    """One group as a run executes it."""

    group: Group
    fn: Callable
    args: list              # (producer group, rows, offs) per read slot, in the function's order
    extra: tuple            # static arguments after them (a matmul's block order)
    dram: object            # (T,) DRAM element bases of a DMA group, else None


@functools.cache
def recycle_large_buffers() -> bool:
    """Have glibc's malloc serve large blocks from its heap and keep freed memory, so that XLA's
    buffers of tens of MB (a group's values) reuse pages instead of mmapping fresh ones: faulting in
    and zeroing new pages cost about 4/5 of a pass over a large tensor.
    The process then keeps its peak heap rather than returning it to the OS.  False where the C
    library is not glibc (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 1 << 30) and mallopt(m_trim_threshold, (1 << 31) - 1))


@functools.cache
def _fill_fn(starts: tuple):
    """Zero the DRAM arrays in place (donated) and write the inputs at their element offsets."""
    def run(data, inputs):
        data = {d: jnp.zeros_like(a) for d, a in data.items()}
        for (d, start), x in zip(starts, inputs, strict=True):
            data[d] = lax.dynamic_update_slice(data[d], x, (start,))
        return data
    return jax.jit(run, donate_argnums=0)


class Executor:
    """A program ready to run: its plan, with every group's function and device arrays prepared."""

    def __init__(self, program: Program):
        recycle_large_buffers()
        self.program = program
        self.plan = build_plan(program)
        blob = program.constants
        self.const = {d: jnp.asarray(np.frombuffer(blob[:len(blob) // d.itemsize * d.itemsize], d.numpy))
                      for d in DType}
        self.const_values = {}   # loads of the constant region, computed on the first run
        self.spare = None        # the last run's DRAM arrays
        self.pending_checks = []  # a run's data-dependent checks (gathers' indices)
        self.fill = _fill_fn(tuple((ref.dtype, (ref.offset - self.plan.data_origin) // ref.dtype.itemsize)
                                   for ref in program.inputs))
        prepared = [(g, g.sig.prepare(g)) for g in self.plan.groups]
        hows = [tuple(how_to_read(g, s, self.plan, *p.reads[s]) if s in p.reads else None for s in g.sig.slots)
                for g, p in prepared]
        partial = {g.reads[s].src for (g, p), h in zip(prepared, hows, strict=True)
                   for s, how in zip(g.sig.slots, h, strict=True) if s in p.reads and how != "whole"}
        inlined, deferred = fused_producers(self.plan, partial)
        self.inlined = {src: (self.plan.groups[src].sig.dtype, jnp.asarray(self.plan.groups[src].dram, jnp.int32))
                        for src in inlined}   # inlined load group id -> (element type, DRAM bases)
        self.deferred = {}   # deferred vector group id -> its (src, rows, offs) arguments
        self.steps = self._steps(prepared, hows, inlined, deferred)
        self.frees = self._frees()

    def _steps(self, prepared: list[tuple[Group, Prepared]], hows: list, inlined: set, deferred: set) -> list[Step]:
        steps, fns = [], {}
        for (g, p), h in zip(prepared, hows, strict=True):
            if g.id in inlined:
                fns[g.id] = compiled(g.sig, (), p.layout)
                continue
            fn = compiled(g.sig, h, p.layout)
            args = [(g.reads[s].src, jnp.asarray(rows, jnp.int32), jnp.asarray(offs, jnp.int32))
                    for s, (rows, offs) in p.reads.items()]
            # a fused producer's value is its (value, rows, offs) triple's first argument
            producers = tuple((3 * k, fns[src]) for k, (src, _, _) in enumerate(args)
                              if src in inlined or src in deferred)
            fn = with_producers(fn, producers) if producers else fn
            if g.id in deferred:
                fns[g.id] = fn
                self.deferred[g.id] = args
                continue
            steps.append(Step(g, fn, args, p.extra, jnp.asarray(g.dram, jnp.int32) if g.dram is not None else None))
        return steps

    def _frees(self) -> list[list[int]]:
        """Per step, the values to free after it: those a step reads (through the deferred groups it
        runs too) are freed after their last reader."""
        frees = [[] for _ in self.steps]
        last = {}
        for k, step in enumerate(self.steps):
            for src in self._sources(step.args):
                last[src] = k
        for src, k in last.items():
            frees[k].append(src)
        return frees

    def _sources(self, args) -> set[int]:
        """The values a step's arguments read, those of the deferred groups it runs included."""
        out = set()
        for src, _, _ in args:
            if src in self.deferred:
                out |= self._sources(self.deferred[src])
            elif src not in self.inlined:
                out.add(src)
        return out

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        p, plan = self.program, self.plan
        if self.spare is None:
            self.spare = {d: jnp.zeros(plan.data_bytes // d.itemsize, d.numpy) for d in plan.dtypes}
        data, self.spare = self.spare, None
        data = self.fill(data, [np.asarray(x, ref.dtype.numpy).reshape(-1) for ref, x in zip(p.inputs, inputs,
                                                                                              strict=True)])
        values, self.pending_checks = {}, []
        for step, frees in zip(self.steps, self.frees, strict=True):
            args = [a for src, rows, offs in step.args for a in (self._value(src, values, data), rows, offs)]
            step.group.sig.run(step, args, values, data, self)
            for src in frees:
                del values[src]
        for check in self.pending_checks:   # data-dependent: any failure discards the run
            check()
        outs = []
        for t in p.outputs:
            start = (t.offset - plan.data_origin) // t.dtype.itemsize
            outs.append(np.array(data[t.dtype][start:start + t.nbytes // t.dtype.itemsize]).reshape(t.shape))
        self.spare = data   # the next run zeroes these pages instead of faulting in fresh ones
        return outs

    def _value(self, src: int, values: dict, data: dict):
        """A producer group's value, or for an inlined load or a deferred vector op what its reader
        computes it from."""
        if src in self.inlined:
            dtype, bases = self.inlined[src]
            return data[dtype], bases
        if src in self.deferred:
            return tuple(a for s, rows, offs in self.deferred[src] for a in (self._value(s, values, data), rows, offs))
        return values[src]


def execute(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a program on host arrays with the batched executor (the reference interpreter when the
    program is outside the batched model)."""
    if "executor" not in program.cache:
        try:
            program.cache["executor"] = Executor(program)
        except PlanError as e:
            warnings.warn(f"batched executor cannot run this program ({e}); using the reference interpreter",
                          ReferenceFallbackWarning, stacklevel=2)
            program.cache["executor"] = None
    ex = program.cache["executor"]
    return reference.execute(program, inputs) if ex is None else ex.run(inputs)
