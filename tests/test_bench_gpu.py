"""experiments/bench_gpu.py's CPU-side logic: the budget, the output check, the random configs, and a whole
`run` of a tiny prepared folder in a process that must not load torch, torch2jax or stagec.frontend."""

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

from stagec.isa import HardwareConfig
from stagec.layers import model_graph, model_layers

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import bench_gpu  # noqa: E402


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter as a counter that measurements advance by hand."""
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    return now


def test_sized_skips_a_size_whose_estimate_overruns_the_deadline(clock):
    def measure(size):
        clock[0] += 5 + size       # 5 s of compiling, then 4 calls of size / 4 s each
        return bench_gpu.Row("item", str(size), warm_s=size / 4, compile_s=5.0)

    rows = bench_gpu.sized("item", [1, 10, 100], measure, deadline=100.0)
    assert [r.size for r in rows] == ["1", "10", "100"]
    assert rows[1].warm_s == 2.5 and rows[2].warm_s is None     # 5 + 100 s estimated > 79 s left
    assert rows[2].check == "skipped: ~105 s > 79 s left"


def test_sized_reports_a_failure_and_ends_the_item(clock):
    def measure(size):
        if size == 10:
            raise RuntimeError("API drift")
        return bench_gpu.Row("item", str(size))

    rows = bench_gpu.sized("item", [1, 10, 100], measure, deadline=1e9)
    assert [r.size for r in rows] == ["1", "10"] and rows[1].check == "error: RuntimeError: API drift"


def test_budget_shares_what_is_left_over_the_items_to_run(clock):
    budget = bench_gpu.Budget(end=90.0, items_left=3)
    assert budget.share() == 30.0
    clock[0] = 50.0                # the first item overran its share: the rest split what is left
    assert budget.share() == 70.0 and budget.share() == 90.0


def test_output_check_is_exact_for_int8_and_relative_for_fp32():
    ref = [np.array([1.0, -4.0], np.float32)]
    near = [ref[0] + np.float32(2e-4)]
    assert bench_gpu.output_check(ref, ref, exact=True).startswith("ok")
    assert bench_gpu.output_check(near, ref, exact=True).startswith("MISMATCH")
    assert bench_gpu.output_check(near, ref, exact=False).startswith("ok")        # 2e-4 <= 1e-4 * 4
    assert bench_gpu.output_check([ref[0] + 1e-3], ref, exact=False).startswith("MISMATCH")


def test_random_configs_start_with_the_given_one_and_stay_within_2x():
    hw = HardwareConfig()
    own = np.array(jax.tree.leaves(hw), np.float32)
    batch = np.array(jax.tree.leaves(bench_gpu.random_configs(hw, 8)))
    assert batch.shape == (len(own), 8) and np.array_equal(batch[:, 0], own)
    ratio = batch[:, 1:] / own[:, None]
    assert ((ratio >= 0.5) & (ratio <= 2.0)).all() and len(np.unique(ratio)) > 1


def test_run_of_a_tiny_folder_checks_every_item_without_torch(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    programs = {"tiny_fp32": (model, (x,), {}, None), "tiny_int8": (model, (x,), {}, "int8")}
    layers = {"tiny": lambda: model_layers(model_graph(model, (x,)))}
    bench_gpu.prepare(tmp_path, programs, ("tiny_int8",), layers)
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, str(EXPERIMENTS / "bench_gpu.py"), "run", str(tmp_path), "--out", str(out),
                    "--budget-s", "600", "--timing-sizes", "4", "--costmodel-sizes", "10",
                    "--tuner-starts", "2"], check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["loaded"] == {"torch": False, "torch2jax": False, "stagec.frontend": False}
    items = sorted(r["item"] for r in result["rows"])
    assert items == sorted(["executor"] * 2 + ["timing"] + ["costmodel evaluate", "costmodel grad", "tuner"])
    assert all(r["check"].startswith("ok") for r in result["rows"]), result["rows"]
