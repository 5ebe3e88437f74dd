"""The batched executor's plan: programs whose dataflow is irregular still run batched."""

import warnings

import torch
from helpers import rel_err
from torch import nn

import stagec


class ConcatThenPointwise(nn.Module):
    """Segformer's decode head in small: a 1x1 conv over a concat of tensors made at different depths,
    so the conv's accumulate chain over channel tiles loads each tile from another producer."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 16, 3, padding=1)
        self.second = nn.Conv2d(16, 16, 3, padding=1)
        self.fuse = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        a = self.first(x)
        b = torch.relu(self.second(a))
        return self.fuse(torch.cat([a, b], dim=1))


def test_pointwise_conv_over_concat_of_two_producers():
    torch.manual_seed(0)
    model, x = ConcatThenPointwise().eval(), torch.randn(1, 3, 6, 6)
    # a scratchpad so small that the fuse conv reduces over several channel tiles
    hw = stagec.HardwareConfig(array_rows=4, array_cols=4, scratchpad_bytes=2048, accumulator_bytes=1024,
                               vector_lanes=4)
    program = stagec.compile(model, (x,), hw=hw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no fallback to the reference interpreter
        out, _ = stagec.simulate(program, x)
    assert program.cache["executor"] is not None
    with torch.no_grad():
        assert rel_err(out, model(x).numpy()) < 1e-4


class WideRows(nn.Module):
    """Attention over 96 positions: score tiles stored as rows of contiguous elements (one windowed
    scatter), read back as strided boxes of the producer's values and broadcast row maxima."""

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_box_reads_and_row_scatter_stores_match_the_reference_interpreter():
    from stagec.sim import reference
    from stagec.sim.executor import Executor
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    program = stagec.compile(WideRows().eval(), (q, k, v))
    inputs = [t.numpy() for t in (q, k, v)]
    got = Executor(program).run(inputs)[0]
    want = reference.execute(program, inputs)[0]
    assert rel_err(got, want) < 1e-6
    with torch.no_grad():
        assert rel_err(got, WideRows()(q, k, v).numpy()) < 1e-4
