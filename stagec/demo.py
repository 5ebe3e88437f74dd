"""`stagec demo`: compile the bundled hand-keypoint network (int8 by default), simulate it, and
compare with PyTorch; int8 runs side by side with bf16 and fp32, bf16 beside fp32."""

from __future__ import annotations

import time

import torch

from stagec.errors import InputError

from .models import hand_keypoint_net
from .precision import PRECISIONS, format_runs, run_precision

TOLERANCE = {"fp32": ("max relative error", 1e-4), "int8": ("cosine similarity", 0.99),
             "bf16": ("cosine similarity", 0.999)}
BESIDE = {"int8": ("bf16", "fp32"), "bf16": ("fp32",), "fp32": ()}   # the precisions each is compared with


def run_demo(hw=None, precision: str = "int8") -> bool:
    """Print the report of `precision` (and the costs of the precisions BESIDE it); True when the
    outputs are within TOLERANCE of PyTorch eager."""
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
    runs = [run] + [run_precision(model, (image,), {}, p, hw, reference=ref) for p in BESIDE[precision]]
    print("\nagainst PyTorch eager (fp32):\n" + format_runs(runs))
    what, bound = TOLERANCE[precision]
    value = run.max_rel_err if precision == "fp32" else run.cosine
    ok = value < bound if precision == "fp32" else value >= bound
    print(f"\n{precision} {what} {value:.6g}: {'within' if ok else 'OUTSIDE'} the demo's bound {bound:g}")
    return ok
