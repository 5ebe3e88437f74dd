"""A k x k convolution leading a halo cascade (lower.schedule.halo): MobileNetV2's stem (3x3 stride-2 conv,
depthwise, 1x1 project) runs as one cascade, the conv computing the depthwise's input windows from its
own halo of each window in DRAM, so its result never leaves the chip.  Checked against PyTorch, the
unfused program (fp32 within 1e-5, int8 bit for bit and against stagec.int8_reference), and the
cascade's cost against the simulator."""

import dataclasses

import numpy as np
import pytest
import torch
from helpers import check_cascade_cost, check_fused_against_unfused, rel_err, simulated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_int8_halo import BF16_FUSED, BF16_TORCH, int8_programs

from stagec.isa import HardwareConfig
from stagec.lower.schedule import cascade_map
from stagec.lower.schedule.halo import LINE, RECOMPUTE, ahead_shape, halos, line_buffers
from stagec.lower.schedule.nest import ConvProblem, Exact, LayerShape, TileMapping
from stagec.lower.schedule.nest_work import empty_rows, kernel_rows, matrix_work
from stagec.pipeline import PIPELINE, Compilation, Request, position, run
from stagec.sim import reference

SMALL = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=64 * 1024, accumulator_bytes=16 * 1024,
                       dma_bandwidth_bytes_per_cycle=4.0)


def stem(k=3, stride=2, padding=1, c=3, hidden=16, out=8, size=32, dw=(3, 1, 1), seed=0, dilation=1):
    """(model, input): a conv (k x k, `stride`, `padding`, `dilation`), ReLU6, a depthwise conv (`dw`:
    kernel, stride, padding), ReLU6, a 1x1 projection."""
    torch.manual_seed(seed)
    kd, sd, pd = dw
    model = torch.nn.Sequential(torch.nn.Conv2d(c, hidden, k, stride=stride, padding=padding, dilation=dilation),
                                torch.nn.ReLU6(),
                                torch.nn.Conv2d(hidden, hidden, kd, stride=sd, padding=pd, groups=hidden),
                                torch.nn.ReLU6(), torch.nn.Conv2d(hidden, out, 1)).eval()
    return model, torch.randn(1, c, size, size)


def dram(report) -> float:
    return report.actions.dram_read_bytes + report.actions.dram_write_bytes


def test_a_stem_is_one_cascade_equal_to_pytorch_and_the_unfused_program():
    """The conv's 16x16x16 result and the depthwise's stay on chip: the DRAM traffic is the image (its
    windows' halos, overlapping), the weights and the output."""
    model, x = stem()
    fused, y, report = simulated(model, x)
    _, y_alone, alone = simulated(model, x, fuse_layers=False)
    (cascade,) = fused.metadata["cascades"]
    assert cascade["layers"] == [layer.name for layer in fused.layers]
    assert cascade["halo"] == RECOMPUTE
    assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5
    assert dram(alone) - dram(report) > 2 * 16 * 16 * 16 * 4
    assert report.cycles < alone.cycles


def test_an_int8_stem_keeps_its_integers():
    """Bit for bit stagec.int8_reference and the unfused program, in the batched executor and the ISA's
    reference interpreter."""
    model, x = stem(size=16)
    fused, y, y_alone, y_ref = int8_programs(model, x)
    (cascade,) = fused.metadata["cascades"]
    assert len(cascade["layers"]) == 3
    np.testing.assert_array_equal(y, y_alone)
    np.testing.assert_array_equal(y, y_ref)
    (y_interpreted,) = reference.execute(fused, [x.numpy()])
    np.testing.assert_array_equal(y_interpreted.reshape(y.shape), y)


def test_a_bf16_stem_is_one_cascade_equal_to_the_unfused_program():
    model, x = stem(size=16)
    fused, y, _ = simulated(model, x, quantize="bf16")
    _, y_alone, _ = simulated(model, x, quantize="bf16", fuse_layers=False)
    (cascade,) = fused.metadata["cascades"]
    assert len(cascade["layers"]) == 3
    assert rel_err(y, y_alone) <= BF16_FUSED and rel_err(y, model(x).detach().numpy()) < BF16_TORCH


