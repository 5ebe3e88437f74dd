"""One definition per opcode and per vector function, in the spirit of Exo's instruction definitions.

An opcode's definition is all the toolchain knows about it: the queue that runs it; its operand
slots (which encoded operand, x, y or z, it reads or writes, as which element type, over which
dims of its iteration counts, in which memories); the legal values of its other fields; its
assembly spelling; its reference semantics (numpy, on its operands' values); and the unit whose
timing and energy formulas (sim.costs, sim.energy) it is charged by, with the shape numbers those
formulas take.  A vector function's definition is its sources, its flags and its semantics,
written once over an array namespace (isa.semantics.Namespace: numpy in the reference
interpreter, jax.numpy in the batched executor).

Readers: isa.access (what an instruction touches), isa.verify, isa.assembly, `decode`,
sim.reference, sim.costs (timing), sim.energy, and the batched executor (sim.plan, with one
kernel per opcode in sim.dma and sim.compute).  The tables are read when used, not copied at
import, so a test can register a definition in a copy of a table (tests/test_opcode_table.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stagec.errors import SimulationError

from . import semantics
from .instructions import (
    CLAMP_HEADER_WORDS,
    ITEMSIZE,
    LUT_ENTRIES,
    REQUANT_RECORD_BYTES,
    AccMode,
    DType,
    Instruction,
    Opcode,
    Operand,
    PadValue,
    Queue,
    Space,
    VectorFunc,
)
from .semantics import NUMPY, accumulate, cast, clamp, dot, floor_div, lookup, multiply, pad_value, widen, widening_sum

OPERANDS = ("x", "y", "z")
LOCAL = frozenset({Space.SPAD, Space.ACC})
DRAM = frozenset({Space.DRAM})


def _column(name: str) -> cached_property:
    return cached_property(lambda self: self.code[name].astype(np.int64))


class Fields:
    """Instruction records (some rows of a program's code), columnar, as the definitions read them."""

    n = _column("n")            # (k, 4)
    pad = _column("pad")        # (k, 6)
    func = _column("func")
    mode = _column("mode")

    def __init__(self, code: np.ndarray):
        self.code = code

    def __len__(self) -> int:
        return len(self.code)

    @cached_property
    def elements(self) -> np.ndarray:
        return self.n[:, 0] * self.n[:, 1] * self.n[:, 2]

    def field(self, name: str) -> np.ndarray:
        return self.code[name].astype(np.int64)

    def space(self, operand: str) -> np.ndarray:
        return self.field("spaces") >> 2 * OPERANDS.index(operand) & 3

    def strides(self, operand: str) -> np.ndarray:
        return self.field(f"{operand}_strides")


class Element(enum.Enum):
    """A slot's element type, as the instruction's fields give it."""

    IN = "dtype"            # the dtype field
    OUT = "out_dtype"       # the out_dtype field
    INDEX = "int32"         # GATHER's row indices
    SOURCE2 = "src2"        # a vector function's second source: dtype, or the words of a record (REQUANT, LUT)

    def types(self, f: Fields) -> tuple[np.ndarray, np.ndarray]:
        """(DType, int32 words per element or 1) of each row."""
        ones = np.ones(len(f), np.int64)
        if self is Element.INDEX:
            return np.full(len(f), int(DType.I32)), ones
        if self is Element.SOURCE2:
            own = func_table("src2_dtype", -1)[f.func]
            words = np.where(func_table("src2_table")[f.func].astype(bool), semantics.table_words(f.n, f.strides("z")),
                             func_table("src2_words", 1)[f.func])
            return np.where(own >= 0, own, f.field("dtype")), words
        return f.field(self.value), ones


@dataclass(frozen=True)
class Slot:
    """One operand access of an opcode: element (i0, i1, i2) < dims of pattern `operand`."""

    role: str                   # what it is to the opcode: the semantics read and write it by this name
    operand: str                # 'x', 'y' or 'z'
    write: bool
    element: Element
    dims: Callable[[Fields], np.ndarray]     # (k, 3), from the iteration counts (and pads)
    spaces: frozenset = LOCAL   # memories it may lie in
    when: Callable[[Fields], np.ndarray] | None = None   # the rows that make this access (None: every row)
    present: Callable[[np.ndarray], np.ndarray] | None = None   # by func: the instruction has this operand
    strides: int = 3            # strides the encoding uses (the others must be zero)

    def rows(self, f: Fields) -> np.ndarray:
        on = np.ones(len(f), bool) if self.when is None else self.when(f)
        return on if self.present is None else on & self.present(f.func)


@dataclass(frozen=True)
class Dma:
    """Charged as a DMA (sim.costs.dma_cycles): a latency, then `moved` bytes over the shared DRAM
    channel; energy: those DRAM bytes and every local element it reads or writes."""

    moved: Callable[[Fields], np.ndarray]


@dataclass(frozen=True)
class Array:
    """Charged as M x K x N on the systolic array (sim.costs.matmul_cycles); energy: MACs by the
    operand type and SCALE-Sim's operand traffic of slots 'a', 'b' and 'c'."""

    mkn: Callable[[Fields], np.ndarray]     # (k, 3)


@dataclass(frozen=True)
class Lanes:
    """Charged on the vector unit (sim.costs.vector_cycles); energy: one vector op per element and
    each distinct local element its slots touch (a broadcast operand is read once)."""

    elements: Callable[[Fields], np.ndarray]
    reduce_length: Callable[[Fields], np.ndarray]
    transcendental: Callable[[Fields], np.ndarray]


@dataclass(frozen=True)
class Check:
    """A legality rule beyond the slots and fields: rows where `failing` is true are rejected."""

    field: str
    message: str
    failing: Callable[[Fields], np.ndarray]


@dataclass(frozen=True)
class OpcodeDef:
    opcode: int
    queue: Queue
    counts: tuple[str, ...]     # names of the iteration counts n it uses (the assembly shows these)
    slots: tuple[Slot, ...]
    unit: Dma | Array | Lanes
    semantics: Callable         # (Instruction, Values) -> None: reads and writes its slots by role
    mode: type | None = None    # the enum the mode field holds (PadValue, AccMode), None: none
    modes: frozenset = frozenset({0})       # its legal values
    mode_key: str = ""          # the assembly's key for the mode
    types: frozenset | None = None          # legal (dtype, out_dtype) pairs; None: equal types (funcs: per func)
    takes_func: bool = False    # the func field names a VectorFunc
    pads: bool = False          # six pad counts overlay operand z
    checks: tuple[Check, ...] = ()

    @property
    def name(self) -> str:
        return Opcode(self.opcode).name

    @property
    def rank(self) -> int:
        return len(self.counts)

    def slot(self, role: str, write: bool) -> Slot:
        return next(s for s in self.slots if s.role == role and s.write == write)

    @property
    def local_write(self) -> Slot | None:
        """The slot whose local memory it writes: the value the instruction produces."""
        return next((s for s in self.slots if s.write and s.spaces <= LOCAL), None)

    @property
    def dram_slot(self) -> Slot | None:
        return next((s for s in self.slots if s.spaces == DRAM), None)

    def operands(self, func) -> tuple[str, ...]:
        """The encoded operands an instruction of this opcode (and vector function) has."""
        return tuple(o for o in OPERANDS if any(s.operand == o and (s.present is None or bool(s.present(func)))
                                                for s in self.slots))


@dataclass(frozen=True)
class VectorFuncDef:
    func: int
    apply: Callable             # (namespace, *sources[, destination's old value]) -> value
    sources: int = 1            # 1: src1 (y); 2: src1 and src2 (z)
    reduction: bool = False     # reduces over i2: the destination is (n0, n1, 1), its stride s2 must be 0
    transcendental: bool = False
    reads_dst: bool = False     # apply also takes the destination's old value
    src2_words: int = 1         # > 1: src2 is records of that many words (strides count records)
    src2_dtype: int = -1        # the DType of src2's words; -1: the instruction's dtype
    src2_once: bool = False     # src2 is one record for the whole instruction (dims 1, strides 0): a table
    src2_table: bool = False    # src2 is a table read whole, its elements from word n3 (semantics.table_index)
    runs: bool = False          # its sources are read as contiguous runs over i2 (strides s2 of 1): packed lanes
    types: frozenset | None = None          # legal (dtype, out_dtype) pairs; None: equal types (+ verify.ROUNDING)

    @property
    def name(self) -> str:
        return VectorFunc(self.func).name


# --- vector functions -----------------------------------------------------------------------------
# dst = acc(dst, func(src1[, src2])) over n, converted to out_dtype (float -> int truncates, saturating;
# bf16 operands are computed on as float32 and a bf16 result is rounded: isa.semantics.cast).

ANY_TYPES = frozenset((a, b) for a in DType for b in DType)
SAME_TYPES = frozenset((a, a) for a in DType)
INT32_ONLY = frozenset({(DType.I32, DType.I32)})
# A DMA moves elements as they are, or widens bf16 in DRAM to float32 in local memory (LOAD, GATHER)
# and rounds local float32 to bf16 in DRAM (STORE: dtype is the DRAM side): what the vector unit
# computes on is float32, what DRAM holds is half its size.
DMA_TYPES = SAME_TYPES | {(DType.BF16, DType.F32)}


def _vf(func: VectorFunc, apply, **flags) -> VectorFuncDef:
    return VectorFuncDef(int(func), apply, **flags)


def _compare(op):
    return lambda ns, a, b: op(a, b).astype(a.dtype)


VECTOR_FUNCS: dict[int, VectorFuncDef] = {d.func: d for d in (
    _vf(VectorFunc.COPY, lambda ns, x: x, types=ANY_TYPES),
    _vf(VectorFunc.NEG, lambda ns, x: ns.xp.negative(x)),
    _vf(VectorFunc.ABS, lambda ns, x: ns.xp.abs(x)),
    _vf(VectorFunc.RELU, lambda ns, x: ns.xp.maximum(x, ns.xp.zeros((), x.dtype))),
    _vf(VectorFunc.EXP, lambda ns, x: ns.xp.exp(x), transcendental=True),
    _vf(VectorFunc.LOG, lambda ns, x: ns.xp.log(x), transcendental=True),
    _vf(VectorFunc.RECIP, lambda ns, x: 1 / x, transcendental=True),
    _vf(VectorFunc.RSQRT, lambda ns, x: ns.rsqrt(x), transcendental=True),
    _vf(VectorFunc.SQRT, lambda ns, x: ns.xp.sqrt(x), transcendental=True),
    _vf(VectorFunc.TANH, lambda ns, x: ns.xp.tanh(x), transcendental=True),
    _vf(VectorFunc.ERF, lambda ns, x: ns.erf(x), transcendental=True),
    _vf(VectorFunc.SIGMOID, lambda ns, x: 1 / (1 + ns.xp.exp(-x)), transcendental=True),
    _vf(VectorFunc.ADD, lambda ns, a, b: ns.xp.add(a, b), sources=2),
    _vf(VectorFunc.SUB, lambda ns, a, b: ns.xp.subtract(a, b), sources=2),
    # int8 x int8 -> int32 too (a widening multiply, as int8 SIMD units' SMLAL or RISC-V's vwmacc), and
    # bf16 x bf16 -> float32 (exact): a depthwise tap or TFLite Mul reads int8 or bf16 tiles as they are
    _vf(VectorFunc.MUL, multiply, sources=2, types=SAME_TYPES | {(DType.I8, DType.I32), (DType.BF16, DType.F32)}),
    _vf(VectorFunc.MAX, lambda ns, a, b: ns.xp.maximum(a, b), sources=2),
    _vf(VectorFunc.MIN, lambda ns, a, b: ns.xp.minimum(a, b), sources=2),
    # int32 only (I-BERT's integer-only kernels, lower.graph.integer_kernels): floor(a / b), 0 where b == 0;
    # a >> b, arithmetic (floor(a / 2**b)), b clipped to [0, 31]
    _vf(VectorFunc.DIV, floor_div, sources=2, transcendental=True, types=INT32_ONLY),
    _vf(VectorFunc.SHR, lambda ns, a, b: ns.xp.right_shift(a, ns.xp.clip(b, 0, 31).astype(a.dtype)), sources=2,
        types=INT32_ONLY),
    _vf(VectorFunc.CMP_GT, _compare(lambda a, b: a > b), sources=2),     # 1 or 0
    _vf(VectorFunc.CMP_GE, _compare(lambda a, b: a >= b), sources=2),
    _vf(VectorFunc.CMP_EQ, _compare(lambda a, b: a == b), sources=2),
    _vf(VectorFunc.CMP_NE, _compare(lambda a, b: a != b), sources=2),
    # dst = src2 where src1 != 0, else dst unchanged
    _vf(VectorFunc.SELECT, lambda ns, p, t, dst: ns.xp.where(p != 0, t, dst), sources=2, reads_dst=True),
    # integers wrap, as convert wraps; int8 -> int32 too, so an int8 sum needs no widening copy first
    _vf(VectorFunc.RSUM, widening_sum, reduction=True, types=SAME_TYPES | {(DType.I8, DType.I32)}),
    _vf(VectorFunc.RMAX, lambda ns, x: ns.xp.max(x, axis=-1), reduction=True),
    _vf(VectorFunc.RMIN, lambda ns, x: ns.xp.min(x, axis=-1), reduction=True),
    _vf(VectorFunc.RDOT, dot, sources=2, reduction=True, runs=True, types=frozenset({(DType.I8, DType.I32)})),
    # i32 -> i8 by records (Q31 multiplier, shift, zero point, saturation bounds, bias): the bias added (int32,
    # wrapping), TFLite/gemmlowp rounding, then TFLite's activation_min/max (isa.semantics.saturation_bounds)
    _vf(VectorFunc.REQUANT, lambda ns, x, r: ns.requantize(x, *semantics.record_fields(r)[:5]),
        sources=2, src2_words=REQUANT_RECORD_BYTES // 4, src2_dtype=int(DType.I32),
        types=frozenset({(DType.I32, DType.I8)})),
    # i8 -> i8 through one 256-entry int8 table (src2, the entry of q at q + 128): an int8 NPU's
    # activation function (sigmoid, tanh, GELU, hardswish, ...) at the scales the compiler chose
    _vf(VectorFunc.LUT, lookup, sources=2, src2_words=LUT_ENTRIES, src2_dtype=int(DType.I8), src2_once=True,
        types=frozenset({(DType.I8, DType.I8)})),
    # i8/i32 -> i32 by records (Q31 multiplier, shift, zero point, left shift): TFLite Add's input scaling
    _vf(VectorFunc.RESCALE, lambda ns, x, r: ns.rescale(x, *semantics.rescale_fields(r)), sources=2,
        src2_words=REQUANT_RECORD_BYTES // 4, src2_dtype=int(DType.I32),
        types=frozenset({(DType.I8, DType.I32), (DType.I32, DType.I32)})),
    # f32 -> f32 by a layer's table (lo, hi, 0, 0, a bias per channel; the instruction's from word n3): a float
    # layer's bias add and clamp (ReLU, ReLU6, hardtanh), its bounds held once, not per channel
    _vf(VectorFunc.CLAMP, lambda ns, x, t, index: clamp(ns.xp, x, *semantics.table_entries(ns.xp, t, index)), sources=2,
        src2_table=True, types=frozenset({(DType.F32, DType.F32)})),
)}
# For the compiler (lower.codegen.vector, stagec.layers); the toolchain reads func_table("transcendental").
TRANSCENDENTAL = frozenset(VectorFunc(f) for f, d in VECTOR_FUNCS.items() if d.transcendental)

_LOOKUPS: dict = {}


def func_table(attr: str, default=0) -> np.ndarray:
    """(256,) `attr` of every vector function by its code (`default` for codes that are none)."""
    return _lookup(VECTOR_FUNCS, attr, default)


def opcode_table(attr: str, default=0) -> np.ndarray:
    """(256,) `attr` of every opcode's definition by its code."""
    return _lookup(OPCODES, attr, default)


def _lookup(table: dict, attr: str, default) -> np.ndarray:
    key = (id(table), attr, default)
    hit = _LOOKUPS.get(key)
    if hit is None or hit[0] is not table:   # a table registered in place of another has its own
        values = np.full(256, default, np.int64)
        for code, d in table.items():
            values[code] = getattr(d, attr)
        hit = _LOOKUPS[key] = (table, values)
    return hit[1]


def queues_of(opcodes: np.ndarray) -> np.ndarray:
    """The queue of each instruction, from an array of (valid) opcodes."""
    return opcode_table("queue")[np.asarray(opcodes, np.int64)]


# --- dims as functions of the iteration counts ---------------------------------------------------

def _n(*index):
    """dims (n[index[0]], n[index[1]], n[index[2]]), None = 1."""
    def dims(f: Fields) -> np.ndarray:
        ones = np.ones(len(f), np.int64)
        return np.stack([f.n[:, i] if i is not None else ones for i in index], 1)
    return dims


def _padded(f: Fields) -> np.ndarray:
    return f.n[:, :3] + f.pad[:, 0::2] + f.pad[:, 1::2]


def _src2(f: Fields) -> np.ndarray:
    whole = func_table("src2_once")[f.func] | func_table("src2_table")[f.func]
    return np.where(whole[:, None].astype(bool), 1, f.n[:, :3])



def _vector_dst(f: Fields) -> np.ndarray:
    return np.where(func_table("reduction")[f.func][:, None].astype(bool), _n(0, 1, None)(f), f.n[:, :3])


def _accumulates(f: Fields) -> np.ndarray:
    return f.mode != AccMode.OVERWRITE


def _binary(func) -> np.ndarray:
    return func_table("sources")[func] == 2


def _moved(f: Fields) -> np.ndarray:
    """Bytes a DMA moves over the DRAM channel: n elements of the DRAM type."""
    return f.elements * ITEMSIZE[f.field("dtype")]


# --- reference semantics (numpy; `v` reads and writes the instruction's slots by role) -------------

def check_gather_indices(index: int, rows: np.ndarray, bound: int) -> None:
    bad = np.flatnonzero((rows < 0) | (rows >= bound))
    if bad.size:
        raise SimulationError(f"instruction {index} (GATHER): index {int(rows[bad[0]])} at position {int(bad[0])} is "
                              f"outside the table's {bound} rows; the gather did not run")


def _load(ins: Instruction, v) -> None:
    n, p = ins.n, ins.pad
    box = np.full(v.dims("dst"), pad_value(PadValue(ins.mode), ins.out_dtype), ins.out_dtype.numpy)
    box[p[0]:p[0] + n[0], p[2]:p[2] + n[1], p[4]:p[4] + n[2]] = cast(NUMPY, v.read("src"), ins.out_dtype)
    v.write("dst", box)


def _store(ins: Instruction, v) -> None:
    v.write("dst", cast(NUMPY, v.read("src"), ins.dtype))


def _gather(ins: Instruction, v) -> None:
    rows = v.read("index").reshape(-1)
    check_gather_indices(v.index, rows, ins.n[3])
    v.write("dst", cast(NUMPY, v.read("table", rows=rows), ins.out_dtype))


def _matmul(ins: Instruction, v) -> None:
    m1, m0, k, n = ins.n
    # bf16 operands widen exactly: their products are exact in float32, the sums are float32's
    a, b = widen(NUMPY, v.read("a")).reshape(m1 * m0, k), widen(NUMPY, v.read("b")).reshape(k, n)
    if ins.out_dtype == DType.I32:   # two's-complement wraparound, as the hardware adder
        prod = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    else:
        prod = (a.astype(np.float32) @ b.astype(np.float32)).astype(ins.out_dtype.numpy)
    prod = prod.reshape(m1, m0, n)
    if ins.mode == AccMode.ADD:
        prod = v.read("c") + prod
    v.write("c", prod)


def _vector(ins: Instruction, v) -> None:
    f = VECTOR_FUNCS[ins.func]
    args = [v.read(role) for role in ("src1", "src2")[:f.sources]] + ([v.read("dst")] if f.reads_dst else [])
    index = [semantics.table_index(ins.n, ins.z.strides)] if f.src2_table else []
    result = cast(NUMPY, f.apply(NUMPY, *(widen(NUMPY, a) for a in args), *index), ins.out_dtype).reshape(
        v.dims("dst"))
    if ins.mode != AccMode.OVERWRITE:
        result = accumulate(NUMPY, ins.mode, v.read("dst"), result)
    v.write("dst", result)


# --- the opcodes ------------------------------------------------------------------------------------

OPCODES: dict[int, OpcodeDef] = {d.opcode: d for d in (
    # DMA DRAM -> local: y = x over n, padded VTA-style by (p0, q0, p1, q1, p2, q2) with mode's PadValue
    OpcodeDef(Opcode.LOAD, Queue.LOAD, ("n0", "n1", "n2"),
              (Slot("src", "x", False, Element.IN, _n(0, 1, 2), DRAM),
               Slot("dst", "y", True, Element.OUT, _padded)),
              Dma(_moved), _load, mode=PadValue, modes=frozenset(PadValue), mode_key="padval", pads=True,
              types=DMA_TYPES),
    # DMA local -> DRAM: x = y over n
    OpcodeDef(Opcode.STORE, Queue.STORE, ("n0", "n1", "n2"),
              (Slot("dst", "x", True, Element.IN, _n(0, 1, 2), DRAM),
               Slot("src", "y", False, Element.OUT, _n(0, 1, 2))),
              Dma(_moved), _store, types=DMA_TYPES),
    # indirect DMA (embedding lookup): y[i0, i1, i2] = table x at row z[i0] (int32, stride s0), element
    # (i1, i2); every index must lie in [0, R), checked when it runs (the value is data)
    OpcodeDef(Opcode.GATHER, Queue.LOAD, ("n0", "n1", "n2", "R"),
              (Slot("table", "x", False, Element.IN, _n(3, 1, 2), DRAM),
               Slot("dst", "y", True, Element.OUT, _n(0, 1, 2)),
               Slot("index", "z", False, Element.INDEX, _n(0, None, None), strides=1)),
              Dma(_moved), _gather, types=DMA_TYPES),
    # C = acc(C, A @ B) with A over (m1, m0, k), B over (k, n), C over (m1, m0, n): M = m1 * m0 rows
    OpcodeDef(Opcode.MATMUL, Queue.MATRIX, ("m1", "m0", "k", "n"),
              (Slot("a", "x", False, Element.IN, _n(0, 1, 2), frozenset({Space.SPAD})),
               Slot("b", "y", False, Element.IN, _n(2, 3, None), frozenset({Space.SPAD}), strides=2),
               Slot("c", "z", False, Element.OUT, _n(0, 1, 3), frozenset({Space.ACC}), when=_accumulates),
               Slot("c", "z", True, Element.OUT, _n(0, 1, 3), frozenset({Space.ACC}))),
              Array(lambda f: np.stack([f.n[:, 0] * f.n[:, 1], f.n[:, 2], f.n[:, 3]], 1)), _matmul,
              mode=AccMode, modes=frozenset({AccMode.OVERWRITE, AccMode.ADD}), mode_key="acc",
              types=frozenset({(DType.F32, DType.F32), (DType.BF16, DType.F32), (DType.I8, DType.I32)})),
    # dst (x) = acc(dst, func(src1 (y)[, src2 (z)])) over n; reductions reduce over i2
    OpcodeDef(Opcode.VECTOR, Queue.VECTOR, ("n0", "n1", "n2"),
              (Slot("dst", "x", False, Element.OUT, _vector_dst,
                    when=lambda f: _accumulates(f) | func_table("reads_dst")[f.func].astype(bool)),
               Slot("dst", "x", True, Element.OUT, _vector_dst),
               Slot("src1", "y", False, Element.IN, _n(0, 1, 2)),
               Slot("src2", "z", False, Element.SOURCE2, _src2, present=_binary)),
              Lanes(lambda f: f.elements,
                    lambda f: np.where(func_table("reduction")[f.func].astype(bool), f.n[:, 2], 1),
                    lambda f: func_table("transcendental")[f.func].astype(bool)), _vector,
              mode=AccMode, modes=frozenset(AccMode), mode_key="acc", takes_func=True,
              # (a stride over a single element moves nowhere: a key block of one key reduces over n2 = 1)
              checks=(Check("x_strides", "a reduction's destination stride over the reduced dim (s2) must be 0",
                            lambda f: func_table("reduction")[f.func].astype(bool) & (f.strides("x")[:, 2] != 0)
                            & (f.n[:, 2] > 1)),
                      Check("y_strides", "RDOT reads its sources as runs over i2: their strides s2 must be 1",
                            lambda f: func_table("runs")[f.func].astype(bool)
                            & ((f.strides("y")[:, 2] != 1) | (f.strides("z")[:, 2] != 1))),
                      Check("z_strides", "a table (src2 of LUT) is one for the instruction: its strides must be 0",
                            lambda f: func_table("src2_once")[f.func].astype(bool) & (f.strides("z") != 0).any(1)),
                      Check("n", f"a table's elements (CLAMP's biases) follow its header and each other: n3 must be "
                                 f"at least {CLAMP_HEADER_WORDS}, src2's strides non-negative",
                            lambda f: func_table("src2_table")[f.func].astype(bool)
                            & ((f.n[:, 3] < CLAMP_HEADER_WORDS) | (f.strides("z") < 0).any(1))),
                      Check("mode", "a bf16 destination cannot accumulate (each step would round): accumulate in "
                                    "float32", lambda f: _accumulates(f) & (f.field("out_dtype") == DType.BF16)))),
)}


def decode(record) -> Instruction:
    """One record of ENCODING -> Instruction."""
    d = OPCODES[int(record["opcode"])]
    func = int(record["func"])
    spaces = int(record["spaces"])
    present = d.operands(np.int64(func))

    def operand(o):
        if o not in present:
            return None
        strides = tuple(int(s) for s in record[f"{o}_strides"])
        return Operand(Space(spaces >> 2 * OPERANDS.index(o) & 3), int(record[f"{o}_base"]), strides)

    return Instruction(Opcode(d.opcode), tuple(int(v) for v in record["n"]), operand("x"), operand("y"),
                       operand("z"), func=VectorFunc(func), dtype=DType(int(record["dtype"])),
                       out_dtype=DType(int(record["out_dtype"])), mode=int(record["mode"]),
                       pad=tuple(int(p) for p in record["pad"]) if d.pads else (0,) * 6,
                       push=int(record["push"]), pop=int(record["pop"]))
