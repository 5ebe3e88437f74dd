"""Sub-word packing on the vector unit (HardwareConfig.vector_subword_packing): each 32-bit lane takes
32 / w elements of an instruction a cycle, w its widest operand's bits (sim.costs.lane_bits); the
timing simulator and the nest cost model charge it through one formula (sim.costs)."""

import jax
import numpy as np
import pytest
import torch

from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import layer_cost
from stagec.costmodel.problem import layer_shape, mapping_arrays
from stagec.isa import (
    ConfigError,
    DType,
    HardwareConfig,
    Layer,
    Operand,
    Program,
    Queue,
    Region,
    Space,
    TensorRef,
    VectorFunc,
    store,
    vector,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import encode
from stagec.layers import layer_program, model_graph, model_layers
from stagec.lower.codegen.tokens import insert_tokens
from stagec.lower.schedule.nest import ConvProblem, Exact, LayerShape, TileMapping
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.lower.schedule.nest_map import map_nest
from stagec.sim.costs import instruction_shapes, unit_cycles, unit_parameters, vector_cycles
from stagec.sim.timing import program_cycles, timeline
from stagec.sim.timing_reference import reference_times

LANES = 16
N = (1, 10, 10)   # 100 elements
A = Operand(Space.SPAD, 0, (0, 10, 1))
ON, OFF = HardwareConfig(vector_lanes=LANES), HardwareConfig(vector_lanes=LANES, vector_subword_packing=False)


def _cycles(ins, hw) -> float:
    occupancy, _ = unit_cycles(instruction_shapes(encode([ins])), unit_parameters(hw))
    return float(occupancy[0])


# (instruction, cycles packed, cycles unpacked), by hand: ceil(100 / (16 * per lane)) (+ a reduction's tree)
CASES = {
    "int8 add: 4 a lane": (vector(VectorFunc.ADD, A, A, A, N, dtype=DType.I8), 2, 7),
    "int8 lut (its table read once): 4": (vector(VectorFunc.LUT, A, A, Operand(Space.SPAD, 0, (0, 0, 0)), N,
                                                 dtype=DType.I8), 2, 7),
    "bf16 max: 2": (vector(VectorFunc.MAX, A, A, A, N, dtype=DType.BF16), 4, 7),
    "fp32 add: 1": (vector(VectorFunc.ADD, A, A, A, N), 7, 7),
    "int32 add: 1": (vector(VectorFunc.ADD, A, A, A, N, dtype=DType.I32), 7, 7),
    "int8 x int8 -> int32 mul, widening: 1": (vector(VectorFunc.MUL, A, A, A, N, dtype=DType.I8,
                                                     out_dtype=DType.I32), 7, 7),
    "bf16 x bf16 -> fp32 mul, widening: 1": (vector(VectorFunc.MUL, A, A, A, N, dtype=DType.BF16,
                                                    out_dtype=DType.F32), 7, 7),
    "int32 -> int8 requant (int32 records): 1": (vector(VectorFunc.REQUANT, A, A, A, N, dtype=DType.I32,
                                                        out_dtype=DType.I8), 7, 7),
    "int8 -> int32 rescale: 1": (vector(VectorFunc.RESCALE, A, A, A, N, dtype=DType.I8, out_dtype=DType.I32), 7, 7),
    # a sum of 10 int8 into one int32: 3.2 result bits an element, so its int8 source sets the rate (as SDOT)
    "int8 -> int32 sum over runs of 10: 4, + a tree of 4": (
        vector(VectorFunc.RSUM, Operand(Space.SPAD, 0, (0, 10, 0)), A, None, N, dtype=DType.I8,
               out_dtype=DType.I32), 2 + 4, 7 + 4),
    "int8 -> int32 sum over runs of 2: 16 result bits an element, 2": (
        vector(VectorFunc.RSUM, Operand(Space.SPAD, 0, (0, 2, 0)), A, None, (1, 50, 2), dtype=DType.I8,
               out_dtype=DType.I32), 4 + 1, 7 + 1),
    "fp32 exp: 1, 4 cycles a group": (vector(VectorFunc.EXP, A, A, None, N), 28, 28),
    "bf16 exp: 2, 4 cycles a group": (vector(VectorFunc.EXP, A, A, None, N, dtype=DType.BF16), 16, 28),
}


@pytest.mark.parametrize("case", CASES)
def test_a_lane_takes_32_bits_of_the_widest_operand_a_cycle(case):
    ins, packed, unpacked = CASES[case]
    assert (_cycles(ins, ON), _cycles(ins, OFF)) == (packed, unpacked)


def test_without_packing_a_vector_instruction_costs_what_it_did():
    """Packing off is the formula before sub-words: ceil(elements / lanes), whatever the types."""
    for ins, _, _ in CASES.values():
        n = ins.n[0] * ins.n[1] * ins.n[2]
        reduce_length = ins.n[2] if ins.func == VectorFunc.RSUM else 1
        assert _cycles(ins, OFF) == vector_cycles(n, LANES, transcendental=ins.func == VectorFunc.EXP,
                                                  reduce_length=reduce_length, cycles_per_transcendental=4.0)


def _int8_relu_program(hw: HardwareConfig, rows: int = 16, cols: int = 64) -> Program:
    """LOAD int8, RELU int8 -> int8 in place, STORE: an int8 elementwise program."""
    n, s = (1, rows, cols), (0, cols, 1)
    ins = [load_ins(Operand(Space.DRAM, 0, s), Operand(Space.SPAD, 0, s), n, dtype=DType.I8),
           vector(VectorFunc.RELU, Operand(Space.SPAD, 0, s), Operand(Space.SPAD, 0, s), None, n, dtype=DType.I8),
           store(Operand(Space.DRAM, 4096, s), Operand(Space.SPAD, 0, s), n, dtype=DType.I8)]
    p = Program(code=encode(ins), layer_ids=np.zeros(3, np.int32), layers=(Layer("relu", "test", (), ()),),
                inputs=(TensorRef("x", 0, DType.I8, (rows, cols)),),
                outputs=(TensorRef("y", 4096, DType.I8, (rows, cols)),),
                regions=(Region("weights", "const", 0, 0),), constants=b"", dram_bytes=8192, hw=hw)
    return insert_tokens(p)


def test_an_int8_elementwise_programs_vector_work_takes_a_quarter_of_the_cycles():
    hw = HardwareConfig(vector_lanes=4)
    off = hw.replace(vector_subword_packing=False)
    p = _int8_relu_program(hw)
    on_t, off_t = timeline(p, hw), timeline(p, off)
    vec = int(np.flatnonzero(on_t.queue == Queue.VECTOR)[0])
    assert off_t.end[vec] - off_t.start[vec] == 1024 / 4          # one int8 a lane: the model before packing
    assert on_t.end[vec] - on_t.start[vec] == 1024 / 16           # four int8 a lane
    # the whole program: three quarters of the vector part saved, the DMAs alike; both timings agree
    saved = float(program_cycles(p, off)) - float(program_cycles(p, hw))
    assert saved == 1024 / 4 - 1024 / 16
    for config in (hw, off):
        assert float(program_cycles(p, config)) == reference_times(p.code, config)[2].max()


class _Int8Block(torch.nn.Module):
    """A pointwise conv, a depthwise conv, an int8 max pool: int8 layers whose vector work mixes int8 x
    int8 -> int32 taps, int32 -> int8 requants and int8 maxima."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pw = torch.nn.Conv2d(8, 16, 1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.dw(torch.relu(self.pw(x)))), 2)


def priced_layer(graph, layer, hw):
    """(shape, mapping, nest cost, the emitted layer's instruction shapes, their occupancy on `hw`) of one
    of graph's layers as the mapper maps it; the cost model over jax.numpy checked to price it alike."""
    L = LayerShape.of(layer.kind, layer.problem, layer.extras, layer.repeat)
    m = map_nest(layer.kind, layer.problem, hw, layer.extras, layer.name)
    cost = nest_cost(L, m, hw, Exact)
    shapes = instruction_shapes(layer_program(graph, layer, m, hw).code)
    relaxed = jax.jit(layer_cost)(layer_shape(layer.kind, layer.problem, layer.extras, layer.repeat),
                                  mapping_arrays(m), hardware_point(hw))
    assert float(relaxed.cycles) == pytest.approx(float(cost.cycles), rel=1e-5), layer.name
    return L, m, cost, shapes, unit_cycles(shapes, unit_parameters(hw))[0]


def _vector_cycles(L: LayerShape, cost) -> float:
    on_array = L.kind == 0
    return L.repeat * (cost.work.epilogue + (not on_array) * cost.work.compute)


@pytest.mark.parametrize("packing", [True, False])
def test_the_cost_model_prices_each_int8_layer_as_the_simulator_times_it(packing):
    """Each int8 layer's nest cost (numpy, and the cost model over jax.numpy) has the vector cycles the
    timing formulas charge its emitted instructions, packed or not; and the layer's cycles agree."""
    x = torch.randn(1, 8, 12, 12)
    hw = HardwareConfig(vector_lanes=8, vector_subword_packing=packing)
    graph = model_graph(_Int8Block(), (x,), quantize="int8", calibration=[(x,)])
    layers = model_layers(graph)
    assert {layer.kind for layer in layers} == {"matrix", "depthwise", "pool"}
    for layer in layers:
        assert layer.problem.itemsize == 1, layer.name
        L, _, cost, shapes, occupancy = priced_layer(graph, layer, hw)
        assert float(occupancy[shapes.queue == Queue.VECTOR].sum()) == _vector_cycles(L, cost), layer.name


def test_an_int8_max_pools_taps_pack_four_a_lane():
    p = ConvProblem(1, 16, 12, 12, 16, 2, 2, stride=(2, 2), itemsize=1, out_itemsize=1)
    L, m = LayerShape.of("pool", p), TileMapping(2, 6, 16, 1)   # tiles of 192 elements: 3 groups of 64
    on, off = (nest_cost(L, m, hw, Exact).work.compute for hw in (ON, OFF))
    assert (on, off) == (3 * 3 * 4, 12 * 3 * 4)   # 3 tiles x 4 taps x groups


def test_packing_is_a_structural_boolean_field():
    assert HardwareConfig().vector_subword_packing is True
    assert HardwareConfig(vector_subword_packing=np.bool_(False)).vector_subword_packing is False
    for bad in ("yes", 1, 0.0, None):
        with pytest.raises(ConfigError, match=r"HardwareConfig\.vector_subword_packing = .*expected true or false"):
            HardwareConfig(vector_subword_packing=bad)
    assert HardwareConfig.from_dict({"vector_subword_packing": False}) == OFF.replace(vector_lanes=16)
    assert hardware_point(OFF).vector_subword_packing == 0 and hardware_point(ON).vector_subword_packing == 1
