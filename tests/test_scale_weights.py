"""scale_weights (lower.graph.scale_weights): a squeeze-excite's gate, a run-time scale per channel of a
1x1 convolution's input, moves onto the convolution's weights where they are smaller than the input,
so the gated activation never goes to DRAM.  Checked against PyTorch and the unfused program (fp32, bf16,
int8), and for int8 against the integer reference bit for bit."""

import numpy as np
import pytest
import torch
from helpers import rel_err, simulated

from stagec import int8_reference
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
    """The ELEMENTWISE multiplies of a whole activation by a gate: nodes of a whole activation's shape with a
    run-time input of one value per channel."""
    return [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.output.shape[0] == 1
            and n.output.shape[2:] != (1, 1) and any(v.shape == (1, n.output.shape[1], 1, 1)
                                                     and v.id not in graph.constants for v in n.inputs)]


# bf16: each program rounds its own products to bf16 (the gated activation's or the gated weights'), a few
# 2**-8 relative roundings apart from PyTorch's float32 and from each other; int8: a few steps of the int8
# grids (measured: 0.019 with the gated weights, 0.023 with the gated activation)
PRECISIONS = {None: (4, 1e-5), "bf16": (2, 1e-2), "int8": (1, 0.05)}   # quantize= -> (bytes per element, tolerance)


@pytest.mark.parametrize(("size", "out", "moves", "quantize"), [(14, 16, True, None), (6, 48, False, None),
                                                                 (14, 16, True, "bf16"), (14, 16, True, "int8")],
                         ids=["moves", "stays", "moves-bf16", "moves-int8"])
def test_a_gate_moves_onto_the_weights_where_they_are_smaller(size, out, moves, quantize):
    """14x14 pixels against 16 output channels: the gate scales the projection's weights instead of the
    activation, and the program moves the gated activation's bytes less; 6x6 against 48: it stays.  Either way the
    output is PyTorch's and the unfused program's within the precision's tolerance."""
    torch.manual_seed(size)
    (size_of, tolerance), options = PRECISIONS[quantize], {"quantize": quantize}
    model, x = Excited(out=out).eval(), torch.randn(1, 32, size, size)
    graph = graph_of(model, x, **options)
    assert (not gated(graph)) == moves and len(gated(graph_of(model, x, fuse_layers=False, **options))) == 1
    if moves:
        (scaled,) = [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.output.shape == (out, 32, 1, 1)]
        (project,) = [n for n in graph.nodes if n.op == OpKind.CONV and n.inputs[1] == scaled.output]
        assert project.inputs[0].shape == (1, 32, size, size)
    _, y, report = simulated(model, x, **options)
    _, y_alone, alone = simulated(model, x, fuse_layers=False, **options)
    assert rel_err(y, model(x).detach().numpy()) < tolerance and rel_err(y, y_alone) <= tolerance
    if quantize == "int8":   # the gated weights' int8 (requantized per output channel at run time) too
        np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])
    if moves:   # the gated activation's STORE and LOAD are gone; the weights' multiply reads and writes them
        saved = (2 * x.numel() - 2 * out * 32 - 32) * size_of
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
