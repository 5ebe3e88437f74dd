"""int8 depthwise convolutions as dot products (lower.schedule.nest.TileMapping.dot): per output tile a COPY
per tap lays the window out as each output's taps side by side, and one RDOT (VectorFunc.RDOT, as Arm's
SDOT: int8 products summed four to a 32-bit lane) sums them.  Checked bit for bit against the widening
MUL per tap and stagec.int8_reference, layer by layer and in a halo cascade, and priced as the simulator
times it (nest cost, relaxed cost model, cascade cost)."""

import dataclasses

import jax
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_halo_cascade import block
from test_int8_halo import int8_programs

import stagec
from stagec import int8_reference
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import layer_cost
from stagec.costmodel.problem import layer_shape, mapping_arrays
from stagec.isa import (
    DType,
    HardwareConfig,
    Layer,
    Opcode,
    Operand,
    Program,
    Queue,
    Space,
    TensorRef,
    VectorFunc,
    VerificationError,
    store,
    vector,
    verify,
)
from stagec.isa import load as load_ins
from stagec.isa.instructions import encode
from stagec.layers import model_graph, model_layers
from stagec.lower.codegen.tokens import insert_tokens
from stagec.lower.schedule.cascade import cascade_cost
from stagec.lower.schedule.nest import ConvProblem, Exact, LayerShape, TileMapping, dots
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.lower.schedule.nest_map import map_nest
from stagec.lower.schedule.nest_work import dims, dot_work
from stagec.pipeline import PIPELINE, Compilation, Request, lower_graph, run
from stagec.report import make_report
from stagec.sim.costs import instruction_shapes, unit_cycles, unit_parameters
from stagec.sim.reference import execute as reference_execute

HW = HardwareConfig(vector_lanes=8)


def rdots(program) -> int:
    code = program.code
    return int(((code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.RDOT)).sum())


def rdot_program(strides=(0, 8, 1)) -> Program:
    """c[i] = sum_j a[0, 8 i + j] * a[1, 8 i + j], i < 2: one RDOT over two runs of 8 int8 products."""
    ins = [load_ins(Operand(Space.DRAM, 0, (0, 0, 1)), Operand(Space.SPAD, 0, (0, 0, 1)), (1, 1, 32), dtype=DType.I8),
           vector(VectorFunc.RDOT, Operand(Space.ACC, 0, (0, 1, 0)), Operand(Space.SPAD, 0, strides),
                  Operand(Space.SPAD, 16, (0, 8, 1)), (1, 2, 8), dtype=DType.I8, out_dtype=DType.I32),
           store(Operand(Space.DRAM, 64, (0, 0, 1)), Operand(Space.ACC, 0, (0, 0, 1)), (1, 1, 2), dtype=DType.I32)]
    p = Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32), layers=(Layer("d", "dot", (), ()),),
                inputs=(TensorRef("a", 0, DType.I8, (2, 16)),), outputs=(TensorRef("c", 64, DType.I32, (2,)),),
                regions=(), constants=b"", dram_bytes=128, hw=HW)
    return insert_tokens(p)


def test_rdot_sums_each_runs_int8_products_in_int32():
    """The reference semantics and the batched executor agree with int64 sums, past int16 (-128 * -128
    eight times); the verifier rejects sources strided over i2 (not runs)."""
    a = np.random.default_rng(0).integers(-128, 128, (2, 16)).astype(np.int8)
    a[:, :8] = -128
    expect = (a[0].astype(np.int64) * a[1]).reshape(2, 8).sum(1)
    assert expect[0] == 8 * 128 * 128
    p = rdot_program()
    (c,), _ = stagec.simulate(p, a)
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, expect)
    np.testing.assert_array_equal(reference_execute(p, [a])[0], expect)
    with pytest.raises(VerificationError, match="RDOT reads its sources as runs over i2"):
        verify(rdot_program((0, 1, 2)))


@pytest.mark.parametrize(("kw", "steps"), [(3, 1), (4, 1), (5, 2), (9, 3)])
def test_an_rdot_takes_ceil_kw_over_4_dot_steps_a_lane_and_its_tree(kw, steps):
    """sim.costs, as SDOT: each of 2 x 16 outputs sums its run of kw int8 products in ceil(kw / 4) dot
    steps of one lane (a run of 5 padded to 8, of 3 to 4), 8 lanes, plus ceil(log2(kw)); the nest's dot
    mapping prices its RDOTs by the same rule."""
    ins = vector(VectorFunc.RDOT, Operand(Space.ACC, 0, (16, 1, 0)), Operand(Space.SPAD, 0, (16 * kw, kw, 1)),
                 Operand(Space.SPAD, 0, (0, kw, 1)), (2, 16, kw), dtype=DType.I8, out_dtype=DType.I32)
    occupancy, _ = unit_cycles(instruction_shapes(encode([ins])), unit_parameters(HW))
    assert float(occupancy[0]) == 2 * 16 * steps / 8 + np.ceil(np.log2(kw))
    # one output row of 16 columns and 2 channels, one kernel row: the same RDOT
    L = LayerShape.of("depthwise", ConvProblem(1, 2, 1, 16 + kw - 1, 2, 1, kw, itemsize=1, widened=True,
                                               out_itemsize=1))
    _, cycles = dot_work(L, dims(L, TileMapping(1, 16, 2, dot=True), Exact), HW, Exact)
    assert float(cycles) == float(occupancy[0])


class Depthwise(torch.nn.Module):
    def __init__(self, c, k, stride, padding):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, k, stride=stride, padding=padding, groups=c)

    def forward(self, x):
        return torch.nn.functional.relu6(self.dw(x))


