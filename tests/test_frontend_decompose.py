"""The one-pass core-ATen decomposition gives what ExportedProgram.run_decompositions gives."""

import torch
import torch.nn.functional as F
from torch import nn

from stagec.frontend.decompose import decompositions, to_core_aten


class Block(nn.Module):
    """Composite ops to decompose (conv2d, batch_norm, linear, in-place dropout and add), attention to keep."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(inplace=True)
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale: float, bias=None):
        y = self.drop(self.bn(self.conv(x)))
        y += x.mean(1, keepdim=True)
        q = self.fc(y.flatten(2).transpose(1, 2))
        return F.scaled_dot_product_attention(q, q, q) * scale, y


class Counter(nn.Module):
    """Writes into its own buffer: a mutation the graph's caller must see."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


def _exported(model, args):
    with torch.no_grad():
        return torch.export.export(model.eval(), args)


def _nodes(ep):
    return [(n.op, n.name, str(n.target), n.meta.get("stack_trace"), str(n.meta.get("nn_module_stack")))
            for n in ep.graph.nodes]


def _same_program(fast, reference):
    assert _nodes(fast) == _nodes(reference)
    assert fast.graph_signature == reference.graph_signature


def test_one_trace_gives_the_program_run_decompositions_gives(monkeypatch):
    ep = _exported(Block(), (torch.randn(2, 3, 5, 5), 0.5))
    reference = ep.run_decompositions(decompositions())
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", None)   # no fallback taken
    fast = to_core_aten(ep)
    _same_program(fast, reference)
    assert torch.ops.aten.scaled_dot_product_attention.default in {n.target for n in fast.graph.nodes}


def test_input_mutation_goes_through_run_decompositions():
    ep = _exported(Counter(), (torch.randn(3),))
    _same_program(to_core_aten(ep), ep.run_decompositions(decompositions()))
