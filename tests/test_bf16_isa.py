"""bf16 in the ISA: LOAD widens, STORE rounds to nearest even, MATMUL multiplies bf16 into float32.

Checked against an independent float64 reference that rounds to bf16 with numpy's half-to-even
`round` on the significand, at the same points as the ISA defines (isa.opcodes), and the batched
executor against the reference interpreter, bit for bit.
"""

import numpy as np
import pytest
import torch

from stagec.errors import VerificationError
from stagec.isa import (
    AccMode,
    DType,
    HardwareConfig,
    Layer,
    Operand,
    PadValue,
    Program,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    matmul,
    store,
    vector,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import encode
from stagec.isa.verify import verify
from stagec.lower.codegen.tokens import insert_tokens
from stagec.sim.executor import Executor
from stagec.sim.reference import execute as reference


def nearest_bf16(x) -> np.ndarray:
    """float64 values rounded to the nearest bf16 (8 significant bits), ties to even; normal range only."""
    m, e = np.frexp(np.asarray(x, np.float64))   # x = m * 2**e, 1/2 <= |m| < 1
    return np.ldexp(np.round(m * 256), e - 8)


def bits(x64) -> np.ndarray:
    """The bf16 bit pattern of float64 values that are bf16 numbers."""
    v = np.asarray(x64, np.float32)
    assert (v.astype(np.float64) == x64).all() and (v.view(np.uint32) & 0xFFFF == 0).all()
    return (v.view(np.uint32) >> 16).astype(np.uint16)


def value(b) -> np.ndarray:
    return (np.asarray(b, np.uint32) << 16).view(np.float32).astype(np.float64)


def program(ins, inputs, outputs, blob=b"", hw=None):
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("t", "test", (), ()),),
                inputs=tuple(inputs), outputs=tuple(outputs), regions=(Region("weights", "const", 0, len(blob)),),
                constants=blob, dram_bytes=8192, hw=hw or HardwareConfig())
    return insert_tokens(p)


def run_both(p, inputs, exact=True):
    """The batched executor's outputs, checked equal (bits) to the reference interpreter's; not
    `exact`: float32 sums in another order, so to float32's accuracy (a bf16 result within a unit)."""
    got = Executor(p).run(inputs)
    for g, r in zip(got, reference(p, inputs), strict=True):
        if exact:
            np.testing.assert_array_equal(g.view(np.uint8), r.view(np.uint8))
        elif g.dtype == np.uint16:
            assert np.abs(g.astype(np.int32) - r.astype(np.int32)).max() <= 1
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    return got


S = (0, 0, 1)


