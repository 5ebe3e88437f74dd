"""The frontend over the full-size model zoo: trace cost, jaxpr size, and agreement with PyTorch.

    python experiments/bench_frontend.py [--reduced] [--models resnet18 bert_base ...]

Per model: seconds for torch.export + core-ATen decomposition, seconds for tracing the rule
interpreter into a jaxpr, equation count (attention bodies included), distinct primitives, and
the max relative error (max|jax - torch| / max|torch|, over every output) of the jaxpr evaluated
by JAX against PyTorch eager. Prints a table and writes experiments/results/bench_frontend.json.
Issue 3's targets: every model traced and matching; under 5 s per CNN, under 10 s for BERT-base
(export + trace). The machines are shared: read the times as rough.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax.extend.core import jaxpr_as_fun

from stagec import zoo
from stagec.frontend import flatten_inputs, trace_exported
from stagec.frontend.torch_export import export


def primitives(jaxpr) -> list[str]:
    """Every equation's primitive, call bodies (attention) included."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        names += [n for p in eqn.params.values() if hasattr(p, "jaxpr") for n in primitives(p.jaxpr)]
    return names


def measure(name: str, reduced: bool) -> dict:
    model, args, kwargs = zoo.build(name, reduced)
    t = time.perf_counter()
    ep = export(model, args, kwargs)
    export_s = time.perf_counter() - t
    t = time.perf_counter()
    traced = trace_exported(ep, args, kwargs)
    trace_s = time.perf_counter() - t
    outputs = jax.jit(jaxpr_as_fun(traced.closed))(*flatten_inputs(traced, args, kwargs))
    with torch.no_grad():
        refs = pytree.tree_leaves(model(*args, **kwargs))
    errors = [float(np.abs(np.asarray(o, np.float64) - r.double().numpy()).max() / np.abs(r.double().numpy()).max())
              for o, r in zip(outputs, refs, strict=True)]
    used = primitives(traced.closed.jaxpr)
    return {"model": name, "export_s": export_s, "trace_s": trace_s, "total_s": export_s + trace_s,
            "equations": len(used), "primitives": len(set(used)), "max_rel_err": max(errors)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reduced", action="store_true", help="the reduced (test) configurations")
    parser.add_argument("--models", nargs="*", default=sorted(zoo.ZOO))
    args = parser.parse_args()
    rows = []
    print(f"{'model':22s} {'export s':>9s} {'trace s':>8s} {'total s':>8s} {'eqns':>6s} {'prims':>6s} "
          f"{'max rel err':>12s}")
    for name in args.models:
        row = measure(name, args.reduced)
        rows.append(row)
        print(f"{name:22s} {row['export_s']:9.2f} {row['trace_s']:8.2f} {row['total_s']:8.2f} {row['equations']:6d} "
              f"{row['primitives']:6d} {row['max_rel_err']:12.2e}", flush=True)
    out = Path(__file__).parent / "results" / "bench_frontend.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "reduced": args.reduced, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
