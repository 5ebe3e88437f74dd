"""scale_weights (lower.graph.scale_weights): a squeeze-excite's gate, a run-time scale per channel of a
1x1 convolution's input, moves onto the convolution's weights where they are smaller than the input,
so the gated activation never goes to DRAM.  Checked against PyTorch and the unfused program."""

import pytest
import torch
from helpers import rel_err, simulated

from stagec.lower.graph.graph_ir import OpKind
from stagec.lower.graph.scale_weights import scale_weights
from stagec.pipeline import PIPELINE, Compilation, Request, position, run


class Excited(torch.nn.Module):
    """EfficientNet's block tail: depthwise (SiLU), squeeze-excite, the 1x1 projection."""

    def __init__(self, c=32, out=16, squeeze=8):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.reduce = torch.nn.Conv2d(c, squeeze, 1)
        self.expand = torch.nn.Conv2d(squeeze, c, 1)
        self.project = torch.nn.Conv2d(c, out, 1)

    def forward(self, x):
        silu = torch.nn.functional.silu
        d = silu(self.depthwise(x))
        gate = torch.sigmoid(self.expand(silu(self.reduce(d.mean((2, 3), keepdim=True)))))
        return self.project(d * gate)


def graph_of(model, x, **options):
    return run(PIPELINE[:position("pack")], Compilation(Request(model, (x,), **options))).graph


def gated(graph) -> list:
    """The ELEMENTWISE multiplies of a whole activation by a gate."""
    return [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.output.shape[0] == 1
            and n.output.shape[2:] != (1, 1)]


@pytest.mark.parametrize(("size", "out", "moves"), [(14, 16, True), (6, 48, False)], ids=["moves", "stays"])
def test_a_gate_moves_onto_the_weights_where_they_are_smaller(size, out, moves):
    """14x14 pixels against 16 output channels: the gate scales the projection's weights instead of the
    activation, and the program moves the gated activation's bytes less; 6x6 against 48: it stays.  Either way the
    output is PyTorch's and the unfused program's within 1e-5."""
    torch.manual_seed(size)
    model, x = Excited(out=out).eval(), torch.randn(1, 32, size, size)
    graph = graph_of(model, x)
    assert (not gated(graph)) == moves and len(gated(graph_of(model, x, fuse_layers=False))) == 1
    if moves:
        (scaled,) = [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.output.shape == (out, 32, 1, 1)]
        (project,) = [n for n in graph.nodes if n.op == OpKind.CONV and n.inputs[1] == scaled.output]
        assert project.inputs[0].shape == (1, 32, size, size)
    _, y, report = simulated(model, x)
    _, y_alone, alone = simulated(model, x, fuse_layers=False)
    assert rel_err(y, model(x).detach().numpy()) < 1e-5 and rel_err(y, y_alone) <= 1e-5
    if moves:   # the gated activation's STORE and LOAD are gone; the weights' multiply reads and writes them
        saved = 2 * x.numel() * 4 - 2 * out * 32 * 4 - 32 * 4
        dram = [r.actions.dram_read_bytes + r.actions.dram_write_bytes for r in (report, alone)]
        assert dram[1] - dram[0] >= saved and report.cycles < alone.cycles


def test_only_a_gate_read_by_a_pointwise_conv_alone_moves():
    """A gated activation also returned, or read by a 3x3 convolution, keeps its multiply."""

    class Kept(Excited):
        def forward(self, x):
            d = torch.nn.functional.silu(self.depthwise(x))
            g = d * torch.sigmoid(self.expand(self.reduce(d.mean((2, 3), keepdim=True))))
            return self.project(g), g

    torch.manual_seed(0)
    model, x = Kept().eval(), torch.randn(1, 32, 14, 14)
    graph = graph_of(model, x)
    assert scale_weights(graph) == graph and len(gated(graph)) == 1
