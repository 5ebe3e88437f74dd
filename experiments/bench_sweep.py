"""Sweep benchmark, one run: what a sweep point costs, simulated and predicted.

    .venv/bin/python experiments/bench_sweep.py [--configs 6] [--batch-configs 256] [--sweep-points 12]

1. a full-size ResNet-50 (224x224) sweep point, simulated: the compiler's stages from `pack` on
   (the graph built once) and the simulator's timing and energy, no functional run (target <= 2 s),
   per stage, for each objective the mapper may minimize, over --configs hardware configs (the
   timing simulator's jitted scheduler warmed first, as a worker is after its first points);
2. cost-model evaluations per second: every (config, layer) pair of ResNet-50's conv/matmul layers
   on --batch-configs random configs, one batched, jitted call sharded over the local devices
   (more CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N; GPUs: jax[cuda]);
3. a stagec.sweep of reduced MobileNetV2 (--sweep-points configs), in one process and on a local
   Ray instance of 2 workers: points per second, and per worker.

Writes experiments/results/bench_sweep.json.  Wall-clock numbers are from a shared machine: read ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from stagec import zoo
from stagec.costmodel.batch import evaluate
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.problem import mapping_arrays, stack
from stagec.isa import HardwareConfig
from stagec.layers import model_layers
from stagec.lower.schedule import mapper
from stagec.lower.schedule.mapper import default_mapping
from stagec.lower.schedule.nest_map import FIRST_COMPOSED
from stagec.pipeline import PIPELINE, Compilation, Request, build_graph, position, run
from stagec.report import make_report
from stagec.sweeps import sweep

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = [dict(array_rows=r, array_cols=c, scratchpad_bytes=s * 1024, dataflow=d)
           for r, c, s, d in ((16, 16, 256, "weight_stationary"), (32, 32, 512, "weight_stationary"),
                              (8, 16, 128, "weight_stationary"), (16, 32, 256, "output_stationary"),
                              (32, 8, 192, "weight_stationary"), (8, 8, 64, "output_stationary"))]


def simulated_point(graph, configs: list[dict], objectives=("latency", "energy", "edp", "edp/all")) -> dict:
    """Seconds per stage of lowering and timing `graph` on each config, median over configs: wall
    clock and this process's CPU time (on a shared machine the wall clock counts other sessions)."""
    for config in configs:   # warm: the timing scheduler compiles once per padded program size
        make_report(run(PIPELINE[position("pack"):], Compilation(Request(None, hw=HardwareConfig(**config)),
                                                                 graph=graph)).program)
    out = {}
    for objective in objectives:
        # "edp/all": the mapper composing every fitting candidate, as it did for energy and EDP before
        # it pruned them by a bound (same mappings, tests/test_schedule.py)
        mapper.FIRST_COMPOSED = 1 << 62 if objective.endswith("/all") else FIRST_COMPOSED
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for config in configs:
            mapper._map_nest.cache_clear()   # as on a config never mapped before (the warm-up mapped these)
            c = Compilation(Request(None, hw=HardwareConfig(**config), objective=objective.split("/")[0]),
                            graph=graph)
            steps = [(stage.name, lambda c, stage=stage: run([stage], c)) for stage in PIPELINE[position("pack"):]]
            for name, step in steps + [("time+energy", lambda c: make_report(c.program) and c)]:
                t, p = time.perf_counter(), time.process_time()
                c = step(c)
                wall.setdefault(name, []).append(time.perf_counter() - t)
                cpu.setdefault(name, []).append(time.process_time() - p)
        out[objective] = {clock: {"median_s": statistics.median(sum(v[i] for v in d.values())
                                                                for i in range(len(configs))),
                                  "stages_median_s": {k: round(statistics.median(v), 3) for k, v in d.items()}}
                          for clock, d in (("wall", wall), ("cpu", cpu))}
        for clock in ("cpu", "wall"):
            print(f"  ResNet-50 point, objective {objective}, {clock}: median "
                  f"{out[objective][clock]['median_s']:.2f} s; {out[objective][clock]['stages_median_s']}", flush=True)
    mapper.FIRST_COMPOSED = FIRST_COMPOSED
    return out


