"""Compile + simulate the demo model; simulate time vs jax.jit of the same jaxpr, in one run.

    python experiments/bench_e2e.py [--repeat 20]

Prints a table and writes experiments/results/bench_e2e.json.  Times are medians over
repeats after a warm-up run (jit compilation excluded on both sides); the ratio is the
number to read, the machines being shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import numpy as np
from jax.extend.core import jaxpr_as_fun
from timing_utils import median_times

import stagec
from stagec.frontend import from_torch
from stagec.models import hand_keypoint_net
from stagec.precision import max_relative_error


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    model, (x,) = hand_keypoint_net()
    xn = x.numpy()

    t = time.perf_counter()
    program = stagec.compile(model, (x,))
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    out, _ = stagec.simulate(program, xn)
    first_sim_s = time.perf_counter() - t

    cj = from_torch(model, (x,))
    jitted = jax.jit(jaxpr_as_fun(cj))
    sim_s, jit_s = median_times([lambda: stagec.simulate(program, xn), lambda: jax.block_until_ready(jitted(xn))],
                                args.repeat)
    ref = np.asarray(jitted(xn)[0])
    row = {
        "model": "HandKeypointNet", "input": list(xn.shape), "instructions": len(program),
        "compile_s": compile_s, "first_simulate_s": first_sim_s, "simulate_s": sim_s, "jax_jit_s": jit_s,
        "simulate_over_jit": sim_s / jit_s, "max_rel_error_vs_jaxpr": max_relative_error(out, ref),
        "groups": len(program.cache["executor"].plan.groups) if program.cache.get("executor") else None,
    }
    print(f"{'model':<16} {'instr':>6} {'groups':>6} {'compile s':>9} {'1st sim s':>9} {'sim ms':>8} "
          f"{'jit ms':>8} {'sim/jit':>7} {'rel err':>8}")
    print(f"{row['model']:<16} {row['instructions']:>6} {row['groups']:>6} {compile_s:>9.2f} {first_sim_s:>9.2f} "
          f"{sim_s * 1e3:>8.2f} {jit_s * 1e3:>8.3f} {row['simulate_over_jit']:>7.1f} "
          f"{row['max_rel_error_vs_jaxpr']:>8.1e}")
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "bench_e2e.json").write_text(json.dumps(
        {"machine": platform.platform(), "jax": jax.__version__, "rows": [row]}, indent=2))


if __name__ == "__main__":
    main()
