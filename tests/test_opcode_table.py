"""A new vector function is one definition (isa.opcodes); a new opcode is one definition, one batched
kernel (sim.kernel) and a test.  These tests register a test-only function and a test-only opcode in
copies of the tables and run each through assembly, the verifier, both simulators, timing and energy."""

import math
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stagec.errors import ReferenceFallbackWarning, VerificationError
from stagec.isa import (
    DType,
    HardwareConfig,
    Layer,
    Opcode,
    Operand,
    PadValue,
    Program,
    Queue,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    assemble,
    disassemble,
    opcodes,
    store,
    vector,
    verify,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import Instruction, encode
from stagec.isa.opcodes import Element, Lanes, OpcodeDef, Slot, VectorFuncDef
from stagec.isa.semantics import pad_value
from stagec.lower.codegen.tokens import insert_tokens
from stagec.sim import kernel, reference
from stagec.sim.costs import vector_cycles
from stagec.sim.energy import action_counts
from stagec.sim.executor import execute
from stagec.sim.plan import build_plan
from stagec.sim.timing import timeline

X_OFF, OUT_OFF, A_OFF = 512, 1024, 2048
TILE, S = (1, 4, 8), (0, 8, 1)


def _extend(monkeypatch, cls, name: str, value: int):
    """A member `name` = `value` of the IntEnum `cls` for this test only."""
    member = int.__new__(cls, value)
    member._name_, member._value_ = name, value
    monkeypatch.setitem(cls._member_map_, name, member)
    monkeypatch.setitem(cls._value2member_map_, value, member)
    monkeypatch.setattr(cls, "_member_names_", [*cls._member_names_, name])
    return member


def _program(ins: list[Instruction], outputs: int = 1) -> Program:
    refs = [TensorRef(f"out{j}", OUT_OFF + 128 * j, DType.F32, TILE[1:]) for j in range(outputs)]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("t", "test", (), ()),),
                inputs=(TensorRef("x", X_OFF, DType.F32, TILE[1:]),), outputs=tuple(refs),
                regions=(Region("weights", "const", 0, 0),), constants=b"", dram_bytes=4096, hw=HardwareConfig())
    return insert_tokens(p)


def _local(base: int) -> Operand:
    return Operand(Space.SPAD, base, S)


def _dram(base: int) -> Operand:
    return Operand(Space.DRAM, base, S)


