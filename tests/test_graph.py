"""Graph IR: canonicalization and every pass preserve the reference semantics."""

import numpy as np
import torch
from helpers import rel_err
from jax.extend.core import jaxpr_as_fun
from test_frontend import Everything

from stagec.compiler import GRAPH_PASSES
from stagec.frontend import from_torch
from stagec.lower.canonicalize import canonicalize
from stagec.lower.evaluate import evaluate
from stagec.lower.graph_ir import OpKind
from stagec.models import hand_keypoint_net


def _graphs(model, x):
    cj = from_torch(model, (x,))
    ref = np.asarray(jaxpr_as_fun(cj)(x.numpy())[0])
    g = canonicalize(cj)
    out = [("canonicalize", g)]
    for name, run in GRAPH_PASSES:
        g = run(g)
        out.append((name, g))
    return ref, out


def test_passes_preserve_semantics():
    for model, x in (hand_keypoint_net(), (Everything().eval(), (torch.randn(2, 3, 20, 20),))):
        ref, graphs = _graphs(model, x[0])
        for name, g in graphs:
            assert rel_err(evaluate(g, x[0].numpy())[0], ref) < 1e-5, name


def test_batch_norm_folds_into_the_convolution():
    model, (x,) = hand_keypoint_net()
    _, graphs = _graphs(model, x)
    final = graphs[-1][1]
    convs = [n for n in final.nodes if n.op == OpKind.CONV]
    assert len(convs) == 6
    for n in convs:   # conv + BN + ReLU: one bias add and the ReLU are all that is left
        assert [s.func for s in n.attr("epilogue")] == ["add", "relu"], n
    assert not any(n.op == OpKind.ELEMENTWISE and "mul" in n.name for n in final.nodes if "features.7" not in n.name)


def test_elementwise_chains_fuse():
    class Chain(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2.0 + y) - y
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    g = canonicalize(from_torch(Chain(), (x, y)))
    for _, run in GRAPH_PASSES:
        g = run(g)
    assert len(g.nodes) == 1 and g.nodes[0].op == OpKind.ELEMENTWISE
    assert [s.func for s in g.nodes[0].attr("expr")] == ["mul", "add", "relu", "sub"]
    np.testing.assert_allclose(evaluate(g, x.numpy(), y.numpy())[0], Chain()(x, y).numpy(), rtol=1e-6)


def test_graph_prints():
    model, (x,) = hand_keypoint_net()
    _, graphs = _graphs(model, x)
    text = str(graphs[-1][1])
    assert "conv(" in text and "epilogue={t0=add(i0,i1); t1=relu(t0)}" in text and "return" in text
