"""An int8 graph's layer norm over narrow rows: the float island reads its mean dequantized straight
from the int32 sum of the row's int8 values (lower.graph.quantize), so x - mean is exact where the
island's arithmetic is; rounded to int8 at the mean's own scale first, a row of width 1 came out
-beta instead of beta (fuzz seed 970056)."""

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec import int8_reference
from stagec.lower.graph.graph_ir import OpKind
from stagec.pipeline import build_graph


class NarrowNorm(nn.Module):
    """A linear, then a layer norm over `width` of its 8 outputs: the slice keeps the linear's int8 scale,
    which the mean's calibrated range does not share."""

    def __init__(self, width: int):
        super().__init__()
        self.linear, self.width, self.norm = nn.Linear(8, 8), width, nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.linear(x)[..., 2:2 + self.width])


@pytest.mark.parametrize("width", [1, 3])
def test_a_narrow_layer_norm_reads_its_mean_exactly(width):
    torch.manual_seed(width)
    model = NarrowNorm(width).eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-1, 1)
    x = torch.randn(1, 16, 8)
    calibration = [(torch.randn(1, 16, 8),) for _ in range(3)]
    hw = stagec.HardwareConfig(array_rows=8, array_cols=8)
    program = stagec.compile(model, (x,), quantize="int8", calibration=calibration, hw=hw)
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration)
    (mean,) = [n for n in graph.nodes if n.name.endswith("mul/dequantize")]
    assert graph.producer()[mean.inputs[0].id].op == OpKind.BROADCAST   # the int32 sum, not an int8 mean:
    assert "requant" not in [s.func for s in mean.attr("expr")]         # no rounding to int8 on the way
    y, _ = stagec.simulate(program, x)
    (ref,), env = int8_reference.run(graph, [x.numpy()], keep=True)
    np.testing.assert_allclose(y, ref, rtol=2**-22, atol=0)   # the last float32 step, rsqrt's, to an ulp or two
    # PyTorch's layer norm of the int8 values the norm reads (the slice's, dequantized): only the bf16
    # island's roundings are left between the two (measured: 0 at width 1, 0.006 at width 3)
    (sliced,) = [n for n in graph.nodes if n.op == OpKind.SLICE]
    (dq,) = [n for n in graph.nodes if n.inputs[0].id == sliced.output.id and n.op == OpKind.ELEMENTWISE]
    x_int8 = env[sliced.output.id].astype(np.float32) * graph.constants[dq.inputs[1].id]
    expected = model.norm(torch.from_numpy(x_int8)).detach().numpy()
    np.testing.assert_allclose(y, expected, atol=0.02, rtol=0)   # |y| < 2.5: a few bf16 roundings of 0.01
    if width == 1:   # x - mean is 0: the output is beta, in bf16
        np.testing.assert_allclose(y, np.broadcast_to(model.norm.bias.detach().numpy(), y.shape), rtol=2**-8)


class ViewedMean(nn.Module):
    """A float input less the mean of 3 of a linear's int8 outputs, the mean viewed (unsqueezed) first."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, z):
        return z - self.linear(x)[..., 2:5].mean(-1).unsqueeze(-1)


def test_a_float_reader_reads_a_viewed_mean_from_its_int32_sum():
    """A view between the average and its float reader emits nothing: the reader still takes the mean
    dequantized from the int32 sum (a float copy of the view), not its int8 rounding: the simulator is
    the reference's bit for bit, and PyTorch's within the bf16 island's rounding (measured 0.026; through
    the int8 mean 0.32)."""
    torch.manual_seed(3)
    model = ViewedMean().eval()
    x, z = torch.randn(1, 16, 8), torch.randn(1, 16, 2)
    calibration = [(torch.randn(1, 16, 8), torch.randn(1, 16, 2)) for _ in range(3)]
    program = stagec.compile(model, (x, z), quantize="int8", calibration=calibration,
                             hw=stagec.HardwareConfig(array_rows=8, array_cols=8))
    _, graph = build_graph(model, (x, z), quantize="int8", calibration=calibration)
    (view,) = [n for n in graph.nodes if n.op == OpKind.BROADCAST]
    (mean,) = [n for n in graph.nodes if n.output.id == view.inputs[0].id]
    assert mean.inputs[0].dtype == "int32" and "requant" not in [s.func for s in mean.attr("expr")]
    y, _ = stagec.simulate(program, x, z)
    np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy(), z.numpy()])[0])
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x, z).numpy(), atol=0.04, rtol=0)
