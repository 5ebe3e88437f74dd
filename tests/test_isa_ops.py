"""Indirect DMA (GATHER), comparisons, SELECT and type conversion: batched executor = reference."""

import numpy as np
import pytest

import stagec
from stagec.errors import SimulationError
from stagec.isa import (
    AccMode,
    DType,
    HardwareConfig,
    Layer,
    Operand,
    Program,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    store,
    vector,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import encode, gather
from stagec.lower.codegen.tokens import insert_tokens
from stagec.lower.graph.requant import control_word
from stagec.sim.executor import execute
from stagec.sim.reference import execute as reference


def program(ins, inputs, outputs, blob, dram=4096):
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("t", "test", (), ()),),
                inputs=tuple(inputs), outputs=tuple(outputs), regions=(Region("weights", "const", 0, len(blob)),),
                constants=blob, dram_bytes=dram, hw=HardwareConfig())
    return insert_tokens(p)


def embedding_program(vocab=10, dim=6, tokens=5):
    table = np.random.default_rng(0).standard_normal((vocab, dim)).astype(np.float32)
    ids_off, out_off = 1024, 2048
    ins = [
        load_ins(Operand(Space.DRAM, ids_off, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)), (1, 1, tokens),
                 dtype=DType.I32),
        gather(Operand(Space.DRAM, 0, (dim, 0, 1)), Operand(Space.SPAD, 256, (dim, 0, 1)),
               Operand(Space.SPAD, 0, (1, 0, 0)), (tokens, 1, dim), vocab),
        store(Operand(Space.DRAM, out_off, (dim, 0, 1)), Operand(Space.SPAD, 256, (dim, 0, 1)), (tokens, 1, dim)),
    ]
    return program(ins, [TensorRef("ids", ids_off, DType.I32, (tokens,))],
                   [TensorRef("emb", out_off, DType.F32, (tokens, dim))], table.tobytes()), table


def test_gather_is_an_embedding_lookup():
    p, table = embedding_program()
    ids = np.array([3, 0, 9, 3, 7], np.int32)
    (out,), _ = stagec.simulate(p, ids)
    np.testing.assert_array_equal(out, table[ids])
    np.testing.assert_array_equal(reference(p, [ids])[0], table[ids])


@pytest.mark.parametrize("run", [execute, reference])
def test_out_of_range_index_is_an_error_not_a_clamp(run):
    p, _ = embedding_program()
    with pytest.raises(SimulationError, match=r"instruction 1 \(GATHER\): index 10 at position 2 is outside the "
                                              r"table's 10 rows"):
        run(p, [np.array([1, 2, 10, 0, 0], np.int32)])


def test_compare_select_and_convert():
    n = 12
    a_off, b_off, m_off, i_off = 512, 1024, 1536, 2048
    tile = (1, 1, n)
    s = (0, 0, 1)
    ins = [
        load_ins(Operand(Space.DRAM, a_off, s), Operand(Space.SPAD, 0, s), tile),
        load_ins(Operand(Space.DRAM, b_off, s), Operand(Space.SPAD, 64, s), tile),
        vector(VectorFunc.CMP_GT, Operand(Space.SPAD, 128, s), Operand(Space.SPAD, 0, s), Operand(Space.SPAD, 64, s),
               tile),
        vector(VectorFunc.COPY, Operand(Space.SPAD, 192, s), Operand(Space.SPAD, 64, s), None, tile),
        vector(VectorFunc.SELECT, Operand(Space.SPAD, 192, s), Operand(Space.SPAD, 128, s),
               Operand(Space.SPAD, 0, s), tile),                                 # max(a, b) by selection
        vector(VectorFunc.COPY, Operand(Space.SPAD, 256, s), Operand(Space.SPAD, 192, s), None, tile,
               dtype=DType.F32, out_dtype=DType.I32),                            # truncating, saturating
        store(Operand(Space.DRAM, m_off, s), Operand(Space.SPAD, 192, s), tile),
        store(Operand(Space.DRAM, i_off, s), Operand(Space.SPAD, 256, s), tile, dtype=DType.I32),
    ]
    p = program(ins, [TensorRef("a", a_off, DType.F32, (n,)), TensorRef("b", b_off, DType.F32, (n,))],
                [TensorRef("m", m_off, DType.F32, (n,)), TensorRef("i", i_off, DType.I32, (n,))], b"")
    a = np.array([1.5, -2.7, 3e10, -3e10, np.nan, 0.4, -0.4, 7, 8, 9, -1, 2], np.float32)
    b = np.array([2.5, -2.9, 0, -4e10, 1, 0.5, -0.5, 7, -8, 10, -1, 2.5], np.float32)
    m, i = execute(p, [a, b])
    expect = np.where(a > b, a, b)
    np.testing.assert_array_equal(m, expect)
    assert i.dtype == np.int32
    assert list(i[:4]) == [2, -2, 2**31 - 1, -(2**31)] and i[4] == 1   # nan > 1 is false: b's 1 was kept
    for got, ref in zip((m, i), reference(p, [a, b]), strict=True):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.filterwarnings("ignore:batched executor cannot run")
