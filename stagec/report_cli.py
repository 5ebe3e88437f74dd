"""`stagec report`: time a program (the bundled demo by default) and write its report and plots."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stagec.errors import InputError
from stagec.isa import HardwareConfig

from .exports import write_report
from .plots import write_plots
from .report import make_report


def run_report(program_path: str | None, hw_path: str | None, out_dir: str, precision: str = "int8") -> list[Path]:
    """Write summary.txt, report.json, layers.csv, trace.json (Chrome/Perfetto trace) and the plots (PNG
    and SVG) into `out_dir`; print the summary.
    The demo model is compiled at `precision`; int8 and bf16 also write precision.txt and
    precision.json, beside the precisions the demo compares them with (stagec.demo.BESIDE: DRAM
    bytes, cycles, energy, error against PyTorch)."""
    from .api import load
    out = Path(out_dir)
    written = []
    if program_path:
        if hw_path:
            raise InputError("--hw applies to the demo model; a saved program keeps its own config")
        program, name = load(program_path), Path(program_path).stem
    else:
        from .demo import BESIDE
        from .models import hand_keypoint_net
        from .precision import format_runs, run_precision
        print(f"compiling and simulating the bundled hand-keypoint network ({precision}) ...", flush=True)
        model, example = hand_keypoint_net()
        hw = HardwareConfig.load(hw_path) if hw_path else None
        runs = [run_precision(model, example, {}, p, hw) for p in (precision, *BESIDE[precision])]
        program, name = runs[0].program, "demo"
        if len(runs) > 1:
            out.mkdir(parents=True, exist_ok=True)
            table = format_runs(runs)
            (out / "precision.txt").write_text(table + "\n")
            (out / "precision.json").write_text(json.dumps([r.to_dict() for r in runs], indent=1) + "\n")
            written = [out / "precision.txt", out / "precision.json"]
            print(table + "\n", flush=True)
    print(f"timing {len(program)} instructions ...", flush=True)
    t = time.perf_counter()
    report = make_report(program)
    print(f"timed in {time.perf_counter() - t:.2f} s; drawing plots ...\n", flush=True)
    paths = [*write_report(report, out), *written, *write_plots(report, out, name)]
    print(report.summary() + "\n\nwrote " + ", ".join(str(p) for p in paths))
    return paths
