"""stagec.codesign on the buildable grid, checked against the simulator: the exact model across hardware
configs, the grid search against exhaustive search, the constraints, DRAM bandwidth's price; and
stagec.sensitivities against finite differences of the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from helpers import TwoConvs, seeded_graph
from scipy.stats import spearmanr

import stagec
from stagec.codesigning import Workloads, codesign_graphs
from stagec.costmodel.codesign import CodesignSettings
from stagec.costmodel.grid import BuildableGrid, fit_banks
from stagec.costmodel.model import DEFAULT_CONSTANTS
from stagec.costmodel.rounding import area_of
from stagec.isa import HardwareConfig
from stagec.layers import measure, model_layers
from stagec.pipeline import lower_graph
from stagec.report import make_report
from stagec.sim.timing import timeline

# a small grid and a short descent: the search is what is tested, not the descent's polish
SMALL = CodesignSettings(steps=30, array_range=(4.0, 16.0), memory_range=(32768.0, 131072.0), starts=2, confirm=2,
                         report_every=0)


@pytest.fixture(scope="module")
def two_convs():
    return seeded_graph(TwoConvs(), (1, 8, 20, 20))


def test_exact_model_agrees_with_the_simulator_across_hardware():
    """Each layer on the compiler's mapping for each config (what codesign scores configs by): the
    exact model's cycles against the simulator's, over array shapes, dataflows, memories and
    bandwidths (experiments/codesign_grid.py: the same on 40 configs per layer)."""
    layers = [seeded_graph(torch.nn.Conv2d(160, 320, 1), (1, 160, 14, 14)),
              seeded_graph(torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU()),
                           (1, 16, 14, 14)),
              seeded_graph(torch.nn.Linear(64, 96), (32, 64))]
    rng = np.random.default_rng(0)
    predicted, simulated = [], []
    for graph in layers:
        work, layer = Workloads([graph], "latency", DEFAULT_CONSTANTS), model_layers(graph)[0]
        for _ in range(8):
            hw = fit_banks(HardwareConfig(
                array_rows=int(rng.choice([4, 8, 12, 16, 24])), array_cols=int(rng.choice([4, 8, 12, 16, 24])),
                dataflow=str(rng.choice(["weight_stationary", "output_stationary"])),
                scratchpad_bytes=int(rng.choice([32, 64, 96, 160])) * 1024,
                accumulator_bytes=int(rng.choice([16, 32, 64])) * 1024,
                dma_bandwidth_bytes_per_cycle=float(rng.choice([4, 8, 16, 32]))))
            found = work.evaluate(hw)
            if found is not None:
                predicted.append(float(found[0][0]))
                simulated.append(measure(graph, layer, work.mapping(layer, hw), hw)[0])
    assert len(simulated) >= 20
    error = np.abs(np.array(predicted) / np.array(simulated) - 1)
    assert spearmanr(predicted, simulated).statistic >= 0.95
    assert np.median(error) <= 0.05


def test_codesign_lands_within_5_percent_of_exhaustive_search_over_its_grid():
    """Every grid config under the budget, compiled and timed, against codesign over the same grid."""
    graph = seeded_graph(torch.nn.Conv2d(64, 128, 1), (1, 64, 12, 12))
    settings = CodesignSettings(**{**vars(SMALL), "bandwidth_range": (16.0, 16.0), "memory_range": (32768.0, 65536.0)})
    budget = area_of(HardwareConfig(array_rows=12, array_cols=12, scratchpad_bytes=64 * 1024,
                                    accumulator_bytes=32 * 1024))
    grid, layer = settings.grid(), model_layers(graph)[0]
    work = Workloads([graph], "latency", DEFAULT_CONSTANTS)
    best = np.inf
    for r, c, sp, acc, df in itertools.product(*(grid.values(n) for n in ("array_rows", "array_cols",
                                                                            "scratchpad_bytes", "accumulator_bytes")),
                                               ("weight_stationary", "output_stationary")):
        hw = HardwareConfig(array_rows=r, array_cols=c, scratchpad_bytes=sp, accumulator_bytes=acc, dataflow=df)
        if area_of(hw) <= budget and work.evaluate(hw) is not None:
            best = min(best, measure(graph, layer, work.mapping(layer, hw), hw)[0])
    result = codesign_graphs([graph], budget, settings=settings, progress=False)
    assert result.area_mm2 <= budget
    assert result.reports[0].cycles <= 1.05 * best
    assert result.evaluated < 200            # scored by the exact model, not every grid config
    assert result.hw.array_rows in grid.values("array_rows") and result.hw.scratchpad_bytes % (32 * 1024) == 0


def test_codesign_respects_area_power_and_latency_on_the_simulator(two_convs):
    area, watts, seconds = 2.2, 2.0, 30e-6
    result = codesign_graphs([two_convs], area, "latency", power_budget_w=watts, latency_targets_s=[seconds],
                             settings=SMALL, tune_settings=stagec.TuneSettings(starts=4, steps=20, chunk=10))
    report = result.reports[0]
    energy = sum(report.energy_pj.values())
    assert result.area_mm2 <= area and sum(report.area_mm2.values()) == pytest.approx(result.area_mm2)
    assert energy * 1e-12 / report.latency_s <= watts                # the simulator's power, not the model's
    assert report.latency_s <= seconds
    assert result.ratios["latency[0]"] == pytest.approx(report.latency_s / seconds)
    assert set(result.binding) <= {"area", "power", "latency[0]"} and str(result).startswith("codesign for latency")
    smallest = codesign_graphs([two_convs], None, "area", latency_targets_s=seconds, settings=SMALL, progress=False)
    assert smallest.reports[0].latency_s <= seconds and smallest.area_mm2 <= result.area_mm2
    assert "latency[0]" in smallest.binding        # a smaller config is slower than the target
    narrow = CodesignSettings(**{**vars(SMALL), "array_range": (4.0, 8.0), "memory_range": (32768.0, 65536.0)})
    with pytest.raises(stagec.InputError, match="no buildable config meets the constraints"):   # (on a small grid:
        codesign_graphs([two_convs], area, latency_targets_s=1e-7, settings=narrow, progress=False)   # every one)
    with pytest.raises(stagec.InputError, match="latency_targets_s"):
        codesign_graphs([two_convs], area, latency_targets_s=[1.0, 2.0], settings=SMALL, progress=False)


def test_bandwidth_is_priced_so_it_stops_short_of_its_range(two_convs):
    """With a free DRAM interface bandwidth runs to the top of its range; priced, it stops lower."""
    free = HardwareConfig(area_mm2_per_dram_byte_per_cycle=0.0, dram_phy_mw_per_byte_per_cycle=0.0)
    chosen = [codesign_graphs([two_convs], 1.8, hw=hw, settings=SMALL, progress=False).hw
              for hw in (free, HardwareConfig())]
    assert chosen[0].dma_bandwidth_bytes_per_cycle == SMALL.bandwidth_range[1]
    assert chosen[1].dma_bandwidth_bytes_per_cycle < chosen[0].dma_bandwidth_bytes_per_cycle


def test_grid_steps_by_four_and_by_32_kib():
    grid = BuildableGrid(array_range=(1, 64))
    assert grid.values("array_rows") == (1, 2, *range(4, 65, 4))
    assert grid.step("accumulator_bytes", 16 * 1024, +1) == 32 * 1024
    assert grid.bracket("array_cols", 13.5) == (12, 16)
    assert all(area_of(hw) > 0 for hw in grid.neighbours(HardwareConfig()))


def test_sensitivities_match_finite_differences_of_the_simulator(two_convs):
    from stagec.plots import sensitivity_figure
    from stagec.sensitivity import graph_sensitivities
    hw = HardwareConfig()
    s = graph_sensitivities(two_convs, hw)
    program = lower_graph(two_convs, hw)
    base = make_report(program)
    assert s.latency_s == pytest.approx(base.latency_s) and s.energy_pj == pytest.approx(sum(base.energy_pj.values()))
    for name in ("dma_bandwidth_bytes_per_cycle", "dma_latency_cycles"):
        step = getattr(hw, name) * 1e-3
        fd = (timeline(program, hw.replace(**{name: getattr(hw, name) + step})).cycles
              - timeline(program, hw.replace(**{name: getattr(hw, name) - step})).cycles) / (2 * step) / hw.clock_hz
        assert s[name].latency_s == pytest.approx(fd, rel=1e-2, abs=1e-12)
        assert sum(v[0] for v in s[name].per_layer.values()) == pytest.approx(s[name].latency_s, rel=1e-4)
    dram = base.actions.dram_read_bytes + base.actions.dram_write_bytes
    assert s["energy_pj_per_dram_byte"].energy_pj == pytest.approx(dram, rel=1e-5)
    assert s["clock_hz"].latency_s == pytest.approx(-base.cycles / hw.clock_hz ** 2)
    assert s["dma_bandwidth_bytes_per_cycle"].area_mm2 == pytest.approx(hw.area_mm2_per_dram_byte_per_cycle)
    moved = make_report(lower_graph(two_convs, hw.replace(array_cols=20)))     # one grid step
    rows = s["array_cols"]
    assert (rows.kind, rows.to) == ("step", 20)
    assert rows.latency_s == pytest.approx(moved.latency_s - base.latency_s)
    assert rows.area_mm2 == pytest.approx(sum(moved.area_mm2.values()) - sum(base.area_mm2.values()))
    assert s.best_latency_per_mm2() in {f.name for f in s.fields if f.area_mm2 > 0}
    assert len(sensitivity_figure(s, "two convs").axes) == 4
