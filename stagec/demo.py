"""`stagec demo`: compile the bundled hand-keypoint network, simulate it, compare with PyTorch."""

from __future__ import annotations

import time

import numpy as np
import torch

from .api import compile, simulate  # noqa: A004
from .models import hand_keypoint_net


def max_relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref|: the error relative to the reference's scale."""
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), np.finfo(np.float32).tiny))


def run_demo(hw=None) -> float:
    model, (image,) = hand_keypoint_net()
    t0 = time.perf_counter()
    program = compile(model, (image,), hw=hw)
    t1 = time.perf_counter()
    out, report = simulate(program, image)
    t2 = time.perf_counter()
    with torch.no_grad():
        ref = model(image).numpy()
    err = max_relative_error(out, ref)
    print(f"HandKeypointNet on {program.hw.array_rows}x{program.hw.array_cols} {program.hw.dataflow.replace('_', '-')} "
          f"array, {program.hw.scratchpad_bytes // 1024} KiB scratchpad, {program.hw.accumulator_bytes // 1024} KiB "
          f"accumulator; {len(program)} instructions")
    print(f"compiled in {t1 - t0:.2f} s, simulated in {t2 - t1:.2f} s (first run, with jit compilation)\n")
    print(report.summary())
    print(f"\nmax relative error vs PyTorch eager: {err:.2e}")
    return err
