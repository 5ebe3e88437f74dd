"""A halo cascade's two strategies (lower.schedule.halo): the members ahead of the depthwise recompute
each window's rows shared with the window above (RECOMPUTE), or compute only its new rows, the shared
ones copied forward from the window above (LINE, a line buffer).  Each, forced (cascade_map.HALOS),
equals the unfused program (fp32 within 1e-5, int8 bit for bit and the int8 reference); the line
buffer's expand does fewer MACs and vector work on the same tile; the mapper takes the cheaper one;
its cost predicts the simulator."""

import dataclasses

import numpy as np
import pytest
import torch
from helpers import check_cascade_cost, rel_err, simulated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_halo_cascade import SMALL, block

from stagec import int8_reference
from stagec.isa import HardwareConfig
from stagec.isa.instructions import Opcode, VectorFunc
from stagec.lower.schedule import cascade_map
from stagec.lower.schedule.cascade import cascade_cost
from stagec.lower.schedule.halo import LINE, RECOMPUTE
from stagec.lower.schedule.nest import Exact, LayerShape
from stagec.pipeline import PIPELINE, Compilation, Request, build_graph, position, run
from stagec.report import make_report
from stagec.sim import reference

HALOS = [RECOMPUTE, LINE]


@pytest.fixture
def force(monkeypatch):
    """force(strategy): the mapper weighs that halo strategy alone."""
    return lambda halo: monkeypatch.setattr(cascade_map, "HALOS", (halo,))


def small_block(stride, size=12, **kwargs):
    return block(stride, size=size, c=8, expand=4, out=8, **kwargs)


@pytest.mark.parametrize("stride", [1, 2])
def test_each_strategy_equals_the_unfused_program(force, stride):
    """On SMALL the line buffer takes several row tiles, so its windows share rows (recompute takes one
    here; tests/test_halo_cascade.py recomputes shared rows)."""
    model, x = small_block(stride, size=16)
    _, y_alone, _ = simulated(model, x, hw=SMALL, fuse_layers=False)
    for halo in HALOS:
        force(halo)
        fused, y, _ = simulated(model, x, hw=SMALL)
        (cascade,) = fused.metadata["cascades"]
        assert len(cascade["layers"]) == 3 and cascade["halo"] == halo
        assert halo == RECOMPUTE or cascade["tile"][0] < 16 // stride
        assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5


def test_an_int8_line_buffer_keeps_its_integers(force):
    """int8 rows copied forward (a COPY of int8) and masked: bit for bit stagec.int8_reference (which the
    unfused program equals, tests/test_int8_halo.py), in the batched executor and the reference
    interpreter."""
    model, x = small_block(1)
    force(LINE)
    fused, y, _ = simulated(model, x, quantize="int8")
    (cascade,) = fused.metadata["cascades"]
    assert cascade["halo"] == LINE and copies(fused) > 0
    _, graph = build_graph(model, (x,), quantize="int8")
    np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])
    (y_interpreted,) = reference.execute(fused, [x.numpy()])    # the ISA's reference interpreter agrees
    np.testing.assert_array_equal(y_interpreted.reshape(y.shape), y)


class PointwiseThenInverted(torch.nn.Module):
    """A 1x1 conv feeding an inverted block's expand (a projection without residual before it): the
    cascade pointwise -> expand -> depthwise has two members ahead of the depthwise."""

    def __init__(self):
        super().__init__()
        self.pointwise = torch.nn.Conv2d(8, 8, 1)
        self.expand = torch.nn.Conv2d(8, 32, 1)
        self.depthwise = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)

    def forward(self, x):
        act = torch.nn.functional.relu6
        return act(self.depthwise(act(self.expand(self.pointwise(x)))))


def test_two_members_ahead_share_the_line_buffers_rows(force):
    torch.manual_seed(0)
    model, x = PointwiseThenInverted().eval(), torch.randn(1, 8, 12, 12)
    force(LINE)
    fused, y, _ = simulated(model, x)
    _, y_alone, _ = simulated(model, x, fuse_layers=False)
    assert [len(c["layers"]) for c in fused.metadata["cascades"]] == [3]
    assert fused.metadata["cascades"][0]["halo"] == LINE
    assert rel_err(y, y_alone) <= 1e-5


