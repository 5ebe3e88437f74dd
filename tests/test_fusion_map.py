"""experiments/fusion_map.py, the map of where a fused model's DRAM bytes go: its split of every DMA by
what it moves adds up to the simulator's DRAM counts, group by group, on an inverted residual block
run as one cascade (its residual add read by the last member) and layer by layer."""

import sys
from pathlib import Path

import pytest
import torch

import stagec
from stagec.isa import HardwareConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import fusion_map  # noqa: E402


def inverted_block():
    torch.manual_seed(0)
    act = torch.nn.ReLU6()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 1), act,
                                            torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), act,
                                            torch.nn.Conv2d(32, 8, 1))

        def forward(self, x):
            return x + self.body(x)
    return Block().eval(), (torch.randn(1, 8, 12, 12),)


@pytest.mark.parametrize("fuse", [True, False])
def test_the_map_splits_every_dram_byte_and_names_the_cascade(fuse):
    model, args = inverted_block()
    program = stagec.compile(model, args, hw=HardwareConfig(), fuse_layers=fuse)
    rows, report = fusion_map.layer_map(program)
    read = sum(r["weights_read"] + r["in"] + r["halo"] + r["epilogue"] for r in rows)
    assert read == pytest.approx(report.actions.dram_read_bytes)
    assert sum(r["out"] for r in rows) == pytest.approx(report.actions.dram_write_bytes)
    assert sum(r["cycles"] for r in rows) == pytest.approx(report.cycles)
    weights = 4 * (8 * 32 + 32 * 9 + 32 * 8)
    assert sum(r["weights"] for r in rows) == weights
    assert all(r["weights_read"] >= r["weights"] for r in rows)   # each weight read at least once
    if fuse:
        (row,) = rows            # expand -> depthwise -> project + residual: one cascade
        assert row["name"].endswith("+2")
        assert row["in"] == row["epilogue"] == 8 * 12 * 12 * 4   # the residual: the block's input again
        assert row["out"] == 8 * 12 * 12 * 4
    else:
        assert len(rows) == 3
