"""int8 and bf16 members in cascades (lower.schedule.cascade_map.FUSED_DTYPES): an int8 inverted residual
block (1x1 expand -> depthwise -> 1x1 project, each requantized to int8) runs as one halo cascade, its
expanded activation held int8 and masked by an int8 MUL; a bf16 one holds bf16 intermediates.  int8 is
checked bit for bit against the unfused program and stagec.int8_reference, bf16 against the unfused
program and PyTorch, and both cascades' cost against the simulator."""

import numpy as np
import pytest
from helpers import rel_err, simulated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cascade import KINDS
from test_halo_cascade import block

from stagec import int8_reference
from stagec.isa import HardwareConfig
from stagec.isa.instructions import DType, Opcode, VectorFunc
from stagec.lower.schedule.cascade import cascade_cost
from stagec.lower.schedule.halo import depthwise_at
from stagec.lower.schedule.nest import Exact, LayerShape
from stagec.pipeline import PIPELINE, Compilation, Request, build_graph, run
from stagec.report import make_report

# Fused and unfused bf16 programs sum a member's input channels in other tile orders (float32); a bf16
# intermediate whose sum lies at a rounding tie then rounds one bf16 ulp (2**-8) the other way, and
# that element is one term of the next member's sums: the outputs differ by well under 1e-3 of their
# scale (1.5e-4 on the pointwise chain), against bf16's own 4e-3 from PyTorch.
BF16_FUSED = 1e-3
BF16_TORCH = 1e-2


def int8_programs(model, x, **options):
    """(fused program, its output, the unfused output, int8_reference's output) of `model` on `x`."""
    fused, y, _ = simulated(model, x, quantize="int8", **options)
    _, y_alone, _ = simulated(model, x, quantize="int8", fuse_layers=False, **options)
    _, graph = build_graph(model, (x,), quantize="int8")
    return fused, y, y_alone, int8_reference.run(graph, [x.numpy()])[0]


def masks(program, dtype: DType) -> int:
    """The MULs of `dtype` to `dtype` in `program`: the halo masks (a depthwise tap's MUL widens)."""
    code = program.code
    return int(((code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.MUL) & (code["dtype"] == dtype)
                & (code["out_dtype"] == dtype)).sum())


@pytest.mark.parametrize("stride", [1, 2], ids=["residual", "strided"])
def test_an_int8_inverted_block_is_one_cascade_equal_to_the_unfused_program_and_the_reference(stride):
    """Stride 1 with the residual add (a TFLite Add in the projection's epilogue), stride 2 without."""
    model, x = block(stride)
    fused, y, y_alone, y_ref = int8_programs(model, x)
    (cascade,) = fused.metadata["cascades"]
    assert len(cascade["layers"]) == 3 and cascade["layers"][1].startswith("depthwise")
    assert masks(fused, DType.I8) > 0
    np.testing.assert_array_equal(y, y_alone)
    np.testing.assert_array_equal(y, y_ref)


@pytest.mark.parametrize(("k", "padding", "size", "hw"), [
    (5, 2, 9, HardwareConfig(array_rows=4, array_cols=4, scratchpad_bytes=32 * 1024, accumulator_bytes=8 * 1024)),
    (3, 0, 15, HardwareConfig(array_rows=16, array_cols=16, scratchpad_bytes=16 * 1024, accumulator_bytes=32 * 1024)),
], ids=["5x5-small", "unpadded"])
def test_int8_blocks_on_small_hardware_keep_their_integers(k, padding, size, hw):
    model, x = block(1, size=size, c=8, expand=6, out=8, k=k, padding=padding)
    fused, y, y_alone, y_ref = int8_programs(model, x, hw=hw)
    assert any(len(c["layers"]) > 1 for c in fused.metadata["cascades"])
    np.testing.assert_array_equal(y, y_alone)
    np.testing.assert_array_equal(y, y_ref)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([4, 8]), size=st.integers(3, 16), kernel=st.sampled_from([(3, 1), (5, 2), (3, 0)]),
       stride=st.sampled_from([1, 2]), array=st.sampled_from([4, 8, 16]), spad_kib=st.sampled_from([16, 32, 128]))
def test_random_int8_blocks_on_random_hardware_keep_their_integers(c, size, kernel, stride, array, spad_kib):
    """Fused or split, an int8 block's output is the unfused program's and the reference's, bit for bit."""
    k, padding = kernel
    model, x = block(stride, size=max(size, k), c=c, expand=6, out=c, k=k, padding=padding)
    hw = HardwareConfig(array_rows=array, array_cols=array, scratchpad_bytes=spad_kib * 1024,
                        accumulator_bytes=16 * 1024)
    _, y, y_alone, y_ref = int8_programs(model, x, hw=hw)
    np.testing.assert_array_equal(y, y_alone)
    np.testing.assert_array_equal(y, y_ref)


@pytest.mark.parametrize("stride", [1, 2], ids=["residual", "strided"])
def test_a_bf16_inverted_block_is_one_cascade_equal_to_the_unfused_program_and_pytorch(stride):
    model, x = block(stride)
    fused, y, report = simulated(model, x, quantize="bf16")
    _, y_alone, alone = simulated(model, x, quantize="bf16", fuse_layers=False)
    (cascade,) = fused.metadata["cascades"]
    assert len(cascade["layers"]) == 3 and masks(fused, DType.BF16) > 0
    assert rel_err(y, y_alone) <= BF16_FUSED and rel_err(y, model(x).detach().numpy()) < BF16_TORCH
    # the expanded activation (96 channels, bf16) crosses DRAM twice layer by layer, not at all fused
    expanded = 96 * 28 * 28 * 2
    dram = [r.actions.dram_read_bytes + r.actions.dram_write_bytes for r in (alone, report)]
    assert dram[0] - dram[1] > 2 * expanded


@pytest.mark.parametrize("kind", ["ffn", "pointwise"])
def test_bf16_pointwise_chains_are_cascades_equal_to_the_unfused_program(kind):
    model, x = KINDS[kind]()
    fused, y, _ = simulated(model, x, quantize="bf16")
    _, y_alone, _ = simulated(model, x, quantize="bf16", fuse_layers=False)
    assert fused.metadata["cascades"]
    assert rel_err(y, y_alone) <= BF16_FUSED and rel_err(y, model(x).detach().numpy()) < BF16_TORCH


@pytest.mark.parametrize(("quantize", "stride"), [("int8", 1), ("int8", 2), ("bf16", 1), ("bf16", 2)])
def test_the_int8_and_bf16_halo_cascade_cost_predicts_the_simulator(quantize, stride):
    """As tests/test_halo_cascade.py's, over the cascade's own layers (the program also converts its
    input): DRAM bytes (the masks' at their element size), vector ops, MACs, instructions and the
    footprint are the program's, cycles within 10% of the layers' span in the timed simulation."""
    model, x = block(stride)
    hw = HardwareConfig()
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw, quantize=quantize)))
    (cascade,) = c.schedule.cascades
    shapes = [LayerShape.of(*c.schedule[name].nests[0]) for name in cascade.layers]
    assert depthwise_at(shapes) == 1
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, cascade.chunk is not None, cascade.line)
    layers = [layer for layer in make_report(c.program).layers if layer.name in cascade.layers]
    assert len(layers) == 3
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops", f"macs_{quantize}"):
        assert getattr(cost.actions, action) == sum(getattr(layer.actions, action) for layer in layers), action
    assert cost.instructions == sum(sum(layer.instructions.values()) for layer in layers)
    assert cost.cycles == pytest.approx(layers[-1].end_cycle - layers[0].start_cycle, rel=0.1)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)