def copies(program) -> int:
    code = program.code
    return int(((code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.COPY)).sum())


def test_the_line_buffer_computes_fewer_rows_on_the_same_tile(force):
    """The same schedule lowered with each strategy (their mappings are one: the window tile): the
    expand's MACs and vector ops drop by the shared rows it no longer recomputes, less their COPYs."""
    model, x = small_block(1)
    force(LINE)
    c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, (x,), hw=SMALL)))
    (cascade,) = c.schedule.cascades
    assert cascade.halo == LINE and cascade.tile[0] < 12       # several row tiles: rows shared
    assert ", halo line buffer," in str(c.schedule)             # the schedule dump names the strategy
    programs = {}
    for halo in HALOS:
        schedule = dataclasses.replace(c.schedule, cascades=(dataclasses.replace(cascade, halo=halo),))
        programs[halo] = run(PIPELINE[position("program"):], dataclasses.replace(c, schedule=schedule)).program
    expand = cascade.layers[0]
    work = {h: next(layer.actions for layer in make_report(p).layers if layer.name == expand)
            for h, p in programs.items()}
    assert all(f"halo {h}," in make_report(p).summary() for h, p in programs.items())
    # per column strip, each window after the first shares 2 rows (3x3, stride 1) of its columns
    th, tw = cascade.tile
    shared_rows = 2 * (-(-12 // th) - 1)
    columns = sum(min(tw, 12 - q) + 2 for q in range(0, 12, tw))
    assert work[RECOMPUTE].macs_fp32 - work[LINE].macs_fp32 == shared_rows * columns * 8 * 32   # c x 4c
    assert work[LINE].vector_ops < work[RECOMPUTE].vector_ops
    assert copies(programs[LINE]) > copies(programs[RECOMPUTE])


@pytest.mark.parametrize(("spad_kib", "picked"), [(256, LINE), (24, RECOMPUTE)])
def test_the_mapper_takes_the_cheaper_strategy(spad_kib, picked):
    """map_cascade weighs both: on a roomy scratchpad the line buffer costs less; on 24 KiB only a
    chunked cascade fits (tests/test_chunked_cascade.py), which recomputes its rows."""
    model, x = block(1, size=16, c=32, out=32)
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=spad_kib * 1024, accumulator_bytes=16 * 1024)
    c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, (x,), hw=hw)))
    (chain,) = cascade_map.chains(c.graph, c.layout, dict(c.schedule.tilings), ())
    nests = [c.schedule[n.name].nests[0] for n in chain]
    each = {}
    for halo in HALOS:
        cascade_map.HALOS = (halo,)
        try:
            each[halo] = cascade_map.map_cascade(nests, hw, "edp")
        finally:
            cascade_map.HALOS = None
    chosen = cascade_map.map_cascade(nests, hw, "edp")
    assert chosen.halo == picked
    assert chosen.value == min(m.value for m in each.values() if m is not None)
    other = each[RECOMPUTE if picked == LINE else LINE]
    assert other is None or other.value > chosen.value


@pytest.mark.parametrize("stride", [1, 2])
def test_the_line_buffer_cost_predicts_the_simulator(force, stride):
    """As tests/test_halo_cascade.py's (tests/helpers.py:check_cascade_cost): DRAM bytes, vector ops (the
    COPYs' too), MACs, instructions and the footprint are the program's."""
    model, x = block(stride, size=16)
    force(LINE)
    hw = HardwareConfig()
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw)))
    (cascade,) = c.schedule.cascades
    assert cascade.halo == LINE
    # cycles within 10% (tests/test_int8_depthwise.py's cascade too): the nest under-predicts a cascade's
    # small tiles (both strategies); the counts are exact
    check_cascade_cost(c, cascade, hw, cycles=0.10)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([4, 8]), size=st.integers(5, 12), kernel=st.sampled_from([(3, 1), (5, 2), (3, 0)]),
       stride=st.sampled_from([1, 2]), array=st.sampled_from([4, 8, 16]), spad_kib=st.sampled_from([16, 32, 128]))
