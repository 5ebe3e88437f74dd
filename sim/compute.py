"""The batched executor's compute kernels: MATMUL and VECTOR groups, and the joins that lay out a
read spanning several values (sim.kernel).

A node is a chain of instructions accumulating into one region (a convolution's taps, a pool's
window) or a single instruction; a group's members are nodes of one signature, run as one batched
read -> compute.  VECTOR applies each vector function's own semantics (isa.opcodes) with jax.numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import PlanError
from stagec.isa import opcodes
from stagec.isa.access import element_offsets, is_dense
from stagec.isa.instructions import AccMode, DType, Opcode
from stagec.isa.semantics import ACCUMULATE, Namespace, accumulate, cast, table_index, table_words, widen

from .boxes import box, read
from .fixed_point import requantize, rescale
from .fusion import matmul_blocks
from .kernel import Kernel, Prepared, register

HIGHEST = lax.Precision.HIGHEST


def _convert(x, to: DType):
    """COPY's conversion (isa.semantics.convert): float -> int truncates and saturates, NaN -> 0."""
    t = to.numpy
    if jnp.issubdtype(x.dtype, jnp.floating) and np.issubdtype(t, np.integer):
        info = np.iinfo(t)
        x = jnp.clip(jnp.nan_to_num(jnp.trunc(x), nan=0.0), info.min, info.max)
    return x.astype(t)


# the vector functions' semantics, in JAX
JAX = Namespace(jnp, lax.erf, lax.rsqrt, requantize, _convert, lax.bitcast_convert_type, rescale)


def _rel(strides, dims) -> np.ndarray:
    return element_offsets(strides, dims).astype(np.int32)


@register(Opcode.MATMUL)
@dataclass(frozen=True)
class Matmul(Kernel):
    """One chain per member: out[t] = init[t] + sum_j A[t,j] @ B[t,j] (isa.opcodes: MATMUL)."""

    chain: int              # instructions per member
    n: tuple                # (m1, m0, k, n)
    a_strides: tuple
    b_strides: tuple        # B's two
    c_strides: tuple
    has_init: bool
    dtype: DType
    out_dtype: DType
    kind = "matmul"
    slots = ("a", "b", "init")

    @classmethod
    def describe(cls, node):
        node.local("a", "x", node.dtype)
        node.local("b", "y", node.dtype)
        node.initial("z")
        m1, m0, _, n = node.n
        if not is_dense(node.strides("z"), (m1, m0, n)):
            raise PlanError(f"instruction {node.index}: MATMUL writes a non-contiguous accumulator region")
        sig = cls(node.chain, node.n, node.strides("x"), node.strides("y")[:2], node.strides("z"), node.has_init,
                  node.dtype, node.out_dtype)
        return sig, tuple(node.source(s) for s in cls.slots), m1 * m0 * n

    def read_dims(self, slot):
        m1, m0, k, n = self.n
        if slot == "a":
            return box(self.a_strides, (m1, m0, k))
        if slot == "b":
            return box((*self.b_strides, 0), (k, n, 1))
        return box(self.c_strides, (m1, m0, n))

    def prepare(self, group) -> Prepared:
        """The members as blocks of S distinct A reads x O distinct B reads (sim.fusion.matmul_blocks),
        each A and B read once; `sel` puts the blocks' products in member order."""
        reads = super().prepare(group).reads
        ia, ib, sel, grid = matmul_blocks(group)
        reads["a"] = tuple(x[ia] for x in reads["a"])
        reads["b"] = tuple(x[ib] for x in reads["b"])
        permuted = bool((sel != np.arange(len(sel))).any())
        return Prepared(reads, (jnp.asarray(sel, jnp.int32),), (grid, permuted))

    def build(self, hows, layout):
        j, (m1, m0, k, n) = self.chain, self.n
        (s, o), permuted = layout
        rel_a, rel_b = _rel(self.a_strides, (m1, m0, k)), _rel((*self.b_strides, 0), (k, n, 1))
        rel_c = _rel(self.c_strides, (m1, m0, n))
        acc = self.out_dtype.numpy

        def run(pa, ra, oa, pb, rb, ob, *rest):
            *init, sel = rest
            blocks = ra.shape[0] // s
            a = widen(JAX, read(pa, ra, oa, rel_a, hows[0])).reshape(blocks, s, j, m1 * m0, k)
            b = widen(JAX, read(pb, rb, ob, rel_b, hows[1])).reshape(blocks, o, j, k, n)
            out = jnp.einsum("bsjmk,bojkn->bsomn", a, b, precision=HIGHEST, preferred_element_type=acc)
            out = out.reshape(blocks * s * o, m1 * m0 * n)
            out = out[sel] if permuted else out
            if self.has_init:
                out = read(*init, rel_c, hows[2]).reshape(out.shape) + out
            return out
        return jax.jit(run)


