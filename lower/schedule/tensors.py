"""Tensors in DRAM as strided views: transposes, broadcasts, slices and most reshapes
are new views of the same bytes, never instructions."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from stagec.isa.instructions import DType

DTYPE_OF = {"float32": DType.F32, "bfloat16": DType.BF16, "int32": DType.I32,   # graph value types -> element types
            "int8": DType.I8}


class DramRegion(enum.IntEnum):
    CONST = 0
    DATA = 1   # inputs, outputs, intermediates: relocated past the constant blob at the end


@dataclass(frozen=True)
class DramTensor:
    """Element (i_0, ..., i_r) at byte offset + itemsize * sum(i_d * strides[d]) of `region`."""

    region: DramRegion
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType = DType.F32

    @classmethod
    def dense(cls, region, offset, shape, order=None, dtype=DType.F32) -> DramTensor:
        """A contiguous buffer; `order` lists logical dims from outermost to innermost in memory."""
        order = tuple(range(len(shape))) if order is None else tuple(order)
        strides = [0] * len(shape)
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= shape[d]
        return cls(region, offset, tuple(shape), tuple(strides), dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def address(self, index) -> int:
        """Byte offset (within the region) of the element at `index`."""
        return self.offset + self.dtype.itemsize * sum(i * s for i, s in zip(index, self.strides, strict=True))

    def transpose(self, perm) -> DramTensor:
        return DramTensor(self.region, self.offset, tuple(self.shape[p] for p in perm),
                          tuple(self.strides[p] for p in perm), self.dtype)

    def broadcast(self, shape, dims) -> DramTensor:
        """lax.broadcast_in_dim as a view: new and size-1-expanded dims get stride 0."""
        strides = [0] * len(shape)
        for i, d in enumerate(dims):
            strides[d] = self.strides[i] if self.shape[i] == shape[d] else 0
        return DramTensor(self.region, self.offset, tuple(shape), tuple(strides), self.dtype)

    def broadcast_to(self, shape) -> DramTensor:
        """numpy-style broadcasting (align right) as a view."""
        lead = len(shape) - self.rank
        return self.broadcast(shape, tuple(range(lead, len(shape))))

    def slice(self, start, limit, step) -> DramTensor:
        shape = tuple(max(0, -(-(hi - lo) // s)) for lo, hi, s in zip(start, limit, step, strict=True))
        return DramTensor(self.region, self.address(start), shape,
                          tuple(st * s for st, s in zip(self.strides, step, strict=True)), self.dtype)

    def select(self, dim: int, index: int) -> DramTensor:
        """Fix one dim at `index`, dropping it."""
        start = [0] * self.rank
        start[dim] = index
        return DramTensor(self.region, self.address(start), self.shape[:dim] + self.shape[dim + 1:],
                          self.strides[:dim] + self.strides[dim + 1:], self.dtype)

    def reshape(self, shape) -> DramTensor | None:
        """The same elements in row-major order under a new shape, as a view; None if that
        needs a copy (numpy's no-copy reshape rule)."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        old = [(d, s) for d, s in zip(self.shape, self.strides, strict=True) if d != 1]
        new = list(shape)
        strides = [0] * len(new)
        oi, ni = 0, 0
        while oi < len(old) and ni < len(new):
            oj, nj = oi + 1, ni + 1
            op, np_ = old[oi][0], new[ni]
            while op != np_:
                if np_ < op:
                    np_ *= new[nj]
                    nj += 1
                else:
                    op *= old[oj][0]
                    oj += 1
            if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
                return None
            strides[nj - 1] = old[oj - 1][1]
            for k in range(nj - 1, ni, -1):
                strides[k - 1] = strides[k] * new[k]
            oi, ni = oj, nj
        return DramTensor(self.region, self.offset, shape, tuple(strides), self.dtype)


def coalesce(shape, *strides_list, max_count: int | None = None):
    """Merge adjacent dims that every operand traverses contiguously (into no count above
    `max_count`, where given); drop size-1 dims.

    Returns (shape, [strides per operand]) of the smallest rank describing the same iteration.
    """
    dims = [(d, [s[i] for s in strides_list]) for i, d in enumerate(shape) if d != 1]
    merged: list[tuple[int, list[int]]] = []
    for d, ss in dims:
        if merged:
            pd, pss = merged[-1]
            if all(ps == s * d for ps, s in zip(pss, ss, strict=True)) and (max_count is None or pd * d <= max_count):
                merged[-1] = (pd * d, ss)
                continue
        merged.append((d, ss))
    if not merged:
        merged = [(1, [0] * len(strides_list))]
    return tuple(d for d, _ in merged), [tuple(ss[k] for _, ss in merged) for k in range(len(strides_list))]


def local_type(dram: DType) -> DType:
    """How local memory holds an element LOADed from DRAM as `dram` for the vector unit (and how a
    STORE to `dram` finds it): bf16 as float32, what the vector unit computes on (isa.opcodes: the
    DMA widens and rounds); the matrix unit's operands LOAD bf16 as it is."""
    return DType.F32 if dram == DType.BF16 else dram