def test_random_line_buffered_blocks_on_random_hardware(c, size, kernel, stride, array, spad_kib):
    """The line buffer forced (split where it does not fit): the output is PyTorch's within 1e-5 (as the
    unfused program's is) and every cascade fits the memories."""
    k, padding = kernel
    model, x = block(stride, size=size, c=c, expand=4, out=c, k=k, padding=padding)
    hw = HardwareConfig(array_rows=array, array_cols=array, scratchpad_bytes=spad_kib * 1024,
                        accumulator_bytes=16 * 1024)
    cascade_map.HALOS = (LINE,)
    try:
        program, y, _ = simulated(model, x, hw=hw)
    finally:
        cascade_map.HALOS = None
    assert rel_err(y, model(x).detach().numpy()) < 1e-5
    for cascade in program.metadata.get("cascades", ()):
        spad, acc = program.metadata["local_peak_bytes"][cascade["layers"][0]]
        assert spad <= hw.scratchpad_bytes and acc <= hw.accumulator_bytes


TINY = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=24 * 1024, accumulator_bytes=16 * 1024)
BLOCKS = {"3x3": {"stride": 1, "size": 12}, "3x3/2": {"stride": 2, "size": 16},
          "5x5": {"stride": 1, "size": 10, "k": 5, "padding": 2}}


@pytest.fixture(scope="module")
def block_nests():
    """Each of BLOCKS's chain of nests (expand, depthwise, project), as the mapper gives them."""
    out = {}
    for name, shape in BLOCKS.items():
        model, x = small_block(**shape)
        c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, (x,), hw=SMALL, fuse_layers=False)))
        (chain,) = cascade_map.chains(c.graph, c.layout, dict(c.schedule.tilings), ())
        out[name] = [c.schedule[n.name].nests[0] for n in chain]
    return out


@pytest.mark.parametrize("name", BLOCKS)
@pytest.mark.parametrize("hw", ["SMALL", "TINY"])
def test_one_grid_takes_the_cheaper_of_each_strategys_best(monkeypatch, block_nests, name, hw):
    """map_cascade's one grid over both strategies (a `line` axis) picks what each strategy's best alone
    (forced) is, the cheaper, recomputing on a tie."""
    nests = block_nests[name]
    hw_config = {"SMALL": SMALL, "TINY": TINY}[hw]
    each = {}
    for halo in HALOS:
        monkeypatch.setattr(cascade_map, "HALOS", (halo,))
        each[halo] = cascade_map.map_cascade(nests, hw_config, "edp")
        assert each[halo].halo == halo
        assert each[halo].chunk is None or halo == RECOMPUTE          # a line buffer holds every channel
    monkeypatch.setattr(cascade_map, "HALOS", None)
    assert cascade_map.map_cascade(nests, hw_config, "edp") == min(each.values(), key=lambda m: m.value)


def test_the_line_is_a_grid_or_a_blend_in_the_cascade_cost(block_nests):
    """cascade_cost's `line` as the mapper's grid (an array of 0 and 1) prices each strategy as the number
    does; a blend (costmodel.fusion's relaxed choice) weighs the two row tilings: on this block, whose
    two row totals differ by an even count, its work is their mean (the relaxed cost's
    (costmodel.smooth.Relaxed) at temperature 0: tests/test_fusion_cost.py)."""
    Ls = [LayerShape.of(*nest) for nest in block_nests["3x3"]]
    ms = list(cascade_map.map_cascade(block_nests["3x3"], SMALL, "edp").mappings)
    each = [cascade_cost(Ls, ms, SMALL, Exact, 0, line) for line in (0, 1)]
    grid = cascade_cost(Ls, ms, SMALL, Exact, 0, np.array([0, 1]))
    half = cascade_cost(Ls, ms, SMALL, Exact, 0, 0.5)
    assert each[1].cycles < each[0].cycles
    for field in ("cycles", "instructions", "spad_bytes", "acc_bytes"):
        np.testing.assert_array_equal(np.broadcast_to(getattr(grid, field), 2), [getattr(c, field) for c in each])
    for field, value in half.actions.to_dict().items():
        np.testing.assert_array_equal(getattr(grid.actions, field), [getattr(c.actions, field) for c in each])
        assert value == (getattr(each[0].actions, field) + getattr(each[1].actions, field)) / 2, field
    assert half.instructions == (each[0].instructions + each[1].instructions) / 2
    assert each[1].actions.macs_fp32 < each[0].actions.macs_fp32      # the shared rows not recomputed
