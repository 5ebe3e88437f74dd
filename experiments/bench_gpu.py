"""GPU benchmark of the simulator and the cost model: prepared where torch is, run on any JAX device.

    .venv/bin/python experiments/bench_gpu.py prepare gpu_bench            # here: compile, save (minutes)
    .venv/bin/python experiments/bench_gpu.py run gpu_bench --budget-s 120  # any device; no torch needed

On a GPU host (its own Python with jax; no torch2jax, no network), from the repository root, with gpu_bench/ beside it:

    python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . && PYTHONPATH=/tmp/site python3 experiments/bench_gpu.py run gpu_bench --budget-s 300 --out $OUT/bench_gpu.json

`prepare DIR` compiles full-size MobileNetV2 (fp32, a 15.4 MB program), full-size ResNet-50 in int8 (27.3 MB;
fp32 would be ~100 MB) and reduced MobileNetV2 (fp32, the small one) on the default config, and saves each
program (.stgc), its inputs and the batched executor's outputs on this machine (.npy, the reference the run
compares with), and the cost-model problems of ResNet-50's and BERT-base's distinct conv/matmul layers with
their default mappings (.npz), listed in DIR/manifest.json.

`run DIR` imports neither torch, torch2jax nor stagec.frontend (its JSON says so) and measures, each item in
its share of --budget-s (a larger size whose estimated cost would overrun the share is skipped, saying so):
  1. executor: each program executed functionally; seconds per inference (median of warm repeats), the first
     call's extra seconds (planning and jit compilation) apart; output vs the saved reference: bit-exact for
     int8 programs, for fp32 within 1e-4 of the output's largest magnitude (another device sums in another
     order);
  2. timing: `program_cycles` vmapped over N random configs (each continuous field scaled by up to 2x either
     way; the first is the program's own, checked against the unbatched call): configs per second;
  3. costmodel: `evaluate` over (configs x layers) batches of ResNet-50's and BERT's layers on random
     structural configs (host -> device -> host included): evaluations per second; then jax.grad of the
     relaxed model's total log-cycles in every pair's hardware point (device-resident inputs);
  4. tuner: `tune_layers` on ResNet-50's layers from a growing number of starts: gradient steps (points x
     adam steps) per second; every tuned mapping at most as costly as its default is checked.
One table (device, item, size, warm s, per second, first-call extra s) on stdout, and JSON to --out (default
experiments/results/bench_gpu.json).  --budget-s holds but for the smallest size of an item, which always runs
while any budget is left (on a loaded 2-core CPU the tuner's first call compiles for over a minute).
"""  # noqa: E501 -- the GPU host's command above is one line, to paste whole

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from stagec.costmodel.batch import evaluate, exact_cost
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.problem import layer_shape, mapping_arrays
from stagec.costmodel.tuner import TuneSettings, tune_layers
from stagec.errors import ReferenceFallbackWarning
from stagec.isa import HardwareConfig
from stagec.lower.schedule.mapper import default_mapping
from stagec.lower.schedule.nest import ConvProblem, TileMapping
from stagec.program_file import load
from stagec.sim.executor import execute
from stagec.sim.timing import program_cycles

