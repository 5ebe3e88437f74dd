"""Integer instructions: int8 x int8 -> int32 MATMUL, MUL and REQUANT, against a Python big-int reference."""

import numpy as np
import pytest
from programs import mutate

import stagec
from stagec.isa import (
    AccMode,
    DType,
    Layer,
    Operand,
    Program,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    VerificationError,
    matmul,
    store,
    vector,
    verify,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import encode
from stagec.lower.codegen.tokens import insert_tokens
from stagec.lower.graph.requant import control_word
from stagec.sim.reference import execute as reference_execute


def gemmlowp_requant(x: int, m: int, shift: int, zp: int) -> int:
    """TFLite MultiplyByQuantizedMultiplier in Python integers (independent of isa.semantics)."""
    x = max(min(x << max(shift, 0), 2**31 - 1), -2**31)
    if x == m == -(2**31):
        high = 2**31 - 1
    else:
        p = x * m
        n = p + ((1 << 30) if p >= 0 else 1 - (1 << 30))
        high = n // (1 << 31) if n >= 0 else -((-n) // (1 << 31))
    right = max(-shift, 0)
    mask = (1 << right) - 1
    rounded = (high >> right) + ((high & mask) > ((mask >> 1) + (high < 0)))
    return max(min(rounded + zp, 127), -128)


def int8_program():
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (8, 3)).astype(np.int8)
    params = np.array([[1 << 30, -4, 3, 100], [1518500250, -7, -5, -2000], [2**31 - 1, 1, 0, 7]])  # m, shift, zp, bias
    records = np.array([[m, control_word(shift, zp), bias, 0] for m, shift, zp, bias in params], np.int32)
    blob = b.tobytes() + b"\0" * 8 + records.tobytes()      # b at 0 (24 B), records at 32
    a_off, c_off = 128, 192
    ins = [
        load_ins(Operand(Space.DRAM, a_off, (0, 8, 1)), Operand(Space.SPAD, 0, (0, 8, 1)), (1, 4, 8), dtype=DType.I8),
        load_ins(Operand(Space.DRAM, 0, (0, 3, 1)), Operand(Space.SPAD, 64, (0, 3, 1)), (1, 8, 3), dtype=DType.I8),
        load_ins(Operand(Space.DRAM, 32, (0, 0, 1)), Operand(Space.SPAD, 128, (0, 0, 1)), (1, 1, records.size),
                 dtype=DType.I32),
        matmul(Operand(Space.SPAD, 0, (0, 8, 1)), Operand(Space.SPAD, 64, (3, 1, 0)), Operand(Space.ACC, 0, (0, 3, 1)),
               1, 4, 8, 3, accumulate=False, dtype=DType.I8, out_dtype=DType.I32),
        vector(VectorFunc.REQUANT, Operand(Space.SPAD, 256, (0, 3, 1)), Operand(Space.ACC, 0, (0, 3, 1)),
               Operand(Space.SPAD, 128, (0, 0, 1)), (1, 4, 3), dtype=DType.I32, out_dtype=DType.I8),
        store(Operand(Space.DRAM, c_off, (0, 3, 1)), Operand(Space.SPAD, 256, (0, 3, 1)), (1, 4, 3), dtype=DType.I8),
    ]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("q", "matmul", (), ()),),
                inputs=(TensorRef("a", a_off, DType.I8, (4, 8)),), outputs=(TensorRef("c", c_off, DType.I8, (4, 3)),),
                regions=(Region("weights", "const", 0, len(blob)),), constants=blob, dram_bytes=256,
                hw=stagec.HardwareConfig())
    return insert_tokens(p), b, params


def test_int8_matmul_and_requantize_are_bit_exact():
    p, b, params = int8_program()
    a = np.random.default_rng(4).integers(-128, 128, (4, 8)).astype(np.int8)
    (c,), _ = stagec.simulate(p, a)
    assert p.cache["executor"] is not None
    acc = a.astype(np.int64) @ b.astype(np.int64)
    expect = np.array([[gemmlowp_requant(int(acc[i, j] + params[j, 3]), *map(int, params[j, :3])) for j in range(3)]
                       for i in range(4)], np.int8)
    assert c.dtype == np.int8
    np.testing.assert_array_equal(c, expect)


def test_requantize_saturates_and_rounds_ties_away_from_zero():
    from stagec.isa.semantics import requantize
    x = np.array([2**31 - 1, -(2**31), 6, -6, 4, -4, 5, -5])
    m = np.full(8, 1 << 30)      # 0.5
    shift = np.array([0, 0, -1, -1, -2, -2, 0, 0])
    got = requantize(x, m, shift, np.zeros(8))
    expect = [gemmlowp_requant(int(a), int(b), int(c), 0) for a, b, c in zip(x, m, shift, strict=True)]
    np.testing.assert_array_equal(got, expect)
    # saturation; the rounding shift's ties (1.5, 0.5) go away from zero; the doubling high multiply
    # rounds 2.5 up and -2.5 to -2 (gemmlowp's nudge of 1 - 2^30 for negative products)
    assert list(got) == [127, -128, 2, -2, 1, -1, 3, -2]