def _runs_everywhere(p: Program, x: np.ndarray, expect: list[np.ndarray]) -> None:
    """Assembly round trip, verifier, reference interpreter and batched executor (no fallback)."""
    assert assemble(disassemble(p)) == p
    verify(p)
    for got, want in zip(reference.execute(p, [x]), expect, strict=True):
        np.testing.assert_array_equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceFallbackWarning)
        for got, want in zip(execute(p, [x]), expect, strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.fixture
def square(monkeypatch):
    """SQUARE (x * x), a unary vector function that exists only in this test."""
    func = _extend(monkeypatch, VectorFunc, "SQUARE", 50)
    monkeypatch.setattr(opcodes, "VECTOR_FUNCS",
                        {**opcodes.VECTOR_FUNCS, 50: VectorFuncDef(50, lambda ns, x: ns.xp.multiply(x, x))})
    return func


def test_a_vector_function_is_one_definition(square):
    p = _program([load_ins(_dram(X_OFF), _local(0), TILE),
                  vector(square, _local(256), _local(0), None, TILE),
                  store(_dram(OUT_OFF), _local(256), TILE)])
    assert "vector.square" in disassemble(p)
    x = np.random.default_rng(0).standard_normal(TILE[1:]).astype(np.float32)
    _runs_everywhere(p, x, [x * x])
    i = 1   # the SQUARE
    t = timeline(p)
    assert t.end[i] - t.start[i] == vector_cycles(32, p.hw.vector_lanes)
    counts = action_counts(p.code, p.hw)
    assert (counts.vector_ops[i], counts.scratchpad_read_bytes[i], counts.scratchpad_write_bytes[i]) == (32, 128, 128)


def _fill(ins: Instruction, v) -> None:
    v.write("dst", np.full(v.dims("dst"), pad_value(PadValue(ins.mode), ins.out_dtype), ins.out_dtype.numpy))


# FILL: dst (x) = the mode's PadValue over n, on the vector unit.
FILL = OpcodeDef(6, Queue.VECTOR, ("n0", "n1", "n2"), (Slot("dst", "x", True, Element.OUT, lambda f: f.n[:, :3]),),
                 Lanes(lambda f: f.elements, lambda f: np.ones(len(f), np.int64), lambda f: np.zeros(len(f), bool)),
                 _fill, mode=PadValue, modes=frozenset(PadValue), mode_key="fill")


@dataclass(frozen=True)
class FillKernel(kernel.Kernel):
    n: tuple
    fill: int
    dtype: DType
    kind = "fill"
    slots = ()

    @classmethod
    def describe(cls, node):
        return cls(node.n[:3], node.mode, node.out_dtype), (), math.prod(node.n[:3])

    def prepare(self, group):
        return kernel.Prepared({}, (jnp.zeros(len(group.members)),))

    def build(self, hows, layout):
        value, size = pad_value(PadValue(self.fill), self.dtype), math.prod(self.n)
        return jax.jit(lambda members: jnp.full((members.shape[0], size), value))


@pytest.fixture
def fill(monkeypatch):
    """FILL, an opcode that exists only in this test, in a copy of the opcode table."""
    op = _extend(monkeypatch, Opcode, "FILL", 6)
    monkeypatch.setattr(opcodes, "OPCODES", {**opcodes.OPCODES, 6: FILL})
    return op


def _fill_program(op, **fields) -> Program:
    """out0 = -inf; out1 = max(x, -inf) = x."""
    dst = fields.pop("dst", _local(256))
    return _program([load_ins(_dram(X_OFF), _local(0), TILE),
                     Instruction(op, (*TILE, 0), dst, fields.pop("y", None), mode=PadValue.NEG_INF),
                     vector(VectorFunc.MAX, _local(512), _local(0), _local(256), TILE),
                     store(_dram(OUT_OFF), _local(256), TILE), store(_dram(OUT_OFF + 128), _local(512), TILE)],
                    outputs=2)


def test_an_opcode_is_one_definition_and_one_kernel(fill, monkeypatch):
    p = _fill_program(fill)
    assert "    fill          f32>f32 n=1,4,8 x=spad:0x100/0,8,1 fill=neg_inf" in disassemble(p)
    x = np.random.default_rng(1).standard_normal(TILE[1:]).astype(np.float32)
    with pytest.warns(ReferenceFallbackWarning, match="no kernel for FILL"):
        execute(_fill_program(fill), [x])
    monkeypatch.setattr(kernel, "KERNELS", {**kernel.KERNELS, 6: FillKernel})
    _runs_everywhere(p, x, [np.full(TILE[1:], -np.inf, np.float32), x])
    assert "fill" in {g.kind for g in build_plan(p).groups}
    i = 1   # the FILL
    assert timeline(p).end[i] - timeline(p).start[i] == vector_cycles(32, p.hw.vector_lanes)
    counts = action_counts(p.code, p.hw)
    assert (counts.vector_ops[i], counts.scratchpad_read_bytes[i], counts.scratchpad_write_bytes[i]) == (32, 0, 128)


def test_the_verifier_holds_a_new_opcode_to_its_definition(fill):
    with pytest.raises(VerificationError, match="FILL's dst operand \\(x\\) lies in the scratchpad or accumulator"):
        verify(_fill_program(fill, dst=_dram(A_OFF)))
    with pytest.raises(VerificationError, match="byte 32 is unused by FILL and must be zero"):
        verify(_fill_program(fill, y=_local(64)))


@pytest.mark.parametrize("d", list(opcodes.OPCODES.values()), ids=lambda d: d.name)
def test_every_definition_is_one_the_toolchain_can_read(d):
    # the timing shares the DRAM channel between the LOAD and STORE queues: their opcodes are DMAs
    assert isinstance(d.unit, opcodes.Dma) == (d.queue in (Queue.LOAD, Queue.STORE))
    directions = [(s.operand, s.write) for s in d.slots]
    assert len(directions) == len(set(directions))     # one Access per operand and direction
    assert d.mode is None or set(d.modes) <= set(d.mode)
    if isinstance(d.unit, opcodes.Array):              # SCALE-Sim's operand traffic names a, b, c
        assert {s.role for s in d.slots} == {"a", "b", "c"}
    if isinstance(d.unit, opcodes.Dma):                # its bytes go over the DRAM channel one way
        assert d.dram_slot is not None
    assert d.opcode in kernel.KERNELS                  # the batched executor runs it