RESULTS = Path(__file__).resolve().parent / "results"
FP32_TOLERANCE = 1e-4   # of the output's largest magnitude
REPEAT = 3              # warm calls per measurement (their median)
PROGRAMS = {   # name -> (zoo model, reduced, quantize): the small one first
    "mobilenet_v2_small_fp32": ("mobilenet_v2", True, None),
    "mobilenet_v2_fp32": ("mobilenet_v2", False, None),
    "resnet50_int8": ("resnet50", False, "int8"),
}
TIMING_PROGRAMS = ("mobilenet_v2_fp32", "resnet50_int8")
LAYER_STRUCTURE = jax.tree.structure(layer_shape("matrix", ConvProblem(1, 1, 1, 1, 1)))
MAPPING_STRUCTURE = jax.tree.structure(mapping_arrays(TileMapping(1, 1, 1, 1)))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- prepare (torch, the frontend and the experiments' layer builders are imported here only) --------------

def save_program(out: Path, name: str, program, inputs: list[np.ndarray]) -> dict:
    """`program` (.stgc), its inputs and this machine's executor outputs (.npy) under `out`; its manifest entry."""
    program.save(out / f"{name}.stgc")
    outputs = execute(program, inputs)
    for kind, arrays in (("in", inputs), ("out", outputs)):
        for i, a in enumerate(arrays):
            np.save(out / f"{name}.{kind}{i}.npy", a)
    return {"name": name, "instructions": len(program), "inputs": len(inputs), "outputs": len(outputs),
            "quantize": program.metadata.get("quantize"), "bytes": (out / f"{name}.stgc").stat().st_size}


def save_layers(out: Path, name: str, layers: list, hw: HardwareConfig) -> dict:
    """The cost-model problems of `layers` (stagec.layers.Layer) and their default mappings on `hw`, one row
    of float32 leaves each (LAYER_STRUCTURE, MAPPING_STRUCTURE), as {name}.layers.npz."""
    shapes = np.array([jax.tree.leaves(L.shape()) for L in layers], np.float32)
    maps = np.array([jax.tree.leaves(mapping_arrays(default_mapping(L.kind, L.problem, hw, L.extras)))
                     for L in layers], np.float32)
    np.savez(out / f"{name}.layers.npz", layers=shapes, mappings=maps, names=np.array([L.name for L in layers]))
    return {"name": name, "layers": len(layers)}


def prepare(out: Path, programs: dict, timing: tuple, layer_sets: dict) -> dict:
    """Compile and save `programs` ({name: (model, args, kwargs, quantize)}) and `layer_sets` ({name: a
    function returning stagec.layers.Layer list}) under `out`, with manifest.json listing them, `timing`
    naming the programs the timing item takes."""
    import stagec
    from stagec.api import program_inputs

    out.mkdir(parents=True, exist_ok=True)
    manifest = {"hw": HardwareConfig().to_dict(), "programs": [], "timing": list(timing), "layer_sets": []}
    for name, (model, args, kwargs, quantize) in programs.items():
        t = time.perf_counter()
        program = stagec.compile(model, args, kwargs=kwargs, quantize=quantize, progress=False)
        entry = save_program(out, name, program, program_inputs(program, args, kwargs))
        manifest["programs"].append({**entry, "prepare_s": round(time.perf_counter() - t, 1)})
        log(f"prepare: {name}: {entry['instructions']} instructions, {entry['bytes'] / 1e6:.1f} MB")
    for name, build in layer_sets.items():
        manifest["layer_sets"].append(save_layers(out, name, build(), HardwareConfig()))
        log(f"prepare: {name} layers saved")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def prepare_default(out: Path) -> dict:
    """`prepare` of PROGRAMS (zoo models, seeded random weights) and ResNet-50's and BERT-base's layers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_layers import bert_layers, resnet50_layers

    from stagec import zoo

    programs = {name: (*zoo.build(model, reduced=reduced), quantize)
                for name, (model, reduced, quantize) in PROGRAMS.items()}
    layer_sets = {"resnet50": resnet50_layers, "bert": bert_layers}
    return prepare(out, programs, TIMING_PROGRAMS,
                   {k: lambda f=f: [L for _, _, L in f()] for k, f in layer_sets.items()})


# --- run ---------------------------------------------------------------------------------------------------

def load_layers(folder: Path, names) -> tuple:
    """(LayerShape, TileMapping) batches of the named layer sets, saved by `save_layers`."""
    rows = [np.load(folder / f"{name}.layers.npz") for name in names]
    layers, maps = (np.concatenate([r[key] for r in rows]) for key in ("layers", "mappings"))
    for structure, a in ((LAYER_STRUCTURE, layers), (MAPPING_STRUCTURE, maps)):
        if a.shape[1] != structure.num_leaves:
            raise ValueError(f"{folder}: layer arrays have {a.shape[1]} fields, this stagec's {structure} has "
                             f"{structure.num_leaves}: prepare again with this stagec")
    return jax.tree.unflatten(LAYER_STRUCTURE, list(layers.T)), jax.tree.unflatten(MAPPING_STRUCTURE, list(maps.T))


def timed(fn, repeat: int = REPEAT) -> tuple[float, float, object]:
    """(first call's seconds, median of `repeat` warm calls' seconds, the last result)."""
    t = time.perf_counter()
    result = jax.block_until_ready(fn())
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return first, statistics.median(times), result


@dataclass(frozen=True)
class Row:
    item: str
    size: str
    warm_s: float | None = None
    rate: float | None = None
    unit: str = ""
    compile_s: float | None = None
    check: str = ""


@dataclass
class Budget:
    """The run's seconds, shared out: each item gets what is left over the items still to run."""

    end: float
    items_left: int

    def share(self) -> float:
        allowance = (self.end - time.perf_counter()) / max(self.items_left, 1)
        self.items_left -= 1
        return time.perf_counter() + allowance


def sized(item: str, sizes: list, measure, deadline: float, label=str) -> list[Row]:
    """measure(size) -> Row for each size in growing order, while the estimated cost of the next fits before
    `deadline` (a skipped one's row named label(size)); a failure ends the item, printed."""
    rows, last = [], None
    for size in sizes:
        left = deadline - time.perf_counter()
        if left <= 0 or (last is not None and estimate(*last, size) > left):
            why = "budget used" if left <= 0 else f"~{estimate(*last, size):.0f} s > {left:.0f} s left"
            rows.append(Row(item, label(size), check=f"skipped: {why}"))
            log(f"  {item} {size}: {rows[-1].check}")
            continue
        t = time.perf_counter()
        try:
            rows.append(measure(size))
        except Exception as e:   # noqa: BLE001 -- one API drift must not lose the other items
            traceback.print_exc()
            rows.append(Row(item, label(size), check=f"error: {type(e).__name__}: {e}"[:300]))
            break
        last = (rows[-1], time.perf_counter() - t, size)
        log(f"  {item} {size}: {rows[-1]}")
    return rows


def estimate(row: Row, seconds: float, size, next_size) -> float:
    """Seconds a larger size will take: the first call's extra again (a new shape compiles anew) and every
    call's warm time scaled by the size ratio (without the split: all seconds scaled).  Linear is an upper
    bound where the batch is latency-bound: on an H200 the vmapped timing simulator took 0.82 s for one config
    and 0.73 s for 1024, so name the sizes (--timing-sizes 1024) rather than let them be skipped."""
    ratio = next_size / size
    if row.warm_s is None or row.compile_s is None:
        return seconds * ratio
    return row.compile_s + (1 + REPEAT) * row.warm_s * ratio


def executor_rows(folder: Path, manifest: dict, deadline: float) -> list[Row]:
    entries = {e["instructions"]: e for e in manifest["programs"]}

    def label(instructions: int) -> str:
        return f"{entries[instructions]['name']} ({instructions} instr)"

    def measure(instructions: int) -> Row:
        e = entries[instructions]
        program = load(folder / f"{e['name']}.stgc")
        inputs = [np.load(folder / f"{e['name']}.in{i}.npy") for i in range(e["inputs"])]
        expected = [np.load(folder / f"{e['name']}.out{i}.npy") for i in range(e["outputs"])]
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReferenceFallbackWarning)   # the slow interpreter is not the benchmark
            first, warm, outputs = timed(lambda: execute(program, inputs))
        return Row("executor", label(instructions), warm, 1 / warm, "inferences/s", first - warm,
                   output_check(outputs, expected, exact=e["quantize"] == "int8"))

    return sized("executor", sorted(entries), measure, deadline, label)


