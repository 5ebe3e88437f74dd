"""The batched executor's DMA kernels: LOAD, GATHER and STORE groups (sim.kernel).

A group whose members' DRAM bases form an affine grid of boxes reads (or writes) it as one strided
slice (sim.boxes); otherwise by a gather (scatter) of every element.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import PlanError
from stagec.isa.access import element_offsets, is_dense
from stagec.isa.instructions import DType, Opcode, PadValue
from stagec.isa.opcodes import check_gather_indices
from stagec.isa.semantics import cast, pad_value

from .boxes import (
    as_slices,
    box,
    box_positions,
    contiguous_run,
    grid,
    in_live_order,
    natural_run,
    put_box,
    read,
    take_box,
)
from .compute import JAX
from .kernel import DRAM_CONST, Kernel, Prepared, register

ROW_SCATTER = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=(0,))


def _rel(strides, dims) -> np.ndarray:
    return element_offsets(strides, dims).astype(np.int32)


def _dram_memory(executor, data: dict, space: int, dtype: DType):
    return executor.const[dtype] if space == DRAM_CONST else data[dtype]


@register(Opcode.LOAD)
@dataclass(frozen=True)
class Load(Kernel):
    """Each member's box of DRAM, padded (isa.opcodes: LOAD)."""

    n: tuple
    dram_strides: tuple
    pad: tuple
    pad_value: int
    space: int              # DRAM_CONST or DRAM_DATA
    dtype: DType
    out_dtype: DType        # the local type: dtype, or float32 widened from bf16
    kind = "load"
    reads_dram = True
    slots = ()

    @classmethod
    def describe(cls, node):
        space = node.dram("x", node.dtype)
        p = node.pad
        dims = tuple(node.n[k] + p[2 * k] + p[2 * k + 1] for k in range(3))
        if not is_dense(node.strides("y"), dims):
            raise PlanError(f"instruction {node.index}: LOAD writes a non-contiguous local region")
        return (cls(node.n[:3], node.strides("x"), p, node.mode, space, node.dtype, node.out_dtype), (),
                int(np.prod(dims)))

    def prepare(self, group) -> Prepared:
        return Prepared({}, layout=grid(group.dram))

    def build(self, hows, layout):
        n, strides, pad = self.n, self.dram_strides, self.pad
        fill = pad_value(PadValue(self.pad_value), self.dtype)
        box_dims = (*layout, *zip(n, strides, strict=True)) if layout is not None else None
        slices = as_slices(box_dims, unique=False) if box_dims is not None else None
        if slices is not None:
            live, span = slices

            def run_box(mem, bases):
                v = take_box(lax.dynamic_slice(mem, (bases[0],), (span,)), box_dims, live).reshape(-1, *n)
                if any(pad):
                    v = jnp.pad(v, ((0, 0), (pad[0], pad[1]), (pad[2], pad[3]), (pad[4], pad[5])),
                                constant_values=fill)
                return cast(JAX, v.reshape(v.shape[0], -1), self.out_dtype)
            return jax.jit(run_box)
        dims = (n[0] + pad[0] + pad[1], n[1] + pad[2] + pad[3], n[2] + pad[4] + pad[5])
        i0, i1, i2 = np.meshgrid(*(np.arange(d) - pad[2 * k] for k, d in enumerate(dims)), indexing="ij")
        inside = ((i0 >= 0) & (i0 < n[0]) & (i1 >= 0) & (i1 < n[1]) & (i2 >= 0) & (i2 < n[2])).reshape(-1)
        rel = np.where(inside, (i0 * strides[0] + i1 * strides[1] + i2 * strides[2]).reshape(-1), 0).astype(np.int32)

        def run(mem, bases):
            v = mem.at[bases[:, None] + rel].get(mode="promise_in_bounds")
            return cast(JAX, v if inside.all() else jnp.where(inside, v, fill), self.out_dtype)
        return jax.jit(run)

    def run(self, step, args, values, data, executor) -> None:
        mem = _dram_memory(executor, data, self.space, self.dtype)
        g = step.group.id
        if self.space != DRAM_CONST:
            values[g] = step.fn(mem, step.dram)
            return
        if g not in executor.const_values:   # weights: the same every run
            executor.const_values[g] = step.fn(mem, step.dram)
        values[g] = executor.const_values[g]


