"""The instruction emitter: what every lowering rule writes through.

It keeps the instruction list, which layer each instruction belongs to, which
DRAM operands point into the data region (relocated past the constant blob
once its size is known), and the constant blob itself.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import (
    MAX_COUNT,
    AccMode,
    DType,
    Instruction,
    Operand,
    PadValue,
    Space,
    VectorFunc,
    gather,
    load,
    matmul,
    store,
    vector,
)
from stagec.isa.semantics import NUMPY, round_bf16

from ..schedule.buffers import Buffer, local_bytes
from ..schedule.tensors import DTYPE_OF, DramRegion, DramTensor, coalesce, local_type
from .memory import ALIGN, LocalAllocator, align

ACC_DTYPE = {DType.F32: DType.F32, DType.BF16: DType.F32, DType.I8: DType.I32}   # a MATMUL's operand type -> its
# accumulator's


@dataclass
class ConstPool:
    """The constant blob: arrays placed once each (per layout), 64-byte aligned."""

    chunks: list = field(default_factory=list)   # byte views of the arrays and their padding
    size: int = 0
    _placed: dict = field(default_factory=dict)

    def place(self, key, array: np.ndarray) -> int:
        if key not in self._placed:
            # A byte view, not tobytes(): blob() then copies a model's weights once, not three times.
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            self._placed[key] = self.size
            self.chunks += [data, bytes(align(data.size) - data.size)]
            self.size += align(data.size)
        return self._placed[key]

    def tensor(self, key, array: np.ndarray, order=None) -> DramTensor:
        """A constant as a DramTensor of its logical shape, stored with dims in `order`."""
        order = tuple(range(array.ndim)) if order is None else tuple(order)
        offset = self.place((key, order), np.transpose(array, order))
        return DramTensor.dense(DramRegion.CONST, offset, array.shape, order, DTYPE_OF[str(array.dtype)])

    def scalar(self, value: float, dtype: DType = DType.F32) -> DramTensor:
        """One constant element of `dtype` as a 0-d tensor; an infinity fills an integer type with its
        extreme (the identity of max/min, as PadValue's)."""
        t = dtype.numpy
        if dtype == DType.BF16:
            offset = self.place(("scalar", dtype, value), round_bf16(NUMPY, np.array([value], np.float32)))
            return DramTensor(DramRegion.CONST, offset, (), (), dtype)
        if np.issubdtype(t, np.integer):
            info = np.iinfo(t)
            value = info.min if value == -np.inf else info.max if value == np.inf else value
            if value != int(value) or not info.min <= value <= info.max:
                raise ValueError(f"constant {value} is not a {dtype.name} value")
        offset = self.place(("scalar", dtype, value), np.array([value], t))
        return DramTensor(DramRegion.CONST, offset, (), (), dtype)

    def blob(self) -> bytes:
        return b"".join(self.chunks)


class Emitter:
    def __init__(self, hw: HardwareConfig):
        self.hw = hw
        self.instructions: list[Instruction] = []
        self.relocate: list[bool] = []
        self.layer_ids: list[int] = []
        self.layer = -1
        self.consts = ConstPool()
        self.layer_name = ""
        self.local_peaks: dict[str, list[int]] = {}   # layer -> [scratchpad, accumulator] bytes it used

    # --- local memory -----------------------------------------------------------------------
    def allocate(self, buffers: list[Buffer]) -> dict[str, list[int]]:
        """Place one nest's buffers (lower.schedule.buffers: the list the mapper checked fits) in the
        scratchpad and the accumulator, which the nest owns whole: {name: the base of each of its
        buffers}.  Largest alignment first, so no gap opens; each layer's high-water marks are kept
        in `local_peaks`."""
        memories = {Space.SPAD: LocalAllocator(self.hw.scratchpad_bytes, "scratchpad", self.layer_name),
                    Space.ACC: LocalAllocator(self.hw.accumulator_bytes, "accumulator", self.layer_name)}
        bases = {b.name: [memories[b.space].alloc(int(b.nbytes), b.align) for _ in range(int(b.count))]
                 for b in sorted(buffers, key=lambda b: -b.align)}
        peaks = self.local_peaks.setdefault(self.layer_name, [0, 0])
        for i, (space, need) in enumerate(zip((Space.SPAD, Space.ACC), local_bytes(buffers), strict=True)):
            memories[space].expect(int(need))
            peaks[i] = max(peaks[i], int(need))
        return bases

    def _append(self, ins: Instruction, dram: DramRegion | None = None) -> None:
        self.instructions.append(ins)
        self.relocate.append(dram == DramRegion.DATA)
        self.layer_ids.append(self.layer)

    # --- DMA ----------------------------------------------------------------------------------
    def load(self, src: DramTensor, start, axes, counts, dst: Operand, *, pad=(0,) * 6,
             pad_value=PadValue.ZERO, local: DType | None = None) -> None:
        """LOAD the box of `src` at `start` spanning `axes` (3 logical dims, None = unit) into a
        dense local box (counts + pads), as `local` elements (default: local_type)."""
        self._append(load(_dram_operand(src, start, axes), dst, counts, pad=pad, pad_value=pad_value,
                          dtype=src.dtype, out_dtype=local or local_type(src.dtype)), src.region)

    def gather(self, table: DramTensor, start, rows: int, width: int, dst: Operand, index: Operand) -> None:
        """GATHER `rows` rows of a 2-D table (columns from start[1], `width` of them) by the int32
        indices at `index` into the dense local `dst`."""
        self._append(gather(_dram_operand(table, start, (0, None, 1)), dst, index, (rows, 1, width), table.shape[0],
                            dtype=table.dtype, out_dtype=local_type(table.dtype)), table.region)

    def store(self, dst: DramTensor, start, axes, counts, src: Operand) -> None:
        self._append(store(_dram_operand(dst, start, axes), src, counts, dtype=dst.dtype,
                           out_dtype=local_type(dst.dtype)), dst.region)

    def load_box(self, src: DramTensor, start, axes, counts, space: Space, base: int, *,
                 local: DType | None = None) -> None:
        """LOAD an N-D box (dense in local memory, in `axes` order) with as few 3-D LOADs as possible."""
        self._box(src, start, axes, counts, space, base, functools.partial(self.load, local=local))

    def store_box(self, dst: DramTensor, start, axes, counts, space: Space, base: int) -> None:
        self._box(dst, start, axes, counts, space, base, self.store)

    def _box(self, t: DramTensor, start, axes, counts, space, base, op) -> None:
        counts = [int(c) for c in counts]
        local = [math.prod(counts[i + 1:]) for i in range(len(counts))]
        # Merge dims contiguous on both sides, within the counts' 16-bit field (a weight box of
        # 3x3x64x128 is one DMA of 576 x 128, not 73728 split at 65535 into two of different shapes,
        # whose matmuls would read across them); loop over what does not fit one 3-D DMA.
        shape, (dram_s, local_s) = _factor(*coalesce(counts, [t.strides[a] for a in axes], local,
                                                     max_count=MAX_COUNT))
        lead = max(len(shape) - 3, 0)
        fill = (1,) * (3 - len(shape[lead:]))
        inner = fill + shape[lead:]
        inner_d, inner_l = (0,) * len(fill) + dram_s[lead:], (0,) * len(fill) + local_s[lead:]
        item, origin = t.dtype.itemsize, t.address(start)
        if not lead and max(inner) <= MAX_COUNT:   # the common case: one DMA
            op(DramTensor(t.region, origin, inner, inner_d, t.dtype), (0, 0, 0), (0, 1, 2), inner,
               Operand(space, base, inner_l))
            return
        for idx in np.ndindex(*shape[:lead]):
            for n, org in _split_counts(inner):
                od = _dot(idx, dram_s) + _dot(org, inner_d)
                ol = _dot(idx, local_s) + _dot(org, inner_l)
                op(DramTensor(t.region, origin + od * item, n, inner_d, t.dtype), (0, 0, 0), (0, 1, 2), n,
                   Operand(space, base + ol * item, inner_l))

    # --- compute --------------------------------------------------------------------------------
    def matmul(self, a: Operand, b: Operand, c: Operand, m1, m0, k, n, *, accumulate: bool,
               dtype: DType = DType.F32) -> None:
        """C (+)= A @ B; int8 operands accumulate in int32, float32 and bf16 ones in float32."""
        self._append(matmul(a, b, c, m1, m0, k, n, accumulate=accumulate, dtype=dtype, out_dtype=ACC_DTYPE[dtype]))

    def vector(self, func: VectorFunc, dst: Operand, src1: Operand, src2: Operand | None, counts, *,
               acc: AccMode = AccMode.OVERWRITE, dtype: DType = DType.F32, out_dtype: DType | None = None,
               table_offset: int = 0) -> None:
        self._append(vector(func, dst, src1, src2, counts, acc=acc, dtype=dtype, out_dtype=out_dtype,
                            table_offset=table_offset))


def _dram_operand(t: DramTensor, start, axes) -> Operand:
    strides = tuple(t.strides[a] if a is not None else 0 for a in axes)
    return Operand(Space.DRAM, t.address(start), strides)


def _factor(shape, strides_list):
    """(shape, strides_list) with each count above the 16-bit field split in two counts within it
    where it factors so (a * b, stride s -> a with stride b * s, b with stride s)."""
    out_shape, out_strides = [], [[] for _ in strides_list]
    for i, d in enumerate(shape):
        a = next((a for a in range(-(-d // MAX_COUNT), MAX_COUNT + 1) if d % a == 0), None) if d > MAX_COUNT else None
        counts = (d,) if a is None else (a, d // a)
        out_shape += counts
        for out, strides in zip(out_strides, strides_list, strict=True):
            out += [strides[i]] if a is None else [strides[i] * (d // a), strides[i]]
    return tuple(out_shape), [tuple(s) for s in out_strides]


def _split_counts(n):
    """Split a 3-D count tuple so that no count exceeds the u16 field; yields (counts, origins)."""
    ranges = [[(o, min(MAX_COUNT, d - o)) for o in range(0, d, MAX_COUNT)] for d in n]
    for r0 in ranges[0]:
        for r1 in ranges[1]:
            for r2 in ranges[2]:
                yield (r0[1], r1[1], r2[1]), (r0[0], r1[0], r2[0])


def _dot(a, b) -> int:
    return sum(int(x) * int(y) for x, y in zip(a, b, strict=False))


def dense_strides(counts) -> tuple[int, int, int]:
    """Row-major strides of a dense local box."""
    _, c1, c2 = counts
    return (c1 * c2, c2, 1)


__all__ = ["ALIGN", "ConstPool", "DType", "Emitter", "dense_strides", "local_type"]
