"""Area vs latency: the Pareto front of gradient co-design for MobileNetV2 and BERT, simulator-confirmed.

    .venv/bin/python experiments/codesign_pareto.py [--budgets 1 1.5 2 3 4.5] [--full]

For each model and area budget, stagec.codesign tunes the array, memories, DMA bandwidth and
dataflow with every layer's mapping, rounds to a buildable config within the budget, and the
simulator times the whole model on it (every layer, not just the conv-shaped ones the cost model
sees).  For reference, hand-picked square arrays with the default memories and the default
(grid-search) mapper are simulated too, with the DMA bandwidth co-design may reach (the area
table does not price bandwidth, so co-design moves it within a range and takes its top).
By default the zoo's reduced configs are used (same architecture, fewer and narrower layers,
small inputs) so the sweep takes minutes; --full uses the published sizes.

Writes experiments/results/codesign_pareto.{json,png,svg}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stagec import zoo  # noqa: E402
from stagec.codesigning import codesign_graphs  # noqa: E402
from stagec.costmodel.codesign import CodesignSettings  # noqa: E402
from stagec.isa import HardwareConfig  # noqa: E402
from stagec.layers import model_graph  # noqa: E402
from stagec.pipeline import lower_graph  # noqa: E402
from stagec.report import make_report  # noqa: E402
from stagec.sim.energy import area_mm2  # noqa: E402
from stagec.tuning import TuneSettings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"MobileNetV2": "mobilenet_v2", "BERT-base": "bert_base"}
BASELINE_ARRAYS = (4, 8, 16, 32)


def pareto(points):
    """The points no other beats in both area and cycles, by area."""
    points = sorted(points, key=lambda p: (p["area_mm2"], p["simulated_cycles"]))
    front, best = [], float("inf")
    for p in points:
        if p["simulated_cycles"] < best:
            front.append(p)
            best = p["simulated_cycles"]
    return front


def sweep(name: str, graph, budgets, settings: CodesignSettings, tune_settings) -> dict:
    points = []
    for budget in budgets:
        t0 = time.perf_counter()
        r = codesign_graphs([graph], budget, "latency", settings=settings, tune_settings=tune_settings,
                            progress=False)
        hw = r.hw
        points.append({"budget_mm2": budget, "area_mm2": r.area_mm2, "simulated_cycles": r.reports[0].cycles,
                       "predicted_cycles_conv_layers": r.predicted_cycles[0],
                       "simulated_energy_uj": sum(r.reports[0].energy_pj.values()) / 1e6,
                       "hw": {"array": f"{hw.array_rows}x{hw.array_cols}", "dataflow": hw.dataflow,
                              "scratchpad_kib": hw.scratchpad_bytes // 1024,
                              "accumulator_kib": hw.accumulator_bytes // 1024,
                              "dma_bytes_per_cycle": hw.dma_bandwidth_bytes_per_cycle},
                       "seconds": time.perf_counter() - t0})
        print(f"  {name} budget {budget} mm^2: {points[-1]['hw']} area {r.area_mm2:.3f} -> "
              f"{r.reports[0].cycles:.0f} cycles ({points[-1]['seconds']:.0f}s)", file=sys.stderr, flush=True)
    baselines = []
    for side in BASELINE_ARRAYS:
        hw = HardwareConfig(array_rows=side, array_cols=side,
                            dma_bandwidth_bytes_per_cycle=settings.bandwidth_range[1])
        baselines.append({"array": f"{side}x{side}", "area_mm2": float(sum(area_mm2(hw).values())),
                          "simulated_cycles": make_report(lower_graph(graph, hw)).cycles})
    return {"codesign": points, "pareto": pareto(points), "baseline_default_mapper": baselines}


def plot(results: dict, path: Path, reduced: bool) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        pts = r["codesign"]
        ax.scatter([p["area_mm2"] for p in pts], [p["simulated_cycles"] for p in pts], color="C0",
                   label="co-designed (simulated)", zorder=3)
        front = r["pareto"]
        ax.step([p["area_mm2"] for p in front], [p["simulated_cycles"] for p in front], where="post", color="C0")
        ax.scatter([p["area_mm2"] for p in pts], [p["predicted_cycles_conv_layers"] for p in pts], facecolors="none",
                   edgecolors="C1", label="cost model (conv/matmul layers)", zorder=3)
        for p in pts:
            ax.annotate(p["hw"]["array"], (p["area_mm2"], p["simulated_cycles"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        base = r["baseline_default_mapper"]
        ax.scatter([b["area_mm2"] for b in base], [b["simulated_cycles"] for b in base], marker="x", color="gray",
                   label="square array, default memories + mapper, same DMA")
        for b in base:
            ax.annotate(b["array"], (b["area_mm2"], b["simulated_cycles"]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color="gray")
        for p in pts:
            ax.axvline(p["budget_mm2"], color="C0", alpha=0.15, lw=0.8)
        ax.set(xlabel="area (mm$^2$)", ylabel="latency (cycles, simulated)", yscale="log",
               title=f"{name} ({'reduced' if reduced else 'full-size'} config)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(path.with_suffix(suffix), dpi=130)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.8, 1.2, 2.0, 3.0, 4.5])
    ap.add_argument("--full", action="store_true", help="published model sizes instead of the reduced configs")
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    settings = CodesignSettings(steps=args.steps, report_every=0)
    tune_settings = TuneSettings(starts=8, steps=60, chunk=30)
    results = {}
    for title, name in MODELS.items():
        model, margs, kwargs = zoo.build(name, reduced=not args.full)
        print(f"{title}: tracing", file=sys.stderr, flush=True)
        results[title] = sweep(title, model_graph(model, margs, kwargs), args.budgets, settings, tune_settings)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "codesign_pareto"
    out.with_suffix(".json").write_text(json.dumps({"reduced": not args.full, **results}, indent=1) + "\n")
    plot(results, out, not args.full)
    for title, r in results.items():
        print(f"{title} ({'reduced' if not args.full else 'full'}): budget -> area, array, simulated cycles")
        for p in r["codesign"]:
            print(f"  {p['budget_mm2']:>5.2f} mm^2 -> {p['area_mm2']:.3f} mm^2 {p['hw']['array']:>7} "
                  f"{p['hw']['dataflow'][:6]} spad {p['hw']['scratchpad_kib']} KiB acc {p['hw']['accumulator_kib']} "
                  f"KiB bw {p['hw']['dma_bytes_per_cycle']:g}: {p['simulated_cycles']:.0f} cycles")
        for b in r["baseline_default_mapper"]:
            print(f"  baseline {b['array']:>7}, default memories + mapper: {b['area_mm2']:.3f} mm^2, "
                  f"{b['simulated_cycles']:.0f} cycles")
    print(f"wrote {out}.json/.png/.svg")


if __name__ == "__main__":
    main()
