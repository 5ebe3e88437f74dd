"""`stagec report`: time a program (the bundled demo by default) and write its report and plots."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stagec.isa import HardwareConfig

from .plots import write_plots
from .report import make_report


def run_report(program_path: str | None, hw_path: str | None, out_dir: str) -> list[Path]:
    """Write summary.txt, report.json and the plots (PNG and SVG) into `out_dir`; print the summary."""
    from .api import compile, load  # noqa: A004
    if program_path:
        if hw_path:
            raise SystemExit("stagec report: --hw applies to the demo model; a saved program keeps its own config")
        program, name = load(program_path), Path(program_path).stem
    else:
        from .models import hand_keypoint_net
        print("compiling the bundled hand-keypoint network ...", flush=True)
        model, example = hand_keypoint_net()
        program, name = compile(model, example, hw=HardwareConfig.load(hw_path) if hw_path else None), "demo"
    print(f"timing {len(program)} instructions ...", flush=True)
    t = time.perf_counter()
    report = make_report(program)
    print(f"timed in {time.perf_counter() - t:.2f} s; drawing plots ...\n", flush=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = report.summary()
    (out / "summary.txt").write_text(summary + "\n")
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    paths = [out / "summary.txt", out / "report.json", *write_plots(report, out, name)]
    print(summary + "\n\nwrote " + ", ".join(str(p) for p in paths))
    return paths
