"""Which memory each instruction reads and writes, as address patterns over iteration dims.

The verifier, the reference interpreter and the simulator's planner all ask the
same question ("what does instruction i touch?"); this module answers it once,
columnar over the whole instruction stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import opcodes
from .instructions import ITEMSIZE
from .opcodes import OPERANDS, Fields


@dataclass(frozen=True)
class Access:
    """One operand slot of many instructions: element (i0,i1,i2) < dims is at
    base + itemsize * (i0*s0 + i1*s1 + i2*s2) in memory `space`."""

    operand: str            # 'x', 'y' or 'z'
    write: bool
    valid: np.ndarray       # bool (N,): this instruction makes this access
    space: np.ndarray       # (N,)
    base: np.ndarray        # (N,) bytes
    strides: np.ndarray     # (N, 3) elements
    dims: np.ndarray        # (N, 3)
    itemsize: np.ndarray    # (N,) bytes of one element: dtype's, times `words`
    dtype: np.ndarray       # (N,) DType of the element (of its words, for records)
    words: np.ndarray       # (N,) words per element: 1, or the words of a record (REQUANT's src2)

    def extent(self) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) byte range of each pattern (meaningful where valid and dims >= 1)."""
        span = (np.maximum(self.dims, 1) - 1) * self.strides
        lo = self.base + self.itemsize * np.minimum(span, 0).sum(1)
        hi = self.base + self.itemsize * (np.maximum(span, 0).sum(1) + 1)
        return lo, hi


def accesses(code: np.ndarray) -> list[Access]:
    """Every read and write of every instruction, one Access per (operand, direction), from the
    opcodes' slots (isa.opcodes)."""
    n = len(code)
    parts: dict[tuple[str, bool], list] = {}
    op = code["opcode"]
    for d in opcodes.OPCODES.values():
        rows = np.flatnonzero(op == d.opcode)
        if rows.size:
            f = Fields(code[rows])
            for s in d.slots:
                on = s.rows(f)
                parts.setdefault((s.operand, s.write), []).append((rows[on], s.dims(f)[on],
                                                                   *(t[on] for t in s.element.types(f))))
    spaces = code["spaces"].astype(np.int64)
    out = []
    for i, operand in enumerate(OPERANDS):
        pattern = None   # (space, base, strides): one set of arrays for both directions
        for write in (False, True):
            if not any(len(p[0]) for p in parts.get((operand, write), ())):
                continue
            valid, dims = np.zeros(n, bool), np.zeros((n, 3), np.int64)
            dtype, words = np.zeros(n, np.int64), np.zeros(n, np.int64)
            for rows, d, t, w in parts[operand, write]:
                valid[rows], dims[rows], dtype[rows], words[rows] = True, d, t, w
            pattern = pattern or (spaces >> (2 * i) & 3, code[f"{operand}_base"].astype(np.int64),
                                  code[f"{operand}_strides"].astype(np.int64))
            out.append(Access(operand, write, valid, *pattern, dims, np.where(valid, ITEMSIZE[dtype] * words, 0),
                              dtype, words))
    return out


def element_offsets(strides, dims) -> np.ndarray:
    """Element offsets (i0*s0 + i1*s1 + i2*s2) in iteration order, flattened."""
    s0, s1, s2 = (int(s) for s in strides)
    d0, d1, d2 = (int(d) for d in dims)
    return (np.arange(d0, dtype=np.int64)[:, None, None] * s0 + np.arange(d1, dtype=np.int64)[None, :, None] * s1
            + np.arange(d2, dtype=np.int64)[None, None, :] * s2).reshape(-1)


def dense_patterns(strides: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """is_dense over arrays of patterns (N, 3)."""
    s, d = np.asarray(strides, np.int64), np.asarray(dims, np.int64)
    return (((d[:, 2] <= 1) | (s[:, 2] == 1)) & ((d[:, 1] <= 1) | (s[:, 1] == d[:, 2]))
            & ((d[:, 0] <= 1) | (s[:, 0] == d[:, 1] * d[:, 2])))


def overlapping_patterns(strides: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """Per pattern (N, 3), True where it may visit an element twice: its dims (those of more than one
    step), sorted by |stride|, do not nest, each stride beyond the span of the smaller ones."""
    d = np.asarray(dims, np.int64)
    s = np.where(d > 1, np.abs(np.asarray(strides, np.int64)), 0)
    order = np.argsort(s, 1)
    d, s = np.take_along_axis(d, order, 1), np.take_along_axis(s, order, 1)
    span = np.zeros(len(d), np.int64)
    overlap = np.zeros(len(d), bool)
    for k in range(3):
        steps = d[:, k] > 1
        overlap |= steps & (s[:, k] <= span)
        span = np.where(steps, span + (d[:, k] - 1) * s[:, k], span)
    return overlap


def is_dense(strides, dims) -> bool:
    """True when the pattern visits consecutive elements in iteration order (row-major, no gaps)."""
    expect = 1
    for s, d in zip(reversed(list(strides)), reversed(list(dims)), strict=True):
        if d > 1 and s != expect:
            return False
        expect *= int(d)
    return True
