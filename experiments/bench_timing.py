"""Timing-simulator speed and fidelity: instructions timed per second, ResNet-18 vs SCALE-Sim.

    python experiments/bench_timing.py [--scalesim-python /path/to/python-with-scalesim] [--repeat 10]

Three tables, in one run:
  1. instructions timed per second: ResNet-18 on a 32x32 weight-stationary array (about 23k
     instructions) and the same stream repeated 20 times; first call (plan + jit compile) and warm
     median over repeats;
  2. timing the whole ResNet-18 vs SCALE-Sim 3.0.0 on the same 32x32 array: measured (SCALE-Sim's
     CPU seconds) when --scalesim-python names a Python that has `scalesim`, otherwise the issue's
     figure of about 250 CPU-s, labelled as such; target: at most 1%;
  3. per-layer matrix-unit cycles vs SCALE-Sim: our MATMUL cycles for the layer as the compiler
     tiled it, SCALE-Sim's formula for the whole layer (folds x per-fold, sim.costs), and SCALE-Sim's
     own number when it ran.  Differences come from tiling (each tile pays the array's fill and
     drain), not from the per-fold formula, which matches SCALE-Sim exactly (tests/test_timing.py).

Writes experiments/results/bench_timing.json and ResNet-18's report plots under
experiments/results/resnet18_32x32/.  Times are medians on a shared machine: read the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from scalesim_ref import matrix_layers, run_scalesim  # noqa: E402
from workloads import resnet18  # noqa: E402

import stagec  # noqa: E402
from stagec.isa import HardwareConfig, Opcode  # noqa: E402
from stagec.plots import write_plots  # noqa: E402
from stagec.report import make_report  # noqa: E402
from stagec.sim.costs import matmul_cycles  # noqa: E402
from stagec.sim.timing import program_times, timeline  # noqa: E402

RESULTS = Path(__file__).parent / "results"
ISSUE_SCALESIM_CPU_S = 250.0


def compiled_resnet18(hw: HardwareConfig) -> stagec.Program:
    """ResNet-18 compiled for `hw`, cached under experiments/results (compiling takes a minute)."""
    path = RESULTS / f"resnet18_{hw.array_rows}x{hw.array_cols}.stgc"
    if path.exists():
        program = stagec.load(path)
        if program.hw == hw:
            return program
    print("compiling ResNet-18 (about a minute) ...", flush=True)
    model, example = resnet18()
    program = stagec.compile(model, example, hw=hw)
    program.save(path)
    return program


def repeated(program: stagec.Program, times: int) -> stagec.Program:
    """The instruction stream run `times` times back to back (tokens balance within each copy)."""
    return dataclasses.replace(program, code=np.concatenate([program.code] * times),
                               layer_ids=np.concatenate([program.layer_ids] * times), cache={})


def time_once(program: stagec.Program) -> float:
    """Seconds to time `program` from scratch for this program (plan built; jit compiled if its size is new)."""
    program.cache.clear()
    t = time.perf_counter()
    timeline(program)
    return time.perf_counter() - t


def warm_median(program: stagec.Program, repeat: int) -> float:
    timeline(program)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(program_times(program))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def throughput_rows(program: stagec.Program, repeat: int) -> list[dict]:
    rows = []
    for name, p in (("ResNet-18", program), ("ResNet-18 x 20", repeated(program, 20))):
        print(f"timing {name} ({len(p)} instructions) ...", flush=True)
        first = time_once(p)
        warm = warm_median(p, repeat)
        rows.append({"stream": name, "instructions": len(p), "first_s": first, "warm_s": warm,
                     "instructions_per_s": len(p) / warm})
    return rows


def layer_rows(program: stagec.Program, scalesim_cycles: list[int] | None) -> list[dict]:
    hw = program.hw
    tl = timeline(program)
    matmul = program.code["opcode"] == Opcode.MATMUL
    busy = np.bincount(program.layer_ids[matmul], weights=(tl.end - tl.start)[matmul],
                       minlength=len(program.layers))
    rows = []
    for j, layer in enumerate(matrix_layers(program)):
        m, k, n = layer.mkn
        formula = int(matmul_cycles(m, k, n, hw.array_rows, hw.array_cols, hw.dataflow)) - 1   # SCALE-Sim counts from 0
        row = {"layer": layer.name, "mkn": [m, k, n], "stagec_cycles": float(busy[layer.layer]),
               "scalesim_formula": formula, "stagec_over_formula": float(busy[layer.layer]) / formula}
        if scalesim_cycles is not None:
            row["scalesim_measured"] = scalesim_cycles[j]
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scalesim-python", help="a Python interpreter that can import scalesim (3.0.0)")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    hw = HardwareConfig(array_rows=32, array_cols=32)
    program = compiled_resnet18(hw)

    speed = throughput_rows(program, args.repeat)
    print(f"\n{'stream':<16} {'instr':>8} {'first s':>8} {'warm s':>8} {'instr/s (warm)':>15}")
    for r in speed:
        print(f"{r['stream']:<16} {r['instructions']:>8} {r['first_s']:>8.3f} {r['warm_s']:>8.4f} "
              f"{r['instructions_per_s']:>15.3g}")

    scalesim_cycles = None
    if args.scalesim_python:
        print("\nrunning SCALE-Sim on ResNet-18's matrix layers (minutes) ...", flush=True)
        wall, cpu, scalesim_cycles = run_scalesim(matrix_layers(program), hw.array_rows, hw.array_cols,
                                                  hw.dataflow, args.scalesim_python)
        scalesim = {"source": "measured", "cpu_s": cpu, "wall_s": wall}
    else:
        scalesim = {"source": "the issue's figure (not measured here: no --scalesim-python)",
                    "cpu_s": ISSUE_SCALESIM_CPU_S}
    ours = speed[0]
    versus = {"stagec_first_s": ours["first_s"], "stagec_warm_s": ours["warm_s"], "scalesim": scalesim,
              "first_over_scalesim": ours["first_s"] / scalesim["cpu_s"],
              "warm_over_scalesim": ours["warm_s"] / scalesim["cpu_s"]}
    print(f"\nResNet-18 on 32x32: stagec {ours['first_s']:.3f} s first call, {ours['warm_s'] * 1e3:.2f} ms warm; "
          f"SCALE-Sim {scalesim['cpu_s']:.0f} CPU-s ({scalesim['source']}): "
          f"{100 * versus['first_over_scalesim']:.3f}% (first), {100 * versus['warm_over_scalesim']:.5f}% (warm); "
          "target <= 1%")

    layers = layer_rows(program, scalesim_cycles)
    print(f"\n{'layer':<34} {'M,K,N':>16} {'stagec':>10} {'formula':>10} {'measured':>10} {'stagec/formula':>14}")
    for r in layers:
        measured = r.get("scalesim_measured", "-")
        print(f"{r['layer'][:34]:<34} {','.join(map(str, r['mkn'])):>16} {r['stagec_cycles']:>10.0f} "
              f"{r['scalesim_formula']:>10} {measured:>10} {r['stagec_over_formula']:>14.2f}")
    total = sum(r["stagec_cycles"] for r in layers) / sum(r["scalesim_formula"] for r in layers)
    print(f"{'all matrix layers':<34} {'':>16} {'':>10} {'':>10} {'':>10} {total:>14.2f}")

    plots = write_plots(make_report(program), RESULTS / "resnet18_32x32", "ResNet-18, 32x32")
    print("plots: " + ", ".join(str(p) for p in plots if p.suffix == ".png"))

    (RESULTS / "bench_timing.json").write_text(json.dumps(
        {"machine": platform.platform(), "jax": jax.__version__, "hw": hw.to_dict(), "throughput": speed,
         "resnet18_vs_scalesim": versus, "layers": layers, "stagec_over_formula_all_layers": total}, indent=2))
    print(f"\nwrote {RESULTS / 'bench_timing.json'}")


if __name__ == "__main__":
    main()