def output_check(outputs, expected, exact: bool) -> str:
    err = max(float(np.max(np.abs(o.astype(np.float64) - r), initial=0)) for o, r in zip(outputs, expected,
                                                                                          strict=True))
    scale = max(float(np.max(np.abs(r), initial=0)) for r in expected)
    ok = err == 0 if exact else err <= FP32_TOLERANCE * scale
    return f"{'ok' if ok else 'MISMATCH'}: max |diff| {err:.3g} ({'exact' if exact else 'rel'} of max {scale:.3g})"


def random_configs(hw: HardwareConfig, n: int, seed: int = 0) -> HardwareConfig:
    """`hw`'s pytree with every continuous leaf scaled by 2**u, u uniform in [-1, 1], per config; config 0 is hw."""
    rng = np.random.default_rng(seed)
    leaves, structure = jax.tree.flatten(hw)
    scaled = [np.float32(v) * np.exp2(np.concatenate([[0.0], rng.uniform(-1, 1, n - 1)])).astype(np.float32)
              for v in leaves]
    return jax.tree.unflatten(structure, scaled)


def timing_rows(folder: Path, names: list[str], sizes: list[int], deadline: float) -> list[Row]:
    rows = []
    for k, name in enumerate(names):
        program = load(folder / f"{name}.stgc")
        single = float(program_cycles(program))
        batched = jax.jit(jax.vmap(lambda h, p=program: program_cycles(p, h)))

        def measure(n: int, name=name, batched=batched, single=single, program=program) -> Row:
            first, warm, cycles = timed(lambda: batched(random_configs(program.hw, n)))
            ok = abs(float(cycles[0]) - single) <= 1e-6 * single and bool(np.isfinite(cycles).all())
            return Row("timing", f"{name} ({len(program)} instr) x {n} configs", warm, n / warm, "configs/s",
                       first - warm, f"{'ok' if ok else 'MISMATCH'}: config 0 {float(cycles[0]):.0f} cycles")

        share = time.perf_counter() + (deadline - time.perf_counter()) / (len(names) - k)
        rows += sized("timing", sizes, measure, share, lambda n, name=name: f"{name} x {n} configs")
    return rows


