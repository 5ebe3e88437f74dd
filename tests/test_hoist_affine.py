"""hoist_affine: a ResNet basic block's second batch norm, fused into the shortcut's epilogue with
the residual add, moves back to its own convolution and folds there; the block stays int8."""

from types import MappingProxyType

import numpy as np
import pytest
import torch
from helpers import rel_err
from torch import nn

import stagec
from stagec import int8_reference
from stagec.isa import DType
from stagec.lower.graph.evaluate import evaluate
from stagec.lower.graph.graph_ir import Graph, Node, OpKind, Step, Value
from stagec.lower.graph.hoist_affine import hoist_affine
from stagec.pipeline import build_graph


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block behind a conv + BN + ReLU stem (so that the identity
    shortcut reads a layer's result, as in a network)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c_in, 3, padding=1, bias=False), nn.BatchNorm2d(c_in), nn.ReLU())
        self.conv1, self.bn1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out)
        self.conv2, self.bn2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out)
        self.downsample = None if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
        for bn in (m for m in self.modules() if isinstance(m, nn.BatchNorm2d)):   # batch norms that do something
            bn.weight.data.uniform_(0.5, 2.0)
            bn.bias.data.normal_(0, 0.5)
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = self.stem(x)
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


BLOCKS = {"identity": (8, 8, 1), "downsample": (4, 8, 2)}


def block(kind: str):
    torch.manual_seed(7)
    return BasicBlock(*BLOCKS[kind]).eval(), torch.randn(1, 3, 12, 12)


@pytest.mark.parametrize("kind", BLOCKS)
def test_the_second_batch_norm_folds_and_fp32_equals_pytorch(kind):
    model, x = block(kind)
    traced, graph = build_graph(model, (x,))
    for n in graph.nodes:   # every batch norm folded: bias adds, the residual add and ReLUs are left
        assert n.op != OpKind.ELEMENTWISE, n
        assert "mul" not in [s.func for s in n.attr("epilogue") or ()], n
    ref = model(x).detach().numpy()
    assert rel_err(evaluate(graph, x.numpy())[0], ref) < 1e-5
    y, _ = stagec.simulate(stagec.compile(model, (x,)), x)
    assert rel_err(y, ref) < 1e-5


@pytest.mark.parametrize("kind", BLOCKS)
def test_a_basic_block_never_leaves_int8(kind):
    model, x = block(kind)
    calibration = [(x,)] + [(torch.randn(x.shape),) for _ in range(3)]
    program = stagec.compile(model, (x,), quantize="int8", calibration=calibration)
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration)
    code, layer_of = program.code, program.layer_ids
    first, last = 0, len(program.layers) - 1
    assert program.layers[first].name.endswith("quantize")
    assert program.layers[last].name.endswith("dequantize") or program.layers[last].name.endswith("relu")
    f32 = (code["dtype"] == DType.F32) | (code["out_dtype"] == DType.F32)
    inner = f32 & (layer_of != first) & (layer_of != last)
    assert not inner.any(), [program.layers[i].name for i in np.unique(layer_of[inner])]
    for n in graph.nodes[1:-1]:   # between the input's QUANTIZE and the output's layer, int8 values only
        assert n.output.dtype == "int8", n
    y, _ = stagec.simulate(program, x)
    np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])
    ref = model(x).detach().numpy()
    assert float(np.ravel(y) @ np.ravel(ref) / np.linalg.norm(y) / np.linalg.norm(ref)) > 0.999


def _conv(x: Value, w: Value, out: Value, name: str, epilogue=None, extras=()) -> Node:
    attrs = {"stride": (1, 1), "padding": ((0, 0), (0, 0)), "dilation": (1, 1), "groups": 1, "epilogue": epilogue}
    return Node(OpKind.CONV, (x, w, *extras), out, tuple(sorted((k, v) for k, v in attrs.items() if v)), name)


def _graph(producer_epilogue):
    """conv -> elementwise tanh(x * s + b - t): the chain moves into the conv unless the conv's own
    epilogue ends in something other than an affine step."""
    rng = np.random.default_rng(0)
    x, w, out = Value(1, (1, 3, 5, 5)), Value(2, (4, 3, 1, 1)), Value(3, (1, 4, 5, 5))
    s, b, t, e = (Value(i, (1, 4, 1, 1)) for i in (4, 5, 6, 7))
    y = Value(8, out.shape)
    consts = {v.id: rng.normal(size=v.shape).astype(np.float32) for v in (w, s, b, t, e)}
    chain = (Step("mul", (0, 1)), Step("add", (2, 4)), Step("sub", (5, 3)), Step("tanh", (6,)))
    nodes = (_conv(x, w, out, "conv", producer_epilogue, (e,) if producer_epilogue else ()),
             Node(OpKind.ELEMENTWISE, (out, s, b, t), y, (("expr", chain),), "bn"))
    return Graph((x,), (y,), nodes, MappingProxyType(consts))


@pytest.mark.parametrize("epilogue, moves", [(None, True), ((Step("add", (0, 1)),), True),
                                             ((Step("add", (0, 1)), Step("relu", (2,))), False)])
def test_an_elementwise_consumers_chain_moves_into_a_foldable_producer(epilogue, moves):
    graph = _graph(epilogue)
    hoisted = hoist_affine(graph)
    x = np.random.default_rng(1).normal(size=(1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(evaluate(hoisted, x)[0], evaluate(graph, x)[0], rtol=1e-6, atol=1e-6)
    conv, bn = hoisted.nodes
    assert [s.func for s in bn.attr("expr")] == (["tanh"] if moves else ["mul", "add", "sub", "tanh"])
    assert [s.func for s in conv.attr("epilogue") or ()] == [s.func for s in epilogue or ()] + \
        ["mul", "add", "sub"] * moves


class ConvReadTwice(nn.Module):
    """A conv's result read by a depthwise conv twice: as its input and, shifted by a constant and
    through a ReLU, in its epilogue (fuse_epilogues puts the difference there)."""

    def __init__(self):
        super().__init__()
        self.conv, self.depthwise = nn.Conv2d(2, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        y = self.conv(x)
        return self.depthwise(y) - torch.relu(y + 0.5)


def test_a_value_its_reader_takes_twice_keeps_its_chain():
    """One reader node counted as one use: the shift moved into the conv's epilogue, and the depthwise
    conv's input was left naming a value no node produced (found by the fuzzing campaign, seed 940044,
    as a KeyError in DRAM planning)."""
    torch.manual_seed(0)
    model, x = ConvReadTwice().eval(), torch.randn(1, 2, 6, 6)
    y, _ = stagec.simulate(stagec.compile(model, (x,)), x)
    assert rel_err(y, model(x).detach().numpy()) < 1e-5
