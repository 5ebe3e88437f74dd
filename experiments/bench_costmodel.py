"""Cost-model benchmark, one run: fidelity against the simulator, calibration, search quality,
tuner vs random search at equal wall-clock, and evaluation throughput.

    .venv/bin/python experiments/bench_costmodel.py [--mappings 500] [--max-instructions 1200]

1. fidelity: random legal mappings of full-size ResNet-50 (224x224) and BERT-base (128 tokens)
   layers, cost model vs the instruction-level timing simulator: Spearman rank correlation and
   median |relative error| of cycles (targets >= 0.95, <= 5%), and of energy.  Mappings are drawn
   log-uniformly per tile dim and kept if legal and at most --max-instructions long (emitting a
   program costs ~0.1 ms per instruction in Python; that cap leans the sample to larger tiles).
2. calibration: the model's constants fitted on half the measurements, errors on the other half.
3. search quality: the tuner vs exhaustive search (every legal integer mapping, exact model) on
   small layers (target tuner / optimum <= 1.05), with evaluations and seconds.
4. equal wall-clock: random search given the tuner's wall-clock on the ResNet-50/BERT layers.
5. throughput: exact-model evaluations per second, vmapped and jitted (target >= 1e6/s).

Writes experiments/results/bench_costmodel.json.  Wall-clock numbers are from a shared machine:
read ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from costmodel_layers import bert_layers, resnet50_layers  # noqa: E402
from timing_utils import median_time  # noqa: E402

from stagec.costmodel.batch import evaluate, exact_cost  # noqa: E402
from stagec.costmodel.calibrate import calibrate  # noqa: E402
from stagec.costmodel.hardware import hardware_point  # noqa: E402
from stagec.costmodel.problem import layer_shape, mapping_arrays, stack, to_tile_mapping  # noqa: E402
from stagec.costmodel.space import random_legal, random_theta, to_mapping  # noqa: E402
from stagec.costmodel.tuner import TuneSettings, tune_layers  # noqa: E402
from stagec.isa import HardwareConfig  # noqa: E402
from stagec.layers import measure  # noqa: E402
from stagec.lower.schedule.buffers import Extras  # noqa: E402
from stagec.lower.schedule.mapper import default_mapping  # noqa: E402
from stagec.lower.schedule.nest import SWITCHES, ConvProblem, LayerShape, TileMapping, conflicts  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HW = HardwareConfig()
POINT = hardware_point(HW)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fidelity(workloads, count: int, max_instructions: int, seed: int = 0) -> dict:
    per_layer = -(-count // len(workloads))
    rows = []
    t0 = time.perf_counter()
    for i, (name, graph, layer) in enumerate(workloads):
        maps = random_legal(jax.random.PRNGKey(seed * 1000 + i), layer.shape(), POINT, per_layer, max_instructions,
                            oversample=1024)
        for j in range(len(maps.tile_oh)):
            m = jax.tree.map(lambda a, j=j: a[j], maps)
            cycles, energy = measure(graph, layer, to_tile_mapping(m), HW)
            rows.append(dict(layer=name, index=i, mapping=str(to_tile_mapping(m)), **{
                f: float(getattr(m, f)) for f in TileMapping.__dataclass_fields__},
                simulated_cycles=cycles, simulated_energy_pj=energy))
        log(f"  fidelity: {i + 1}/{len(workloads)} layers, {len(rows)} mappings, {time.perf_counter() - t0:.0f}s")
    layers, maps = _batch(rows, [layer.shape() for _, _, layer in workloads], range(len(rows)))
    predicted = exact_cost(layers, maps, POINT)
    for r, c, e in zip(rows, predicted.cycles, predicted.energy_pj, strict=True):
        r.update(predicted_cycles=float(c), predicted_energy_pj=float(e))
    return rows


def _batch(rows, shapes, idx):
    """The (layers, mappings) of some measured rows, as batches."""
    layers = stack([shapes[rows[i]["index"]] for i in idx])
    return layers, TileMapping(*(np.array([rows[i][f] for i in idx], np.float32)
                                   for f in TileMapping.__dataclass_fields__))


def agreement(predicted, simulated) -> dict:
    predicted, simulated = np.asarray(predicted), np.asarray(simulated)
    err = np.abs(predicted / simulated - 1)
    return {"spearman": float(spearmanr(predicted, simulated).statistic), "median_abs_rel_error": float(np.median(err)),
            "p90_abs_rel_error": float(np.quantile(err, 0.9)), "n": int(len(err))}


def calibration(rows, shapes) -> dict:
    rng = np.random.default_rng(0)
    order = rng.permutation(len(rows))
    fit, held = order[: len(rows) // 2], order[len(rows) // 2:]

    def batch(idx):
        return *_batch(rows, shapes, idx), np.array([rows[i]["simulated_cycles"] for i in idx])

    t0 = time.perf_counter()
    result = calibrate(*batch(fit)[:2], POINT, batch(fit)[2])
    layers, maps, measured = batch(held)
    before = exact_cost(layers, maps, POINT).cycles
    after = exact_cost(layers, maps, POINT, result.constants).cycles
    return {"constants": {k: float(v) for k, v in vars(result.constants).items()},
            "fit": {"before": result.error_before, "after": result.error_after},
            "held_out_before": agreement(before, measured), "held_out_after": agreement(after, measured),
            "seconds": time.perf_counter() - t0}


BIAS = dict(channel_words=1, channel_loads=1, channel_load_bytes=4)          # a per-channel fp32 vector
RESIDUAL = dict(tile_bytes=4, tile_loads=1, tile_load_bytes=(0,) * 7 + (4,))   # a whole fp32 tile
SMALL = [   # (kind, problem, epilogue): small enough to enumerate every mapping
    ("matrix", ConvProblem(1, 16, 8, 8, 32, 3, 3, padding=((1, 1), (1, 1))), Extras(**BIAS, plain=2)),
    ("matrix", ConvProblem(1, 24, 1, 40, 32), Extras(**BIAS, plain=1)),
    ("matrix", ConvProblem(1, 32, 6, 6, 24, 1, 1), Extras(**BIAS, **RESIDUAL, plain=2)),
    ("depthwise", ConvProblem(1, 24, 10, 10, 24, 3, 3, padding=((1, 1), (1, 1))), Extras(**BIAS, plain=2)),
]


def all_mappings(kind: str, p: ConvProblem) -> TileMapping:
    L = LayerShape.of(kind, p)
    cs = range(1, p.c + 1) if kind == "matrix" else [1]
    switches = [(0, 1) if s.exists(L) else (0,) for s in SWITCHES]
    grid = np.array(list(itertools.product(range(1, p.oh + 1), range(1, p.ow + 1), range(1, p.o + 1), cs, *switches)),
                    np.float32)
    m = TileMapping(*grid.T)
    keep = ~conflicts(m, L)
    return jax.tree.map(lambda v: v[keep], m)


def search_quality(settings: TuneSettings) -> list[dict]:
    out = []
    for kind, p, extras in SMALL:
        L = layer_shape(kind, p, extras)
        maps = all_mappings(kind, p)
        n = len(maps.tile_oh)
        t0 = time.perf_counter()
        cost = evaluate(jax.tree.map(lambda v, n=n: np.full(n, v, np.float32), L), maps, POINT)
        optimum = float(np.min(np.where(cost.violation > 0, np.inf, cost.cycles)))
        exhaustive_s = time.perf_counter() - t0
        fallback = mapping_arrays(default_mapping(kind, p, HW, extras))
        t0 = time.perf_counter()
        tuned = tune_layers(stack([L]), stack([fallback]), POINT, settings=settings, progress=None)
        out.append({"layer": f"{kind} {p.c}->{p.o} {p.h}x{p.w} k{p.kh}", "optimum_cycles": optimum,
                    "tuner_cycles": float(tuned.values[0]), "default_cycles": float(tuned.fallback_values[0]),
                    "tuner_over_optimum": float(tuned.values[0]) / optimum,
                    "default_over_optimum": float(tuned.fallback_values[0]) / optimum,
                    "exhaustive_evaluations": int(len(maps.tile_oh)), "exhaustive_s": exhaustive_s,
                    "tuner_evaluations": tuned.evaluations, "tuner_gradient_steps": tuned.gradient_steps,
                    "tuner_s": time.perf_counter() - t0})
        log(f"  search: {out[-1]['layer']}: tuner/optimum {out[-1]['tuner_over_optimum']:.3f}")
    return out


def equal_time(workloads, settings: TuneSettings) -> dict:
    """Tuner vs random search given the same wall-clock (the tuner's, measured warm)."""
    shapes = stack([layer.shape() for _, _, layer in workloads])
    fallback = stack([mapping_arrays(default_mapping(layer.kind, layer.problem, HW, layer.extras))
                      for _, _, layer in workloads])
    tune_layers(shapes, fallback, POINT, settings=settings, progress=None)        # compile
    t0 = time.perf_counter()
    tuned = tune_layers(shapes, fallback, POINT, settings=settings, progress=None)
    budget = time.perf_counter() - t0
    best = np.full(len(workloads), np.inf)
    evaluations, key = 0, jax.random.PRNGKey(1)
    layers = jax.tree.map(lambda v: np.repeat(v, 256), shapes)

    @jax.jit
    def draw(key):   # 256 random integer mappings per layer, their exact cycles (inf where illegal)
        theta = jax.vmap(lambda k, L: random_theta(k, L, 256))(jax.random.split(key, len(workloads)), shapes)
        maps = jax.tree.map(lambda a: jnp.round(a).reshape(-1), to_mapping(theta, jax.tree.map(
            lambda v: v[:, None], shapes)))
        cost = exact_cost(layers, maps, POINT)
        return jnp.where(cost.violation > 0, jnp.inf, cost.cycles).reshape(len(workloads), -1).min(1)

    draw(key).block_until_ready()     # compiled before the clock starts, as the tuner was
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < budget:
        key, sub = jax.random.split(key)
        best = np.minimum(best, np.asarray(draw(sub)))
        evaluations += 256 * len(workloads)
    return {"seconds": budget, "tuner_total_cycles": float(np.sum(tuned.values)),
            "random_total_cycles": float(np.sum(best)), "default_total_cycles": float(np.sum(tuned.fallback_values)),
            "random_over_tuner": float(np.sum(best) / np.sum(tuned.values)), "random_evaluations": evaluations,
            "tuner_evaluations": tuned.evaluations, "layers": len(workloads),
            "random_found_nothing_for": int(np.sum(~np.isfinite(best)))}


def throughput(workloads, batch: int = 1 << 20) -> dict:
    shapes = [layer.shape() for _, _, layer in workloads]
    rng = np.random.default_rng(0)
    which = rng.integers(0, len(shapes), batch)
    layers = jax.tree.map(lambda *xs: np.stack(xs)[which], *shapes)
    hi = np.stack([[float(s.oh), float(s.ow), float(s.o), float(s.c)] for s in shapes])[which]
    tiles = np.maximum(1, np.floor(np.exp(rng.uniform(0, 1, (batch, 4)) * np.log(hi)))).astype(np.float32)
    maps = TileMapping(*tiles.T, *rng.integers(0, 2, (4, batch)).astype(np.float32), np.zeros(batch, np.float32))
    layers, maps = jax.device_put((layers, maps))

    def run():
        jax.block_until_ready(exact_cost(layers, maps, POINT))

    seconds = median_time(run, 3)
    return {"batch": batch, "seconds": seconds, "evaluations_per_s": batch / seconds,
            "devices": [str(d) for d in jax.local_devices()], "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mappings", type=int, default=500)
    ap.add_argument("--max-instructions", type=int, default=1200)
    args = ap.parse_args()
    t_all = time.perf_counter()
    log("building ResNet-50 and BERT-base layers")
    workloads = resnet50_layers() + bert_layers()
    rows = fidelity(workloads, args.mappings, args.max_instructions)
    shapes = [layer.shape() for _, _, layer in workloads]
    result = {
        "hw": HW.to_dict(),
        "fidelity": {"cycles": agreement([r["predicted_cycles"] for r in rows], [r["simulated_cycles"] for r in rows]),
                     "energy": agreement([r["predicted_energy_pj"] for r in rows],
                                         [r["simulated_energy_pj"] for r in rows]),
                     "max_instructions": args.max_instructions, "layers": len(workloads)},
    }
    for net in ("resnet50", "bert"):
        mine = [r for r in rows if r["layer"].startswith(net)]
        result["fidelity"][f"cycles_{net}"] = agreement([r["predicted_cycles"] for r in mine],
                                                         [r["simulated_cycles"] for r in mine])
    log("calibrating")
    result["calibration"] = calibration(rows, shapes)
    settings = TuneSettings()
    log("search quality vs exhaustive")
    result["search"] = search_quality(settings)
    log("tuner vs random search at equal wall-clock")
    result["equal_time"] = equal_time(workloads, settings)
    log("throughput")
    result["throughput"] = throughput(workloads)
    result["seconds"] = time.perf_counter() - t_all
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_costmodel.json").write_text(json.dumps({**result, "mappings": rows}, indent=1) + "\n")
    print(table(result))


def table(r: dict) -> str:
    f, c = r["fidelity"], r["calibration"]
    lines = [f"{'metric':<58} {'value':>12} {'target':>10}", "-" * 82]

    def row(name, value, target=""):
        lines.append(f"{name:<58} {value:>12} {target:>10}")

    row(f"fidelity: mappings (ResNet-50 + BERT-base, {f['layers']} layers)", f["cycles"]["n"])
    row("  cycles Spearman (all)", f"{f['cycles']['spearman']:.4f}", ">= 0.95")
    row("  cycles median |rel err| (all)", f"{100 * f['cycles']['median_abs_rel_error']:.2f}%", "<= 5%")
    row("  cycles p90 |rel err|", f"{100 * f['cycles']['p90_abs_rel_error']:.2f}%")
    for net in ("resnet50", "bert"):
        g = f[f"cycles_{net}"]
        row(f"  {net}: Spearman / median |rel err| (n={g['n']})",
            f"{g['spearman']:.3f}/{100 * g['median_abs_rel_error']:.1f}%")
    row("  energy Spearman / median |rel err|",
        f"{f['energy']['spearman']:.4f}/{100 * f['energy']['median_abs_rel_error']:.2f}%")
    row("calibration: held-out median |rel err| before -> after",
        f"{100 * c['held_out_before']['median_abs_rel_error']:.2f}->"
        f"{100 * c['held_out_after']['median_abs_rel_error']:.2f}%")
    row("  held-out Spearman before -> after",
        f"{c['held_out_before']['spearman']:.3f}->{c['held_out_after']['spearman']:.3f}")
    for s in r["search"]:
        row(f"search: {s['layer']}: tuner/optimum (default/opt)",
            f"{s['tuner_over_optimum']:.3f} ({s['default_over_optimum']:.2f})", "<= 1.05")
        row("  evaluations tuner/exhaustive, s tuner (1st: +jit)/exh.",
            f"{s['tuner_evaluations'] // 1000}k/{s['exhaustive_evaluations'] // 1000}k "
            f"{s['tuner_s']:.1f}/{s['exhaustive_s']:.1f}")
    e = r["equal_time"]
    row(f"equal wall-clock ({e['seconds']:.1f}s): random/tuner total cycles", f"{e['random_over_tuner']:.3f}", "> 1")
    row("  tuner / default mapper total cycles", f"{e['tuner_total_cycles'] / e['default_total_cycles']:.3f}")
    t = r["throughput"]
    row(f"throughput: exact evaluations/s (batch {t['batch']}, jit+vmap)", f"{t['evaluations_per_s']:.3g}", ">= 1e6")
    row(f"  on {len(t['devices'])} {t['devices'][0].split(':')[0]} device(s), {t['cpus']} cores, load average",
        f"{t['load_average_1min']:.1f}")
    row("total benchmark seconds", f"{r['seconds']:.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
