"""Sub-word packing on the array (HardwareConfig.array_subword_packing): each PE's 32-bit datapath
multiplies 32 / w operand pairs of a MATMUL a cycle along the reduction (a dot-4 int8 PE, dot-2 bf16),
so a MATMUL's K steps ceil(K / p) times; the timing simulator, the energy counts, the nest cost model
and the reports' peaks charge it through sim.costs."""

import pytest
import torch
from test_subword import priced_layer

import stagec
from stagec import presets
from stagec.isa import ConfigError, DType, HardwareConfig, Operand, Program, Queue, Space
from stagec.isa.instructions import encode, matmul
from stagec.layers import layer_program, model_graph, model_layers
from stagec.lower.schedule.nest_map import map_nest
from stagec.report import make_report, model_limit
from stagec.sim.costs import array_macs_per_cycle, instruction_shapes, unit_cycles, unit_parameters
from stagec.sim.energy import action_counts

A, B, C = Operand(Space.SPAD, 0, (0, 96, 1)), Operand(Space.SPAD, 8192, (32, 1)), Operand(Space.ACC, 0, (0, 32, 1))
OUT = {DType.F32: DType.F32, DType.BF16: DType.F32, DType.I8: DType.I32}


def _matmul(dtype, accumulate=False):
    return matmul(A, B, C, 1, 49, 96, 32, accumulate=accumulate, dtype=dtype, out_dtype=OUT[dtype])


def _cycles(ins, hw) -> float:
    occupancy, _ = unit_cycles(instruction_shapes(encode([ins])), unit_parameters(hw))
    return float(occupancy[0])


# M 49, K 96, N 32 on 16 x 16, by hand.  Weight stationary: ceil(K / 16p) x 2 folds of 2*16 + 16 + 49 - 2
# = 95 cycles; output stationary: 4 x 2 folds of 16 + 16 + ceil(K / p) - 2.
CASES = {("weight_stationary", DType.F32): 6 * 2 * 95, ("weight_stationary", DType.BF16): 3 * 2 * 95,
         ("weight_stationary", DType.I8): 2 * 2 * 95, ("output_stationary", DType.F32): 8 * 126,
         ("output_stationary", DType.BF16): 8 * 78, ("output_stationary", DType.I8): 8 * 54}


@pytest.mark.parametrize("dataflow, dtype", CASES)
def test_a_pe_multiplies_32_bits_of_operand_pairs_a_cycle(dataflow, dtype):
    hw = HardwareConfig(dataflow=dataflow)
    assert _cycles(_matmul(dtype), hw) == CASES[dataflow, dtype]
    # off: one MAC a PE a cycle, every type at fp32's cycles (the model before packing)
    assert _cycles(_matmul(dtype), hw.replace(array_subword_packing=False)) == CASES[dataflow, DType.F32]


def test_partial_sums_go_to_the_accumulator_once_per_packed_row_fold():
    """Weight stationary writes M x N partial sums per fold of K over the rows: ceil(96 / 64) = 2 in
    int8 packed, 6 unpacked (SCALE-Sim's count, sim.energy)."""
    packed = action_counts(encode([_matmul(DType.I8)]), HardwareConfig())
    unpacked = action_counts(encode([_matmul(DType.I8)]), HardwareConfig(array_subword_packing=False))
    assert float(packed.total().accumulator_write_bytes) == 49 * 32 * 2 * 4
    assert float(unpacked.total().accumulator_write_bytes) == 49 * 32 * 6 * 4
    assert float(packed.total().macs_int8) == float(unpacked.total().macs_int8) == 49 * 96 * 32


class _Block(torch.nn.Module):
    """A 3x3 conv over 40 channels (K per MATMUL past one packed fold of 16 rows), a pointwise conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(40, 24, 3, padding=1)
        self.pw = torch.nn.Conv2d(24, 72, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.conv(x)))


X = torch.randn(1, 40, 10, 10)


def _graph(precision):
    return model_graph(_Block(), (X,), quantize=None if precision == "fp32" else precision,
                       calibration=[(X,)] if precision == "int8" else None)


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("dataflow", ["weight_stationary", "output_stationary"])
def test_the_cost_model_prices_each_layers_matmuls_as_the_simulator_times_them(precision, packing, dataflow):
    """Each conv's nest cost (numpy, and the cost model over jax.numpy) has the array cycles and the
    accumulator writes the simulator charges its emitted MATMULs, packed or not."""
    hw = HardwareConfig(dataflow=dataflow, array_subword_packing=packing)
    graph = _graph(precision)
    layers = [layer for layer in model_layers(graph) if layer.kind == "matrix"]
    assert len(layers) == 2
    for layer in layers:
        L, m, cost, shapes, occupancy = priced_layer(graph, layer, hw)
        assert float(occupancy[shapes.queue == Queue.MATRIX].sum()) == L.repeat * cost.work.compute, layer.name
        counts = action_counts(layer_program(graph, layer, m, hw).code, hw).total()
        assert float(cost.actions.accumulator_write_bytes) == pytest.approx(
            float(counts.accumulator_write_bytes), rel=1e-9), layer.name


def test_an_int8_models_array_cycles_fall_by_packing():
    """The same int8 mapping on a packing array: the MATMULs take fewer cycles (K of 360 and 24 in
    four-pair steps), never more."""
    graph = _graph("int8")
    on, off = HardwareConfig(), HardwareConfig(array_subword_packing=False)
    for layer in (la for la in model_layers(graph) if la.kind == "matrix"):
        m = map_nest(layer.kind, layer.problem, off, layer.extras, layer.name)
        program = layer_program(graph, layer, m, off)
        shapes = instruction_shapes(program.code)
        matrix = shapes.queue == Queue.MATRIX
        packed, unpacked = (float(unit_cycles(shapes, unit_parameters(hw))[0][matrix].sum()) for hw in (on, off))
        assert packed < unpacked, layer.name


@pytest.mark.parametrize("packing", [True, False])
def test_the_model_limit_and_utilization_take_each_precisions_peak(packing):
    hw = HardwareConfig(array_subword_packing=packing)
    program = stagec.compile(_Block(), (X,), hw=hw, quantize="int8", calibration=[(X,)])
    report = make_report(program)
    macs = sum(layer.macs for layer in program.layers)
    assert {layer.precision for layer in report.layers if layer.macs} == {"int8"}
    peak = 1024 if packing else 256
    assert array_macs_per_cycle(hw, 1) == peak and array_macs_per_cycle(hw, 4) == 256
    assert model_limit(program)["compute_cycles"] == pytest.approx(macs / peak)
    assert report.model_limit == model_limit(program)
    assert report.array_utilization == pytest.approx(macs / peak / report.cycles)
    conv = next(layer for layer in report.layers if layer.macs)
    assert conv.roofline["compute_cycles"] == pytest.approx(conv.macs / peak)


def test_packing_is_a_structural_boolean_field_kept_by_program_files():
    assert HardwareConfig().array_subword_packing is True
    assert presets.load("gemmini").array_subword_packing is False    # Gemmini's PE: one int8 MAC a cycle
    with pytest.raises(ConfigError, match=r"HardwareConfig\.array_subword_packing = .*expected true or false"):
        HardwareConfig(array_subword_packing=1)
    off = HardwareConfig.from_dict({"array_subword_packing": False})
    program = stagec.compile(_Block(), (X,), hw=off)
    assert Program.from_bytes(program.to_bytes()).hw == off
