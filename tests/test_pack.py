"""Depthwise convs: on the vector unit or channel-packed on the array, whichever the cost says."""

import numpy as np
import pytest
import torch
from helpers import rel_err
from torch import nn

import stagec
from stagec import int8_reference
from stagec.isa.instructions import Opcode
from stagec.layers import model_graph
from stagec.lower.schedule.mapper import node_problem
from stagec.lower.schedule.nest_map import map_window
from stagec.lower.schedule.pack import block_diagonal
from stagec.pipeline import build_graph
from stagec.report import model_limit

NARROW_VECTOR = stagec.HardwareConfig(vector_lanes=4)   # a 16x16 array beside 4 lanes: packing pays
# an int8 depthwise conv's taps are dot products on the vector unit (RDOT: one SDOT step per 4 taps of a
# row), which beat packing at stride 2 on 4 lanes; on 2, packing pays
NARROWER_VECTOR = stagec.HardwareConfig(vector_lanes=2)


def depthwise(c, k, stride=1, dilation=1):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(c, c, k, stride=stride, padding=dilation * (k // 2), dilation=dilation,
                                   groups=c), nn.ReLU6()).eval()


def cycles_and_check(model, x, hw, mappings=None):
    program = stagec.compile(model, (x,), hw=hw, mappings=mappings)
    out, report = stagec.simulate(program, x)
    with torch.no_grad():
        assert rel_err(out, model(x).numpy()) < 1e-4
    return program, report.to_dict()["cycles"]


def vector_mapping(model, x, hw):
    node = next(n for n in model_graph(model, (x,)).nodes if n.op.value == "conv")
    kind, p, extras = node_problem(node)
    assert kind == "depthwise"
    return {node.name: map_window(p, hw, extras, True, node.name)}


@pytest.mark.parametrize("c,k,stride,dilation,size", [(32, 3, 1, 1, 14), (24, 3, 2, 1, 29), (12, 5, 1, 2, 11)])
def test_packs_on_the_array_where_cheaper_and_matches_pytorch(c, k, stride, dilation, size):
    model, x = depthwise(c, k, stride, dilation), torch.randn(1, c, size, size)
    packed, packed_cycles = cycles_and_check(model, x, NARROW_VECTOR)
    assert (packed.code["opcode"] == Opcode.MATMUL).any()
    # the vector-unit mapping of the same layer, forced, is slower in the timing simulator
    on_vector, vector_cycles = cycles_and_check(model, x, NARROW_VECTOR, vector_mapping(model, x, NARROW_VECTOR))
    assert not (on_vector.code["opcode"] == Opcode.MATMUL).any()
    assert packed_cycles < vector_cycles


def test_stays_on_the_vector_unit_where_that_is_cheaper():
    model, x = depthwise(32, 3), torch.randn(1, 32, 14, 14)
    program, _ = cycles_and_check(model, x, stagec.HardwareConfig())
    assert not (program.code["opcode"] == Opcode.MATMUL).any()


def test_a_layer_mapped_by_the_caller_is_not_packed():
    model, x = depthwise(32, 3), torch.randn(1, 32, 14, 14)
    program, _ = cycles_and_check(model, x, NARROW_VECTOR, vector_mapping(model, x, NARROW_VECTOR))
    assert not (program.code["opcode"] == Opcode.MATMUL).any()


def test_block_diagonal_weights_compute_the_depthwise_conv():
    w = np.random.default_rng(0).standard_normal((12, 1, 3, 3)).astype(np.float32)
    x = torch.randn(1, 12, 7, 7)
    packed = torch.from_numpy(block_diagonal(w, 4))
    assert packed.shape == (12, 4, 3, 3) and int((packed != 0).sum()) == w.size
    ref = torch.nn.functional.conv2d(x, torch.from_numpy(w), groups=12)
    assert torch.allclose(torch.nn.functional.conv2d(x, packed, groups=3), ref, atol=1e-5)


@pytest.mark.parametrize("c,k,stride,dilation,size", [(32, 3, 1, 1, 14), (24, 3, 2, 1, 29)])
def test_an_int8_depthwise_conv_packs_and_keeps_its_integer_sums(c, k, stride, dilation, size):
    model, x = depthwise(c, k, stride, dilation), torch.randn(1, c, size, size)
    calibration = [(x,), (torch.randn(x.shape),)]
    program = stagec.compile(model, (x,), hw=NARROWER_VECTOR, quantize="int8", calibration=calibration)
    assert (program.code["opcode"] == Opcode.MATMUL).any()
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration)
    y, _ = stagec.simulate(program, x)
    # int32 sums of int8 products are exact: the block-diagonal zeros add nothing, bit for bit
    np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])


def test_a_packed_layer_counts_its_useful_macs_and_weights():
    """The report's MACs and the model-level limit's compulsory bytes leave out the block-diagonal zeros
    (counted, a packed layer's G-fold MACs and weights inflated the limit the cycles are measured against)."""
    c, size = 32, 14
    model, x = depthwise(c, 3), torch.randn(1, c, size, size)
    packed, _ = cycles_and_check(model, x, NARROW_VECTOR)
    on_vector, _ = cycles_and_check(model, x, NARROW_VECTOR, vector_mapping(model, x, NARROW_VECTOR))
    assert (packed.code["opcode"] == Opcode.MATMUL).any()
    conv = next(layer for layer in packed.layers if layer.op == "conv")
    assert conv.macs == c * size * size * 9
    assert len(packed.constants) > len(on_vector.constants) and packed.metadata["packed_weight_zeros"] > 0
    limit, unpacked = model_limit(packed), model_limit(on_vector)
    assert (limit["macs"], limit["compulsory_bytes"]) == (unpacked["macs"], unpacked["compulsory_bytes"])
