"""Small hand-written programs whose timing has a closed form."""

from __future__ import annotations

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
    load,
    matmul,
    store,
)
from stagec.isa.instructions import encode
from stagec.lower.codegen.tokens import insert_tokens

F32 = 4


def roomy_hw(**fields) -> HardwareConfig:
    """A config with memories big enough for whole-layer tiles."""
    return HardwareConfig(**{"scratchpad_bytes": 4 << 20, "accumulator_bytes": 4 << 20, **fields})


def build(instructions, hw: HardwareConfig, *, const: int, inp: int, out: int, layer_ids=None,
          layers=None) -> Program:
    """A program over DRAM [weights (const bytes) | input (inp bytes) | output (out bytes)], tokens inserted."""
    weights = np.zeros(const // F32, np.float32)
    layers = layers or (Layer("layer", "matmul", ((inp // F32,),), (out // F32,)),)
    p = Program(code=encode(instructions),
                layer_ids=np.zeros(len(instructions), np.int32) if layer_ids is None else np.asarray(layer_ids),
                layers=layers, inputs=(TensorRef("x", const, DType.F32, (inp // F32,)),),
                outputs=(TensorRef("y", const + inp, DType.F32, (out // F32,)),),
                regions=(Region("weights", "const", 0, const), Region("x", "input", const, inp),
                         Region("y", "output", const + inp, out)),
                constants=weights.tobytes(), dram_bytes=const + inp + out, hw=hw)
    return insert_tokens(p)


def single_matmul(m: int, k: int, n: int, hw: HardwareConfig) -> Program:
    """LOAD A [m,k] and B [k,n], one MATMUL, STORE C [m,n]: a layer as SCALE-Sim runs it."""
    a_bytes, b_bytes, c_bytes = m * k * F32, k * n * F32, m * n * F32
    ins = [
        load(Operand(Space.DRAM, b_bytes, (0, k, 1)), Operand(Space.SPAD, 0, (0, k, 1)), (1, m, k)),
        load(Operand(Space.DRAM, 0, (0, n, 1)), Operand(Space.SPAD, a_bytes, (0, n, 1)), (1, k, n)),
        matmul(Operand(Space.SPAD, 0, (0, k, 1)), Operand(Space.SPAD, a_bytes, (n, 1, 0)),
               Operand(Space.ACC, 0, (0, n, 1)), 1, m, k, n, accumulate=False),
        store(Operand(Space.DRAM, b_bytes + a_bytes, (0, n, 1)), Operand(Space.ACC, 0, (0, n, 1)), (1, m, n)),
    ]
    return build(ins, hw, const=b_bytes, inp=a_bytes, out=c_bytes,
                 layers=(Layer("mm", "matmul", ((m, k), (k, n)), (m, n), macs=m * k * n),))


def load_store_load(x: int, y: int, s: int, hw: HardwareConfig) -> Program:
    """LOAD x elements, STORE s of them, and an independent LOAD of y elements into another buffer."""
    ins = [
        load(Operand(Space.DRAM, 0, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)), (1, 1, x)),
        store(Operand(Space.DRAM, (x + y) * F32, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)), (1, 1, s)),
        load(Operand(Space.DRAM, x * F32, (0, 0, 1)), Operand(Space.SPAD, x * F32, (0, 0, 1)), (1, 1, y)),
    ]
    return build(ins, hw, const=x * F32, inp=y * F32, out=s * F32)


def pipeline(tiles: int, m: int, k: int, n: int, hw: HardwareConfig, buffers: int = 2) -> Program:
    """Per tile: LOAD an A tile, MATMUL with resident weights, STORE the C tile; `buffers` rotating buffers."""
    a_bytes, b_bytes, c_bytes = m * k * F32, k * n * F32, m * n * F32
    ins = [load(Operand(Space.DRAM, 0, (0, n, 1)), Operand(Space.SPAD, 0, (0, n, 1)), (1, k, n))]
    for t in range(tiles):
        a_local, c_local = b_bytes + (t % buffers) * a_bytes, (t % buffers) * c_bytes
        a_dram, c_dram = b_bytes + t * a_bytes, b_bytes + tiles * a_bytes + t * c_bytes
        ins += [
            load(Operand(Space.DRAM, a_dram, (0, k, 1)), Operand(Space.SPAD, a_local, (0, k, 1)), (1, m, k)),
            matmul(Operand(Space.SPAD, a_local, (0, k, 1)), Operand(Space.SPAD, 0, (n, 1, 0)),
                   Operand(Space.ACC, c_local, (0, n, 1)), 1, m, k, n, accumulate=False),
            store(Operand(Space.DRAM, c_dram, (0, n, 1)), Operand(Space.ACC, c_local, (0, n, 1)), (1, m, n)),
        ]
    return build(ins, hw, const=b_bytes, inp=tiles * a_bytes, out=tiles * c_bytes,
                 layers=(Layer("mm", "matmul", ((tiles * m, k), (k, n)), (tiles * m, n), macs=tiles * m * k * n),))
