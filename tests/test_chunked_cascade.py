"""Chunked cascades (lower.schedule.cascade): an inverted residual block whose expanded window does not
fit whole per spatial tile runs depth-first a chunk of expanded channels at a time, the projection
adding each chunk to its sums; an FFN's hidden layer the same way.  Checked against PyTorch, against
the same model compiled layer by layer, and the cascade's cost against the simulator."""

import numpy as np
import pytest
import torch
from helpers import check_fused_against_unfused, rel_err, simulated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_halo_cascade import SMALL, block, dram

import stagec
from stagec.isa import HardwareConfig
from stagec.lower.schedule.cascade import cascade_cost, chunk_at, intermediate
from stagec.lower.schedule.halo import ahead_shapes
from stagec.lower.schedule.nest import Exact, LayerShape
from stagec.pipeline import PIPELINE, Compilation, Request, run
from stagec.report import make_report
from stagec.sim.energy import energy_pj

WIDE = {"c": 64, "expand": 6, "out": 64, "size": 14}     # 384 expanded channels over 14x14


def compiled(model, x, hw):
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw)))
    (cascade,) = c.schedule.cascades
    shapes = [LayerShape.of(*c.schedule[name].nests[0]) for name in cascade.layers]
    return c, cascade, shapes


@pytest.mark.parametrize("stride", [1, 2])
def test_a_wide_block_runs_chunked_equal_to_pytorch_and_the_unfused_program(stride):
    """The block's expanded window at the chosen tile, every channel, would not fit the scratchpad:
    the cascade walks the expand's output-channel tiles, and still only the input, weights, residual
    and output move."""
    model, x = block(stride, **WIDE)
    hw = HardwareConfig()
    c, cascade, shapes = compiled(model, x, hw)
    assert len(cascade.layers) == 3 and cascade.chunk == chunk_at(shapes) == 0
    assert f", chunks of {cascade.mappings[0].tile_o} channels" in str(c.schedule)
    expand = ahead_shapes(shapes, cascade.mappings, np)[0]
    whole = intermediate(expand, cascade.mappings[0])
    assert whole.nbytes * whole.count > hw.scratchpad_bytes
    assert cascade.mappings[0].tile_o < expand.o and cascade.mappings[2].tile_o == shapes[2].o
    _, y, report = simulated(model, x, hw=hw)
    _, y_alone, alone = simulated(model, x, hw=hw, fuse_layers=False)
    ref = model(x).detach().numpy()
    assert rel_err(y, ref) < 1e-5 and rel_err(y, y_alone) <= 1e-5
    assert report.actions.dram_write_bytes == ref.size * 4
    assert dram(report) < dram(alone) and report.cycles < alone.cycles


@pytest.mark.parametrize(("stride", "hw", "c"), [(1, HardwareConfig(), 64), (2, HardwareConfig(), 64),
                                                (1, SMALL, 32)], ids=["s1", "s2", "s1-small"])
def test_the_chunked_cascade_cost_predicts_the_simulator(stride, hw, c):
    """As tests/test_halo_cascade.py's: DRAM bytes, instructions, vector ops, MACs and the footprint are
    the program's (the block is one cascade), cycles within 15% of the timed simulation, energy within 2%."""
    model, x = block(stride, **{**WIDE, "c": c, "out": c})
    c, cascade, shapes = compiled(model, x, hw)
    assert cascade.chunk is not None and len(cascade.layers) == 3
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, 1)
    report = make_report(c.program)
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops", "macs_fp32"):
        assert getattr(cost.actions, action) == getattr(report.actions, action), action
    assert cost.instructions == len(c.program)
    assert cost.cycles == pytest.approx(report.cycles, rel=0.15)
    energy = sum(energy_pj(cost.actions, report.cycles, hw).values())
    assert energy == pytest.approx(sum(report.energy_pj.values()), rel=0.02)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)


