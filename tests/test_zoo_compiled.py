"""Every zoo model (reduced configs) compiles, passes the verifier, and simulates to PyTorch eager
within 1e-4 relative error, through the model's own input and output structure."""

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import rel_err

import stagec
from stagec import zoo


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_zoo_model_on_the_accelerator(name):
    model, args, kwargs = zoo.build(name, reduced=True)
    program = stagec.compile(model, args, kwargs=kwargs)
    stagec.load(program.to_bytes())   # the file's header, structure and a fresh, full verification
    out, report = stagec.simulate(program, *args, **kwargs)   # on the batched executor (pyproject's filterwarnings)
    with torch.no_grad():
        ref = model(*args, **kwargs)
    got = pytree.tree_leaves(out)
    want = [t.numpy() for t in pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
    assert len(got) == len(want) and type(out) is type(ref)
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).shape == w.shape
        assert rel_err(g, w) < 1e-4
    assert report.cycles > 0 and sum(layer.macs for layer in report.layers) > 0


def test_full_size_resnet50_runs_on_the_batched_executor():
    """The mapper picks some mappings only at full size (ResNet-50's 7x7 stem over 224x224): its
    program must stay inside the batched executor's model, not fall back to the reference
    interpreter (a stacked stem did, and no reduced config showed it)."""
    from stagec.sim.plan import build_plan
    model, args, kwargs = zoo.build("resnet50")
    program = stagec.compile(model, args, kwargs=kwargs)
    plan = build_plan(program)
    assert len(plan.groups) < len(program) / 10   # batched: groups of many instructions each
