"""int8 and bf16 next to fp32: one model compiled each way, simulated, and compared with fp32 PyTorch.

The demo, `stagec report` and experiments/bench_int8.py print the same table.

>>> from stagec.models import hand_keypoint_net  # doctest: +SKIP
>>> model, args = hand_keypoint_net()  # doctest: +SKIP
>>> print(format_runs([run_precision(model, args, {}, p) for p in ("int8", "fp32")]))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.utils._pytree as pytree

from stagec.errors import InputError

from .api import compile, simulate  # noqa: A004
from .report import Report

PRECISIONS = ("int8", "bf16", "fp32")


@dataclass(frozen=True)
class PrecisionRun:
    """One precision's cost and accuracy; errors are against the fp32 PyTorch model."""
    precision: str
    dram_bytes: int
    cycles: float
    energy_uj: float
    max_rel_err: float        # max |out - ref| / max |ref|
    cosine: float             # of the flattened outputs
    report: Report = field(repr=False, compare=False)
    program: object = field(repr=False, compare=False)

    def to_dict(self) -> dict:
        return {"precision": self.precision, "dram_bytes": self.dram_bytes, "cycles": self.cycles,
                "energy_uj": self.energy_uj, "max_rel_err": self.max_rel_err, "cosine": self.cosine}


def max_relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref|: the error relative to the reference's scale."""
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), np.finfo(np.float32).tiny))


def calibration_batches(args: tuple, kwargs: dict, n: int, seed: int = 1) -> list:
    """`n` calibration batches shaped like the example inputs: fresh standard-normal floats (other
    inputs, such as token ids and masks, are the example's own)."""
    g = torch.Generator().manual_seed(seed)

    def like(t):
        return torch.randn(t.shape, generator=g) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    return [(tuple(like(a) for a in args), {k: like(v) for k, v in kwargs.items()}) for _ in range(n)]


def _leaves(out) -> np.ndarray:
    """Every tensor of a model's output structure, flattened into one float64 vector."""
    return np.concatenate([np.asarray(t.numpy() if isinstance(t, torch.Tensor) else t, np.float64).ravel()
                           for t in pytree.tree_leaves(out) if hasattr(t, "shape")])


def run_precision(model, args: tuple, kwargs: dict, precision: str, hw=None, calibration=None,
                  reference=None, objective: str = "edp", percentile: float | None = None,
                  fallback: str | None = None, integer_ops=None, activation_ranges: str | None = None) -> PrecisionRun:
    """Compile `model` at `precision` ('int8' calibrates on `calibration`, default 4 batches of
    calibration_batches, its ranges the `percentile` of |x| when given, and runs its float islands
    in `fallback`, or integer-only for `integer_ops`, with `activation_ranges`: compile's) with the mapper minimizing
    `objective`, simulate it on the example inputs and compare with `reference` (the model's fp32
    PyTorch outputs, computed when not given)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    int8 = precision == "int8"
    program = compile(model, args, hw=hw, kwargs=kwargs, quantize=None if precision == "fp32" else precision,
                      calibration=(calibration or calibration_batches(args, kwargs, 4)) if int8 else None,
                      objective=objective, percentile=percentile if int8 else None,
                      fallback=fallback if int8 else None, integer_ops=integer_ops if int8 else None,
                      activation_ranges=activation_ranges if int8 else None)
    out, report = simulate(program, *args, **kwargs)
    if reference is None:
        with torch.no_grad():
            reference = model(*args, **kwargs)
    got, want = _leaves(out), _leaves(reference)
    b = report.actions
    return PrecisionRun(precision, int(b.dram_read_bytes + b.dram_write_bytes), float(report.cycles),
                        sum(report.energy_pj.values()) / 1e6, max_relative_error(got, want),
                        float(got @ want / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-300)), report, program)


def format_runs(runs: list[PrecisionRun]) -> str:
    """The runs side by side, with each one's ratio to the fp32 run where there is one."""
    base = next((r for r in runs if r.precision == "fp32"), None)
    head = f"{'precision':<9} {'DRAM KiB':>10} {'cycles':>10} {'energy uJ':>10} {'max rel err':>11} {'cosine':>9}"
    lines = [head, "-" * len(head)]
    for r in runs:
        lines.append(f"{r.precision:<9} {r.dram_bytes / 1024:>10.1f} {r.cycles:>10.0f} {r.energy_uj:>10.2f} "
                     f"{r.max_rel_err:>11.2e} {r.cosine:>9.6f}")
    if base:
        for r in runs:
            if r is not base:
                lines.append(f"{r.precision} / fp32: DRAM {r.dram_bytes / base.dram_bytes:.2f}x, cycles "
                             f"{r.cycles / base.cycles:.2f}x, energy {r.energy_uj / base.energy_uj:.2f}x")
    return "\n".join(lines)
