"""The report: per-layer records, totals, roofline, JSON, table, plots and the `stagec report` command."""

import dataclasses
import json

import numpy as np
import pytest
from timing_programs import pipeline, roomy_hw

from stagec.cli import main
from stagec.isa import Layer
from stagec.plots import write_plots
from stagec.report import make_report
from stagec.sim.timing import timeline


@pytest.fixture(scope="module")
def two_layer_program():
    """The pipeline program with its instructions split over two layers (first half, second half)."""
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=8.0, dma_latency_cycles=20.0)
    program = pipeline(6, 32, 64, 32, hw)
    ids = (np.arange(len(program)) >= len(program) // 2).astype(np.int32)
    layers = (Layer("first", "matmul", ((96, 64), (64, 32)), (96, 32), macs=96 * 64 * 32),
              Layer("second", "matmul", ((96, 64), (64, 32)), (96, 32), macs=96 * 64 * 32))
    return dataclasses.replace(program, layer_ids=ids, layers=layers, cache={})


def test_layer_cycles_add_up_and_spans_cover_them(two_layer_program):
    report = make_report(two_layer_program)
    tl = timeline(two_layer_program)
    assert report.cycles == tl.cycles
    assert sum(layer.cycles for layer in report.layers) == pytest.approx(report.cycles)
    first, second = report.layers
    assert first.start_cycle == 0 and second.end_cycle == pytest.approx(report.cycles)
    assert second.start_cycle < first.end_cycle                # the layers overlap in time
    assert first.cycles == pytest.approx(first.end_cycle)
    assert sum(first.instructions.values()) + sum(second.instructions.values()) == len(two_layer_program)


def test_roofline_bound_of_a_layer(two_layer_program):
    report = make_report(two_layer_program)
    hw = two_layer_program.hw
    roof = report.layers[0].roofline
    compulsory = (96 * 64 + 64 * 32 + 96 * 32) * 4
    assert roof["compulsory_bytes"] == compulsory
    assert roof["memory_cycles"] == pytest.approx(compulsory / hw.dma_bandwidth_bytes_per_cycle)
    assert roof["compute_cycles"] == pytest.approx(96 * 64 * 32 / hw.peak_macs_per_cycle)
    assert roof["bound"] == "memory" and roof["bound_cycles"] == roof["memory_cycles"]
    assert roof["achieved_over_bound"] == pytest.approx(report.layers[0].span_cycles / roof["bound_cycles"])
    assert report.roofline_cycles == pytest.approx(2 * roof["bound_cycles"])


def test_to_dict_is_strict_json_with_the_documented_keys(two_layer_program):
    report = make_report(two_layer_program)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert {"cycles", "latency_s", "instructions", "busy_cycles", "array_utilization", "bytes", "energy_pj",
            "area_mm2", "roofline_cycles", "cycles_over_roofline", "layers", "hw"} <= set(data)
    assert data["latency_s"] == pytest.approx(report.cycles / two_layer_program.hw.clock_hz)
    assert data["energy_pj"]["total"] == pytest.approx(sum(v for k, v in data["energy_pj"].items() if k != "total"))
    layer = data["layers"][0]
    assert {"name", "op", "macs", "cycles", "span_cycles", "busy_cycles", "bytes", "energy_pj",
            "roofline"} <= set(layer)
    assert layer["bytes"]["dram"]["read"] > 0 and set(layer["busy_cycles"]) == {"load", "matrix", "vector", "store"}
    assert sum(lay["energy_pj"]["dram"] for lay in data["layers"]) == pytest.approx(data["energy_pj"]["dram"])


def test_summary_table(two_layer_program):
    text = make_report(two_layer_program).summary()
    assert "first" in text and "second" in text
    assert "roofline bounds" in text and "energy:" in text and "area:" in text


def test_plots_are_png_and_svg(two_layer_program, tmp_path):
    paths = write_plots(make_report(two_layer_program), tmp_path, "pipeline")
    assert sorted(p.name for p in paths) == sorted(f"{k}.{s}" for k in ("timeline", "roofline", "layers")
                                                  for s in ("png", "svg"))
    for p in paths:
        head = p.read_bytes()[:64]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in p.read_bytes()[:2000]


def test_report_command_on_a_saved_program(two_layer_program, tmp_path, capsys):
    path = tmp_path / "p.stgc"
    two_layer_program.save(path)
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "second" in capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["cycles"] == pytest.approx(make_report(two_layer_program).cycles)
    assert (tmp_path / "out" / "timeline.svg").exists()
    assert json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    assert (tmp_path / "out" / "layers.csv").read_text().splitlines()[0].startswith("layer,op,")
    assert main(["report", str(path), "--hw", "x.yaml", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("stagec report: --hw applies to the demo model; a saved program keeps its own "
                                       "config\n")


def test_roofline_bytes_are_exact_for_any_layer_shape(two_layer_program):
    huge = Layer("huge", "matmul", ((2**32, 2**32), (2**32, 1)), (2**32, 1), macs=0)
    program = dataclasses.replace(two_layer_program, layers=(huge, two_layer_program.layers[1]), cache={})
    roof = make_report(program).to_dict()["layers"][0]["roofline"]
    assert roof["compulsory_bytes"] == (2**64 + 2 * 2**32) * 4 and roof["memory_cycles"] > 0


def test_model_limit_is_the_hand_computed_bound():
    """Two Linear layers: the limit counts both layers' MACs, the weights and biases read once (the first's
    in its clamp table behind the ReLU's 16-byte header, padded as the blob places arrays, to 64 bytes), the
    model's input read once and its output written once -- the hidden activation is not compulsory."""
    import torch

    import stagec
    from stagec.isa import HardwareConfig
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(48, 64)
    hw = HardwareConfig(array_rows=8, array_cols=8, dma_bandwidth_bytes_per_cycle=4.0)
    program = stagec.compile(model, (x,), hw=hw)
    report = make_report(program)
    macs = 48 * 64 * 128 + 48 * 128 * 32
    weights = (64 * 128 + 128 * 32 + 32) * 4 + -(-(4 + 128) * 4 // 64) * 64
    compulsory = weights + (48 * 64 + 48 * 32) * 4
    limit = report.model_limit
    assert limit["macs"] == macs and limit["compute_cycles"] == pytest.approx(macs / 64)
    assert limit["compulsory_bytes"] == compulsory
    assert limit["memory_cycles"] == pytest.approx(limit["compulsory_bytes"] / 4.0)
    assert limit["bound_cycles"] == pytest.approx(max(macs / 64, limit["compulsory_bytes"] / 4.0))
    assert report.cycles_over_model_limit == pytest.approx(report.cycles / limit["bound_cycles"])
    assert report.cycles_over_model_limit >= 1.0
    assert report.to_dict()["cycles_over_model_limit"] == report.cycles_over_model_limit
    assert "model limit:" in report.summary()
