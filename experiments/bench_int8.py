"""int8 and bf16 against fp32 over the zoo, in one run: per model, DRAM bytes, simulated cycles and
energy of each, and the int8 and bf16 outputs' cosine similarity and max relative error against
fp32 PyTorch (bf16: its ratios to fp32 and its cosine).

    python experiments/bench_int8.py [models...] [--full resnet18 ...] [--calibration 4]
                                     [--objective latency|energy|edp] [--percentile P]
                                     [--fallback bf16 fp32] [--hw CONFIG] [--out FILE]

Models run in their reduced configs unless named in --full (full-size simulation of the larger
models takes far longer than a benchmark run should).  int8 calibrates on --calibration batches
of fresh random inputs and is measured on the zoo's own example input.  Target: cosine >= 0.99 for
the CNNs.  int8 runs once per --fallback (the type of its float islands, compile's fallback=): the
main table shows the first, a second table every one side by side.  Writes
experiments/results/bench_int8.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import torch

from stagec import HardwareConfig, zoo
from stagec.precision import calibration_batches, run_precision

CNNS = ("resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0")
DEFAULT_FULL = ("resnet18", "mobilenet_v2")


def bench(name: str, full: bool, n_calibration: int, fallbacks: list[str], objective: str,
          percentile: float | None, hw: HardwareConfig | None = None) -> dict:
    model, args, kwargs = zoo.build(name, reduced=not full)
    with torch.no_grad():
        ref = model(*args, **kwargs)
    calibration = calibration_batches(args, kwargs, n_calibration)
    t = time.perf_counter()
    common = {"reference": ref, "objective": objective, "hw": hw}
    int8_options = {"calibration": calibration, "percentile": percentile, **common}
    int8 = run_precision(model, args, kwargs, "int8", fallback=fallbacks[0], **int8_options)
    int8_s = time.perf_counter() - t
    by_fallback = {fallbacks[0]: int8.to_dict(), **{
        fb: run_precision(model, args, kwargs, "int8", fallback=fb, **int8_options).to_dict()
        for fb in fallbacks[1:]}}
    fp32 = run_precision(model, args, kwargs, "fp32", **common)
    bf16 = run_precision(model, args, kwargs, "bf16", **common)
    return {"model": name, "size": "full" if full else "reduced", "objective": objective,
            "int8": int8.to_dict(), "fp32": fp32.to_dict(),
            "bf16": bf16.to_dict(), "dram_ratio": int8.dram_bytes / fp32.dram_bytes,
            "cycles_ratio": int8.cycles / fp32.cycles, "energy_ratio": int8.energy_uj / fp32.energy_uj,
            "bf16_ratios": {"dram": bf16.dram_bytes / fp32.dram_bytes, "cycles": bf16.cycles / fp32.cycles,
                            "energy": bf16.energy_uj / fp32.energy_uj},
            "int8_by_fallback": by_fallback,
            "int8_compile_and_simulate_s": int8_s, "cosine_target_met": int8.cosine >= 0.99 if name in CNNS else None}


def fallback_table(rows: list[dict], fallbacks: list[str]) -> str:
    """int8 per float-island type, side by side: cycles and energy relative to the first, cosine."""
    head = f"{'model':<21} " + " ".join(f"{'Mcycles ' + fb:>14} {'energy ' + fb:>12} {'cosine ' + fb:>12}"
                                        for fb in fallbacks)
    lines = ["", "int8 float islands", head, "-" * len(head)]
    for r in rows:
        if "error" not in r:
            runs = [r["int8_by_fallback"][fb] for fb in fallbacks]
            lines.append(f"{r['model']:<21} " + " ".join(
                f"{x['cycles'] / 1e6:>14.3f} {x['energy_uj']:>12.1f} {x['cosine']:>12.6f}" for x in runs))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=list(zoo.ZOO))
    parser.add_argument("--full", nargs="*", default=list(DEFAULT_FULL), help="models to run full-size")
    parser.add_argument("--calibration", type=int, default=4, help="calibration batches")
    parser.add_argument("--percentile", type=float, help="int8 ranges: this percentile of |x| (default: max |x|)")
    parser.add_argument("--objective", default="edp", choices=("latency", "energy", "edp"),
                        help="what the mapper minimizes, for all three precisions alike")
    parser.add_argument("--fallback", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"],
                        help="int8's float island types, the first in the main table")
    parser.add_argument("--hw", help="a hardware config file (YAML or JSON); default: HardwareConfig()")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_int8.json"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    header = (f"{'model':<21} {'size':<7} {'DRAM MB int8':>12} {'fp32':>8} {'ratio':>6} {'Mcycles int8':>12} "
              f"{'fp32':>7} {'ratio':>6} {'energy uJ int8':>14} {'fp32':>9} {'ratio':>6} {'cosine':>8} {'rel err':>8}"
              f" | {'bf16/fp32: DRAM':>15} {'cycles':>6} {'energy':>6} {'cosine':>9} {'rel err':>8}")
    print(header, flush=True)
    rows = []
    for name in args.models:
        try:
            r = bench(name, name in args.full, args.calibration, args.fallback, args.objective, args.percentile,
                      HardwareConfig.load(args.hw) if args.hw else None)
        except Exception as e:   # one model's failure is a row of the table, not the end of the run
            rows.append({"model": name, "size": "full" if name in args.full else "reduced",
                         "error": f"{type(e).__name__}: {e}"})
            print(f"{name:<21} FAILED {rows[-1]['error'][:200]}", flush=True)
            continue
        rows.append(r)
        i8, f32, b = r["int8"], r["fp32"], r["bf16_ratios"]
        print(f"{name:<21} {r['size']:<7} {i8['dram_bytes'] / 1e6:>12.2f} {f32['dram_bytes'] / 1e6:>8.2f} "
              f"{r['dram_ratio']:>6.2f} {i8['cycles'] / 1e6:>12.3f} {f32['cycles'] / 1e6:>7.3f} "
              f"{r['cycles_ratio']:>6.2f} {i8['energy_uj']:>14.1f} {f32['energy_uj']:>9.1f} "
              f"{r['energy_ratio']:>6.2f} {i8['cosine']:>8.5f} {i8['max_rel_err']:>8.2e} | "
              f"{b['dram']:>15.2f} {b['cycles']:>6.2f} {b['energy']:>6.2f} "
              f"{r['bf16']['cosine']:>9.6f} {r['bf16']['max_rel_err']:>8.2e}", flush=True)
    print(fallback_table(rows, args.fallback))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
