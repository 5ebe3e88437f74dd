import jax
import numpy as np
import pytest
import torch
from helpers import rel_err
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from torch import nn

from stagec.frontend import UnsupportedOpError, from_jax, from_torch, supported_ops


def run(cj, *xs):
    return [np.asarray(o) for o in jaxpr_as_fun(cj)(*[np.asarray(x) for x in xs])]


class Everything(nn.Module):
    """Every op of the first frontend milestone in one model."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.grouped = nn.Conv2d(8, 8, 1, groups=2, bias=False)
        self.mp = nn.MaxPool2d(3, stride=2, padding=1)
        self.ap = nn.AvgPool2d(2)
        self.aap = nn.AdaptiveAvgPool2d((3, 3))
        self.fc = nn.Linear(8 * 9, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.grouped(self.dw(x)) * 0.5 + x
        x = self.ap(self.mp(x))
        x = self.aap(x).flatten(1)
        y = torch.mm(x, self.fc.weight.t()) + self.fc(x)
        return torch.softmax(y.permute(1, 0).reshape(5, -1), dim=0)


def test_operator_set_matches_pytorch():
    torch.manual_seed(0)
    model = Everything().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 20, 20)
    cj = from_torch(model, (x,))
    assert isinstance(cj, ClosedJaxpr)
    assert [tuple(v.aval.shape) for v in cj.jaxpr.invars] == [(2, 3, 20, 20)]
    assert len(cj.consts) >= 8   # weights and buffers are constants, not inputs
    with torch.no_grad():
        ref = model(x).numpy()
    assert rel_err(run(cj, x)[0], ref) < 1e-5


def test_adaptive_pool_uneven_windows():
    model = nn.AdaptiveAvgPool2d((3, 2))
    x = torch.randn(1, 2, 7, 5)
    assert rel_err(run(from_torch(model, (x,)), x)[0], model(x).numpy()) < 1e-6


def test_training_mode_model_is_traced_for_inference_and_left_alone():
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4))
    model.train()
    x = torch.randn(3, 2, 6, 6)
    cj = from_torch(model, (x,))
    assert model.training and model[1].training
    model.eval()
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(run(cj, x)[0], ref, rtol=1e-5, atol=1e-5)


class Cumsum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)   # no rule for this op


def test_unsupported_op_names_op_line_and_list():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(Cumsum(), (torch.randn(2, 3),))
    msg = str(e.value)
    assert "aten.cumsum.default" in msg
    assert "test_frontend.py" in msg and "torch.cumsum(x, dim=1)" in msg
    assert "supported_ops()" in msg and "stagec ops" in msg


def test_supported_ops_lists_the_table():
    ops = supported_ops()
    for name in ("aten.convolution.default", "aten.addmm.default", "aten._softmax.default", "aten.relu.default"):
        assert name in ops


def test_plain_jax_function():
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)

    def f(x):
        return jax.nn.relu(x @ w)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    cj = from_jax(f, (x,))
    np.testing.assert_allclose(run(cj, x)[0], np.maximum(x @ w, 0), rtol=1e-6)