def test_a_k_x_k_conv_leads_only_ahead_of_a_depthwise():
    """A k x k conv may be a cascade's first member only, and only with a depthwise member after it (its
    input windows then are the depthwise's); it keeps a line buffer only with its kernel rows stacked
    (halo.line_buffers)."""
    conv = LayerShape.of("matrix", ConvProblem(1, 3, 32, 32, 16, 3, 3, (2, 2), ((1, 1), (1, 1))))
    dw = LayerShape.of("depthwise", ConvProblem(1, 16, 16, 16, 16, 3, 3, padding=((1, 1), (1, 1))))
    pw = LayerShape.of("matrix", ConvProblem(1, 16, 16, 16, 8))
    assert halos([conv, dw, pw]) == halos([pw, dw, pw]) == (RECOMPUTE, LINE)
    assert not line_buffers([conv, dw, pw]) and line_buffers([conv, dw, pw], stacked=1)
    assert line_buffers([pw, dw, pw])
    model, x = stem()
    c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, (x,))))
    (chain,) = cascade_map.chains(c.graph, c.layout, dict(c.schedule.tilings), ())
    nests = [c.schedule[n.name].nests[0] for n in chain]
    assert cascade_map.map_cascade(nests, HardwareConfig(), "edp") is not None
    assert cascade_map.map_cascade([nests[0], nests[2]], HardwareConfig(), "edp") is None   # no depthwise
    assert not cascade_map.follows(nests[1], nests[0])      # a k x k conv follows nothing
    assert not cascade_map.follows(nests[0], nests[2])      # and only a depthwise follows it


def test_the_conv_reads_its_own_halo_of_each_window():
    """ahead_shape of a 3x3 stride-2 conv: its output the windows side by side (the rows of every tile's
    window), its input rows what each window's rows read, counted here window by window: a window of r
    rows at the depthwise's padded row s reads the conv's input rows 2 (s - 1) - 1 .. + 2 r, clipped to
    the image.  The nest's DRAM bytes and MACs of the member are those sums, where only the first and
    the last window read padding (halo's module doc); with tiles of 2 rows the last but one window also
    reads the conv's bottom padding row, which the nest counts as loaded."""
    p = ConvProblem(1, 3, 29, 29, 16, 3, 3, (2, 2), ((1, 1), (1, 1)))
    conv = LayerShape.of("matrix", p)
    dw = LayerShape.of("depthwise", ConvProblem(1, 16, p.oh, p.ow, 16, 3, 3, padding=((1, 1), (1, 1))))
    for th in (2, 3, 4, 5, 15):
        shape = ahead_shape(conv, dw, th, th, np)
        windows = [(min(th, dw.oh - s) + 2, s) for s in range(0, dw.oh, th)]     # (rows, first padded row)
        reads = [min(2 * (s - 1) - 1 + 2 * r + 1, p.h) - max(2 * (s - 1) - 1, 0) for r, s in windows]
        assert shape.oh == shape.ow == sum(r for r, _ in windows)
        m = TileMapping(th + 2, th + 2, 16, 3)
        work = matrix_work(shape, m, HardwareConfig(), Exact)
        assert work.halo[1] == (sum(reads) + (th == 2)) ** 2 * 3 * 4
        assert shape.macs == sum(r for r, _ in windows) ** 2 * 16 * 27


@pytest.mark.parametrize("halo", [RECOMPUTE, LINE])
@pytest.mark.parametrize("hw", [HardwareConfig(), SMALL], ids=["default", "small"])
def test_the_stem_cascade_cost_predicts_the_simulator(hw, halo, monkeypatch):
    """As tests/test_halo_cascade.py's: DRAM bytes (a stacked halo's rows all in the padding LOADed as
    zeros too), vector ops, MACs, instructions and the footprint are the program's, cycles within 15% of
    the timed simulation, energy within 2%; each halo strategy forced (the line buffer's conv stacked)."""
    monkeypatch.setattr(cascade_map, "HALOS", (halo,))
    model, x = stem()
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw)))
    (cascade,) = c.schedule.cascades
    first = c.schedule[cascade.layers[0]].nests[0].problem
    assert len(cascade.layers) == 3 and first.kh == 3 and cascade.halo == halo
    assert cascade.mappings[0].stacked or halo == RECOMPUTE
    check_cascade_cost(c, cascade, hw)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_line_buffered_stem_equals_pytorch_and_the_unfused_program(quantize, monkeypatch):
    """The conv computes each window's new rows alone, its kernel rows stacked (one LOAD per output row,
    zeros for the rows above the image that the depthwise's padding row reads): fp32 within 1e-5 of the
    unfused program and PyTorch, int8 bit for bit the unfused program and stagec.int8_reference."""
    monkeypatch.setattr(cascade_map, "HALOS", (LINE,))
    model, x = stem(size=24)
    if quantize:
        fused, y, y_alone, y_ref = int8_programs(model, x)
        np.testing.assert_array_equal(y, y_alone)
        np.testing.assert_array_equal(y, y_ref)
    else:
        fused, y, _ = simulated(model, x)
        _, y_alone, _ = simulated(model, x, fuse_layers=False)
        assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5
    (cascade,) = fused.metadata["cascades"]
    assert len(cascade["layers"]) == 3 and cascade["halo"] == LINE


