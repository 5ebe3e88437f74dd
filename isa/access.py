"""Which memory each instruction reads and writes, as address patterns over iteration dims.

The verifier, the reference interpreter and the simulator's planner all ask the
same question ("what does instruction i touch?"); this module answers it once,
columnar over the whole instruction stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .instructions import (
    BINARY,
    READS_DST,
    REDUCTIONS,
    REQUANT_RECORD_BYTES,
    AccMode,
    DType,
    Opcode,
    VectorFunc,
)

_ITEMSIZE = np.zeros(256, np.int64)
for _d in DType:
    _ITEMSIZE[_d] = _d.itemsize


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
    itemsize: np.ndarray    # (N,)

    def extent(self) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) byte range of each pattern (meaningful where valid and dims >= 1)."""
        span = (np.maximum(self.dims, 1) - 1) * self.strides
        lo = self.base + self.itemsize * np.minimum(span, 0).sum(1)
        hi = self.base + self.itemsize * (np.maximum(span, 0).sum(1) + 1)
        return lo, hi


def accesses(code: np.ndarray) -> list[Access]:
    """Every read and write of every instruction, one Access per (operand slot, direction)."""
    op = code["opcode"]
    func = code["func"]
    n = code["n"].astype(np.int64)
    spaces = code["spaces"].astype(np.int64)
    size_in, size_out = _ITEMSIZE[code["dtype"]], _ITEMSIZE[code["out_dtype"]]
    is_load, is_store = op == Opcode.LOAD, op == Opcode.STORE
    is_mm, is_vec, is_gather = op == Opcode.MATMUL, op == Opcode.VECTOR, op == Opcode.GATHER
    reads_dst = ((code["mode"] != AccMode.OVERWRITE) & (is_mm | is_vec)) | (is_vec & np.isin(func, list(READS_DST)))
    pad = code["pad"].astype(np.int64)
    padded = n[:, :3] + np.where(is_load[:, None], pad[:, 0::2] + pad[:, 1::2], 0)
    ones = np.ones(len(code), np.int64)
    reduction = np.isin(func, list(REDUCTIONS)) & is_vec

    def dims_for(slot):
        if slot == "x":   # DMA: DRAM side (GATHER: any row of the table); MATMUL: A (m1,m0,k); VECTOR: dst
            d = np.where(reduction[:, None], np.stack([n[:, 0], n[:, 1], ones], 1), n[:, :3])
            return np.where(is_gather[:, None], np.stack([n[:, 3], n[:, 1], n[:, 2]], 1), d)
        if slot == "y":   # LOAD: padded local box; MATMUL: B (k,n,1); else n
            d = np.where(is_load[:, None], padded, n[:, :3])
            return np.where(is_mm[:, None], np.stack([n[:, 2], n[:, 3], ones], 1), d)
        d = np.where(is_gather[:, None], np.stack([n[:, 0], ones, ones], 1), n[:, :3])   # GATHER: the indices
        return np.where(is_mm[:, None], np.stack([n[:, 0], n[:, 1], n[:, 3]], 1), d)  # z: C or src2

    out = []
    for i, slot in enumerate("xyz"):
        space = spaces >> (2 * i) & 3
        base = code[f"{slot}_base"].astype(np.int64)
        strides = code[f"{slot}_strides"].astype(np.int64)
        dims = dims_for(slot)
        if slot == "x":
            reads = [(is_load | is_gather, size_in), (is_mm, size_in), (is_vec & reads_dst, size_out)]
            writes = [(is_store, size_in), (is_vec, size_out)]
        elif slot == "y":
            reads = [(is_store, size_out), (is_mm, size_in), (is_vec, size_in)]
            writes = [(is_load | is_gather, size_out)]
        else:
            binary = is_vec & np.isin(func, list(BINARY))
            params = np.where(func == VectorFunc.REQUANT, REQUANT_RECORD_BYTES, size_in)
            reads = [(binary, params), (is_mm & reads_dst, size_out), (is_gather, 4)]
            writes = [(is_mm, size_out)]
        for write, parts in ((False, reads), (True, writes)):
            valid = np.zeros(len(code), bool)
            itemsize = np.zeros(len(code), np.int64)
            for mask, size in parts:
                valid |= mask
                itemsize = np.where(mask, size, itemsize)
            if valid.any():
                out.append(Access(slot, write, valid, space, base, strides, dims, itemsize))
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
