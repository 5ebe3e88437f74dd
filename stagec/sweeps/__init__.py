"""stagec.sweep: design-space sweeps, hardware configs x models x compile options, each point
compiled and simulated (or predicted by the cost model), as Ray tasks or in one process.

    >>> import stagec
    >>> from stagec.sweeps import Range
    >>> results = stagec.sweep(["mobilenet_v2"], {"array_rows": [8, 16, 32], "array_cols": [8, 16, 32],
    ...                        "scratchpad_bytes": Range(64 * 1024, 512 * 1024, 64 * 1024)},
    ...                        options={"quantize": [None, "int8"]}, reduced=True,
    ...                        out="sweep.jsonl")                         # doctest: +SKIP
    >>> print(results.pareto_table("area_mm2", "latency_s"))             # doctest: +SKIP
    >>> results.figure().savefig("pareto.png")                            # doctest: +SKIP

Each model is traced once per sweep (once per precision: int8 calibrates on its example
inputs); a point is the compiler's stages from `pack` on and the simulator's timing and energy
(no functional run).  Rows are appended to `out` (JSON lines) as points finish, keyed by a
stable point id: running the same sweep again computes only the points the file lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stagec.errors import InputError
from stagec.isa import HardwareConfig

from .executors import choose, run_local, run_ray
from .points import METRICS, TIMING_FIELDS, Settings
from .results import ResultsFile, SweepResults, load_results
from .space import MODES, OPTIONS, Point, Range, hardware_grid, make_points, option_grid

__all__ = ["METRICS", "MODES", "OPTIONS", "TIMING_FIELDS", "Range", "SweepResults", "load_results", "sweep"]
COSTMODEL_CHUNK = 256     # points per task in mode="costmodel": one batched cost-model call each


def sweep(models, hw, *, options: Mapping | None = None, samples: int | None = None, seed: int = 0,
          base: HardwareConfig | None = None, mode: str = "simulate", out: str | Path = "sweep.jsonl",
          executor: str | None = None, address: str | None = None, workers: int | None = None,
          max_retries: int = 3, reduced: bool = False, tune_settings=None, measure: Callable | None = None,
          progress: bool = True) -> SweepResults:
    """Sweep `models` x the hardware space `hw` x `options`, appending a row per point to `out`.

    models: a list of zoo names (stagec.zoo; `reduced` for their small configs), (model, args) or
        (model, args, kwargs) examples, or stagec graphs (stagec.pipeline.build_graph), or a dict
        of name -> any of those (the rows' `model` column).
    hw: HardwareConfig field -> a list of values or a `Range`; every combination (a grid), or with
        `samples`, that many random draws (seeded).  Or a list of configs (each field -> value).
        Fields not named are `base`'s.
    options: quantize (None, "int8", "bf16"), objective ("latency", "energy", "edp": what the mapper
        minimizes), tune (False, True: stagec.tune's mappings, with `tune_settings`): a value or a
        list of values each.
    mode: "simulate" (lower + the simulator's timing and energy) or "costmodel" (predicted).
    executor: "ray" (the default when Ray is installed: a running cluster at `address` or
        RAY_ADDRESS, else a local instance of `workers` CPUs) or "local" (this process).
    measure: report -> {column: number}, extra columns of simulated rows (run on the workers).
    """
    base = base or HardwareConfig()
    executor = choose(executor)
    named = _named_models(models, reduced)
    points = make_points(list(named), hardware_grid(hw, samples, seed), option_grid(options), base, mode)
    for p in points:
        if isinstance(named[p.model], _graph_type()) and p.options["quantize"] is not None:
            raise InputError(f"model {p.model!r} is a graph: quantize= needs the model (the graph is its precision)")
    results = ResultsFile(out)
    done = results.done()
    pending = [p for p in points if p.id not in done]
    if pending:
        graphs = {key: _graph(named[key[0]], key[1]) for key in dict.fromkeys(_key(p) for p in pending)}
        settings = Settings(base, tune_settings, measure)
        tasks = _tasks(pending, COSTMODEL_CHUNK if mode == "costmodel" else 1)
        run = run_local(graphs, tasks, settings) if executor == "local" else \
            run_ray(graphs, tasks, settings, address, workers, max_retries)
        with _bar(len(pending), progress) as bar:
            for rows in run:
                results.append(rows)
                bar.update(len(rows))
    ids = {p.id for p in points}
    return SweepResults([r for r in results.rows if r["id"] in ids], results.path, len(pending))


def _named_models(models, reduced: bool) -> dict:
    """name -> model spec (an example tuple or graph; a zoo name's example, built when needed).  A
    zoo model's reduced config is named NAME-reduced: its rows are not the full-size model's."""
    if isinstance(models, (str, tuple)) or isinstance(models, _graph_type()):
        models = [models]
    items = models.items() if isinstance(models, Mapping) else \
        ((spec if isinstance(spec, str) else type(spec[0]).__name__ if isinstance(spec, tuple) else f"graph{i}", spec)
         for i, spec in enumerate(models))
    named: dict = {}
    for name, spec in items:
        if isinstance(spec, str):
            name, spec = (f"{name}-reduced" if reduced and name == spec else name), _Zoo(spec, reduced)
        if name in named:
            raise InputError(f"two models are called {name!r}: give a dict of name -> model")
        named[name] = spec
    if not named:
        raise InputError("a sweep needs at least one model")
    return named


@dataclass(frozen=True)
class _Zoo:
    """A zoo model by name, built only if one of its points is computed."""

    name: str
    reduced: bool


def _graph_type():
    from stagec.lower.graph.graph_ir import Graph
    return Graph


def _graph(spec, quantize: str | None):
    """The graph a model's points share: traced and built once (per precision)."""
    from stagec.pipeline import build_graph
    from stagec.zoo import build

    if isinstance(spec, _graph_type()):
        return spec
    if isinstance(spec, _Zoo):
        spec = build(spec.name, spec.reduced)
    if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
        raise InputError(f"a sweep's model is a zoo name, (model, args[, kwargs]) or a graph, not {spec!r:.80}")
    model, args, kwargs = (*spec, None) if len(spec) == 2 else spec
    return build_graph(model, args, kwargs=kwargs, quantize=quantize)[1]


def _key(p: Point) -> tuple:
    return p.model, p.options["quantize"]


def _tasks(points: list[Point], chunk: int) -> list[tuple]:
    """(graph key, points) tasks: at most `chunk` points each, all of one graph."""
    by_graph: dict = {}
    for p in points:
        by_graph.setdefault(_key(p), []).append(p)
    return [(key, group[i:i + chunk]) for key, group in by_graph.items() for i in range(0, len(group), chunk)]


def _bar(total: int, shown: bool):
    from tqdm import tqdm
    return tqdm(total=total, disable=not shown, desc="sweep", unit="point")
