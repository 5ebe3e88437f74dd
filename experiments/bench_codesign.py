"""Co-design against the searches the issue names (21), on a MobileNet-class and a transformer-class
model (the zoo's reduced configs), in two design spaces.

    .venv/bin/python experiments/bench_codesign.py [--space small|large|both] [--objective edp] [--seeds 3]

Spaces (each: the sized fields codesign chooses, array rows and columns, scratchpad, accumulator,
DMA bandwidth, and the dataflow; on the buildable grid, costmodel.grid):
  small  3 mm^2: arrays 4..64 in steps of 4, memories 32 KiB..1 MiB in 32 KiB steps, 4..64 B/cycle
         (7,088 buildable configs under the budget);
  large  6 mm^2: arrays 4..128, memories 32 KiB..2 MiB, 4..128 B/cycle (hundreds of thousands).
For each model and space:
  codesign                      stagec.codesign (descent, exact-model grid search, its best few simulated);
  random, equal evaluations     random hardware under the budget, each with the compiler's (default
                                mapper's) mapping, as many exact-model evaluations as codesign, the best
                                `confirm` simulated;
  random, equal simulations     the same, given only as many simulated points as codesign simulated;
  random HW+mapping (DOSA)      random hardware AND a random legal mapping per layer (uniform over the
                                mapper's candidates that fit: lower.schedule.mapper.random_mapping), as
                                DOSA's random baseline samples both; equal evaluations, best few simulated
                                with their own mappings;
  TPE, equal evaluations / time optuna's TPE over the same grid (an index per field, the dataflow
                                categorical), over-budget draws told a penalty without an evaluation;
                                stopped at as many samples under the budget as codesign's evaluations
                                (a config TPE draws again counts: it converges and redraws, and
                                counting distinct configs ran for tens of minutes), or at codesign's
                                wall time (which includes its descent's one XLA compilation, ~30 s);
  exhaustive sweep              (small only) stagec.sweep in cost-model mode over every config under the
                                budget (the exact model, each layer on the default mapper's mapping), its
                                best `confirm` simulated: every point simulated would take about an hour
                                per model here.  Its time is the sum of its rows' seconds, so a resumed
                                sweep (experiments/results/sweep_*.jsonl) reports what it first cost.
Reported: evaluated points, simulated points, wall time, the best simulated latency and EDP (seeded
searches: the median over seeds, by the objective).  Writes experiments/results/bench_codesign_SPACE.json.
Every search here prices and simulates configs layer by layer (codesign with fusion=False), as the
baselines do.  --fusion instead runs codesign alone with fusion on and off (stagec.fusing: configs priced,
and their programs simulated, with the cascades compile builds) and reports each pick's predicted and
simulated cycles, DRAM traffic and energy (experiments/results/bench_codesign_fusion_SPACE.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stagec import zoo
from stagec.codesigning import Workloads, codesign_graphs
from stagec.costmodel.codesign import CodesignSettings
from stagec.costmodel.grid import SIZED, fit_banks
from stagec.costmodel.model import DEFAULT_CONSTANTS
from stagec.costmodel.rounding import Constraints, Search, area_of, objective_value
from stagec.errors import StagecError, TilingError
from stagec.isa import HardwareConfig
from stagec.isa.config import DATAFLOWS
from stagec.layers import model_graph
from stagec.lower.schedule.nest_map import random_mapping
from stagec.pipeline import lower_graph
from stagec.report import make_report
from stagec.sweeps import sweep

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"MobileNetV2 (reduced)": "mobilenet_v2", "BERT-base (reduced)": "bert_base"}
PENALTY = 1e3     # TPE's value for a draw over the area budget or that no mapping fits (feasible ones: ~10-60)


@dataclass(frozen=True)
class Space:
    budget: float
    settings: CodesignSettings
    exhaustive: bool


SPACES = {"small": Space(3.0, CodesignSettings(array_range=(4.0, 64.0), memory_range=(32768.0, 1048576.0),
                                               report_every=0), True),
          "large": Space(6.0, CodesignSettings(array_range=(4.0, 128.0), memory_range=(32768.0, 2097152.0),
                                               bandwidth_range=(4.0, 128.0), report_every=0), False)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def describe(hw: HardwareConfig) -> str:
    return (f"{hw.array_rows}x{hw.array_cols} {hw.dataflow.split('_')[0]} {hw.scratchpad_bytes // 1024}+"
            f"{hw.accumulator_bytes // 1024} KiB {hw.dma_bandwidth_bytes_per_cycle:g} B/cycle")


def simulated(graph, hw: HardwareConfig, work: Workloads, maps=None) -> dict:
    """The simulator's cycles, energy and EDP of `graph` on `hw`, each conv-shaped layer on its row's
    mapping in `maps` (default: the compiler's)."""
    report = make_report(lower_graph(graph, hw, work.model_mappings(hw, maps)[0]))
    energy = sum(report.energy_pj.values())
    return {"cycles": report.cycles, "latency_us": report.latency_s * 1e6, "energy_uj": energy / 1e6,
            "edp": report.latency_s * energy * 1e-12, "hw": describe(hw), "area_mm2": area_of(hw)}


def best_simulated(graph, work: Workloads, candidates, objective: str, count: int) -> tuple[dict, int]:
    """The best by the simulator of the first `count` of `candidates` ((hw, maps or None), best first
    by the exact model) the compiler takes, and how many were simulated; a candidate it refuses (a
    random mapping it cannot emit) is skipped for the next."""
    runs = []
    for hw, maps in candidates:
        if len(runs) == count:
            break
        try:
            runs.append(simulated(graph, hw, work, maps))
        except StagecError as e:
            log(f"    skipped {describe(hw)}: {type(e).__name__}: {str(e)[:120]}")
    key = "cycles" if objective == "latency" else "edp"
    return min(runs, key=lambda r: r[key]), len(runs)


def random_configs(rng, space: Space, count: int) -> list[HardwareConfig]:
    grid, out = space.settings.grid(), []
    while len(out) < count:
        hw = fit_banks(HardwareConfig(dataflow=str(rng.choice(DATAFLOWS)),
                                      **{n: rng.choice(grid.values(n)).item() for n in SIZED}))
        if area_of(hw) <= space.budget:
            out.append(hw)
    return out


def grid_under(space: Space) -> list[HardwareConfig]:
    """Every buildable config under the budget (the memories pruned by their area, linear in size)."""
    grid, out = space.settings.grid(), []
    values = [grid.values(n) for n in SIZED]
    for dataflow, rows, cols, bandwidth in itertools.product(DATAFLOWS, values[0], values[1], values[4]):
        base = fit_banks(HardwareConfig(dataflow=dataflow, array_rows=rows, array_cols=cols,
                                        dma_bandwidth_bytes_per_cycle=bandwidth, scratchpad_bytes=values[2][0],
                                        accumulator_bytes=values[3][0]))
        spare = space.budget - area_of(base)
        for spad, acc in itertools.product(values[2], values[3]):
            if (spad + acc - values[2][0] - values[3][0]) / 1024 * base.area_mm2_per_sram_kib <= spare + 1e-9:
                hw = fit_banks(base.replace(scratchpad_bytes=spad, accumulator_bytes=acc))
                if area_of(hw) <= space.budget:
                    out.append(hw)
    return out


def random_search(graph, work: Workloads, space: Space, objective: str, evaluations: int, simulate: int,
                  seed: int) -> dict:
    """`evaluations` random grid configs under the budget scored by the exact model, the best `simulate` timed."""
    t0 = time.perf_counter()
    search = Search(work.evaluate, Constraints(space.budget), objective)
    for hw in random_configs(np.random.default_rng(seed), space, evaluations):
        search.score(hw)
    best, count = best_simulated(graph, work, [(s.hw, None) for s in search.ranked()], objective, simulate)
    return {**best, "evaluated": evaluations, "simulated": count, "seconds": time.perf_counter() - t0}


def dosa_random(graph, work: Workloads, space: Space, objective: str, evaluations: int, simulate: int,
                seed: int) -> dict:
    """DOSA's random baseline: random hardware under the budget and a random legal mapping of every
    layer on it, scored by the exact model; the best `simulate` timed on their own mappings."""
    t0, rng, found = time.perf_counter(), np.random.default_rng(seed), []
    for hw in random_configs(rng, space, evaluations):
        try:
            maps = [random_mapping(u.kind, u.problem, hw, rng, u.extras, u.name) for u in work.rows]
        except TilingError:
            continue   # some layer fits no mapping on this hardware: an evaluation that found nothing
        found.append((objective_value(hw, *work.cost(hw, maps), objective), hw, maps))
    found.sort(key=lambda f: f[0])
    best, count = best_simulated(graph, work, [(hw, maps) for _, hw, maps in found], objective, simulate)
    return {**best, "evaluated": evaluations, "simulated": count, "seconds": time.perf_counter() - t0}


def tpe_search(graph, work: Workloads, space: Space, objective: str, simulate: int, seed: int,
               evaluations: int | None = None, seconds: float | None = None) -> dict:
    """optuna's TPE over the grid's indices and the dataflow until `evaluations` samples under the
    budget (each scored by the exact model; a config drawn again counts, as a sample it spent) or
    `seconds` of wall time, then its best `simulate` timed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0, grid, samples = time.perf_counter(), space.settings.grid(), []
    search = Search(work.evaluate, Constraints(space.budget), objective)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))

    def value(trial) -> float:
        hw = fit_banks(HardwareConfig(dataflow=trial.suggest_categorical("dataflow", DATAFLOWS),
                                      **{n: grid.values(n)[trial.suggest_int(n, 0, len(grid.values(n)) - 1)]
                                         for n in SIZED}))
        if area_of(hw) > space.budget:
            return PENALTY + area_of(hw) / space.budget    # no model needed: told how far over
        samples.append(hw)
        scored = search.score(hw)
        return PENALTY if scored is None else scored.value

    def more() -> bool:
        if evaluations is not None:
            return len(samples) < evaluations and len(study.trials) < 20 * evaluations
        return time.perf_counter() - t0 < seconds

    while more():
        trial = study.ask()
        study.tell(trial, value(trial))
    best, count = best_simulated(graph, work, [(s.hw, None) for s in search.ranked()], objective, simulate)
    return {**best, "evaluated": len(samples), "distinct": len(search.scored), "simulated": count,
            "trials": len(study.trials), "seconds": time.perf_counter() - t0}


def exhaustive(title: str, graph, work: Workloads, space: Space, space_name: str, objective: str,
               simulate: int) -> dict:
    """stagec.sweep in cost-model mode over every config under the budget, its best `simulate` timed."""
    t0 = time.perf_counter()
    configs = grid_under(space)
    fields = ("dataflow", *SIZED)
    name = MODELS[title]
    results = sweep({name: graph}, [{f: getattr(hw, f) for f in fields} for hw in configs],
                    options={"objective": objective if objective != "area" else "latency"}, mode="costmodel",
                    executor="local", out=RESULTS / f"sweep_{name}_{space_name}_{objective}.jsonl", progress=True)
    rows = [r for r in results.rows if r["error"] is None]
    key = (lambda r: r["cycles"]) if objective == "latency" else (lambda r: r["latency_s"] * r["energy_pj"])
    top = [HardwareConfig(**{f: r[f] for f in fields}) for r in sorted(rows, key=key)[:simulate]]
    sweep_seconds = sum(r["seconds"] for r in results.rows)
    t1 = time.perf_counter()
    best, count = best_simulated(graph, work, [(hw, None) for hw in top], objective, simulate)
    log(f"  {title}: exhaustive sweep of {len(configs)} configs ({len(rows)} mappable), {sweep_seconds:.0f} s "
        f"of rows ({results.computed} computed now, {t1 - t0:.0f} s wall)")
    return {**best, "evaluated": len(configs), "simulated": count,
            "seconds": sweep_seconds + time.perf_counter() - t1}


def median(runs: list[dict], objective: str) -> dict:
    key = "cycles" if objective == "latency" else "edp"
    mid = sorted(runs, key=lambda r: r[key])[len(runs) // 2]
    return {**mid, "seconds": float(np.mean([r["seconds"] for r in runs])),
            "evaluated": int(np.median([r["evaluated"] for r in runs])), "all_" + key: [r[key] for r in runs]}


def bench(title: str, graph, space: Space, space_name: str, objective: str, seeds: int) -> dict:
    t0 = time.perf_counter()
    # layer by layer, as the baselines price and simulate configs (--fusion compares fusion on and off)
    result = codesign_graphs([graph], space.budget, objective, settings=space.settings, progress=False, fusion=False)
    work = Workloads([graph], objective, DEFAULT_CONSTANTS, fusion=False)
    ours = {**simulated(graph, result.hw, work), "evaluated": result.evaluated, "simulated": result.simulated,
            "seconds": time.perf_counter() - t0}
    log(f"  {title}: codesign {ours}")
    rows, confirm = {"codesign": ours}, space.settings.confirm
    searches = {
        "random, equal evaluations": lambda s: random_search(graph, work, space, objective, result.evaluated,
                                                             confirm, s),
        "random, equal simulations": lambda s: random_search(graph, work, space, objective, result.simulated,
                                                             result.simulated, s),
        "random HW+mapping (DOSA)": lambda s: dosa_random(graph, work, space, objective, result.evaluated, confirm,
                                                          s),
        "TPE, equal evaluations": lambda s: tpe_search(graph, work, space, objective, confirm, s,
                                                       evaluations=result.evaluated),
        "TPE, equal time": lambda s: tpe_search(graph, work, space, objective, confirm, s, seconds=ours["seconds"]),
    }
    for label, run in searches.items():
        rows[label] = median([run(seed) for seed in range(seeds)], objective)
        log(f"  {title}: {label} {rows[label]}")
    if space.exhaustive:
        rows["exhaustive sweep (exact model)"] = exhaustive(title, graph, work, space, space_name, objective, confirm)
    return rows


def fusion(title: str, graph, space: Space, objective: str) -> dict:
    """codesign with fusion on and off at the space's budget: each pick's predicted and simulated
    cycles, DRAM traffic and energy (the simulated program fused as compile fuses it, or layer by layer)."""
    rows = {}
    for on in (True, False):
        t0 = time.perf_counter()
        r = codesign_graphs([graph], space.budget, objective, settings=space.settings, progress=False, fusion=on)
        report = r.reports[0]
        rows["on" if on else "off"] = {
            "hw": describe(r.hw), "area_mm2": r.area_mm2, "seconds": time.perf_counter() - t0,
            "cascades": len(report.cascades), "predicted_cycles": r.predicted_cycles[0], "cycles": report.cycles,
            "predicted_dram_kib": r.predicted_dram_bytes[0] / 1024,
            "dram_kib": (report.actions.dram_read_bytes + report.actions.dram_write_bytes) / 1024,
            "predicted_energy_uj": r.predicted_energy_pj[0] / 1e6, "energy_uj": sum(report.energy_pj.values()) / 1e6}
        log(f"  {title}: fusion {'on' if on else 'off'} {rows['on' if on else 'off']}")
    return rows


def fusion_table(space_name: str, space: Space, out: dict, objective: str) -> str:
    lines = [f"space {space_name}: {space.budget:g} mm^2, objective {objective}, codesign with fusion on and off "
             "(predicted / simulated)",
             f"{'model':22s} {'fusion':6s} {'cycles':>19s} {'DRAM KiB':>17s} {'energy uJ':>15s} {'cascades':>8s} "
             f"{'seconds':>7s}  config"]
    for title, rows in out.items():
        for label, r in rows.items():
            lines.append(f"{title:22s} {label:6s} {r['predicted_cycles']:9.0f}/{r['cycles']:9.0f} "
                         f"{r['predicted_dram_kib']:8.0f}/{r['dram_kib']:8.0f} "
                         f"{r['predicted_energy_uj']:7.1f}/{r['energy_uj']:7.1f} {r['cascades']:8d} {r['seconds']:7.0f}"
                         f"  {r['hw']} ({r['area_mm2']:.2f} mm^2)")
    return "\n".join(lines)


def table(space_name: str, space: Space, out: dict, objective: str) -> str:
    key = "cycles" if objective == "latency" else "edp"
    lines = [f"space {space_name}: {space.budget:g} mm^2, objective {objective}",
             f"{'model':22s} {'search':31s} {'evaluated':>9s} {'simulated':>9s} {'seconds':>8s} {'latency us':>10s} "
             f"{'EDP (J s)':>10s} {'vs codesign':>11s}  config"]
    for title, rows in out.items():
        for label, r in rows.items():
            lines.append(f"{title:22s} {label:31s} {r['evaluated']:9d} {r['simulated']:9d} {r['seconds']:8.1f} "
                         f"{r['latency_us']:10.1f} {r['edp']:10.3g} {r[key] / rows['codesign'][key]:11.3f}  {r['hw']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="both", choices=(*SPACES, "both"))
    ap.add_argument("--objective", default="edp", choices=("latency", "edp"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=list(MODELS.values()), choices=list(MODELS.values()))
    ap.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive sweep")
    ap.add_argument("--fusion", action="store_true",
                    help="instead of the searches: codesign with fusion on and off, predicted vs simulated")
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    graphs = {title: model_graph(*zoo.build(name, reduced=True)) for title, name in MODELS.items()
              if name in args.models}
    for space_name in SPACES if args.space == "both" else (args.space,):
        space = SPACES[space_name]
        if args.no_exhaustive:
            space = Space(space.budget, space.settings, False)
        if args.fusion:
            out = {title: fusion(title, graph, space, args.objective) for title, graph in graphs.items()}
            (RESULTS / f"bench_codesign_fusion_{space_name}.json").write_text(json.dumps(out, indent=1) + "\n")
            print(fusion_table(space_name, space, out, args.objective), flush=True)
            continue
        out = {title: bench(title, graph, space, space_name, args.objective, args.seeds)
               for title, graph in graphs.items()}
        (RESULTS / f"bench_codesign_{space_name}.json").write_text(json.dumps(
            {"budget_mm2": space.budget, "objective": args.objective, "seeds": args.seeds, **out}, indent=1) + "\n")
        print(table(space_name, space, out, args.objective), flush=True)


if __name__ == "__main__":
    main()
