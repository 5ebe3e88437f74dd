"""Area and energy vs latency: the Pareto fronts of MobileNetV2 and BERT over a hardware grid, simulated.

    .venv/bin/python experiments/codesign_pareto.py [--full] [--executor local|ray] [--plot-only]

Every config of the grid (array sides, scratchpad and accumulator sizes, dataflow) is compiled
and timed by the simulator for each model (stagec.sweep: each model traced once, points as Ray
tasks when Ray is installed).  Rows go to experiments/results/codesign_pareto.jsonl as they
finish, so a stopped run resumes; the fronts (table and figure) are drawn from that file alone
(--plot-only redraws them without computing anything).  Reduced model configs by default
(same architecture, fewer and narrower layers); --full uses the published sizes.

Writes experiments/results/codesign_pareto.{jsonl,png,svg}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stagec.sweeps import load_results, sweep

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ["mobilenet_v2", "bert_base"]
GRID = {"array_rows": [4, 8, 16, 32], "array_cols": [4, 8, 16, 32], "dataflow": ["weight_stationary",
        "output_stationary"], "scratchpad_bytes": [64 * 1024, 128 * 1024, 256 * 1024],
        "accumulator_bytes": [16 * 1024, 64 * 1024]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="published model sizes instead of the reduced configs")
    ap.add_argument("--executor", choices=("local", "ray"), help="default: ray when installed")
    ap.add_argument("--plot-only", action="store_true", help="redraw from the results file, compute nothing")
    args = ap.parse_args()
    out = RESULTS / f"codesign_pareto{'_full' if args.full else ''}.jsonl"
    results = load_results(out) if args.plot_only else \
        sweep(MODELS, GRID, reduced=not args.full, out=out, executor=args.executor)
    for x in ("area_mm2", "energy_pj"):
        print(results.pareto_table(x, "latency_s"), end="\n\n")
    fig = results.figure()
    for suffix in (".png", ".svg"):
        fig.savefig(out.with_suffix(suffix), dpi=130)
    print(f"{len(results.rows)} points ({len(results.rows) - len(results.ok())} infeasible); wrote "
          f"{out.with_suffix('')}.{{jsonl,png,svg}}")


if __name__ == "__main__":
    main()
