"""The int8 product of two activations (lower/graph/int8_binary.py): TFLite's int8 Mul, written out
here in Python integers, against the simulator and the independent integer reference."""

import numpy as np
import torch
from test_int8_ops import amax_scale, compile_int8, float_steps, mbqm, tflite_multiplier
from torch import nn

import stagec
from stagec import int8_reference
from stagec.lower.graph.graph_ir import OpKind
from stagec.lower.graph.int8_binary import MUL_EXPR


class Gate(nn.Module):
    """conv(x) * sigmoid(gate(mean(conv(x)))): a feature map times one gate per channel (squeeze-excitation's
    product), both operands outputs too, so that the test knows their calibrated ranges."""

    def __init__(self, c=4):
        super().__init__()
        self.conv, self.gate = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        x = self.conv(x)
        g = torch.sigmoid(self.gate(x.mean((2, 3), keepdim=True)))
        return x * g, x, g


def test_an_int8_mul_is_tflite_mul_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    model, x = Gate().eval(), torch.randn(1, 4, 5, 6, generator=g)
    calibration = [(x,)] + [(torch.randn(x.shape, generator=g),) for _ in range(3)]
    program, graph = compile_int8(model, (x,), calibration)
    assert not float_steps(graph)
    funcs = [s.func for s in MUL_EXPR]   # the output's DEQUANTIZE fused after them
    (mul,) = [n for n in graph.nodes
              if n.op == OpKind.ELEMENTWISE and [s.func for s in n.attr("expr")][:len(funcs)] == funcs]
    with torch.no_grad():
        s_y, s_a, s_b = (amax_scale(*[model(c[0])[i] for c in calibration]) for i in range(3))
    # TFLite reference_ops::Mul (int8, zero points 0): the int32 product, times s_a s_b / s_y
    m, e = tflite_multiplier(s_a * s_b / s_y)
    _, env = int8_reference.run(graph, [x.numpy()], keep=True)
    qa, qb = (env[v.id] for v in mul.inputs[:2])
    q = [min(max(mbqm(int(a) * int(b), m, e), -128), 127) for a, b in np.broadcast(qa, qb)]
    ys, _ = stagec.simulate(program, x)
    np.testing.assert_array_equal(np.rint(ys[0] / np.float32(s_y)).ravel(), q)
    for y, ref in zip(ys, int8_reference.run(graph, [x.numpy()]), strict=True):
        np.testing.assert_array_equal(y, ref)
    with torch.no_grad():
        expect, x_max = model(x)[0].numpy(), float(model(x)[1].abs().max())
    # the product's rounding, x's (times a gate <= 1), and the gate's LUT rounding and input's (a step each)
    assert np.abs(ys[0] - expect).max() <= s_y / 2 + s_a / 2 + 2 * s_b * x_max


class SqueezeExcite(nn.Module):
    """EfficientNet's block middle: conv + SiLU, squeeze-excitation, projection."""

    def __init__(self, c=8, squeezed=2):
        super().__init__()
        self.conv, self.project = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)
        self.reduce, self.expand = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x):
        x = nn.functional.silu(self.conv(x))
        gate = torch.sigmoid(self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return self.project(x * gate)


def test_a_squeeze_excitation_block_never_leaves_int8():
    torch.manual_seed(3)
    model, x = SqueezeExcite().eval(), torch.randn(1, 8, 9, 9)
    calibration = [(x,)] + [(torch.randn(x.shape),) for _ in range(3)]
    program, graph = compile_int8(model, (x,), calibration)
    assert not float_steps(graph)
    assert any(n.op == OpKind.ELEMENTWISE and n.attr("expr") == MUL_EXPR for n in graph.nodes)
    y, _ = stagec.simulate(program, x)
    np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])
    with torch.no_grad():
        ref = model(x).numpy()
    assert float(np.ravel(y) @ np.ravel(ref) / np.linalg.norm(y) / np.linalg.norm(ref)) > 0.999