def structural_configs(n: int, seed: int = 0):
    """n random HardwarePoints (fields of shape (n,)): array shape, memories, lanes, dataflow varied."""
    rng = np.random.default_rng(seed)
    base = jax.tree.map(lambda v: np.full(n, v, np.float32), hardware_point(HardwareConfig()))
    draws = {"array_rows": [4, 8, 16, 32, 64], "array_cols": [4, 8, 16, 32, 64],
             "scratchpad_bytes": [s * 32 * 1024 for s in range(1, 17)], "accumulator_bytes": [32768, 65536, 131072],
             "vector_lanes": [8, 16, 32], "weight_stationary": [0.0, 1.0]}
    return replace(base, **{k: rng.choice(v, n).astype(np.float32) for k, v in draws.items()})


def pairs_of(layers, maps, n_pairs: int):
    """(layers, mappings, hardware points) of ceil(n_pairs / layers) random configs x every layer."""
    n_layers = len(maps.tile_oh)
    configs = -(-n_pairs // n_layers)
    hws = jax.tree.map(lambda v: np.repeat(v, n_layers), structural_configs(configs))
    return (*(jax.tree.map(lambda v: np.tile(v, configs), t) for t in (layers, maps)), hws)


@jax.jit
def _log_cycles_grad(layers, maps, hws):
    def total(h):
        return jnp.sum(jnp.log(exact_cost(layers, maps, h, smooth=0.05, hw_batched=True).cycles))
    return jax.grad(total)(hws)


def costmodel_rows(folder: Path, sets: list[str], sizes: list[int], deadline: float) -> list[Row]:
    layers, maps = load_layers(folder, sets)

    def measure(n: int) -> Row:
        batch = pairs_of(layers, maps, n)
        first, warm, cost = timed(lambda: evaluate(*batch))
        pairs = len(cost.cycles)
        ok = bool(np.isfinite(cost.cycles).all() and (cost.cycles > 0).all())
        return Row("costmodel evaluate", f"{pairs} pairs", warm, pairs / warm, "evaluations/s", first - warm,
                   "ok: cycles finite, > 0" if ok else "MISMATCH: cycles not finite or <= 0")

    def measure_grad(n: int) -> Row:
        batch = jax.device_put(pairs_of(layers, maps, n))
        first, warm, grad = timed(lambda: _log_cycles_grad(*batch))
        pairs = len(batch[1].tile_oh)
        finite = all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grad))
        faster = float(jnp.mean(grad.config.dma_bandwidth_bytes_per_cycle)) < 0
        return Row("costmodel grad", f"{pairs} pairs", warm, pairs / warm, "pair-gradients/s", first - warm,
                   f"{'ok' if finite and faster else 'MISMATCH'}: finite {finite}, mean d/d(bandwidth) < 0 {faster}")

    half = time.perf_counter() + (deadline - time.perf_counter()) / 2
    def label(n: int) -> str:
        return f"~{n} pairs"

    return (sized("costmodel evaluate", sizes, measure, half, label)
            + sized("costmodel grad", sizes, measure_grad, deadline, label))


