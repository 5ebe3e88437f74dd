"""Models compile, pass the verifier, and simulate to PyTorch eager within 1e-4."""

import numpy as np
import torch
from helpers import rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import stagec
from stagec.models import hand_keypoint_net
from stagec.sim.reference import execute as reference_execute


def check(model, x, hw=None, reference=False):
    program = stagec.compile(model, (x,), hw=hw)
    out, report = stagec.simulate(program, x)
    with torch.no_grad():
        ref = model(x).numpy()
    assert out.shape == ref.shape
    assert rel_err(out, ref) < 1e-4
    if reference:   # the batched executor agrees with the one-instruction-at-a-time interpreter
        np.testing.assert_allclose(out, reference_execute(program, [x.numpy()])[0], rtol=1e-5, atol=1e-6)
    return program, report


def test_demo_model():
    model, (x,) = hand_keypoint_net()
    program, report = check(model, x)
    assert report.instructions["matrix"] > 0 and report.instructions["vector"] > 0
    assert sum(layer.macs for layer in report.layers) > 5e6
    # batch norm is folded away: no per-channel multiply survives in the convolutions' epilogues
    ops = {layer.op for layer in program.layers}
    assert {"conv", "pool", "matmul"} <= ops


@st.composite
def conv_nets(draw):
    cin = draw(st.integers(1, 6))
    size = draw(st.integers(9, 16))
    layers, c, h = [], cin, size
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.sampled_from([1, 2, 3, 5]))
        stride, pad = draw(st.integers(1, 3)), draw(st.integers(0, k // 2 + 1))
        if (h + 2 * pad - k) // stride + 1 < 1:
            break
        h = (h + 2 * pad - k) // stride + 1
        groups = draw(st.sampled_from([1, c])) if c > 1 else 1
        cout = c if groups == c and draw(st.booleans()) else draw(st.integers(1, 4)) * groups
        layers.append(nn.Conv2d(c, cout, k, stride=stride, padding=pad, groups=groups, bias=draw(st.booleans())))
        if draw(st.booleans()):
            layers.append(nn.ReLU())
        c = cout
    if not layers:
        layers.append(nn.Conv2d(c, 2, 1))
    return nn.Sequential(*layers), (draw(st.integers(1, 2)), cin, size, size)


@settings(max_examples=6)   # each example compiles and simulates a program
@given(conv_nets(), st.integers(0, 2**16))
def test_random_conv_nets(net, seed):
    model, shape = net
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight)
    check(model.eval(), torch.randn(*shape))


@settings(max_examples=6)   # each example compiles and simulates a program
@given(st.integers(1, 3), st.integers(1, 70), st.integers(1, 40), st.integers(1, 70), st.booleans())
def test_random_linear_nets(batch, din, hidden, dout, bias):
    torch.manual_seed(din * hidden)
    model = nn.Sequential(nn.Linear(din, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, dout)).eval()
    check(model, torch.randn(batch, din))


def test_tiny_scratchpad_still_correct():
    hw = stagec.HardwareConfig(array_rows=4, array_cols=4, scratchpad_bytes=4096, accumulator_bytes=1024,
                               vector_lanes=4)
    model = nn.Sequential(nn.Conv2d(5, 12, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(12 * 5 * 5, 7)).eval()
    check(model, torch.randn(2, 5, 10, 10), hw=hw, reference=True)


def test_batched_executor_matches_reference_interpreter():
    model, (x,) = hand_keypoint_net()
    small = nn.Sequential(*list(model.features.children())[:4]).eval()
    check(small, x[:, :, :32, :32], reference=True)


def test_softmax_head():
    model = nn.Sequential(nn.Linear(10, 6), nn.Softmax(dim=-1)).eval()
    check(model, torch.randn(3, 10), reference=True)


def test_jax_function():
    import jax
    w = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)

    def f(x):
        return jax.nn.relu(x @ w) * 2.0 - 1.0
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    y, _ = stagec.simulate(stagec.compile(f, (x,)), x)
    assert rel_err(y, np.maximum(x @ w, 0) * 2 - 1) < 1e-5


def test_activations_built_on_expm1_and_log1p():
    # ELU and SELU are expm1 below 0, softplus and mish log1p(exp(x)): exp and log on the vector unit
    for act in (nn.ELU(0.7), nn.SELU(), nn.Softplus(), nn.Softplus(beta=2.0, threshold=5.0), nn.Mish()):
        check(nn.Sequential(nn.Linear(8, 8), act).eval(), torch.randn(4, 8) * 3)


class IndexedAssignment(nn.Module):
    """Each way the lowering runs indexed assignment and strided views, around a layer: a gather of
    overwritten rows, gathers combined per update a row receives, a running count and a gather by
    a mask from the input, a gather by a constant map, windows of two sizes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):   # x (2, 5, 6)
        h = self.lin(x)
        y = h.clone()
        y[:, torch.tensor([0, 3])] = 0.0
        return {"index_put": y, "accumulate": torch.ones(4, 6).index_put((torch.tensor([1, 1, 3]),), h[0, :3],
                                                                         accumulate=True),
                "masked_scatter": h[0].masked_scatter(h[1] > 0, h[0] * 2), "as_strided": h.as_strided((5, 4), (2, 1)),
                "adaptive_max": nn.functional.adaptive_max_pool2d(h, (3, 4))}


def test_indexed_assignment_on_the_accelerator():
    torch.manual_seed(0)
    model, x = IndexedAssignment().eval(), torch.randn(2, 5, 6)
    out, _ = stagec.simulate(stagec.compile(model, (x,)), x)
    with torch.no_grad():
        ref = model(x)
    for name, expected in ref.items():
        assert out[name].shape == tuple(expected.shape) and rel_err(out[name], expected.numpy()) < 1e-5, name
