"""The instruction set: every opcode, field and encoding on one screen.

Every instruction is 64 bytes, little-endian, with one layout:

    offset  field       meaning
    0       opcode      Opcode
    1       func        VectorFunc (VECTOR), else 0
    2       dtype       element type read (DMA: DRAM side; MATMUL: A and B; VECTOR: sources)
    3       out_dtype   element type written (DMA: local side; MATMUL: C; VECTOR: dst)
    4       push        bit q set: send a dependency token to queue q when done
    5       pop         bit q set: wait for (and take) a token from queue q before starting
    6       mode        AccMode (MATMUL, VECTOR); PadValue (LOAD)
    7       spaces      Space of operand x (bits 0-1), y (bits 2-3), z (bits 4-5)
    8       n[4]        u16 x 4: the iteration space
    16      x           operand pattern: base (u32, bytes), strides (i32 x 3, elements)
    32      y           operand pattern
    48      z           operand pattern; LOAD keeps its 6 pad counts (u8) here

An operand pattern addresses element (i0, i1, i2) at base + (i0*s0 + i1*s1 +
i2*s2) * itemsize; a zero stride broadcasts.  A table function (CLAMP) reads src2
as one table instead: its base is the table's header (CLAMP's lo, hi and two
reserved words), the element of (i0, i1, i2) is word n3 + i0*s0 + i1*s1 + i2*s2
of it (n3 >= 4, strides >= 0: a layer's biases, one per channel, after the
header), and the access the verifier bounds-checks is the table's words from its
base through the last one read.  What each opcode and vector
function does with its operands, which fields it uses and what values they may
take is defined once, per opcode, in isa.opcodes.

Queues are in-order and run concurrently; tokens (VTA-style) order them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Opcode(enum.IntEnum):
    LOAD = 1
    STORE = 2
    MATMUL = 3
    VECTOR = 4
    GATHER = 5


class Queue(enum.IntEnum):
    LOAD = 0
    MATRIX = 1
    VECTOR = 2
    STORE = 3


class Space(enum.IntEnum):
    DRAM = 0
    SPAD = 1   # input/weight scratchpad
    ACC = 2    # accumulator SRAM


MEMORY_NAMES = {Space.DRAM: "DRAM", Space.SPAD: "scratchpad", Space.ACC: "accumulator"}


class DType(enum.IntEnum):
    F32 = 0
    BF16 = 1
    I8 = 2
    I32 = 3

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        return _NUMPY[self].itemsize


_NUMPY = {DType.F32: np.dtype(np.float32), DType.BF16: np.dtype(np.uint16),  # bf16 bit pattern
          DType.I8: np.dtype(np.int8), DType.I32: np.dtype(np.int32)}
ITEMSIZE = np.zeros(256, np.int64)   # bytes of each element type, indexed by an encoded dtype field
for _d in DType:
    ITEMSIZE[_d] = _d.itemsize


class AccMode(enum.IntEnum):
    OVERWRITE = 0
    ADD = 1
    MAX = 2
    MIN = 3


class PadValue(enum.IntEnum):
    ZERO = 0
    NEG_INF = 1   # most negative value of the type: the identity of max-pooling
    POS_INF = 2


class VectorFunc(enum.IntEnum):
    # unary
    COPY = 0
    NEG = 1
    ABS = 2
    RELU = 3
    EXP = 4
    LOG = 5
    RECIP = 6
    RSQRT = 7
    SQRT = 8
    TANH = 9
    ERF = 10
    SIGMOID = 11
    # binary
    ADD = 16
    SUB = 17
    MUL = 18
    MAX = 19
    MIN = 20
    DIV = 21        # int32 floor division (I-BERT's integer softmax and layer norm)
    SHR = 22        # int32 arithmetic shift right by src2 (clipped to 0..31): floor(x / 2**s)
    CMP_GT = 24
    CMP_GE = 25
    CMP_EQ = 26
    CMP_NE = 27
    SELECT = 28
    # reductions over i2
    RSUM = 32
    RMAX = 33
    RMIN = 34
    # sum over i2 of src1 * src2: int8 x int8 -> int32 dot products of runs contiguous in both (Arm's SDOT,
    # Helium's VMLADAV: four int8 products summed into each 32-bit lane)
    RDOT = 35
    # int32 -> int8: a per-channel int32 bias added, then a fixed-point multiplier, shift and zero point
    # (TFLite/gemmlowp rounding; the bias as Ethos-U's scale-bias records carry it)
    REQUANT = 40
    # int8 -> int8 through a 256-entry int8 table (src2): dst = table[src1 + 128]
    LUT = 41
    # int8/int32 -> int32 by the same records, a left shift first and no int8 saturation (TFLite Add's inputs)
    RESCALE = 44
    # float: dst = min(max(src1 + bias, lo), hi) by a layer's table (src2: lo, hi, 0, 0, then a bias per
    # channel; the instruction's biases from word n3, at src2's strides): a conv's bias add and its
    # ReLU / ReLU6 / hardtanh as one pass over the tile (the fp32 analogue of REQUANT's output stage)
    CLAMP = 45


# a REQUANT or RESCALE record, four int32 words: the Q31 multiplier; the control word (bits 0-7: the saturation
# bounds' lo + 128, bits 8-15: 127 - hi, bits 16-23: the zero point, bits 24-31: the shift, each byte signed but
# the bounds'); REQUANT's bias; RESCALE's left shift.  Per channel, so its size is DRAM traffic: 16 bytes, as
# TFLite's per-channel bias, multiplier and shift (12) aligned to a power of two so records stay aligned in a
# buffer of them (Arm's Ethos-U packs the same into 10)
REQUANT_RECORD_BYTES = 16
CLAMP_HEADER_WORDS = 4      # a CLAMP table's header: lo, hi, two reserved words (0); its biases follow
LUT_ENTRIES = 256           # a LUT table: one int8 per int8 input, the entry of q at q + 128
RECORD_ALIGN = 16           # an element aligns to its size, a record (REQUANT's, a LUT table) to at most this
MAX_COUNT = 65535           # the largest iteration count n[i] (u16)

INSTRUCTION_BYTES = 64
OPERANDS = ("x", "y", "z")

# One record layout for every opcode; `pad` overlays operand z (LOAD only).
ENCODING = np.dtype({
    "names": ["opcode", "func", "dtype", "out_dtype", "push", "pop", "mode", "spaces", "n",
              "x_base", "x_strides", "y_base", "y_strides", "z_base", "z_strides", "pad"],
    "formats": ["u1", "u1", "u1", "u1", "u1", "u1", "u1", "u1", ("<u2", 4),
                "<u4", ("<i4", 3), "<u4", ("<i4", 3), "<u4", ("<i4", 3), ("u1", 6)],
    "offsets": [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 20, 32, 36, 48, 52, 48],
    "itemsize": INSTRUCTION_BYTES,
})


@dataclass(frozen=True)
class Operand:
    """An address pattern: `space` memory, byte `base`, element `strides` over the iteration dims."""

    space: Space
    base: int
    strides: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self):
        if type(self.space) is not Space:
            object.__setattr__(self, "space", Space(self.space))
        s = self.strides
        if not (type(s) is tuple and len(s) == 3 and all(type(v) is int for v in s)):   # the emitter's hot path
            object.__setattr__(self, "strides", tuple(int(v) for v in s) + (0,) * (3 - len(s)))


@dataclass(frozen=True)
class Instruction:
    """One decoded instruction; see the module docstring for what each field means per opcode."""

    opcode: Opcode
    n: tuple[int, int, int, int]
    x: Operand | None      # an operand the opcode does not have (isa.opcodes) is None
    y: Operand | None
    z: Operand | None = None
    func: VectorFunc = VectorFunc.COPY
    dtype: DType = DType.F32
    out_dtype: DType = DType.F32
    mode: int = 0
    pad: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
    push: int = 0
    pop: int = 0


_NO_OPERAND = Operand(Space.DRAM, 0)


def load(src: Operand, dst: Operand, n, *, pad=(0,) * 6, pad_value=PadValue.ZERO,
         dtype=DType.F32, out_dtype=None) -> Instruction:
    """DMA DRAM -> scratchpad/accumulator; `pad` = (before0, after0, before1, after1, before2, after2)."""
    return Instruction(Opcode.LOAD, _dims(n, 3), src, dst, None, dtype=dtype,
                       out_dtype=dtype if out_dtype is None else out_dtype, mode=int(pad_value), pad=tuple(pad))


def store(dst: Operand, src: Operand, n, *, dtype=DType.F32, out_dtype=None) -> Instruction:
    """DMA scratchpad/accumulator -> DRAM; `dtype` is the DRAM type, `out_dtype` the local one."""
    return Instruction(Opcode.STORE, _dims(n, 3), dst, src, None, dtype=dtype,
                       out_dtype=dtype if out_dtype is None else out_dtype)


def gather(table: Operand, dst: Operand, index: Operand, n, rows: int, *, dtype=DType.F32,
           out_dtype=None) -> Instruction:
    """Indirect DMA: dst[i0, i1, i2] = table row index[i0] (rows < `rows`), elements (i1, i2)."""
    return Instruction(Opcode.GATHER, (*_dims(n, 3)[:3], int(rows)), table, dst, index, dtype=dtype,
                       out_dtype=dtype if out_dtype is None else out_dtype)


def matmul(a: Operand, b: Operand, c: Operand, m1: int, m0: int, k: int, n: int, *,
           accumulate: bool, dtype=DType.F32, out_dtype=DType.F32) -> Instruction:
    mode = AccMode.ADD if accumulate else AccMode.OVERWRITE
    return Instruction(Opcode.MATMUL, (m1, m0, k, n), a, b, c, dtype=dtype, out_dtype=out_dtype, mode=int(mode))


def vector(func: VectorFunc, dst: Operand, src1: Operand, src2: Operand | None, n, *,
           acc: AccMode = AccMode.OVERWRITE, dtype=DType.F32, out_dtype=None, table_offset: int = 0) -> Instruction:
    """A VECTOR instruction; `table_offset`: n3, the word of src2 its elements start at (a table's, CLAMP's)."""
    return Instruction(Opcode.VECTOR, _dims(n, 3)[:3] + (int(table_offset),), dst, src1, src2, func=VectorFunc(func),
                       dtype=dtype, out_dtype=dtype if out_dtype is None else out_dtype, mode=int(acc))


def _dims(n, rank) -> tuple[int, int, int, int]:
    n = tuple(int(v) for v in n)
    if len(n) != rank:
        raise ValueError(f"expected {rank} iteration counts, got {n}")
    return n + (0,) * (4 - rank)


# The encoding without the pad overlay: one tuple per instruction builds a whole array at once.
_FIELDS = np.dtype([(name, ENCODING.fields[name][0]) for name in ENCODING.names if name != "pad"])
assert _FIELDS.itemsize == INSTRUCTION_BYTES


def _record(ins: Instruction) -> tuple:
    x, y, z = (o or _NO_OPERAND for o in (ins.x, ins.y, ins.z))
    z_base, z_strides = z.base, z.strides
    if ins.z is None:   # the six pad counts (LOAD's; zero elsewhere) overlay z's first bytes (little-endian)
        p = ins.pad
        z_base = p[0] | p[1] << 8 | p[2] << 16 | p[3] << 24
        z_strides = (p[4] | p[5] << 8, 0, 0)
    return (ins.opcode, ins.func, ins.dtype, ins.out_dtype, ins.push, ins.pop, ins.mode,
            x.space | y.space << 2 | z.space << 4, ins.n, x.base, x.strides, y.base, y.strides, z_base, z_strides)


def encode(instructions: list[Instruction]) -> np.ndarray:
    """Instructions -> records of ENCODING."""
    return np.array([_record(ins) for ins in instructions], _FIELDS).view(ENCODING)
