"""stagec.tune: mappings for a model's layers by gradient on the cost model.

    >>> import torch, stagec
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
    >>> x = torch.randn(1, 8, 16, 16)
    >>> tuned = stagec.tune(model, (x,), settings=stagec.TuneSettings(starts=4, steps=20, chunk=10),
    ...                     progress=None)
    >>> tuned.predicted <= tuned.default_predicted
    True
    >>> program = stagec.compile(model, (x,), mappings=tuned.mappings)   # or compile(..., tune="gradient")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import jax
import numpy as np

from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import DEFAULT_CONSTANTS, CostConstants
from stagec.costmodel.problem import mapping_arrays, stack, to_tile_mapping
from stagec.costmodel.space import objective_of
from stagec.costmodel.tuner import DEFAULT_SETTINGS, TuneSettings, print_progress, tune_layers

__all__ = ["TuneSettings", "Tuning", "tune", "tune_graph", "tune_layer_list"]
from stagec.errors import InputError
from stagec.isa import HardwareConfig
from stagec.lower.graph.graph_ir import Graph
from stagec.lower.schedule.mapper import default_mapping
from stagec.lower.schedule.nest import TileMapping

from .layers import Layer, measure, model_graph, model_layers


@dataclass(frozen=True)
class Tuning:
    """Tuned mappings by layer name (what compile(mappings=...) takes), with the cost model's
    objective for the model (layers summed) under them and under the default mapper's."""

    mappings: dict[str, TileMapping]
    predicted: float                  # the cost model's, under the tuned mappings (kept_default aside)
    default_predicted: float
    objective: str
    evaluations: int
    kept_default: tuple[str, ...] = ()   # layers whose tuned mapping the simulator measured worse

    def to_dict(self) -> dict:
        """As JSON-ready data (`from_dict` reads it back; `stagec tune -o` writes it)."""
        return {"objective": self.objective, "predicted": self.predicted, "default_predicted": self.default_predicted,
                "evaluations": self.evaluations, "kept_default": list(self.kept_default),
                "mappings": {name: {k: v.item() if hasattr(v, "item") else v for k, v in asdict(m).items()}
                             for name, m in self.mappings.items()}}

    @classmethod
    def from_dict(cls, data) -> Tuning:
        """A Tuning from `to_dict`'s data; anything else is an InputError naming what is wrong."""
        try:
            maps = {str(name): TileMapping(**fields_) for name, fields_ in data["mappings"].items()}
            return cls(maps, float(data["predicted"]), float(data["default_predicted"]), str(data["objective"]),
                       int(data["evaluations"]), tuple(data.get("kept_default", ())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"not a stagec tuning (stagec tune -o): {type(e).__name__}: {e}") from None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path) -> Tuning:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None

    def __str__(self) -> str:
        gain = f", {self.default_predicted / self.predicted:.2f}x" if self.predicted else ""
        lines = [f"tuned {len(self.mappings)} layers for {self.objective}: {self.predicted:.4g} "
                 f"(default mapper {self.default_predicted:.4g}{gain})"]
        lines += [f"  kept the default mapper's for {len(self.kept_default)} (the simulator measured it better)"] \
            if self.kept_default else []
        return "\n".join(lines + [f"  {name}: {m}" for name, m in self.mappings.items()])


def tune_graph(graph: Graph, hw: HardwareConfig, objective: str = "latency", settings: TuneSettings = DEFAULT_SETTINGS,
               constants: CostConstants = DEFAULT_CONSTANTS, progress: Callable | None = print_progress) -> Tuning:
    """Tune every conv-shaped layer of a fused graph (layers of one shape are tuned once), then run
    each tuned mapping that differs from the default mapper's in the timing simulator beside the
    default: where the cost model misjudged and the default measures better, the default stays
    (`Tuning.kept_default`)."""
    layers = model_layers(graph)
    tuning = tune_layer_list(layers, hw, objective, settings, constants, progress)
    mappings, verdict = dict(tuning.mappings), {}   # layers of one shape share a mapping and a verdict
    for layer in layers:
        default = default_mapping(layer.kind, layer.problem, hw, layer.extras, layer.name, objective)
        tuned, key = mappings[layer.name], _shape_key(layer.shape())
        if tuned == default:
            continue
        if key not in verdict:
            tuned_value, default_value = (objective_of(*measure(graph, layer, m, hw), objective)
                                          for m in (tuned, default))
            verdict[key] = default_value < tuned_value
        if verdict[key]:
            mappings[layer.name] = default
    kept = tuple(name for name in mappings if mappings[name] != tuning.mappings[name])
    return replace(tuning, mappings=mappings, kept_default=kept)


def _shape_key(shape) -> tuple[float, ...]:
    """A LayerShape as a hashable key: layers with equal keys are tuned (and confirmed) once."""
    return tuple(float(v) for v in jax.tree.leaves(shape))


def tune_layer_list(layers: list[Layer], hw: HardwareConfig, objective: str = "latency",
                    settings: TuneSettings = DEFAULT_SETTINGS, constants: CostConstants = DEFAULT_CONSTANTS,
                    progress: Callable | None = print_progress) -> Tuning:
    if not layers:
        return Tuning({}, 0.0, 0.0, objective, 0)
    shapes = [layer.shape() for layer in layers]
    keys = [_shape_key(s) for s in shapes]
    unique = list(dict.fromkeys(keys))
    first = {k: keys.index(k) for k in unique}
    fallback = [default_mapping(layers[first[k]].kind, layers[first[k]].problem, hw, layers[first[k]].extras,
                                layers[first[k]].name, objective) for k in unique]
    out = tune_layers(stack([shapes[first[k]] for k in unique]), stack([mapping_arrays(m) for m in fallback]),
                      hardware_point(hw), objective, constants, settings, progress)
    tuned = [to_tile_mapping(jax.tree.map(lambda a, i=i: a[i], out.mappings)) for i in range(len(unique))]
    where = [unique.index(k) for k in keys]
    return Tuning({layer.name: tuned[w] for layer, w in zip(layers, where, strict=True)},
                  float(np.sum(out.values[where])), float(np.sum(out.fallback_values[where])), objective,
                  out.evaluations)


def tune(model_or_fn, example_args, hw: HardwareConfig | None = None, objective: str = "edp",
         kwargs: dict | None = None, settings: TuneSettings = DEFAULT_SETTINGS,
         constants: CostConstants = DEFAULT_CONSTANTS, progress: Callable | None = print_progress,
         **options) -> Tuning:
    """Mappings for every conv/matmul/pooling layer of a model, tuned by gradient on the cost model
    for `objective` ('latency', 'energy' or 'edp', per layer), each projected to a legal mapping
    and never worse (by the exact model) than the default mapper's.  `progress(step, total, best,
    seconds)` is called after every projection round (None: silent).  `options` are compile's
    fuse/quantize/calibration/percentile: with quantize="int8" the quantized graph's layers are
    tuned (the mappings are for compile(..., quantize="int8") with the same calibration)."""
    hw = hw or HardwareConfig()
    graph = model_graph(model_or_fn, example_args, kwargs, **options)
    return tune_graph(graph, hw, objective, settings, constants, progress)