def check_layer(c, size, k, stride, padding, hw=HW, tile=None):
    """An int8 depthwise layer with and without the dot mapping (the mapper's tiles, or `tile`): the same
    output, stagec.int8_reference's; the layer's instructions and their vector cycles are its nest
    cost's, and the relaxed cost model's cycles the nest's."""
    torch.manual_seed(c * size + k)
    model, x = Depthwise(c, k, stride, padding).eval(), torch.randn(1, c, size, size)
    graph = model_graph(model, (x,), quantize="int8", calibration=[(x,)])
    (layer,) = [layer for layer in model_layers(graph) if layer.kind == "depthwise"]
    m = map_nest(layer.kind, layer.problem, hw, layer.extras, layer.name) if tile is None else TileMapping(*tile)
    L = LayerShape.of(layer.kind, layer.problem, layer.extras, layer.repeat)
    outs = []
    for dot in (False, True):
        mapping = dataclasses.replace(m, dot=dot)
        program = lower_graph(graph, hw, {layer.name: mapping})
        y, _ = stagec.simulate(program, x)
        outs.append(np.asarray(y))
        rows = program.layer_ids == [p.name for p in program.layers].index(layer.name)
        assert (rdots(program) > 0) == dot
        shapes = instruction_shapes(program.code)
        occupancy, _ = unit_cycles(shapes, unit_parameters(hw))
        cost = nest_cost(L, mapping, hw, Exact)
        assert float(occupancy[rows & (shapes.queue == Queue.VECTOR)].sum()) == cost.work.epilogue + cost.work.compute
        assert int(cost.instructions) == rows.sum()
        relaxed = jax.jit(layer_cost)(layer_shape(layer.kind, layer.problem, layer.extras, layer.repeat),
                                      mapping_arrays(mapping), hardware_point(hw))
        assert float(relaxed.cycles) == pytest.approx(float(cost.cycles), rel=1e-5)
    np.testing.assert_array_equal(outs[1], outs[0])
    ref = int8_reference.run(graph, [x.numpy()])[0]
    np.testing.assert_array_equal(outs[1].reshape(ref.shape), ref)


@pytest.mark.parametrize(("c", "size", "k", "stride", "padding", "tile"), [
    (6, 9, 3, 1, 1, (4, 5, 4, 1)),     # edge tiles of every size, channels 4 + 2
    (5, 12, 5, 2, 0, (2, 4, 3, 1)),    # 5x5 stride 2, unpadded
], ids=["3x3", "5x5-s2-unpadded"])
def test_an_int8_depthwise_as_dot_products_keeps_its_integers_and_its_price(c, size, k, stride, padding, tile):
    check_layer(c, size, k, stride, padding, tile=tile)


def test_the_mapper_takes_dot_products_where_they_are_cheaper():
    """With sub-word packing an int8 tap takes one lane as a widening MUL and a quarter of one as a COPY
    and an RDOT: the mapper picks dot; without packing the COPYs are pure cost, and it does not."""
    p = ConvProblem(1, 32, 14, 14, 32, 3, 3, padding=((1, 1), (1, 1)), itemsize=1, widened=True, out_itemsize=1)
    on = map_nest("depthwise", p, HW)
    off = map_nest("depthwise", p, HW.replace(vector_subword_packing=False))
    assert on.dot and not off.dot
    # an fp32 depthwise and an int8 pooling have none
    fp32 = dataclasses.replace(p, itemsize=4, widened=False, out_itemsize=4)
    assert not dots(LayerShape.of("depthwise", fp32)) and not dots(LayerShape.of("pool", p))
    assert not map_nest("depthwise", fp32, HW).dot


def test_an_int8_block_runs_its_depthwise_as_dot_products_in_a_halo_cascade():
    """A 5x5 stride-2 block of 15 hidden channels: one cascade, its depthwise member dot-mapped (the
    expand's window turned channel-major), bit for bit the unfused program and the reference; the
    cascade cost predicts the simulated vector ops, instructions and footprint exactly and the cycles
    within 10%."""
    hw = HardwareConfig()
    model, x = block(2, size=11, c=5, expand=3, out=5, k=5, padding=2)
    fused, y, y_alone, y_ref = int8_programs(model, x, hw=hw)
    np.testing.assert_array_equal(y, y_alone)
    np.testing.assert_array_equal(y, y_ref)
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw, quantize="int8")))
    (cascade,) = c.schedule.cascades
    assert [m.dot for m in cascade.mappings] == [False, True, False] and rdots(c.program) > 1
    shapes = [LayerShape.of(*c.schedule[name].nests[0]) for name in cascade.layers]
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, cascade.chunk is not None)
    layers = [layer for layer in make_report(c.program).layers if layer.name in cascade.layers]
    assert cost.actions.vector_ops == sum(layer.actions.vector_ops for layer in layers)
    assert cost.instructions == sum(sum(layer.instructions.values()) for layer in layers)
    assert cost.cycles == pytest.approx(layers[-1].end_cycle - layers[0].start_cycle, rel=0.1)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 9), size=st.integers(5, 10), kernel=st.sampled_from([(3, 1), (3, 0), (5, 2)]),
       stride=st.sampled_from([1, 2]), data=st.data())
def test_random_int8_depthwise_layers_as_dot_products(c, size, kernel, stride, data):
    k, padding = kernel
    oh = (size + 2 * padding - k) // stride + 1
    tile = (data.draw(st.integers(1, oh)), data.draw(st.integers(1, oh)), data.draw(st.integers(1, c)), 1)
    check_layer(c, size, k, stride, padding, tile=tile)