def test_select_that_accumulates_adds_its_selection_to_the_destination():
    """dst = acc(dst, select(...)): with acc=add, dst + (src2 where src1 != 0, else dst)."""
    n, s, tile = 8, (0, 0, 1), (1, 1, 8)
    p_off, a_off, d_off, out_off = 512, 1024, 1536, 2048
    ins = [
        load_ins(Operand(Space.DRAM, p_off, s), Operand(Space.SPAD, 0, s), tile),
        load_ins(Operand(Space.DRAM, a_off, s), Operand(Space.SPAD, 64, s), tile),
        load_ins(Operand(Space.DRAM, d_off, s), Operand(Space.SPAD, 128, s), tile),
        vector(VectorFunc.SELECT, Operand(Space.SPAD, 128, s), Operand(Space.SPAD, 0, s), Operand(Space.SPAD, 64, s),
               tile, acc=AccMode.ADD),
        store(Operand(Space.DRAM, out_off, s), Operand(Space.SPAD, 128, s), tile),
    ]
    p = program(ins, [TensorRef(k, off, DType.F32, (n,)) for k, off in (("p", p_off), ("a", a_off), ("d", d_off))],
                [TensorRef("out", out_off, DType.F32, (n,))], b"")
    rng = np.random.default_rng(1)
    pred, a, d = (rng.integers(0, 2, n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
                  rng.standard_normal(n).astype(np.float32))
    expect = d + np.where(pred != 0, a, d)
    np.testing.assert_array_equal(reference(p, [pred, a, d])[0], expect)
    np.testing.assert_array_equal(execute(p, [pred, a, d])[0], expect)


@pytest.mark.filterwarnings("ignore:batched executor cannot run")
def test_requant_that_accumulates_adds_to_the_destination():
    """REQUANT honours its accumulate mode like every vector function: dst = dst + requant(x) (int8,
    wrapping); the reference interpreter ignored the mode."""
    n, s, tile = 8, (0, 0, 1), (1, 1, 8)
    x_off, d_off, out_off = 512, 1024, 1536
    record = np.array([2**30, control_word(0, zero_point=3), 0, 0], np.int32)   # x * 0.5, rounded, plus 3
    ins = [
        load_ins(Operand(Space.DRAM, x_off, s), Operand(Space.SPAD, 0, s), tile, dtype=DType.I32),
        load_ins(Operand(Space.DRAM, 0, (0, 0, 1)), Operand(Space.SPAD, 64, (0, 0, 1)), (1, 1, 4), dtype=DType.I32),
        load_ins(Operand(Space.DRAM, d_off, s), Operand(Space.SPAD, 128, s), tile, dtype=DType.I8),
        vector(VectorFunc.REQUANT, Operand(Space.SPAD, 128, s), Operand(Space.SPAD, 0, s),
               Operand(Space.SPAD, 64, (0, 0, 0)), tile, acc=AccMode.ADD, dtype=DType.I32, out_dtype=DType.I8),
        store(Operand(Space.DRAM, out_off, s), Operand(Space.SPAD, 128, s), tile, dtype=DType.I8),
    ]
    p = program(ins, [TensorRef("x", x_off, DType.I32, (n,)), TensorRef("d", d_off, DType.I8, (n,))],
                [TensorRef("out", out_off, DType.I8, (n,))], record.tobytes())
    x = np.array([-9, -3, 0, 1, 5, 100, 250, -250], np.int32)
    d = np.array([1, 2, -3, 4, 120, -128, 10, 0], np.int8)
    halves = np.array([-4, -1, 0, 1, 3, 50, 125, -125]) + 3        # round(x / 2), ties away from zero, + 3
    expect = (d.astype(np.int64) + np.clip(halves, -128, 127)).astype(np.int8)   # the int8 adder wraps
    np.testing.assert_array_equal(reference(p, [x, d])[0], expect)
    np.testing.assert_array_equal(execute(p, [x, d])[0], expect)


def test_an_int8_vector_chain_wraps_as_the_int8_adder():
    """Three int8 COPYs accumulating into one destination (a chain the executor sums at once): the sum
    wraps in int8, as each add does (the batched executor summed in int32 and crashed storing it)."""
    s, tile = (0, 0, 1), (1, 1, 4)
    copies = [vector(VectorFunc.COPY, Operand(Space.SPAD, 64, s), Operand(Space.SPAD, 0, s), None, tile,
                     acc=AccMode.ADD if k else AccMode.OVERWRITE, dtype=DType.I8) for k in range(3)]
    ins = [load_ins(Operand(Space.DRAM, 512, s), Operand(Space.SPAD, 0, s), tile, dtype=DType.I8), *copies,
           store(Operand(Space.DRAM, 1024, s), Operand(Space.SPAD, 64, s), tile, dtype=DType.I8)]
    p = program(ins, [TensorRef("x", 512, DType.I8, (4,))], [TensorRef("y", 1024, DType.I8, (4,))], b"")
    x = np.array([100, -100, 50, 1], np.int8)
    expect = np.array([44, -44, -106, 3], np.int8)   # 3 * x mod 256
    np.testing.assert_array_equal(reference(p, [x])[0], expect)
    np.testing.assert_array_equal(execute(p, [x])[0], expect)