def test_a_stacked_member_streaming_its_weights_loads_a_tile_at_once(monkeypatch):
    """A stacked conv in a cascade has its weights laid out in its k order ([KW, KH, C, O], as a stacked
    layer alone has them): a tile of output channels is one LOAD, as the cost counts (laid out
    [KH, KW, C, O], it was kw LOADs a tile: 54 instructions for the cost's 50)."""
    monkeypatch.setattr(cascade_map, "HALOS", (LINE,))
    model, x = stem(3, 1, 0, size=10)
    hw = HardwareConfig(array_rows=4, array_cols=4, scratchpad_bytes=64 * 1024, accumulator_bytes=16 * 1024)
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=hw)))
    (cascade,) = c.schedule.cascades
    assert cascade.mappings[0].stacked
    # the mapper holds these weights resident: the cascade again as one 8x8 tile, its output channels in two
    # tiles of 8, each member streaming its weights
    conv = TileMapping(10, 10, 8, 3, double_buffer=True, weights_resident=False, stacked=True)
    rest = TileMapping(8, 8, 8, 8, double_buffer=True, weights_resident=False)
    streamed = dataclasses.replace(cascade, tile=(8, 8), mappings=(conv, rest, rest))
    own = dict(zip(streamed.layers, streamed.mappings, strict=True))
    tilings = tuple((name, dataclasses.replace(t, mappings=(own[name],)) if name in own else t)
                    for name, t in c.schedule.tilings)
    schedule = dataclasses.replace(c.schedule, tilings=tilings, cascades=(streamed,))
    c = run(PIPELINE[position("program"):], dataclasses.replace(c, schedule=schedule))
    check_cascade_cost(c, streamed, hw)


def test_kernel_rows_and_empty_rows_count_the_rows_one_by_one():
    """nest_work.kernel_rows and empty_rows against the rows counted one by one: output row r reads input rows
    r * stride - pad_top .. + kh - 1, empty where none of them is inside; padding wider than the kernel
    too (a member ahead of a depthwise computes its padding rows), where the closed forms once counted
    a row's padding past its kernel."""
    cases = [(32, 3, 2, 3, 2), (9, 3, 1, 4, 5), (10, 5, 3, 0, 8), (7, 3, 2, 1, 1), (19, 2, 3, 3, 1), (12, 7, 2, 9, 9),
             (5, 3, 1, 0, 0), (4, 5, 1, 2, 2)]
    for h, kh, stride, top, bottom in cases:
        L = LayerShape.of("matrix", ConvProblem(1, 3, h, h, 8, kh, kh, (stride, stride), ((top, bottom), (0, 0))))
        reads = [range(r * stride - top, r * stride - top + kh) for r in range(L.oh)]
        inside = [sum(0 <= i < h for i in rows) for rows in reads]
        assert kernel_rows(L, Exact) == sum(inside)
        assert empty_rows(L, Exact) == inside.count(0)


def test_a_stem_that_does_not_fit_is_split():
    """A 5 KiB scratchpad holds each layer alone, not the stem's windows, intermediates and weights together
    (6 KiB does since a clamp's bounds are held once a layer): no cascade of the three, and the output is
    still right."""
    model, x = stem(hidden=32, size=24)
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=5 * 1024, accumulator_bytes=8 * 1024)
    c = run(PIPELINE[:position("schedule") + 1], Compilation(Request(model, (x,), hw=hw)))
    (chain,) = cascade_map.chains(c.graph, c.layout, dict(c.schedule.tilings), ())
    assert cascade_map.map_cascade([c.schedule[n.name].nests[0] for n in chain], hw, "edp") is None
    assert all(len(cascade.layers) < 3 for cascade in c.schedule.cascades)
    check_fused_against_unfused(model, x, hw)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel=st.sampled_from([(3, 1, 1), (5, 2, 1), (2, 0, 1), (1, 0, 1), (3, 2, 2)]),
       stride=st.sampled_from([1, 2, 3]), size=st.integers(6, 20),
       dw=st.sampled_from([(3, 1, 1), (3, 2, 1), (5, 1, 2), (3, 1, 0)]),
       array=st.sampled_from([4, 8]), spad_kib=st.sampled_from([16, 64]))
def test_random_stems_on_random_hardware(kernel, stride, size, dw, array, spad_kib):
    """Random first convs (kernel, padding, dilation, stride) before random depthwise convs: fused or split,
    the output is the unfused program's within 1e-5 and every cascade fits the memories."""
    k, padding, dilation = kernel
    size = max(size, (dw[0] - 1) * stride + (k - 1) * dilation + 1)    # the depthwise's kernel in its input
    model, x = stem(k, stride, padding, size=size, dw=dw, seed=size, dilation=dilation)
    hw = HardwareConfig(array_rows=array, array_cols=array, scratchpad_bytes=spad_kib * 1024,
                        accumulator_bytes=16 * 1024)
    check_fused_against_unfused(model, x, hw)