def rounding_inputs(n=64):
    """float32 values at and around bf16 rounding ties, both signs, and random ones."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal(n // 2).astype(np.float32)
    b = base.view(np.uint32) & ~np.uint32(0xFFFF)
    ties = (b | 0x8000).view(np.float32)                  # exactly halfway: even wins
    near = (b | rng.integers(0, 0x10000, n // 2).astype(np.uint32)).view(np.float32)
    return np.concatenate([ties, near]).reshape(n)


def test_store_rounds_float32_to_nearest_even_bf16_and_load_widens_it_back():
    n = 64
    x_off, y_off, z_off = 1024, 2048, 3072
    ins = [load_ins(Operand(Space.DRAM, x_off, S), Operand(Space.SPAD, 0, S), (1, 1, n)),
           store(Operand(Space.DRAM, y_off, S), Operand(Space.SPAD, 0, S), (1, 1, n), dtype=DType.BF16,
                 out_dtype=DType.F32),
           load_ins(Operand(Space.DRAM, y_off, S), Operand(Space.SPAD, 512, S), (1, 1, n), dtype=DType.BF16,
                    out_dtype=DType.F32),
           store(Operand(Space.DRAM, z_off, S), Operand(Space.SPAD, 512, S), (1, 1, n))]
    p = program(ins, [TensorRef("x", x_off, DType.F32, (n,))],
                [TensorRef("y", y_off, DType.BF16, (n,)), TensorRef("z", z_off, DType.F32, (n,))])
    x = rounding_inputs(n)
    y, z = run_both(p, [x])
    expect = nearest_bf16(x)
    np.testing.assert_array_equal(y, bits(expect))
    np.testing.assert_array_equal(z, expect.astype(np.float32))
    torch_bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(y, torch_bits)   # and torch's .to(torch.bfloat16) agrees
    assert (nearest_bf16(x[:32]) != x[:32]).all()   # the ties were ties


@pytest.mark.parametrize("pad_value, fill", [(PadValue.ZERO, 0.0), (PadValue.NEG_INF, -np.inf),
                                             (PadValue.POS_INF, np.inf)])
def test_a_bf16_load_pads_with_bf16_values_kept_or_widened(pad_value, fill):
    n = 6
    x_off, k_off, w_off = 1024, 2048, 3072
    kept = (load_ins(Operand(Space.DRAM, x_off, S), Operand(Space.SPAD, 0, S), (1, 1, n), pad=(0, 0, 0, 0, 1, 2),
                     pad_value=pad_value, dtype=DType.BF16),
            store(Operand(Space.DRAM, k_off, S), Operand(Space.SPAD, 0, S), (1, 1, n + 3), dtype=DType.BF16))
    wide = (load_ins(Operand(Space.DRAM, x_off, S), Operand(Space.SPAD, 256, S), (1, 1, n), pad=(0, 0, 0, 0, 2, 1),
                     pad_value=pad_value, dtype=DType.BF16, out_dtype=DType.F32),
            store(Operand(Space.DRAM, w_off, S), Operand(Space.SPAD, 256, S), (1, 1, n + 3)))
    p = program([*kept, *wide], [TensorRef("x", x_off, DType.BF16, (n,))],
                [TensorRef("k", k_off, DType.BF16, (n + 3,)), TensorRef("w", w_off, DType.F32, (n + 3,))])
    x64 = nearest_bf16(np.random.default_rng(2).standard_normal(n))
    k, w = run_both(p, [bits(x64)])
    np.testing.assert_array_equal(value(k), np.concatenate([[fill], x64, [fill, fill]]))
    np.testing.assert_array_equal(w, np.concatenate([[fill, fill], x64, [fill]]).astype(np.float32))


def matmul_program(m, k, n, b_blob):
    """c = a @ b, a [m, k] a bf16 input, b [k, n] bf16 constants; stored as float32 and as bf16."""
    a_off, c_off, d_off = 2560, 4096, 5120
    ins = [load_ins(Operand(Space.DRAM, a_off, (0, k, 1)), Operand(Space.SPAD, 0, (0, k, 1)), (1, m, k),
                    dtype=DType.BF16),
           load_ins(Operand(Space.DRAM, 0, (0, n, 1)), Operand(Space.SPAD, 2048, (0, n, 1)), (1, k, n),
                    dtype=DType.BF16),
           matmul(Operand(Space.SPAD, 0, (0, k, 1)), Operand(Space.SPAD, 2048, (n, 1, 0)),
                  Operand(Space.ACC, 0, (0, n, 1)), 1, m, k, n, accumulate=False, dtype=DType.BF16),
           store(Operand(Space.DRAM, c_off, (0, n, 1)), Operand(Space.ACC, 0, (0, n, 1)), (1, m, n)),
           store(Operand(Space.DRAM, d_off, (0, n, 1)), Operand(Space.ACC, 0, (0, n, 1)), (1, m, n),
                 dtype=DType.BF16, out_dtype=DType.F32)]
    return program(ins, [TensorRef("a", a_off, DType.BF16, (m, k))],
                   [TensorRef("c", c_off, DType.F32, (m, n)), TensorRef("d", d_off, DType.BF16, (m, n))], b_blob)


def test_bf16_matmul_is_exact_products_summed_in_float32_then_rounded_on_store():
    """Operands whose products and sums are exact in float32 (8-bit integers times powers of two): the
    float32 result equals the float64 one, and the stored bf16 is its nearest-even rounding."""
    m, k, n = 8, 24, 16
    rng = np.random.default_rng(3)
    a64 = rng.integers(-255, 256, (m, k)) * 2.0 ** rng.integers(-8, 0, (m, 1))
    b64 = rng.integers(-255, 256, (k, n)) * 2.0 ** -6
    c, d = run_both(matmul_program(m, k, n, bits(b64).tobytes()), [bits(a64)])
    c64 = a64 @ b64
    np.testing.assert_array_equal(c, c64.astype(np.float32))
    np.testing.assert_array_equal(d, bits(nearest_bf16(c64)))
    assert (nearest_bf16(c64) != c64).any()   # the store did round


def test_bf16_matmul_of_random_operands_is_float32_accurate():
    m, k, n = 8, 64, 16
    rng = np.random.default_rng(4)
    a64, b64 = nearest_bf16(rng.standard_normal((m, k))), nearest_bf16(rng.standard_normal((k, n)))
    c, d = run_both(matmul_program(m, k, n, bits(b64).tobytes()), [bits(a64)], exact=False)
    c64 = a64 @ b64
    np.testing.assert_allclose(c, c64, rtol=0, atol=k * np.abs(c64).max() * 2.0**-24)
    assert np.abs(value(d) - c64).max() <= np.abs(c64).max() * 2.0**-8 + 1e-12


def test_vector_ops_on_bf16_compute_in_float32_and_round_their_result():
    n = 32
    a_off, b_off, s_off, i_off = 1024, 1536, 2048, 2560
    ins = [load_ins(Operand(Space.DRAM, a_off, S), Operand(Space.SPAD, 0, S), (1, 1, n), dtype=DType.BF16),
           load_ins(Operand(Space.DRAM, b_off, S), Operand(Space.SPAD, 256, S), (1, 1, n), dtype=DType.BF16),
           vector(VectorFunc.ADD, Operand(Space.SPAD, 512, S), Operand(Space.SPAD, 0, S), Operand(Space.SPAD, 256, S),
                  (1, 1, n), dtype=DType.BF16),
           vector(VectorFunc.COPY, Operand(Space.SPAD, 768, S), Operand(Space.SPAD, 0, S), None, (1, 1, n),
                  dtype=DType.BF16, out_dtype=DType.I32),
           store(Operand(Space.DRAM, s_off, S), Operand(Space.SPAD, 512, S), (1, 1, n), dtype=DType.BF16),
           store(Operand(Space.DRAM, i_off, S), Operand(Space.SPAD, 768, S), (1, 1, n), dtype=DType.I32)]
    p = program(ins, [TensorRef("a", a_off, DType.BF16, (n,)), TensorRef("b", b_off, DType.BF16, (n,))],
                [TensorRef("s", s_off, DType.BF16, (n,)), TensorRef("i", i_off, DType.I32, (n,))])
    rng = np.random.default_rng(5)
    a64, b64 = nearest_bf16(rng.standard_normal(n) * 40), nearest_bf16(rng.standard_normal(n))
    s, i = run_both(p, [bits(a64), bits(b64)])
    np.testing.assert_array_equal(s, bits(nearest_bf16(a64 + b64)))   # a + b is exact in float32
    np.testing.assert_array_equal(i, np.trunc(a64).astype(np.int32))


def one(ins_fn, hw=None):
    return program([ins_fn()], [], [], hw=hw)


@pytest.mark.parametrize("make, message", [
    (lambda: load_ins(Operand(Space.DRAM, 0, S), Operand(Space.SPAD, 0, S), (1, 1, 4), dtype=DType.F32,
                      out_dtype=DType.BF16), "load F32->BF16 is not supported"),
    (lambda: store(Operand(Space.DRAM, 1024, S), Operand(Space.SPAD, 0, S), (1, 1, 4), dtype=DType.F32,
                   out_dtype=DType.BF16), "store F32->BF16 is not supported"),
    (lambda: load_ins(Operand(Space.DRAM, 0, S), Operand(Space.SPAD, 0, S), (1, 1, 4), dtype=DType.BF16,
                      out_dtype=DType.I32), "load BF16->I32 is not supported"),
    (lambda: matmul(Operand(Space.SPAD, 0, S), Operand(Space.SPAD, 64, (1, 1, 0)), Operand(Space.ACC, 0, S),
                    1, 1, 1, 1, accumulate=False, dtype=DType.BF16, out_dtype=DType.BF16),
     "matmul BF16->BF16 is not supported"),
    (lambda: vector(VectorFunc.ADD, Operand(Space.SPAD, 0, S), Operand(Space.SPAD, 64, S), Operand(Space.SPAD, 128, S),
                    (1, 1, 4), acc=AccMode.ADD, dtype=DType.BF16), "a bf16 destination cannot accumulate"),
])
def test_the_verifier_rejects_illegal_bf16_pairs(make, message):
    with pytest.raises(VerificationError, match=message):
        verify(one(make))


def test_bf16_needs_the_hardware_mode():
    hw = HardwareConfig(dtypes=("int8", "fp32"))
    with pytest.raises(VerificationError, match="BF16 needs the 'bf16' mode"):
        verify(one(lambda: load_ins(Operand(Space.DRAM, 0, S), Operand(Space.SPAD, 0, S), (1, 1, 4),
                                    dtype=DType.BF16, out_dtype=DType.F32), hw))