def tuner_rows(folder: Path, layer_set: str, starts: list[int], deadline: float) -> list[Row]:
    layers, maps = load_layers(folder, [layer_set])
    point = hardware_point(HardwareConfig())

    def measure(n: int) -> Row:
        settings = TuneSettings(starts=n)
        first, warm, out = timed(lambda: tune_layers(layers, maps, point, settings=settings, progress=None))
        ok = bool((out.values <= out.fallback_values).all())
        ratio = out.values.sum() / out.fallback_values.sum()
        return Row("tuner", f"{len(maps.tile_oh)} layers x {n} starts x {settings.steps} steps", warm,
                   out.gradient_steps / warm, "point-steps/s", first - warm,
                   f"{'ok' if ok else 'MISMATCH'}: tuned/default cycles {ratio:.3f}")

    return sized("tuner", starts, measure, deadline, lambda n: f"{n} starts")


def run(folder: Path, budget_s: float, timing_sizes, costmodel_sizes, tuner_starts) -> dict:
    manifest = json.loads((folder / "manifest.json").read_text())
    sets = [s["name"] for s in manifest["layer_sets"]]
    items = {"executor": lambda d: executor_rows(folder, manifest, d),
             "timing": lambda d: timing_rows(folder, manifest["timing"], timing_sizes, d),
             "costmodel": lambda d: costmodel_rows(folder, sets, costmodel_sizes, d),
             "tuner": lambda d: tuner_rows(folder, sets[0], tuner_starts, d)}
    budget = Budget(time.perf_counter() + budget_s, len(items))
    device = str(jax.devices()[0])
    rows = []
    for name, item in items.items():
        deadline = budget.share()
        log(f"{name}: {deadline - time.perf_counter():.0f} s of budget")
        try:
            rows += item(deadline)
        except Exception as e:   # noqa: BLE001 -- as in `sized`: report, go on to the next item
            traceback.print_exc()
            rows.append(Row(name, "-", check=f"error: {type(e).__name__}: {e}"[:300]))
    return {"device": device, "platform": jax.default_backend(), "jax": jax.__version__,
            "python": platform.python_version(), "budget_s": budget_s,
            "loaded": {m: m in sys.modules for m in ("torch", "torch2jax", "stagec.frontend")},
            "rows": [{"device": device, **{f.name: getattr(r, f.name) for f in fields(r)}} for r in rows]}


def table(result: dict) -> str:
    def num(v, spec):
        return "-" if v is None else format(v, spec)
    lines = [f"{'device':<14} {'item':<19} {'size':<52} {'warm s':>9} {'per second':>22} {'1st +s':>7}  check"]
    for r in result["rows"]:
        rate = "-" if r["rate"] is None else f"{r['rate']:.3g} {r['unit']}"
        lines.append(f"{r['device'][:14]:<14} {r['item']:<19} {r['size'][:52]:<52} {num(r['warm_s'], '9.4f'):>9} "
                     f"{rate:>22} {num(r['compile_s'], '7.1f'):>7}  {r['check']}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare").add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, default=RESULTS / "bench_gpu.json")
    r.add_argument("--budget-s", type=float, default=360)
    r.add_argument("--timing-sizes", type=int, nargs="+", default=[1, 64, 1024])
    r.add_argument("--costmodel-sizes", type=int, nargs="+", default=[10 ** k for k in range(3, 7)])
    r.add_argument("--tuner-starts", type=int, nargs="+", default=[16, 128, 1024])
    args = ap.parse_args(argv)
    if args.command == "prepare":
        prepare_default(args.dir)
        total = sum(f.stat().st_size for f in args.dir.iterdir())
        print(f"{args.dir}: {total / 1e6:.1f} MB")
        return
    t = time.perf_counter()
    result = run(args.dir, args.budget_s, sorted(args.timing_sizes), sorted(args.costmodel_sizes),
                 sorted(args.tuner_starts))
    result["wall_s"] = round(time.perf_counter() - t, 1)
    print(table(result))
    print(f"wall {result['wall_s']} s of budget {args.budget_s:.0f} s; loaded: {result['loaded']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
