"""Evaluating sweep points: a task is one graph and some of its points, run where the executor
puts it (this process, or a Ray worker), and gives one results row per point.

mode="simulate": each point is lowered (the compiler's stages from `pack` on, on the graph built
once per model and precision) and timed and costed by the simulator (sim.timing, sim.energy: no
functional run).  mode="costmodel": the task's points are predicted in one batched call of the
cost model (costmodel.batch.evaluate: every (config, layer) pair, sharded over the local
devices), each layer under the mapping the default mapper (or the tuner) picks for its config;
the cost model sees the conv-shaped layers only (stagec.layers), so its cycles leave the rest out.

A point that fails as a point can (a config isa/config.py rejects, a layer no tiling fits: any
StagecError) is a row with its error; anything else is a bug and raises.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stagec.errors import StagecError
from stagec.isa import HardwareConfig
from stagec.sim.energy import area_mm2

from .space import Point

METRICS = ("cycles", "latency_s", "energy_pj", "area_mm2", "peak_scratchpad_bytes", "peak_accumulator_bytes",
           "dram_bytes")
TIMING_FIELDS = ("seconds", "worker")   # how and where a row was computed: differ between runs


@dataclass(frozen=True)
class Settings:
    """How a sweep's tasks evaluate their points (the same for every task)."""

    base: HardwareConfig
    tune_settings: object = None                 # stagec.TuneSettings for tune=True (None: its defaults)
    measure: Callable | None = None              # simulate: report -> {column: number}, extra columns


def run_task(graph, points: list[Point], settings: Settings) -> list[dict]:
    """The rows of `points` (all of one graph and one mode)."""
    if points[0].mode == "costmodel":
        return _predict(graph, points, settings)
    start = time.perf_counter()
    try:
        metrics, error = _simulate(graph, points[0], settings), None
    except StagecError as e:
        metrics, error = {}, e
    return [row(points[0], settings.base, metrics, error, time.perf_counter() - start)]


def row(point: Point, base: HardwareConfig, metrics: dict, error: Exception | None, seconds: float) -> dict:
    """A results row: the point (id, model, mode, options, every config field), its metrics (None
    where it failed), its error as `Type: message`, and where and how long it ran."""
    config = point.config(base)
    try:
        area = float(sum(area_mm2(HardwareConfig(**config)).values()))
    except StagecError:
        area = None
    return {"id": point.id, "model": point.model, "mode": point.mode, **point.options, **config,
            **{m: None for m in METRICS}, "area_mm2": area, **metrics,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "seconds": round(seconds, 4), "worker": f"{socket.gethostname()}:{os.getpid()}"}


def _simulate(graph, point: Point, settings: Settings) -> dict:
    from stagec.pipeline import lower_graph
    from stagec.report import make_report

    hw = HardwareConfig(**point.config(settings.base))
    program = lower_graph(graph, hw, _tuned(graph, hw, point, settings), point.options["objective"])
    report = make_report(program)
    metrics = {"cycles": float(report.cycles), "latency_s": float(report.latency_s),
               "energy_pj": float(sum(report.energy_pj.values())),
               "peak_scratchpad_bytes": report.memory["scratchpad"],
               "peak_accumulator_bytes": report.memory["accumulator"],
               "dram_bytes": int(report.actions.dram_read_bytes + report.actions.dram_write_bytes)}
    return {**metrics, **(settings.measure(report) if settings.measure is not None else {})}


def _tuned(graph, hw: HardwareConfig, point: Point, settings: Settings) -> dict | None:
    if not point.options["tune"]:
        return None
    from stagec.tuning import DEFAULT_SETTINGS, tune_graph
    return tune_graph(graph, hw, point.options["objective"], settings.tune_settings or DEFAULT_SETTINGS,
                      progress=None).mappings


def _predict(graph, points: list[Point], settings: Settings) -> list[dict]:
    """Every point's cost-model prediction from one batched evaluation of its (config, layer) pairs."""
    import jax

    from stagec.costmodel.batch import evaluate
    from stagec.costmodel.hardware import hardware_point
    from stagec.costmodel.problem import mapping_arrays, stack
    from stagec.layers import model_layers

    start = time.perf_counter()
    layers = model_layers(graph)
    chosen, failed = {}, {}   # point index -> (hw, mappings) or its error
    for i, point in enumerate(points):
        try:
            hw = HardwareConfig(**point.config(settings.base))
            chosen[i] = hw, _mappings(layers, hw, point, settings)
        except StagecError as e:
            failed[i] = e
    pairs = [(i, layer, m) for i, (_, maps) in chosen.items() for layer, m in zip(layers, maps, strict=True)]
    if pairs:
        cost = evaluate(stack([layer.shape() for _, layer, _ in pairs]), stack([mapping_arrays(m) for *_, m in pairs]),
                        stack([hardware_point(chosen[i][0]) for i, *_ in pairs]))
        cost = jax.tree.map(np.asarray, cost)
    owner = np.array([i for i, *_ in pairs], np.int64)
    seconds = (time.perf_counter() - start) / len(points)
    rows = []
    for i, point in enumerate(points):
        if i in failed:
            rows.append(row(point, settings.base, {}, failed[i], seconds))
            continue
        mine = owner == i
        cycles = float(cost.cycles[mine].sum()) if mine.any() else 0.0
        metrics = {"cycles": cycles, "latency_s": cycles / float(chosen[i][0].clock_hz),
                   "energy_pj": float(cost.energy_pj[mine].sum()) if mine.any() else 0.0,
                   "peak_scratchpad_bytes": int(cost.spad_bytes[mine].max()) if mine.any() else 0,
                   "peak_accumulator_bytes": int(cost.acc_bytes[mine].max()) if mine.any() else 0}
        rows.append(row(point, settings.base, metrics, None, seconds))
    return rows


def _mappings(layers, hw: HardwareConfig, point: Point, settings: Settings) -> list:
    """Each layer's mapping on `hw`: the tuner's (tune=True), else the default mapper's."""
    from stagec.lower.schedule.mapper import default_mapping
    from stagec.tuning import DEFAULT_SETTINGS, tune_layer_list

    objective = point.options["objective"]
    if point.options["tune"]:
        tuned = tune_layer_list(layers, hw, objective, settings.tune_settings or DEFAULT_SETTINGS, progress=None)
        return [tuned.mappings[layer.name] for layer in layers]
    return [default_mapping(layer.kind, layer.problem, hw, layer.extras, layer.name, objective) for layer in layers]