@register(Opcode.VECTOR)
@dataclass(frozen=True)
class Vector(Kernel):
    """One chain per member: the vector function (isa.opcodes, in JAX) of each instruction,
    accumulated into the initial value."""

    chain: int
    func: int
    acc: int
    n: tuple
    dst_strides: tuple
    src1_strides: tuple
    src2_strides: tuple | None
    has_init: bool
    dtype: DType
    out_dtype: DType
    table_offset: int = 0       # n3: a table function's first element (isa.semantics.table_index)
    kind = "vector"
    slots = ("src1", "src2", "init")

    @classmethod
    def describe(cls, node):
        f = opcodes.VECTOR_FUNCS[node.func]
        if node.acc != AccMode.OVERWRITE and (f.reads_dst or f.src2_words > 1):
            raise PlanError(f"instruction {node.index}: {f.name} with an accumulate mode")
        node.local("src1", "y", node.dtype)
        if f.sources == 2:
            node.local("src2", "z", DType(f.src2_dtype) if f.src2_dtype >= 0 else node.dtype)
        node.initial("x")
        dims = _dst_dims(f, node.n)
        if not is_dense(node.strides("x"), dims):
            raise PlanError(f"instruction {node.index}: vector op writes a non-contiguous local region")
        sig = cls(node.chain, node.func, node.acc, node.n[:3], node.strides("x"), node.strides("y"),
                  node.strides("z") if f.sources == 2 else None, node.has_init, node.dtype, node.out_dtype,
                  node.n[3] if f.src2_table else 0)
        return sig, tuple(node.source(s) for s in cls.slots), int(np.prod(dims))

    def read_dims(self, slot):
        f = opcodes.VECTOR_FUNCS[self.func]
        if slot == "src1":
            return box(self.src1_strides, self.n)
        if slot == "src2" and f.src2_table:   # the table's words, read whole
            return ((self._table_words, 1),)
        if slot == "src2" and f.src2_words > 1:   # records of src2_words words, strides counting records
            w = f.src2_words
            return (*((c, st * w) for c, st in box(self.src2_strides, _src2_dims(f, self.n))), (w, 1))
        if slot == "src2":
            return box(self.src2_strides, self.n)
        return box(self.dst_strides, _dst_dims(f, self.n))

    @property
    def _table_words(self) -> int:
        return int(table_words((*self.n, self.table_offset), self.src2_strides))

    def build(self, hows, layout):
        j, n, f = self.chain, self.n, opcodes.VECTOR_FUNCS[self.func]
        rel1, rel_dst = _rel(self.src1_strides, n), _rel(self.dst_strides, _dst_dims(f, n))
        w = self._table_words if f.src2_table else f.src2_words
        words = (w,) if w > 1 or f.src2_table else ()
        index = [table_index((*n, self.table_offset), self.src2_strides)] if f.src2_table else []
        rel2 = None
        if f.sources == 2:
            rel2 = (_rel(self.src2_strides, _src2_dims(f, n))[:, None] * w + np.arange(w)).reshape(-1)

        def run(*args):
            t = args[1].shape[0]
            sources = [read(*args[:3], rel1, hows[0]).reshape(t, j, *n)]
            rest = args[3:]
            if f.sources == 2:
                sources.append(read(*rest[:3], rel2, hows[1]).reshape(t, j, *_src2_dims(f, n), *words))
                rest = rest[3:]
            init = read(*rest, rel_dst, hows[2]).reshape(t, -1) if self.has_init else None
            if f.reads_dst:
                sources.append(init.reshape(sources[0].shape))
            v = cast(JAX, f.apply(JAX, *(widen(JAX, x) for x in sources), *index).reshape(t, j, -1), self.out_dtype)
            if self.acc == AccMode.OVERWRITE:
                return v[:, 0]
            # the members, in order; an integer sum wraps in the value's type, as each add would
            chain = getattr(jnp, ACCUMULATE[AccMode(self.acc)][1])(v, axis=1).astype(v.dtype)
            return accumulate(JAX, self.acc, init, chain) if self.has_init else chain
        return jax.jit(run)


def _dst_dims(f: opcodes.VectorFuncDef, n) -> tuple:
    return (n[0], n[1], 1) if f.reduction else tuple(n[:3])


def _src2_dims(f: opcodes.VectorFuncDef, n) -> tuple:
    return (1, 1, 1) if f.src2_once or f.src2_table else tuple(n[:3])


@dataclass(frozen=True)
class Join(Kernel):
    """Each member's value laid out from its pieces ((start, rows, row length): consecutive rows of a
    producer group), pasted in program order (a later writer's elements over an earlier one's, as
    local memory holds them).  Made by the planner (sim.plan), not by an opcode."""

    dtype: DType
    length: int
    layout: tuple
    kind = "join"

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(f"p{j}" for j in range(len(self.layout)))

    def read_dims(self, slot):
        return ((self.layout[int(slot[1:])][2], 1),)

    def build(self, hows, layout):
        rels = [np.arange(n, dtype=np.int32) for _, _, n in self.layout]

        def run(*args):
            out = jnp.zeros((args[1].shape[0], self.length), self.dtype.numpy)
            for j, ((start, rows, n), how) in enumerate(zip(self.layout, hows, strict=True)):
                piece = read(*args[3 * j:3 * j + 3], rels[j], how).reshape(-1, rows * n)
                out = out.at[:, start:start + rows * n].set(piece)
            return out
        return jax.jit(run)