@register(Opcode.GATHER)
@dataclass(frozen=True)
class Gather(Kernel):
    """Indirect DMA (isa.opcodes: GATHER): each member's n0 row indices come from a local value; the
    rows are checked after the run (any bad index discards it)."""

    n: tuple
    table_strides: tuple
    index_stride: int
    space: int
    dtype: DType
    out_dtype: DType
    kind = "gather"
    reads_dram = True
    slots = ("idx",)

    @classmethod
    def describe(cls, node):
        node.local("idx", "z", DType.I32)
        space = node.dram("x", node.dtype)
        if not is_dense(node.strides("y"), node.n[:3]):
            raise PlanError(f"instruction {node.index}: GATHER writes a non-contiguous local region")
        n = node.n
        sig = cls(n, node.strides("x"), node.strides("z")[0], space, node.dtype, node.out_dtype)
        return sig, (node.source("idx"),), n[0] * n[1] * n[2]

    def read_dims(self, slot):
        return box((self.index_stride, 0, 0), (self.n[0], 1, 1))

    def build(self, hows, layout):
        n, strides = self.n, self.table_strides
        rel_idx = _rel((self.index_stride, 0, 0), (n[0], 1, 1))
        rel_row = _rel((0, strides[1], strides[2]), (1, n[1], n[2]))

        def run(mem, P, rows, offs, bases):
            idx = read(P, rows, offs, rel_idx, hows[0])[:, 0]                      # (T, n0)
            safe = jnp.where((idx < 0) | (idx >= n[3]), 0, idx)   # out-of-range rows are reported, not read
            addr = bases[:, None, None] + safe[..., None] * strides[0] + rel_row   # (T, n0, n1*n2)
            return cast(JAX, mem.at[addr].get(mode="promise_in_bounds").reshape(idx.shape[0], -1), self.out_dtype), idx
        return jax.jit(run)

    def run(self, step, args, values, data, executor) -> None:
        mem = _dram_memory(executor, data, self.space, self.dtype)
        values[step.group.id], idx = step.fn(mem, *args, step.dram)
        executor.pending_checks.append(functools.partial(self._check, step.group, idx))

    def _check(self, group, idx) -> None:
        idx = np.asarray(idx)
        for t in np.flatnonzero(((idx < 0) | (idx >= self.n[3])).any(1))[:1]:
            check_gather_indices(group.instructions[t], idx[t], self.n[3])


@register(Opcode.STORE)
@dataclass(frozen=True)
class Store(Kernel):
    """Each member's local value into its box of DRAM (isa.opcodes: STORE)."""

    n: tuple
    dram_strides: tuple
    local_strides: tuple
    dtype: DType            # DRAM's
    local: DType            # the value's: dtype, or float32 rounded to bf16
    kind = "store"
    slots = ("src",)

    @classmethod
    def describe(cls, node):
        node.local("src", "y", node.out_dtype)
        node.dram("x", node.dtype)
        sig = cls(node.n[:3], node.strides("x"), node.strides("y"), node.dtype, node.out_dtype)
        return sig, (node.source("src"),), 0

    def read_dims(self, slot):
        return box(self.local_strides, self.n)

    def prepare(self, group) -> Prepared:
        return Prepared(super().prepare(group).reads, layout=grid(group.dram))

    def build(self, hows, layout):
        n, to, rel_src = self.n, self.dtype, _rel(self.local_strides, self.n)

        def stored(P, rows, offs):   # the values read, as DRAM holds them
            return cast(JAX, read(P, rows, offs, rel_src, hows[0]), to)
        dims = (*layout, *zip(n, self.dram_strides, strict=True)) if layout is not None else None
        slices = as_slices(dims, unique=True) if dims is not None else None
        if slices is None:
            rel_dram = _rel(self.dram_strides, n)

            def run(data, P, rows, offs, bases):
                vals = stored(P, rows, offs)
                idx = (bases[:, None] + rel_dram).reshape(-1)
                return data.at[idx].set(vals.reshape(-1), mode="promise_in_bounds", unique_indices=True)
            return jax.jit(run, donate_argnums=0)
        live, span = slices
        inner, width = contiguous_run(live)
        outer, run = natural_run(dims)
        if width >= 64 and run >= 16:   # the values' own runs, as they are: no transpose
            return _store_windows(box_positions(outer), run, stored)
        if width >= 64:                 # the box's runs in memory, the values transposed to them
            return _store_windows(box_positions([(c, s) for _, c, s in live[:inner]]), width,
                                  lambda *a: in_live_order(stored(*a), dims, live))
        return _store_padded(dims, live, span, stored)

    def run(self, step, args, values, data, executor) -> None:
        data[self.dtype] = step.fn(data[self.dtype], *args, step.dram)


def _store_windows(starts: np.ndarray, width: int, stored):
    """A store as one windowed scatter, in place: `stored`(the values, as DRAM holds them) laid out
    as runs of `width` contiguous elements at DRAM offsets `starts` (from the group's first base)."""
    starts = starts.astype(np.int32)[:, None]
    ascending = bool((np.diff(starts[:, 0]) > 0).all())

    def run_rows(data, P, rows, offs, bases):
        vals = stored(P, rows, offs).reshape(-1, width)
        return lax.scatter(data, bases[0] + starts, vals, ROW_SCATTER, indices_are_sorted=ascending,
                           unique_indices=True, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    return jax.jit(run_rows, donate_argnums=0)


def _store_padded(dims, live, span: int, stored):
    """A store of the box laid out over its whole span (zeros between), then written in place where
    the box's mask says."""
    mask = np.zeros(span, bool)
    mask[box_positions(dims)] = True
    # NOTE: two computations: XLA fuses the box's transposes and pads into an in-place update of the
    # whole DRAM array as one slow loop
    layout = jax.jit(lambda P, rows, offs: put_box(stored(P, rows, offs), dims, live, span))

    def write(data, new, bases):
        if not mask.all():
            new = jnp.where(mask, new, lax.dynamic_slice(data, (bases[0],), (span,)))
        return lax.dynamic_update_slice(data, new, (bases[0],))
    write = jax.jit(write, donate_argnums=0)
    return lambda data, P, rows, offs, bases: write(data, layout(P, rows, offs), bases)