def test_requantize_type_rules():
    p, _, _ = int8_program()
    with pytest.raises(VerificationError, match="REQUANT converts i32 to i8"):
        verify(mutate(p, 4, out_dtype=int(DType.I32)))
    with pytest.raises(VerificationError, match=r"matmul I8->F32 is not supported"):
        verify(mutate(p, 3, out_dtype=int(DType.F32)))


def test_batched_requantize_equals_the_definition_bit_for_bit():
    """sim.fixed_point (32-bit JAX limbs) against isa.semantics on edge values and random ones, and
    against the big-int gemmlowp reference on a sample."""
    import jax

    from stagec.isa.semantics import requantize
    from stagec.sim.fixed_point import requantize as batched
    rng = np.random.default_rng(0)
    edge = np.array([0, 1, -1, 2, -2, 3, 2**31 - 1, -2**31, 2**30, -2**30, 2**15, -2**15, 2**31 - 2, -2**31 + 1])
    n = 50_000

    def pick(size):
        return np.where(rng.random(size) < 0.3, rng.choice(edge, size), rng.integers(-2**31, 2**31, size))
    x = np.where(rng.random(n) < 0.5, rng.integers(-2**20, 2**20, n), pick(n))   # unsaturated results too
    m = np.where(rng.random(n) < 0.5, rng.integers(2**30, 2**31, n), pick(n))
    shift = rng.integers(-40, 33, n)   # the definition's int64 left shift is exact up to 32
    zp = np.where(rng.random(n) < 0.8, rng.integers(-200, 200, n), pick(n))
    bounds, bias = np.zeros(n, np.int64), np.where(rng.random(n) < 0.5, 0, pick(n))   # x + bias wraps in both
    got = np.asarray(jax.jit(batched)(*(a.astype(np.int32) for a in (x, m, shift, zp, bounds, bias))))
    np.testing.assert_array_equal(got, requantize(x, m, shift, zp, bounds, bias))
    assert len(np.unique(got)) > 200   # not all saturated
    sample = rng.choice(n, 2000, replace=False)
    wrapped = (x + bias + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(got[sample], [gemmlowp_requant(*(int(a[i]) for a in (wrapped, m, shift, zp)))
                                                for i in sample])


def widening_mul_program():
    """c = a0 * b + a1 * b (int8 x int8 -> int32, the second MUL accumulating): a depthwise conv's two taps."""
    n = 16
    ins = [
        load_ins(Operand(Space.DRAM, 0, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)), (1, 1, 3 * n), dtype=DType.I8),
        vector(VectorFunc.MUL, Operand(Space.ACC, 0, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)),
               Operand(Space.SPAD, 2 * n, (0, 0, 1)), (1, 1, n), dtype=DType.I8, out_dtype=DType.I32),
        vector(VectorFunc.MUL, Operand(Space.ACC, 0, (0, 0, 1)), Operand(Space.SPAD, n, (0, 0, 1)),
               Operand(Space.SPAD, 2 * n, (0, 0, 1)), (1, 1, n), acc=AccMode.ADD, dtype=DType.I8, out_dtype=DType.I32),
        store(Operand(Space.DRAM, 64, (0, 0, 1)), Operand(Space.ACC, 0, (0, 0, 1)), (1, 1, n), dtype=DType.I32),
    ]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("m", "mul", (), ()),),
                inputs=(TensorRef("a", 0, DType.I8, (3, n)),), outputs=(TensorRef("c", 64, DType.I32, (n,)),),
                regions=(), constants=b"", dram_bytes=128, hw=stagec.HardwareConfig())
    return insert_tokens(p)


def test_a_widening_int8_mul_multiplies_and_accumulates_in_int32():
    p = widening_mul_program()
    a = np.array([[-128, 127, -128, 127, 100, -100, 1, 0, -1, 77, -77, 5, 6, 7, -8, 9]] * 3, np.int8)
    a[1] = a[1][::-1]
    a[2] = np.roll(a[0], 3)
    a[1, 0] = a[2, 0] = -128   # -128 * -128 twice: 32768, past int16, so no narrower sum passes
    expect = (a[0].astype(np.int64) + a[1]) * a[2]
    (c,), _ = stagec.simulate(p, a)
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, expect)
    np.testing.assert_array_equal(reference_execute(p, [a])[0], expect)
    with pytest.raises(VerificationError, match=r"mul I8->F32 is not supported"):
        verify(mutate(p, 1, out_dtype=int(DType.F32)))