def costmodel_throughput(graph, n_configs: int, repeat: int = 5) -> dict:
    """(config, layer) pairs evaluated per second by one batched call (default-config mappings)."""
    layers = model_layers(graph)
    rng = np.random.default_rng(0)
    configs = [HardwareConfig(array_rows=int(rng.choice([4, 8, 16, 32, 64])),
                              array_cols=int(rng.choice([4, 8, 16, 32])),
                              scratchpad_bytes=int(rng.integers(1, 17)) * 32 * 1024,
                              dma_bandwidth_bytes_per_cycle=float(rng.uniform(4, 64))) for _ in range(n_configs)]
    maps = [mapping_arrays(default_mapping(L.kind, L.problem, HardwareConfig(), L.extras, L.name, "edp"))
            for L in layers]
    shapes = stack([L.shape() for L in layers] * n_configs)
    mappings = stack(maps * n_configs)
    hws = stack([hardware_point(h) for h in configs for _ in layers])
    t = time.perf_counter()
    evaluate(shapes, mappings, hws)
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = evaluate(shapes, mappings, hws)
        times.append(time.perf_counter() - t)
    pairs = n_configs * len(layers)
    best = statistics.median(times)
    result = {"devices": len(jax.local_devices()), "platform": jax.default_backend(), "configs": n_configs,
              "layers": len(layers), "pairs": pairs, "first_call_s": round(first, 2), "median_s": best,
              "pairs_per_s": pairs / best, "configs_per_s": n_configs / best,
              "finite": bool(np.isfinite(out.cycles).all())}
    print(f"  cost model: {pairs} (config, layer) pairs in {best * 1e3:.1f} ms on {result['devices']} "
          f"{result['platform']} device(s): {result['pairs_per_s']:.3g} evaluations/s, "
          f"{result['configs_per_s']:.3g} ResNet-50 configs/s (first call, with compilation, {first:.1f} s)",
          flush=True)
    return result


def sweep_rates(points: int) -> dict:
    """stagec.sweep of reduced MobileNetV2, local and on 2 Ray workers: points/s (per worker)."""
    space = {"array_rows": [4, 8, 16, 32], "array_cols": [8, 16, 32], "scratchpad_bytes": [128 * 1024]}
    out = {}
    executors = ["local"] + (["ray"] if importlib.util.find_spec("ray") else [])
    for executor in executors:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            results = sweep(["mobilenet_v2"], space, samples=points, seed=1, reduced=True, out=Path(tmp) / "s.jsonl",
                            executor=executor, workers=2, progress=False)
            wall = time.perf_counter() - t
        workers = 1 if executor == "local" else 2
        busy = sum(r["seconds"] for r in results.rows)
        out[executor] = {"points": len(results.rows), "wall_s": wall, "points_per_s": len(results.rows) / wall,
                         "points_per_s_per_worker": len(results.rows) / wall / workers,
                         "point_median_s": statistics.median(r["seconds"] for r in results.rows),
                         "worker_busy_s": busy}
        print(f"  sweep, {executor}: {len(results.rows)} points in {wall:.1f} s (tracing and start-up included): "
              f"{out[executor]['points_per_s']:.2f} points/s, {out[executor]['points_per_s_per_worker']:.2f} "
              f"per worker; median point {out[executor]['point_median_s']:.2f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=len(CONFIGS))
    ap.add_argument("--batch-configs", type=int, default=256)
    ap.add_argument("--sweep-points", type=int, default=12)
    ap.add_argument("--parts", nargs="+", choices=("point", "costmodel", "sweep"),
                    default=["point", "costmodel", "sweep"])
    args = ap.parse_args()
    model, margs, kwargs = zoo.build("resnet50")
    t = time.perf_counter()
    graph = build_graph(model, margs, kwargs=kwargs)[1]
    print(f"ResNet-50 traced and built once: {time.perf_counter() - t:.1f} s", flush=True)
    parts = {"point": lambda: simulated_point(graph, CONFIGS[:args.configs]),
             "costmodel": lambda: costmodel_throughput(graph, args.batch_configs),
             "sweep": lambda: sweep_rates(args.sweep_points)}
    result = {"cpus": os.cpu_count(), "load_average": os.getloadavg(),
              **{name: parts[name]() for name in args.parts}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / 'bench_sweep.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
