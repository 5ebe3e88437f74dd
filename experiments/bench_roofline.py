"""How close the compiled programs come to the roofline: for each model on the default hardware,
total simulated latency over the sum of its layers' roofline bounds (max of MACs / peak and
compulsory DRAM bytes / bandwidth), with the worst layers; writes each model's timeline and
roofline plots.

    python experiments/bench_roofline.py [models...]

Targets (issue 5): at most 1.25 for ResNet-50 and BERT-base.  The `floor` column says how much of
the gap no mapping can close on this hardware: each array layer's roofline with its compute term
replaced by SCALE-Sim's weight-stationary fold time at the layer's whole M (every fold pays 2R + C - 2
cycles of preload, fill and drain besides its M streamed rows: at M = 128, BERT's sequence, that is
1.36x MACs / peak on a 16x16 array), or at its whole N when the operands are transposed, the lesser.
Writes experiments/results/bench_roofline.json and
experiments/results/roofline_<model>/{timeline,roofline,layers}.{png,svg}.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import stagec
from stagec import zoo
from stagec.plots import write_plots
from stagec.report import make_report

RESULTS = Path(__file__).parent / "results"


def fold_floor(layer, hw) -> float:
    """A lower bound on the layer's cycles under the timing model: memory bound, or the array's
    weight-stationary folds at the layer's whole M (splitting M only adds fold overhead), or, with
    the operands transposed (schedule.TileMapping), at its whole N streamed over ceil(M / C)
    column folds, whichever is less."""
    bound = layer.roofline["bound_cycles"]
    if not layer.instructions["matrix"] or hw.dataflow != "weight_stationary" or not layer.macs:
        return bound
    out = layer.out_shape
    m, n = (math.prod(out) // out[1], out[1]) if layer.op == "conv" else (out[-2], out[-1])
    r, c = hw.array_rows, hw.array_cols
    pixels_held = layer.macs / (r * c) * (2 * r + c + m - 2) / m
    channels_held = layer.macs / (r * c) * (c * math.ceil(m / c) / m) * (2 * r + c + n - 2) / n
    return max(bound, min(pixels_held, channels_held))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=["resnet50", "mobilenet_v2", "bert_base"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"{'model':<14} {'instr':>7} {'cycles':>12} {'roofline':>12} {'ratio':>6} {'floor':>6} {'bound by':>9} "
          f"{'util%':>6}  worst layers (cycles / bound)", flush=True)
    rows = []
    for name in args.models:
        model, example, kwargs = zoo.build(name)
        program = stagec.compile(model, example, kwargs=kwargs)
        t = time.perf_counter()
        report = make_report(program)
        timing_s = time.perf_counter() - t
        layers = sorted(report.layers, key=lambda lr: lr.roofline["bound_cycles"] - lr.cycles)
        memory = sum(lr.roofline["bound_cycles"] for lr in report.layers if lr.roofline["bound"] == "memory")
        worst = ", ".join(f"{lr.name.split('/')[0][-24:]} {lr.cycles / lr.roofline['bound_cycles']:.1f}"
                          for lr in layers[:3])
        ratio = report.cycles / report.roofline_cycles
        floor = sum(fold_floor(lr, program.hw) for lr in report.layers) / report.roofline_cycles
        rows.append({"model": name, "instructions": len(program), "cycles": report.cycles,
                     "roofline_cycles": report.roofline_cycles, "ratio": ratio,
                     "fold_floor_ratio": floor, "timing_s": timing_s,
                     "memory_bound_share": memory / report.roofline_cycles,
                     "array_utilization": report.array_utilization,
                     "plots": [str(p) for p in write_plots(report, RESULTS / f"roofline_{name}", name)]})
        print(f"{name:<14} {len(program):>7} {report.cycles:>12.0f} {report.roofline_cycles:>12.0f} "
              f"{ratio:>6.3f} {floor:>6.3f} "
              f"{'memory' if memory > report.roofline_cycles / 2 else 'compute':>9} "
              f"{100 * report.array_utilization:>6.1f}  {worst}", flush=True)
    (RESULTS / "bench_roofline.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
