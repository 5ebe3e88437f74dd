"""Co-design vs random search at equal samples, on a MobileNet-class and a transformer-class model
(the zoo's reduced configs), in a plain loop (the Ray sweep of issue 21 item 1 lives in stagec.sweep).

    .venv/bin/python experiments/bench_codesign.py [--budget 3.0] [--objective latency] [--seeds 3]

For each model: stagec.codesign (descent, exact-model grid search, its best few simulated) under
the area budget; then random search over the same grid and budget given as many exact-model
evaluations as codesign spent, its best few simulated the same way; and random search given only
as many simulated points as codesign simulated.  Reported: evaluated points, simulated points,
wall time, and the best simulated latency and EDP each found (random: the median over seeds).

Writes experiments/results/bench_codesign.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from stagec import zoo
from stagec.codesigning import Workloads, codesign_graphs
from stagec.costmodel.codesign import CodesignSettings
from stagec.costmodel.grid import SIZED, fit_banks
from stagec.costmodel.model import DEFAULT_CONSTANTS
from stagec.costmodel.rounding import Constraints, Search, area_of
from stagec.isa import HardwareConfig
from stagec.layers import model_graph
from stagec.pipeline import lower_graph
from stagec.report import make_report

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"MobileNetV2 (reduced)": "mobilenet_v2", "BERT-base (reduced)": "bert_base"}
SETTINGS = CodesignSettings(array_range=(4.0, 64.0), memory_range=(32768.0, 1048576.0), report_every=0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def simulated(graph, hw: HardwareConfig, work: Workloads) -> dict:
    report = make_report(lower_graph(graph, hw, work.model_mappings(hw)[0]))
    energy = sum(report.energy_pj.values())
    return {"cycles": report.cycles, "energy_uj": energy / 1e6, "edp": report.latency_s * energy * 1e-12,
            "hw": f"{hw.array_rows}x{hw.array_cols} {hw.dataflow.split('_')[0]} {hw.scratchpad_bytes // 1024}+"
                  f"{hw.accumulator_bytes // 1024} KiB {hw.dma_bandwidth_bytes_per_cycle:g} B/cycle",
            "area_mm2": area_of(hw)}


def random_configs(rng, budget: float, count: int) -> list[HardwareConfig]:
    grid, out = SETTINGS.grid(), []
    while len(out) < count:
        hw = fit_banks(HardwareConfig(dataflow=str(rng.choice(["weight_stationary", "output_stationary"])),
                                      **{n: rng.choice(grid.values(n)).item() for n in SIZED}))
        if area_of(hw) <= budget:
            out.append(hw)
    return out


def random_search(graph, work: Workloads, budget: float, objective: str, evaluations: int, simulate: int,
                  seed: int) -> dict:
    """`evaluations` random grid configs under the budget scored by the exact model, the best `simulate` timed."""
    t0 = time.perf_counter()
    search = Search(work.evaluate, Constraints(budget), objective)
    for hw in random_configs(np.random.default_rng(seed), budget, evaluations):
        search.score(hw)
    runs = [simulated(graph, s.hw, work) for s in search.ranked()[:simulate]]
    best = min(runs, key=lambda r: r["cycles"] if objective == "latency" else r["edp"])
    return {**best, "evaluated": evaluations, "simulated": len(runs), "seconds": time.perf_counter() - t0}


def bench(name: str, graph, budget: float, objective: str, seeds: int) -> dict:
    t0 = time.perf_counter()
    result = codesign_graphs([graph], budget, objective, settings=SETTINGS, progress=False)
    work = Workloads([graph], objective, DEFAULT_CONSTANTS)
    ours = {**simulated(graph, result.hw, work), "evaluated": result.evaluated, "simulated": result.simulated,
            "seconds": time.perf_counter() - t0}
    log(f"  {name}: codesign {ours}")
    rows = {"codesign": ours}
    for label, evaluations, simulate in (("random, equal evaluations", result.evaluated, SETTINGS.confirm),
                                         ("random, equal simulations", result.simulated, result.simulated)):
        runs = [random_search(graph, work, budget, objective, evaluations, simulate, seed) for seed in range(seeds)]
        key = "cycles" if objective == "latency" else "edp"
        median = sorted(runs, key=lambda r: r[key])[len(runs) // 2]
        rows[label] = {**median, "seconds": float(np.mean([r["seconds"] for r in runs])),
                       "all_" + key: [r[key] for r in runs]}
        log(f"  {name}: {label} {rows[label]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=3.0, help="area budget (mm^2, DRAM interface included)")
    ap.add_argument("--objective", default="latency", choices=("latency", "edp"))
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    out = {}
    for title, name in MODELS.items():
        model, margs, kwargs = zoo.build(name, reduced=True)
        out[title] = bench(title, model_graph(model, margs, kwargs), args.budget, args.objective, args.seeds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_codesign.json").write_text(json.dumps({"budget_mm2": args.budget, "objective": args.objective,
                                                             **out}, indent=1) + "\n")
    print(f"{'model':24s} {'search':28s} {'evaluated':>9s} {'simulated':>9s} {'seconds':>8s} {'cycles':>10s} "
          f"{'EDP (J s)':>10s}  config")
    for title, rows in out.items():
        for label, r in rows.items():
            print(f"{title:24s} {label:28s} {r['evaluated']:9d} {r['simulated']:9d} {r['seconds']:8.1f} "
                  f"{r['cycles']:10.0f} {r['edp']:10.3g}  {r['hw']}")


if __name__ == "__main__":
    main()
