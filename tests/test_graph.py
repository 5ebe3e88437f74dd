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


class PrescaledAttention(torch.nn.Module):
    """Whisper's attention in small: q scaled after its projection (then split into heads by a
    reshape), attention with scale 1, softmax normalization before P @ V."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        b, n, d = x.shape

        def split(t):
            return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
        q = split(self.q(x) * (d // self.heads) ** -0.5)
        o = torch.nn.functional.scaled_dot_product_attention(q, split(self.k(x)), split(self.v(x)), scale=1.0)
        return o.transpose(1, 2).reshape(b, n, d)


def test_attention_scales_fold_and_softmax_normalizes_after_p_at_v():
    torch.manual_seed(0)
    model, x = PrescaledAttention().eval(), torch.randn(1, 12, 16)
    ref, graphs = _graphs(model, x)
    for name, g in graphs:
        assert rel_err(evaluate(g, x.numpy())[0], ref) < 1e-5, name
    final = graphs[-1][1]
    scores = (1, 2, 12, 12)
    # no multiply by attention's scale 1, and q's scale folded into its projection's weights
    assert not any(n.op == OpKind.ELEMENTWISE and "mul" in {s.func for s in n.attr("expr")} for n in final.nodes)
    # one reciprocal per row of the scores, not per score
    recips = [n for n in final.nodes if n.op == OpKind.ELEMENTWISE and n.attr("expr")[0].func == "recip"]
    assert [n.output.shape for n in recips] == [scores[:-1] + (1,)]
    # the normalization runs on P @ V's output tile: N values per row instead of K
    pv = [n for n in final.nodes if n.op == OpKind.MATMUL and "mul" in {s.func for s in n.attr("epilogue") or ()}]
    assert len(pv) == 1 and [s.func for s in pv[0].attr("epilogue")] == ["mul"]
    assert pv[0].inputs[2].shape == pv[0].output.shape[:-1] + (1,)
    assert not any(n.op == OpKind.ELEMENTWISE and n.output.shape == scores and n.inputs[0].shape == scores
                   and "mul" in {s.func for s in n.attr("expr")} for n in final.nodes)
