"""Small hand-written programs for ISA tests."""

import dataclasses

import numpy as np

from stagec.isa import (
    DType,
    HardwareConfig,
    Layer,
    Operand,
    Program,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    load,
    matmul,
    store,
    vector,
)
from stagec.isa.instructions import encode
from stagec.lower.codegen.tokens import insert_tokens

A_OFF, C_OFF = 128, 256   # DRAM: weights [0, 80), input a [128, 256), output c [256, 416)


def relu_matmul(hw=None, tokens=True) -> tuple[Program, np.ndarray, np.ndarray]:
    """c = relu(a @ b) for a [8,4] input, b [4,5] constant."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    ins = [
        load(Operand(Space.DRAM, A_OFF, (0, 4, 1)), Operand(Space.SPAD, 0, (0, 4, 1)), (1, 8, 4)),
        load(Operand(Space.DRAM, 0, (0, 5, 1)), Operand(Space.SPAD, 1024, (0, 5, 1)), (1, 4, 5)),
        matmul(Operand(Space.SPAD, 0, (0, 4, 1)), Operand(Space.SPAD, 1024, (5, 1, 0)),
               Operand(Space.ACC, 0, (0, 5, 1)), 1, 8, 4, 5, accumulate=False),
        vector(VectorFunc.RELU, Operand(Space.ACC, 0, (0, 5, 1)), Operand(Space.ACC, 0, (0, 5, 1)), None, (1, 8, 5)),
        store(Operand(Space.DRAM, C_OFF, (0, 5, 1)), Operand(Space.ACC, 0, (0, 5, 1)), (1, 8, 5)),
    ]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32),
                layers=(Layer("mm", "matmul", ((8, 4), (4, 5)), (8, 5), macs=160),),
                inputs=(TensorRef("a", A_OFF, DType.F32, (8, 4)),),
                outputs=(TensorRef("c", C_OFF, DType.F32, (8, 5)),),
                regions=(Region("weights", "const", 0, b.nbytes), Region("a", "input", A_OFF, 128),
                         Region("c", "output", C_OFF, 160)),
                constants=b.tobytes(), dram_bytes=512, hw=hw or HardwareConfig())
    return (insert_tokens(p) if tokens else p), b, rng.standard_normal((8, 4)).astype(np.float32)


def with_code(p: Program, code) -> Program:
    return dataclasses.replace(p, code=code, cache={})


def mutate(p: Program, index: int, **fields) -> Program:
    code = p.code.copy()
    for name, value in fields.items():
        code[name][index] = value
    return with_code(p, code)


def row_max(width: int, dst_stride: int) -> Program:
    """c = the max over each row's first `width` elements of an [8, 4] input a, by one RMAX whose
    destination steps `dst_stride` over the reduced dim."""
    ins = [
        load(Operand(Space.DRAM, A_OFF, (0, 4, 1)), Operand(Space.SPAD, 0, (0, 4, 1)), (1, 8, 4)),
        vector(VectorFunc.RMAX, Operand(Space.SPAD, 1024, (0, 1, dst_stride)), Operand(Space.SPAD, 0, (0, 4, 1)),
               None, (1, 8, width)),
        store(Operand(Space.DRAM, C_OFF, (0, 1, 1)), Operand(Space.SPAD, 1024, (0, 1, 1)), (1, 8, 1)),
    ]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32),
                layers=(Layer("max", "reduce", ((8, 4),), (8,)),),
                inputs=(TensorRef("a", A_OFF, DType.F32, (8, 4)),), outputs=(TensorRef("c", C_OFF, DType.F32, (8,)),),
                regions=(Region("a", "input", A_OFF, 128), Region("c", "output", C_OFF, 32)), constants=b"",
                dram_bytes=512, hw=HardwareConfig())
    return insert_tokens(p)
