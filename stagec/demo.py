"""`stagec demo`: compile the bundled hand-keypoint network (int8 by default), simulate it, and
compare with PyTorch; int8 runs side by side with fp32."""

from __future__ import annotations

import time

import torch

from stagec.errors import InputError

from .models import hand_keypoint_net
from .precision import PRECISIONS, format_runs, run_precision

TOLERANCE = {"fp32": ("max relative error", 1e-4), "int8": ("cosine similarity", 0.99)}


def run_demo(hw=None, precision: str = "int8") -> bool:
    """Print the report of `precision` (int8 also shows fp32 beside it); True when the outputs are
    within TOLERANCE of PyTorch eager."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    model, (image,) = hand_keypoint_net()
    with torch.no_grad():
        ref = model(image)
    t0 = time.perf_counter()
    run = run_precision(model, (image,), {}, precision, hw, reference=ref)
    t1 = time.perf_counter()
    hw = run.program.hw
    print(f"HandKeypointNet ({precision}) on {hw.array_rows}x{hw.array_cols} {hw.dataflow.replace('_', '-')} array, "
          f"{hw.scratchpad_bytes // 1024} KiB scratchpad, {hw.accumulator_bytes // 1024} KiB accumulator; "
          f"{len(run.program)} instructions")
    print(f"compiled and simulated in {t1 - t0:.2f} s (first run, with jit compilation)\n")
    print(run.report.summary())
    runs = [run] + ([run_precision(model, (image,), {}, "fp32", hw, reference=ref)] if precision == "int8" else [])
    print("\nagainst PyTorch eager (fp32):\n" + format_runs(runs))
    what, bound = TOLERANCE[precision]
    value = run.cosine if precision == "int8" else run.max_rel_err
    ok = value >= bound if precision == "int8" else value < bound
    print(f"\n{precision} {what} {value:.6g}: {'within' if ok else 'OUTSIDE'} the demo's bound {bound:g}")
    return ok
