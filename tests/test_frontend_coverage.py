"""stagec.frontend.coverage and `stagec ops`: a model's ATen ops, counts and support, before lowering."""

import textwrap

import pytest
import torch
from torch import nn

from stagec.cli import main
from stagec.frontend import OpCount, coverage, format_coverage


class Net(nn.Module):
    def forward(self, x):
        return torch.relu(x @ x.T) + torch.cumprod(x, 0).sum() + torch.relu(x).sum()


def test_coverage_counts_ops_and_flags_unsupported():
    rows = coverage(Net(), (torch.randn(3, 3),))
    assert OpCount("aten.relu.default", 2, True) in rows
    assert OpCount("aten.cumprod.default", 1, False) in rows
    assert rows == sorted(rows, key=lambda r: (-r.count, r.op))
    table = format_coverage(rows)
    assert "aten.cumprod.default" in table and " NO" in table
    assert table.splitlines()[-1].endswith("1 unsupported: aten.cumprod.default")


FACTORIES = textwrap.dedent('''
    import torch

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU()), torch.randn(2, 4)

    def with_kwargs():
        class M(torch.nn.Module):
            def forward(self, x, *, y):
                return torch.cumprod(x, 0) + y
        return M(), (torch.randn(3),), {"y": torch.randn(3)}
''')


def test_stagec_ops_on_a_factory_file(tmp_path, capsys):
    path = tmp_path / "models.py"
    path.write_text(FACTORIES)
    assert main(["ops", f"{path}:mlp"]) == 0
    out = capsys.readouterr().out
    assert "aten.gelu.default" in out and "all supported" in out
    assert main(["ops", f"{path}:with_kwargs"]) == 1      # an unsupported op: exit status 1
    assert "1 unsupported: aten.cumprod.default" in capsys.readouterr().out


def test_stagec_ops_on_a_zoo_model(capsys):
    assert main(["ops", "whisper_tiny_encoder", "--reduced"]) == 0
    out = capsys.readouterr().out
    assert "aten.scaled_dot_product_attention.default" in out and "aten.convolution.default" in out


@pytest.mark.parametrize("spec, status, message", [
    ("resnet19", 2, "neither a zoo model"), ("missing.py:f", 1, "missing.py: No such file or directory"),
    ("{path}:nothing", 2, "has no function nothing")])
def test_stagec_ops_bad_model_argument_is_a_one_line_error(spec, status, message, tmp_path, capsys):
    path = tmp_path / "models.py"
    path.write_text(FACTORIES)
    assert main(["ops", spec.format(path=path)]) == status
    err = capsys.readouterr().err
    assert err.startswith("stagec ops: ") and message in err and err.count("\n") == 1
