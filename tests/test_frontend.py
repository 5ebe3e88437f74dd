from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from helpers import rel_err
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from torch import nn

from stagec.errors import InputError
from stagec.frontend import ExportError, UnsupportedOpError, from_jax, from_torch, supported_ops, trace_torch


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
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5))
    model.train()
    model[0].eval()    # a mix of modes must come back as it was
    x = torch.randn(3, 2, 6, 6)
    traced = trace_torch(model, (x,))
    cj = traced.closed
    assert "traced in inference mode" in traced.note and "training mode" in traced.note
    assert model.training and model[1].training and model[2].training and not model[0].training
    model.eval()
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(run(cj, x)[0], ref, rtol=1e-5, atol=1e-5)


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


# --- errors a user can act on ------------------------------------------------------------------

class Cumprod(nn.Module):
    def forward(self, x):
        y = torch.cumprod(x, dim=1)   # no rule for this op
        return torch.cumprod(y, dim=0) + torch.sort(x).values


def test_unsupported_op_names_op_line_and_nearest_supported():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(Cumprod(), (torch.randn(2, 3),))
    lines = str(e.value).splitlines()
    cumprod = [line for line in lines if "aten.cumprod.default" in line]
    assert len(cumprod) == 1     # each missing op once, at its first use
    assert "test_frontend.py" in cumprod[0] and "torch.cumprod(x, dim=1)" in cumprod[0]
    assert "nearest supported: aten.prod." in cumprod[0]
    assert any("aten.sort.default" in line and "torch.sort(x)" in line for line in lines)
    assert "supported_ops()" in lines[-1] and "stagec ops" in lines[-1]


class DataDependentBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_export_failure_is_one_line_with_the_model_line_and_a_hint():
    with pytest.raises(ExportError) as e:
        from_torch(DataDependentBranch(), (torch.randn(2, 3),))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("torch.export failed: Could not guard on data-dependent expression")
    assert "test_frontend.py" in msg and "if x.sum() > 0" in msg
    assert "hint:" in msg and "torch.where" in msg


class MaskedSelect(nn.Module):
    def forward(self, x):
        return x[x > 0] * 2


def test_value_dependent_shape_is_an_export_error_naming_the_line():
    with pytest.raises(ExportError) as e:
        from_torch(MaskedSelect(), (torch.randn(2, 3),))
    assert "depends on tensor values" in str(e.value) and "x[x > 0]" in str(e.value)
    assert "static shapes" in str(e.value)


class PoolIndices(nn.Module):
    def forward(self, x):
        values, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
        return values + indices


def test_reading_an_output_stagec_does_not_compute_names_it():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(PoolIndices(), (torch.randn(1, 1, 4, 4),))
    assert "output 1 of ATen op aten.max_pool2d_with_indices.default" in str(e.value)
    assert "return_indices=True" in str(e.value)


class AttentionDropout(nn.Module):
    def forward(self, q):
        return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_rule_rejecting_its_arguments_names_op_and_line():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(AttentionDropout(), (torch.randn(1, 2, 3, 4),))
    assert "aten.scaled_dot_product_attention.default" in str(e.value)
    assert "dropout_p=0.5" in str(e.value) and "test_frontend.py" in str(e.value)


class ScatterByInput(nn.Module):
    def forward(self, x, index):
        y = x.clone()
        y[index] = 0.0
        return y


def test_scatter_with_indices_from_the_inputs_names_op_and_line():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(ScatterByInput(), (torch.randn(5, 3), torch.tensor([1, 2])))
    assert "aten.index_put.default" in str(e.value) and "y[index] = 0.0" in str(e.value)
    assert "computed from the model's inputs" in str(e.value) and "constant indices" in str(e.value)


def test_mask_assignment_from_the_inputs_is_a_select():
    """x[mask] = value with a mask computed from the inputs is no scatter: it traces, as a select."""
    class ClampNegative(nn.Module):
        def forward(self, x):
            y = x.clone()
            y[y < 0] = 0.5
            return y
    x = torch.randn(4, 5)
    closed = from_torch(ClampNegative(), (x,))
    assert not [e for e in closed.jaxpr.eqns if e.primitive.name.startswith("scatter")]
    np.testing.assert_array_equal(run(closed, x)[0], ClampNegative()(x).numpy())


POOLING_MODEL = """
import torch
from torch import nn


class Pooled(nn.Module):
    def forward(self, x):
        y = torch.zeros(3)
        y[x.argmax(0, keepdim=True)] = 1.0
        return nn.functional.adaptive_avg_pool1d(x[None], 1) + y
"""


