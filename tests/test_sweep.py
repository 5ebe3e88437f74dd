"""stagec.sweep: points, resumption, failures as rows, Ray with a worker killed mid-sweep, Pareto fronts."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import stagec
from stagec.costmodel.batch import exact_cost
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.problem import mapping_arrays, stack
from stagec.errors import InputError
from stagec.isa import HardwareConfig
from stagec.layers import model_layers
from stagec.lower.schedule.mapper import default_mapping
from stagec.pipeline import build_graph, lower_graph
from stagec.report import make_report
from stagec.sweeps import TIMING_FIELDS, Range, SweepResults, load_results
from stagec.sweeps.space import hardware_grid, option_grid

# 6 points, 2 infeasible: a scratchpad no tiling fits, and one isa/config.py rejects (not a multiple of its banks)
SPACE = {"array_rows": [4, 8], "scratchpad_bytes": [64, 1002, 32 * 1024]}


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 1)).eval()
    return build_graph(model, (torch.randn(1, 4, 8, 8),))[1]


def _instructions(report) -> dict:
    return {"instructions": sum(report.instructions.values())}


def _rows_without_timing(results: SweepResults) -> dict:
    return {r["id"]: {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in results.rows}


def test_a_local_sweep_simulates_each_point_records_failures_and_resumes(graph, tmp_path):
    out = tmp_path / "sweep.jsonl"
    first = stagec.sweep({"net": graph}, SPACE, out=out, executor="local", progress=False, measure=_instructions)
    assert first.computed == 6 and len(first.rows) == 6
    errors = {(r["array_rows"], r["scratchpad_bytes"]): r["error"] for r in first.rows if r["error"]}
    assert set(errors) == {(rows, spad) for rows in (4, 8) for spad in (64, 1002)}
    assert all(e.startswith("ConfigError") for k, e in errors.items() if k[1] == 1002)
    assert all(e.startswith("TilingError") for k, e in errors.items() if k[1] == 64)
    for r in first.ok():   # each row is what compiling and timing that config gives
        report = make_report(lower_graph(graph, HardwareConfig(array_rows=r["array_rows"],
                                                               scratchpad_bytes=r["scratchpad_bytes"])))
        assert r["cycles"] == report.cycles
        assert r["energy_pj"] == pytest.approx(sum(report.energy_pj.values()))
        assert r["area_mm2"] == pytest.approx(sum(report.area_mm2.values()))
        assert r["instructions"] == sum(report.instructions.values())
        assert 0 < r["peak_scratchpad_bytes"] <= r["scratchpad_bytes"]
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and len({json.loads(line)["id"] for line in lines}) == 6
    again = stagec.sweep({"net": graph}, SPACE, out=out, executor="local", progress=False, measure=_instructions)
    assert again.computed == 0 and out.read_text().splitlines() == lines
    assert _rows_without_timing(again) == _rows_without_timing(first)


def test_an_interrupted_results_file_resumes_from_its_complete_rows(graph, tmp_path):
    out = tmp_path / "sweep.jsonl"
    space = {"array_rows": [4, 8]}
    stagec.sweep({"net": graph}, space, out=out, executor="local", progress=False)
    first, second = out.read_text().splitlines()
    out.write_text(first + "\n" + second[:len(second) // 2])      # killed while writing the second row
    resumed = stagec.sweep({"net": graph}, space, out=out, executor="local", progress=False)
    assert resumed.computed == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == \
        [json.loads(first)["id"], json.loads(second)["id"]]


def _kill_once(report) -> dict:
    """A measure that kills its own worker process the first time it sees the 8-row array."""
    marker = Path(os.environ["STAGEC_TEST_KILL_MARKER"])
    if report.hw.array_rows == 8 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return _instructions(report)


def test_a_ray_sweep_survives_a_killed_worker_and_equals_the_local_sweep(graph, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers do not import the tests
    marker = tmp_path / "killed"
    monkeypatch.setenv("STAGEC_TEST_KILL_MARKER", str(marker))    # the Ray workers inherit it
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        distributed = stagec.sweep({"net": graph}, SPACE, out=tmp_path / "ray.jsonl", executor="ray",
                                   progress=False, measure=_kill_once)
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert marker.exists() and int(marker.read_text()) != os.getpid()   # a worker died, not this process
    ids = [json.loads(line)["id"] for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert len(ids) == 6 and len(set(ids)) == 6                          # every point exactly once
    assert len({r["worker"] for r in distributed.rows}) >= 2
    local = stagec.sweep({"net": graph}, SPACE, out=tmp_path / "local.jsonl", executor="local", progress=False,
                         measure=_kill_once)                              # the marker is there: no kill
    assert _rows_without_timing(distributed) == _rows_without_timing(local)


def test_costmodel_sweep_is_the_cost_model_per_point_and_near_the_simulator(graph, tmp_path):
    space = {"array_rows": [4, 8], "array_cols": [4, 16], "scratchpad_bytes": [64, 32 * 1024]}
    kw = dict(out=tmp_path / "sweep.jsonl", executor="local", progress=False)
    predicted = {(r["array_rows"], r["array_cols"], r["scratchpad_bytes"]): r
                 for r in stagec.sweep({"net": graph}, space, mode="costmodel", **kw).rows}
    simulated = stagec.sweep({"net": graph}, space, **kw).rows
    assert len(predicted) == len(simulated) == 8
    layers = model_layers(graph)
    for r in simulated:
        p = predicted[r["array_rows"], r["array_cols"], r["scratchpad_bytes"]]
        assert (p["error"] is None) == (r["error"] is None)
        if r["error"] is not None:
            continue
        hw = HardwareConfig(array_rows=r["array_rows"], array_cols=r["array_cols"],
                            scratchpad_bytes=r["scratchpad_bytes"])
        maps = [default_mapping(L.kind, L.problem, hw, L.extras, L.name, "edp") for L in layers]
        alone = exact_cost(stack([L.shape() for L in layers]), stack([mapping_arrays(m) for m in maps]),
                           hardware_point(hw))   # this point alone, one hardware point for its layers
        assert p["cycles"] == pytest.approx(float(np.sum(alone.cycles)), rel=1e-6)
        assert p["energy_pj"] == pytest.approx(float(np.sum(alone.energy_pj)), rel=1e-5)
        # the simulator overlaps one layer's tail with the next one's start; the cost model adds them up
        assert p["cycles"] == pytest.approx(r["cycles"], rel=0.1)
        assert p["area_mm2"] == pytest.approx(r["area_mm2"])


def test_pareto_front_is_every_undominated_feasible_row(tmp_path):
    rng = np.random.default_rng(0)
    rows = [{"id": str(i), "model": "ab"[i % 2], "area_mm2": float(a), "latency_s": float(t),
             "error": "TilingError: x" if i % 7 == 0 else None}
            for i, (a, t) in enumerate(rng.integers(1, 20, (60, 2)))]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = load_results(path)
    front = results.pareto()
    ok = [r for r in rows if r["error"] is None]

    def dominated(r):
        return any(o["model"] == r["model"] and o["area_mm2"] <= r["area_mm2"] and o["latency_s"] <= r["latency_s"]
                   and (o["area_mm2"], o["latency_s"]) != (r["area_mm2"], r["latency_s"]) for o in ok)

    points = {(r["model"], r["area_mm2"], r["latency_s"]) for r in ok if not dominated(r)}
    assert {(r["model"], r["area_mm2"], r["latency_s"]) for r in front} == points
    assert len(front) == len(points)                     # one row per undominated point
    assert len(results.pareto_table().splitlines()) == len(front) + 2
    assert len(results.figure().axes) == 4   # a row of two fronts per model


def test_spaces_grid_and_sample_and_reject_unknown_names():
    grid = hardware_grid({"array_rows": [4, 8], "scratchpad_bytes": Range(1024, 4096, 1024)})
    assert len(grid) == 8 and {"array_rows": 8, "scratchpad_bytes": 3072} in grid
    sample = hardware_grid({"array_rows": Range(2, 64), "dma_bandwidth_bytes_per_cycle": Range(4.0, 32.0)},
                           samples=20, seed=3)
    assert sample == hardware_grid({"array_rows": Range(2, 64), "dma_bandwidth_bytes_per_cycle": Range(4.0, 32.0)},
                                   samples=20, seed=3)
    assert all(isinstance(p["array_rows"], int) and 2 <= p["array_rows"] <= 64 for p in sample)
    assert len(option_grid({"quantize": [None, "int8"], "objective": ["latency", "edp"]})) == 4
    with pytest.raises(InputError, match="array_row"):
        hardware_grid({"array_row": [4]})
    listed = [{"array_rows": 4, "scratchpad_bytes": 2048}, {"array_rows": 12}, {"dataflow": "output_stationary"}]
    assert hardware_grid(listed) == listed                  # a space no product describes, as given
    drawn = hardware_grid(listed, samples=2, seed=1)
    assert len(drawn) == 2 and drawn[0] != drawn[1] and all(c in listed for c in drawn)
    for bad in ([{"array_row": 4}], [], [4], "array_rows"):
        with pytest.raises(InputError, match="array_row|hardware space"):
            hardware_grid(bad)
    with pytest.raises(InputError, match="precision"):
        option_grid({"precision": ["int8"]})
    with pytest.raises(InputError, match="quantize"):
        option_grid({"quantize": ["int4"]})


def test_the_sweep_command_writes_rows_a_front_and_a_plot(tmp_path, capsys):
    from stagec.cli import main
    factory = tmp_path / "net.py"
    factory.write_text("import torch\n\ndef net():\n    torch.manual_seed(0)\n"
                       "    return torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1)).eval(), "
                       "(torch.randn(1, 4, 8, 8),)\n")
    out, plot = tmp_path / "sweep.jsonl", tmp_path / "pareto.png"
    assert main(["sweep", f"{factory}:net", "--hw", "array_rows=4,8", "--hw", "scratchpad_bytes=64:16448:16384",
                 "--executor", "local", "--out", str(out), "--plot", str(plot)]) == 0
    rows = load_results(out).rows
    assert sorted((r["array_rows"], r["scratchpad_bytes"]) for r in rows) == [(4, 64), (4, 16448), (8, 64), (8, 16448)]
    assert "4 points (4 computed now, 2 failed)" in capsys.readouterr().out and plot.stat().st_size > 0
    assert main(["sweep", f"{factory}:net", "--hw", "array_rows", "--executor", "local"]) == 2
    assert "expected FIELD=VALUES" in capsys.readouterr().err
