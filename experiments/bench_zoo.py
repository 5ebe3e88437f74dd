"""The full-size zoo on the accelerator, all in one run: per model, compile seconds, instruction
count, DRAM bytes fused vs unfused, peak DRAM activations vs their sum, simulate seconds and the
ratio of simulate time to jax.jit of the same jaxpr on the same inputs, whether the batched executor
ran (not the reference interpreter's fallback) and the simulator's error relative to that jaxpr.

    python experiments/bench_zoo.py [models...] [--repeat 5]

Times are medians after a warm-up run, simulation and jit taking turns (jit compilation
excluded on both sides; the first simulation, with its compilation, is reported apart).  Compile
seconds are each model's first compile, after one compile of a small model so that the process's
one-time start-up (imports, torch.export's and XLA's first calls) is not charged to whichever
model comes first.
Writes experiments/results/bench_zoo.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax.extend.core import jaxpr_as_fun
from timing_utils import median_times

import stagec
from stagec import zoo
from stagec.frontend import flatten_inputs, trace_torch
from stagec.precision import max_relative_error
from stagec.sim.energy import action_counts


def dram_bytes(program) -> int:
    counts = action_counts(program.code, program.hw).total()
    return int(counts.dram_read_bytes + counts.dram_write_bytes)


def bench(name: str, repeat: int) -> dict:
    model, args, kwargs = zoo.build(name)
    t = time.perf_counter()
    program = stagec.compile(model, args, kwargs=kwargs)
    compile_s = time.perf_counter() - t
    unfused = stagec.compile(model, args, kwargs=kwargs, fuse=False)
    t = time.perf_counter()
    out, _ = stagec.simulate(program, *args, **kwargs)
    first_s = time.perf_counter() - t
    batched = program.cache["executor"] is not None   # not the reference interpreter's fallback
    traced = trace_torch(model, args, kwargs)
    flat = flatten_inputs(traced, args, kwargs)
    jitted = jax.jit(jaxpr_as_fun(traced.closed))
    want = jax.block_until_ready(jitted(*flat))
    error = max(max_relative_error(np.asarray(g), np.asarray(w)) for g, w in zip(pytree.tree_leaves(out), want,
                                                                                  strict=True))
    sim_s, jit_s = median_times([lambda: stagec.simulate(program, *args, **kwargs),
                                 lambda: jax.block_until_ready(jitted(*flat))], repeat)
    meta = program.metadata
    return {"model": name, "compile_s": compile_s, "instructions": len(program),
            "dram_bytes_fused": dram_bytes(program), "dram_bytes_unfused": dram_bytes(unfused),
            "peak_activation_bytes": meta["peak_activation_bytes"], "activation_bytes": meta["activation_bytes"],
            "first_simulate_s": first_s, "simulate_s": sim_s, "jax_jit_s": jit_s, "simulate_over_jit": sim_s / jit_s,
            "batched": batched, "max_rel_error_vs_jaxpr": error}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=list(zoo.ZOO))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    nn = torch.nn
    warm_up = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4))
    stagec.compile(warm_up, (torch.randn(1, 3, 8, 8),))
    header = (f"{'model':<22} {'compile s':>9} {'instr':>7} {'DRAM MB fused':>13} {'unfused':>8} "
              f"{'peak act MB':>11} {'sum act MB':>10} {'1st sim s':>9} {'sim s':>7} {'jit s':>7} {'sim/jit':>7} "
              f"{'batched':>7} {'err':>8}")
    print(header, flush=True)
    rows = []
    for name in args.models:
        r = bench(name, args.repeat)
        rows.append(r)
        print(f"{name:<22} {r['compile_s']:>9.2f} {r['instructions']:>7} {r['dram_bytes_fused'] / 1e6:>13.1f} "
              f"{r['dram_bytes_unfused'] / 1e6:>8.1f} {r['peak_activation_bytes'] / 1e6:>11.2f} "
              f"{r['activation_bytes'] / 1e6:>10.2f} {r['first_simulate_s']:>9.1f} {r['simulate_s']:>7.3f} "
              f"{r['jax_jit_s']:>7.3f} {r['simulate_over_jit']:>7.2f} {r['batched']!s:>7} "
              f"{r['max_rel_error_vs_jaxpr']:>8.1e}", flush=True)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_zoo.json").write_text(json.dumps({"machine": platform.platform(), "jax": jax.__version__,
                                                    "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
