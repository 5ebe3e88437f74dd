"""A sweep's points: hardware configs (a grid or a random sample) x models x compile options.

A hardware space maps HardwareConfig field names to the values a field takes: a list, tuple or
range of values, or a `Range` (a grid of its steps, or uniform draws from it).  Each point is
keyed by a stable id, a hash of everything that decides its result, so a results file written by
one run tells the next which points are done.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from stagec.errors import InputError
from stagec.isa import HardwareConfig

# option -> (its default, the values it may take; None: any bool)
OPTIONS = {"quantize": (None, (None, "int8", "bf16")), "objective": ("edp", ("latency", "energy", "edp")),
           "tune": (False, (False, True))}
MODES = ("simulate", "costmodel")
_FIELDS = {f.name: f for f in fields(HardwareConfig)}


@dataclass(frozen=True)
class Range:
    """Values from `lo` to `hi` (inclusive): on a grid, every `step` from lo; sampled, uniform
    draws (multiples of `step` from lo when given; an integer field's draws are integers)."""

    lo: float
    hi: float
    step: float | None = None

    def __post_init__(self):
        if not self.lo <= self.hi or (self.step is not None and self.step <= 0):
            raise InputError(f"{self}: needs lo <= hi and a positive step")

    def grid(self) -> list:
        if self.step is None:
            raise InputError(f"{self}: a grid needs a step")
        count = int(math.floor((self.hi - self.lo) / self.step + 1e-9)) + 1
        return [_number(self.lo + i * self.step) for i in range(count)]

    def draw(self, rng: random.Random, integer: bool):
        if self.step is not None:
            return rng.choice(self.grid())
        return rng.randint(math.ceil(self.lo), math.floor(self.hi)) if integer else rng.uniform(self.lo, self.hi)


@dataclass(frozen=True)
class Point:
    """One point of a sweep: a model (by name), the hardware fields it sets, compile options."""

    model: str
    hw: dict                        # HardwareConfig fields set (on top of the sweep's base config)
    options: dict                   # OPTIONS
    mode: str = "simulate"
    id: str = field(default="", compare=False)

    def config(self, base: HardwareConfig) -> dict:
        """Every field of the point's config (the base's, overridden): a results row's columns."""
        return {**base.to_dict(), **self.hw}


def point_id(model: str, config: dict, options: dict, mode: str) -> str:
    """A stable key of what decides a point's result (the full config, so a changed base is a new point)."""
    text = json.dumps({"model": model, "hw": config, "options": options, "mode": mode}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def hardware_grid(space, samples: int | None = None, seed: int = 0) -> list[dict]:
    """The field settings of a sweep: every combination of `space`'s values, or `samples` random
    draws (each field independently) when given.  `space` may instead be a list of field settings
    (each a mapping, one config): a space no product describes, such as a grid under an area
    budget; `samples` then draws that many of them (seeded, without repeats)."""
    if samples is not None and samples < 1:
        raise InputError(f"samples must be at least 1, not {samples}")
    if not isinstance(space, Mapping):
        configs = [dict(c) for c in space] if isinstance(space, (list, tuple)) and \
            all(isinstance(c, Mapping) for c in space) else None
        if not configs:
            raise InputError("a sweep's hardware space is a mapping of field -> values or a non-empty list of "
                             f"mappings of field -> value, not {space!r:.80}")
        _known({name for c in configs for name in c})
        return configs if samples is None else random.Random(seed).sample(configs, min(samples, len(configs)))
    _known(space)
    names = list(space)
    if samples is None:
        values = [_values(name, space[name]) for name in names]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]
    rng = random.Random(seed)
    return [{name: _draw(name, space[name], rng) for name in names} for _ in range(samples)]


def _known(names) -> None:
    for name in names:
        if name not in _FIELDS:
            raise InputError(f"unknown hardware field {name!r} in the sweep space; fields are {', '.join(_FIELDS)}")


def option_grid(options: Mapping | None) -> list[dict]:
    """Every combination of the option values given (each a value or a list of them), defaults for the rest."""
    options = dict(options or {})
    for name in options:
        if name not in OPTIONS:
            raise InputError(f"unknown sweep option {name!r}; options are {', '.join(OPTIONS)}")
    lists = {}
    for name, (default, allowed) in OPTIONS.items():
        given = options.get(name, default)
        lists[name] = list(given) if isinstance(given, (list, tuple)) else [given]
        for v in lists[name]:
            if v not in allowed:
                raise InputError(f"sweep option {name}={v!r}: expected one of {allowed}")
    return [dict(zip(lists, combo, strict=True)) for combo in itertools.product(*lists.values())]


def make_points(models, hw_settings: list[dict], option_sets: list[dict], base: HardwareConfig,
                mode: str) -> list[Point]:
    """Every (model, hardware, options) point, each with its id (models: their names)."""
    if mode not in MODES:
        raise InputError(f"mode must be one of {MODES}, not {mode!r}")
    points = []
    for model in models:
        for options in option_sets:
            for hw in hw_settings:
                p = Point(model, hw, options, mode)
                points.append(Point(model, hw, options, mode, point_id(model, p.config(base), options, mode)))
    return list({p.id: p for p in points}.values())   # a space listing a value twice: one point


def _values(name: str, spec) -> list:
    if isinstance(spec, Range):
        return spec.grid()
    if isinstance(spec, (list, tuple, range)) and len(spec):
        return list(spec)
    raise InputError(f"sweep field {name}: expected a non-empty list, tuple, range or stagec.sweeps.Range, "
                     f"not {spec!r}")


def _draw(name: str, spec, rng: random.Random):
    if isinstance(spec, Range):
        return spec.draw(rng, _FIELDS[name].metadata["kind"] is int)
    return rng.choice(_values(name, spec))


def _number(x: float):
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x