@pytest.mark.parametrize("hw", [HardwareConfig(), SMALL], ids=["default", "small"])
def test_a_leading_depthwise_runs_chunked_as_its_cost_predicts(hw):
    """A block's tail, depthwise -> projection (384 channels over 14x14), chunked over the depthwise's
    channel tiles, the depthwise LOADing each chunk's halo from DRAM: DRAM bytes, instructions and
    vector ops are the program's, cycles within 15%, energy within 2%, and it equals the unfused program."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(384, 384, 3, padding=1, groups=384), torch.nn.ReLU6(),
                                torch.nn.Conv2d(384, 64, 1)).eval()
    x = torch.randn(1, 384, 14, 14)
    c, cascade, shapes = compiled(model, x, hw)
    assert cascade.chunk == chunk_at(shapes) == 0 and cascade.mappings[1].tile_o == 64
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, 1)
    report = make_report(c.program)
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops"):
        assert getattr(cost.actions, action) == getattr(report.actions, action), action
    assert cost.instructions == len(c.program) and cost.cycles == pytest.approx(report.cycles, rel=0.15)
    energy = sum(energy_pj(cost.actions, report.cycles, hw).values())
    assert energy == pytest.approx(sum(report.energy_pj.values()), rel=0.02)
    _, y, _ = simulated(model, x, hw=hw)
    _, y_alone, _ = simulated(model, x, hw=hw, fuse_layers=False)
    assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5


def test_a_feed_forward_block_runs_chunked_and_overlaps_its_gelu():
    """An FFN over one row tile: its hidden layer a chunk at a time, the second matmul adding each up,
    the GELU of one chunk on the vector unit while the array computes the next (lower.codegen.cascade's
    skew): faster than layer by layer, within 15% of the cost."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
    x = torch.randn(96, 64)
    hw = HardwareConfig()
    c, cascade, shapes = compiled(model, x, hw)
    assert cascade.chunk == 0 and cascade.mappings[1].tile_o == 64
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, 1)
    _, y, report = simulated(model, x, hw=hw)
    _, y_alone, alone = simulated(model, x, hw=hw, fuse_layers=False)
    assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5
    assert report.cycles < alone.cycles and cost.cycles == pytest.approx(report.cycles, rel=0.15)


def test_an_expand_and_depthwise_pair_stores_its_chunks():
    """A block whose depthwise result has another reader beside the projection (a squeeze-excite's
    pool, here a second output): expand -> depthwise is a cascade of its own, chunked where its
    window is too wide, the depthwise storing each chunk's channels."""

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block(1, **WIDE)[0]

        def forward(self, x):
            b = self.block
            d = torch.nn.functional.relu6(b.depthwise(torch.nn.functional.relu6(b.expand(x))))
            return b.project(d), d.mean((2, 3))

    model, x = Pair().eval(), block(1, **WIDE)[1]
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=HardwareConfig())))
    pairs = [cascade for cascade in c.schedule.cascades if len(cascade.layers) == 2]
    assert any(cascade.chunk == 0 and "depthwise" in cascade.layers[1] for cascade in pairs)
    (y, pooled), _ = stagec.simulate(stagec.compile(model, (x,)), x)
    (y_alone, pooled_alone), _ = stagec.simulate(stagec.compile(model, (x,), fuse_layers=False), x)
    ref_y, ref_pooled = (t.detach().numpy() for t in model(x))
    assert rel_err(y, y_alone) <= 1e-5 and rel_err(pooled, pooled_alone) <= 1e-5
    assert rel_err(y, ref_y) < 1e-5 and rel_err(pooled, ref_pooled) < 1e-5


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([24, 40, 64]), expand=st.sampled_from([4, 6]), size=st.integers(4, 14),
       stride=st.sampled_from([1, 2]), array=st.sampled_from([8, 16]), spad_kib=st.sampled_from([24, 64, 256]),
       acc_kib=st.sampled_from([8, 32, 64]))
def test_random_wide_blocks_on_random_hardware(c, expand, size, stride, array, spad_kib, acc_kib):
    """Wide blocks on configs from too small for any cascade of the three to roomy: chunked, whole or
    split, the output is the unfused program's within 1e-5 and every cascade fits the memories."""
    model, x = block(stride, size=size, c=c, expand=expand, out=c)
    hw = HardwareConfig(array_rows=array, array_cols=array, scratchpad_bytes=spad_kib * 1024,
                        accumulator_bytes=acc_kib * 1024)
    check_fused_against_unfused(model, x, hw)