def test_source_line_in_a_package_whose_name_starts_like_torch(tmp_path, monkeypatch):
    """A model in a folder named like torch's install folder plus a suffix (torchvision beside torch in
    site-packages) is the model's code: its frames are not dropped as torch's."""
    import importlib.util

    from stagec.frontend import torch_export
    package = tmp_path / "torchvision_like"
    package.mkdir()
    (package / "models.py").write_text(POOLING_MODEL)
    monkeypatch.setattr(torch_export, "_NOT_THE_MODEL", (tmp_path / "torch", *torch_export._NOT_THE_MODEL))
    spec = importlib.util.spec_from_file_location("torchvision_like_models", package / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(module.Pooled(), (torch.randn(3),))
    assert f"{package / 'models.py'}:9: y[x.argmax(0, keepdim=True)] = 1.0" in str(e.value)


def test_frame_paths_compare_folder_by_folder():
    from stagec.frontend.torch_export import user_frame
    torch_dir = Path(torch.__file__).parent
    trace = (f'File "{torch_dir}vision/models/net.py", line 7, in forward\n    x = self.pool(x)\n'
             f'File "{torch_dir}/nn/modules/pooling.py", line 1402, in forward\n    return F.adaptive_avg_pool2d(x)\n'
             'File "<string>", line 1, in <lambda>\n')
    assert user_frame(trace) == f"{torch_dir}vision/models/net.py:7: x = self.pool(x)"


def test_zero_size_input_is_an_input_error_naming_it():
    with pytest.raises(InputError, match=r"args\[0\] has shape \[2, 0, 4\], a dimension of size 0"):
        trace_torch(nn.Linear(4, 2), (torch.randn(2, 0, 4),))
    with pytest.raises(InputError, match=r"kwargs\['mask'\] has shape \[0\]"):
        trace_torch(ScatterByInput(), (torch.randn(2, 3),), {"index": torch.tensor([1]), "mask": torch.ones(0)})
    with pytest.raises(InputError, match=r"args\[1\] has shape \[3, 0\]"):
        from_jax(lambda a, b: a, (np.ones(2), np.ones((3, 0))))


def test_unflattenable_output_is_an_export_error_with_a_hint():
    class Cache:   # an output type torch's pytree does not know, as transformers' DynamicCache
        def __init__(self, x):
            self.x = x

    class WithCache(nn.Module):
        def forward(self, x):
            return x * 2, Cache(x)
    with pytest.raises(ExportError) as e:
        from_torch(WithCache(), (torch.randn(2),))
    assert "use_cache=False" in str(e.value) and "register_pytree_node" in str(e.value)


class StridedOutsideView(nn.Module):
    def forward(self, x):
        return x[1:].as_strided((2,), (1,), 0)   # storage offset 0 is before the view's first element


def test_as_strided_reading_outside_its_input_names_op_and_line():
    with pytest.raises(UnsupportedOpError) as e:
        from_torch(StridedOutsideView(), (torch.randn(4),))
    assert "aten.as_strided.default" in str(e.value) and "x[1:].as_strided((2,), (1,), 0)" in str(e.value)
    assert "reads storage outside its input" in str(e.value)


# --- the torch2jax tracer --------------------------------------------------------------------------

class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 5))

    def forward(self, x):
        features = self.features(x)
        return {"logits": self.head(features), "features": features}


def test_both_tracers_agree_on_a_model_both_handle():
    torch.manual_seed(0)
    model = SmallCnn().eval()
    model.features[1].running_mean.uniform_(-1, 1)
    model.features[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    by_export, by_torch2jax = trace_torch(model, (x,)), trace_torch(model, (x,), tracer="torch2jax")
    assert by_export.out_tree == by_torch2jax.out_tree and by_export.in_tree == by_torch2jax.in_tree
    with torch.no_grad():
        ref = model(x)
    for out in (by_export(x), by_torch2jax(x)):
        assert set(out) == {"logits", "features"}
        assert rel_err(out["logits"], ref["logits"].numpy()) < 1e-5
        assert rel_err(out["features"], ref["features"].numpy()) < 1e-5
    assert isinstance(from_torch(model, (x,), tracer="torch2jax"), ClosedJaxpr)


class TorchRelu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def test_torch2jax_gaps_are_named_and_point_to_export():
    with pytest.raises(NotImplementedError) as e:
        trace_torch(TorchRelu(), (torch.randn(2),), tracer="torch2jax")
    assert "torch2jax cannot trace" in str(e.value) and "torch.relu" in str(e.value)
    assert "tracer='export'" in str(e.value)
    with pytest.raises(ValueError, match="unknown tracer 'jit'"):
        trace_torch(TorchRelu(), (torch.randn(2),), tracer="jit")
