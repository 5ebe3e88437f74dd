"""Exports: the Chrome/Perfetto trace, the per-layer CSV and the StableHLO text."""

import csv
import json
from collections import defaultdict

import numpy as np
import pytest
import torch

import stagec
from stagec.exports import TRACKS, stablehlo_text, write_csv, write_trace
from stagec.isa import HardwareConfig
from stagec.report import UNITS

COMPLETE_KEYS = {"ph", "ts", "dur", "pid", "tid", "name"}


@pytest.fixture(scope="module")
def conv_report():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 64, 10))
    x = torch.randn(1, 3, 8, 8)
    hw = HardwareConfig(clock_hz=5e8, scratchpad_bytes=16 * 1024)   # small tiles: many instructions per layer
    _, report = stagec.simulate(stagec.compile(model.eval(), (x,), hw=hw), x)
    return report


def _slices(path):
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M") and {"pid", "tid", "name"} <= set(e)
    return trace, [e for e in events if e["ph"] == "X"]


def test_trace_is_chrome_trace_events_one_track_per_unit(conv_report, tmp_path):
    trace, slices = _slices(write_trace(conv_report, tmp_path / "t.json"))
    thread_names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert thread_names == dict(enumerate(TRACKS))
    us_per_cycle = 1e6 / conv_report.clock_hz
    by_track = defaultdict(list)
    for e in slices:
        assert COMPLETE_KEYS <= set(e) and e["dur"] >= 0 and e["ts"] >= 0
        assert e["ts"] == pytest.approx(e["args"]["start_cycle"] * us_per_cycle)
        assert e["dur"] == pytest.approx(e["args"]["cycles"] * us_per_cycle)
        by_track[TRACKS[e["tid"]]].append((e["args"]["start_cycle"], e["args"]["cycles"], e["args"]["instructions"]))
    for track, spans in by_track.items():
        spans.sort()
        for (s0, d0, _), (s1, _, _) in zip(spans, spans[1:], strict=False):
            assert s1 >= s0 + d0, f"{track}: slices overlap at cycle {s1}"
    for unit in UNITS:
        assert sum(d for _, d, _ in by_track[unit]) == pytest.approx(conv_report.busy_cycles[unit], rel=1e-9)
        assert sum(n for *_, n in by_track[unit]) == conv_report.instructions[unit]
    transfers = conv_report.instructions["load"] + conv_report.instructions["store"]
    assert sum(n for *_, n in by_track["dram"]) == transfers
    assert max(s + d for s, d, _ in by_track["dram"]) == pytest.approx(conv_report.cycles)


def test_trace_slices_are_named_by_layer_and_merge_only_back_to_back_runs(conv_report, tmp_path):
    _, slices = _slices(write_trace(conv_report, tmp_path / "t.json"))
    layer_names = {layer.name for layer in conv_report.layers}
    assert {e["name"] for e in slices} <= layer_names | {"(no layer)"}
    assert layer_names <= {e["name"] for e in slices}
    matrix = [e for e in slices if TRACKS[e["tid"]] == "matrix"]
    assert len(matrix) < conv_report.instructions["matrix"]     # runs are merged ...
    tl = conv_report.timeline
    ends = set(np.round(tl.end[tl.queue == UNITS.index("matrix")], 6))
    for e in matrix:   # ... and a merged slice ends where one of its instructions ends
        assert round(e["args"]["start_cycle"] + e["args"]["cycles"], 6) in ends


def test_csv_has_a_row_per_layer_that_adds_up_to_the_report(conv_report, tmp_path):
    with write_csv(conv_report, tmp_path / "layers.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["layer"] for r in rows] == [layer.name for layer in conv_report.layers]
    assert sum(float(r["cycles"]) for r in rows) == pytest.approx(conv_report.cycles)
    assert sum(float(r["dram_read_bytes"]) + float(r["dram_write_bytes"]) for r in rows) <= (
        conv_report.actions.dram_read_bytes + conv_report.actions.dram_write_bytes)
    assert sum(float(r["energy_pj"]) for r in rows) <= sum(conv_report.energy_pj.values()) * (1 + 1e-9)
    assert sum(int(r["macs"]) for r in rows) == sum(layer.macs for layer in conv_report.layers)


def test_stablehlo_text_compiles_and_computes_the_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).eval()
    x = torch.randn(2, 8)
    text = stablehlo_text(model, (x,))
    assert "stablehlo." in text and "func.func public @main" in text
    # NOTE: jax has no public API that compiles StableHLO text; the backend's compile is what jax.jit calls.
    import jax
    from jax._src import xla_bridge
    backend = xla_bridge.get_backend("cpu")
    executable = backend.compile_and_load(text, backend.devices()[:1])
    (y,) = executable.execute([jax.device_put(x.numpy(), backend.devices()[0])])
    np.testing.assert_allclose(np.asarray(y), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_stablehlo_of_a_jax_function_and_a_bad_model():
    import jax.numpy as jnp
    text = stablehlo_text(lambda a: jnp.tanh(a) * 2, (np.ones((3,), np.float32),))
    assert "stablehlo.tanh" in text
    with pytest.raises(stagec.InputError, match="torch.nn.Module or a JAX function"):
        stablehlo_text(42, ())
