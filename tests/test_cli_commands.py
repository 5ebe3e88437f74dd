"""The model commands run as a user runs them, in a subprocess: compile, run, tune, codesign and hw,
with their errors (one line, non-zero exit) and the latency target's verdict (exit 3, slack printed).
Tiny models keep it fast: the tuner has nothing to tune in an elementwise model."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from stagec import presets
from stagec.lower.schedule.nest import TileMapping
from stagec.program_file import load
from stagec.sim.energy import area_mm2
from stagec.tuning import Tuning

FACTORIES = textwrap.dedent('''
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2.0 + 1.0)

    def affine():
        return Affine(), (torch.randn(4, 16),)

    def conv():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(8, 4, 1)).eval()
        return model, (torch.randn(1, 3, 8, 8),)

    def block():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU(),
                                    torch.nn.Conv2d(16, 4, 1)).eval()
        return model, (torch.randn(1, 3, 16, 16),)
''')


def stagec(*args, cwd):
    return subprocess.run([sys.executable, "-m", "stagec", *map(str, args)], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "models.py").write_text(FACTORIES)
    return tmp_path


def one_line(out, command: str, status: int) -> str:
    assert out.returncode == status, out.stderr
    assert out.stderr.startswith(f"stagec {command}: ") and out.stderr.count("\n") == 1, out.stderr
    return out.stderr


def test_compile_then_run_matches_pytorch(work):
    model, (x,) = _factory(work, "conv")
    np.save(work / "x.npy", x.numpy())
    out = stagec("compile", "models.py:conv", "-o", "m.stgc", "--hw", "edge32", "--dump", "schedule", "--quiet",
                 "--stablehlo", "m.mlir", cwd=work)
    assert out.returncode == 0, out.stderr
    assert "==== schedule ====" in out.stdout and "memory: peak scratchpad" in out.stdout
    assert "verdict: " in out.stdout and "no latency or power target given" in out.stdout
    out = stagec("run", "m.stgc", "--input", "x.npy", "--output", "y.npy", "--report", "rep", cwd=work)
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(np.load(work / "y.npy"), model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    report = json.loads((work / "rep" / "report.json").read_text())
    assert report["hw"]["array_rows"] == 32 and report["memory"]["dram"] > 0
    trace = json.loads((work / "rep" / "trace.json").read_text())["traceEvents"]
    busy = sum(e["args"]["cycles"] for e in trace if e["ph"] == "X" and e["cat"] != "dram")
    assert busy == pytest.approx(sum(report["busy_cycles"].values()))
    assert (work / "rep" / "layers.csv").read_text().count("\n") == len(report["layers"]) + 1
    assert "func.func public @main" in (work / "m.mlir").read_text()


def _factory(work, name):
    sys.path.insert(0, str(work))
    try:
        return getattr(__import__("models"), name)()
    finally:
        sys.path.remove(str(work))
        sys.modules.pop("models", None)


def test_an_unmeetable_latency_target_exits_3_with_the_slack(work):
    out = stagec("compile", "models.py:affine", "-o", "m.stgc", "--latency-target", "1ns", "--power-budget", "10W",
                 cwd=work)
    assert out.returncode == 3, out.stderr
    assert "latency target 1e-06 ms" in out.stdout and "MISSED by" in out.stdout
    assert "power target 1e+04 mW" in out.stdout and ", met; slack +" in out.stdout
    assert "verdict: MISSED" in out.stdout and "latency slack -" in out.stdout
    assert "the gradient tuner's mappings for latency" in out.stdout   # what compile tried
    # the saved program keeps its targets: run reports the same verdict
    np.save(work / "x.npy", np.ones((4, 16), np.float32))
    out = stagec("run", "m.stgc", "--input", "x.npy", "--output", "y.npy", "--quiet", cwd=work)
    assert out.returncode == 3 and "verdict: MISSED" in out.stdout
    np.testing.assert_array_equal(np.load(work / "y.npy"), np.full((4, 16), 3.0, np.float32))


def test_tune_writes_mappings_that_compile_takes(work):
    out = stagec("tune", "models.py:affine", "-o", "maps.json", "--steps", "1", "--quiet", cwd=work)
    assert out.returncode == 0, out.stderr
    assert Tuning.load(work / "maps.json").objective == "edp"
    out = stagec("compile", "models.py:affine", "--mappings", "maps.json", "-o", "m.stgc", "-q", cwd=work)
    assert out.returncode == 0, out.stderr
    (work / "bad.json").write_text('{"mappings": {"x": {"tile_oh": 1}}}')
    err = one_line(stagec("compile", "models.py:affine", "--mappings", "bad.json", "-o", "m.stgc", cwd=work),
                   "compile", 2)
    assert "bad.json: not a stagec tuning" in err


def test_a_tuning_round_trips_through_json(tmp_path):
    tuning = Tuning({"0/conv": TileMapping(2, 4, 8, 16, True, False, True, False, False)}, 1.5, 3.0, "latency", 7,
                    ("0/conv",))
    tuning.save(tmp_path / "t.json")
    assert Tuning.load(tmp_path / "t.json") == tuning


def test_calibration_folder_and_quantize(work):
    (work / "cal").mkdir()
    for k in range(2):
        np.save(work / "cal" / f"b{k}.npy", np.random.default_rng(k).normal(size=(1, 3, 8, 8)).astype(np.float32))
    out = stagec("compile", "models.py:conv", "--hw", "wearable", "--quantize", "int8", "--calibration", "cal",
                 "-o", "m.stgc", "-q", cwd=work)
    assert out.returncode == 0, out.stderr
    assert "MACs by precision: int8 " in out.stdout
    err = one_line(stagec("compile", "models.py:affine", "--calibration", "cal", "-o", "m.stgc", cwd=work),
                   "compile", 2)
    assert "--calibration needs --quantize int8" in err


def test_a_saved_torch_export_program_compiles_and_garbage_is_one_line(work):
    model, args = _factory(work, "affine")
    torch.export.save(torch.export.export(model, args), work / "affine.pt2")
    (work / "garbage.pt2").write_bytes(b"not a zip file at all")
    out = stagec("compile", "affine.pt2", "-o", "m.stgc", "-q", cwd=work)
    assert out.returncode == 0, out.stderr
    err = one_line(stagec("compile", "garbage.pt2", "-o", "m.stgc", cwd=work), "compile", 2)
    assert "garbage.pt2: not a torch.export program" in err


@pytest.mark.parametrize("argv, status, message", [
    (["compile", "models.py:affine", "-o", "m.stgc", "--latency-target", "5parsecs"], 2, "latency '5parsecs'"),
    (["compile", "models.py:affine", "-o", "m.stgc", "--hw", "nope"], 1,
     "--hw 'nope' is neither a preset (default, edge32, gemmini, wearable)"),
    (["compile", "missing.py:f", "-o", "m.stgc"], 1, "missing.py: No such file or directory"),
    (["compile", "models.py:affine"], 2, "the following arguments are required: -o/--output"),
    (["run", "missing.stgc", "--input", "x.npy", "--output", "y.npy"], 1, "missing.stgc: No such file"),
    (["hw", "show", "nope"], 1, "hw show 'nope' is neither a preset"),
    (["codesign", "models.py:affine", "--out", "d"], 2, "--area-budget"),
])
def test_bad_arguments_name_what_is_wrong(argv, status, message, work):
    out = stagec(*argv, cwd=work)
    assert out.returncode == status and message in out.stderr, out.stderr


def test_every_command_shows_an_example(work):
    for command in ("compile", "run", "tune", "codesign", "hw"):
        out = stagec(command, "--help", cwd=work)
        assert out.returncode == 0 and f"example:\n  stagec {command}" in out.stdout


def test_hw_list_and_show_give_area_and_peak(work):
    out = stagec("hw", "list", cwd=work)
    assert out.returncode == 0 and [line.split()[0] for line in out.stdout.splitlines()] == list(presets.names())
    out = stagec("hw", "show", "wearable", cwd=work)
    wearable = presets.load("wearable")
    assert out.returncode == 0 and "wearable-class int8 accelerator" in out.stdout
    assert f"area: {sum(area_mm2(wearable).values()):.3f} mm^2" in out.stdout
    assert ("peak: fp32 64 MACs/cycle = 64.0 GOPS, bf16 128 MACs/cycle = 128.0 GOPS, "
            "int8 256 MACs/cycle = 256.0 GOPS at 500 MHz") in out.stdout   # a PE packs 4 int8, 2 bf16


def test_presets_are_the_documented_configs():
    wearable, gemmini, edge = (presets.load(n) for n in ("wearable", "gemmini", "edge32"))
    assert (wearable.array_rows, wearable.scratchpad_bytes, wearable.dma_bandwidth_bytes_per_cycle,
            wearable.clock_hz) == (8, 128 * 1024, 4.0, 5e8)
    area = area_mm2(wearable)   # about 0.5 mm^2 of compute and SRAM; the DRAM interface is priced apart
    assert 0.45 <= sum(area.values()) - area["dram_interface"] <= 0.55
    assert area["dram_interface"] == pytest.approx(0.039 * 4.0)
    assert gemmini.peak_macs_per_cycle == 256
    assert edge.peak_macs_per_cycle == 1024 and presets.load("default") == presets.HardwareConfig()


def test_optimise_size_takes_less_scratchpad_than_performance(work):
    peaks = {}
    for goal in ("performance", "size"):
        out = stagec("compile", "models.py:conv", "--optimise", goal, "-o", f"{goal}.stgc", "-q", cwd=work)
        assert out.returncode == 0, out.stderr
        line = next(li for li in out.stdout.splitlines() if li.startswith("memory: peak scratchpad"))
        peaks[goal] = float(line.split()[3])
    assert peaks["size"] < peaks["performance"]


def test_no_fusion_compiles_layer_by_layer(work):
    for flags, name in (((), "fused"), (("--no-fusion",), "alone")):
        out = stagec("compile", "models.py:block", *flags, "-o", f"{name}.stgc", "-q", cwd=work)
        assert out.returncode == 0, out.stderr
    assert len(load(work / "fused.stgc").metadata["cascades"]) == 1
    assert "cascades" not in load(work / "alone.stgc").metadata


def test_codesign_writes_the_config_and_each_report(work):
    # layer by layer: co-design's fused pricing is tested in tests/test_fusion_cost.py, and its descent
    # compiles for half a minute more
    out = stagec("codesign", "models.py:conv", "--area-budget", "2.0", "--steps", "2", "--latency-target", "1s",
                 "--no-fusion", "--out", "cd", "-q", cwd=work)
    assert out.returncode == 0, out.stderr
    hw = presets.HardwareConfig.load(work / "cd" / "hw.yaml")
    assert sum(area_mm2(hw).values()) <= 2.0
    assert json.loads((work / "cd" / "models" / "report.json").read_text())["targets"]["met"]
    assert (work / "cd" / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert "area_mm2" in (work / "cd" / "pareto.txt").read_text().splitlines()[0]
