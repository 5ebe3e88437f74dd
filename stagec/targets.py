"""Latency and power targets: what compile(latency_target_s=..., power_budget_w=...) is asked to
meet, and the verdict a report gives on them.

The power is the average over one inference: the report's total energy (dynamic and leakage)
over its latency.  A target is met when the simulated value is at most the target; the slack is
target minus value (negative: missed by that much).

    >>> t = Targets(latency_s=5e-3)
    >>> t.to_dict()
    {'latency_s': 0.005, 'power_w': None, 'tried': []}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stagec.errors import InputError

TOP_LAYERS = 3   # the layers a verdict names as taking the most time and the most energy


@dataclass(frozen=True)
class Targets:
    """The targets, None where not set, and what compile tried to meet them (its notes)."""

    latency_s: float | None = None
    power_w: float | None = None
    tried: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("latency_s", "power_w"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise InputError(f"{_ARGUMENT[name]} must be a positive number, not {value!r}")
        object.__setattr__(self, "tried", tuple(self.tried))

    def __bool__(self) -> bool:
        return self.latency_s is not None or self.power_w is not None

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "power_w": self.power_w, "tried": list(self.tried)}

    @classmethod
    def from_dict(cls, data) -> Targets:
        return cls(data.get("latency_s"), data.get("power_w"), tuple(data.get("tried", ())))


_ARGUMENT = {"latency_s": "latency_target_s", "power_w": "power_budget_w"}


@dataclass(frozen=True)
class Check:
    """One target against what the simulator measured."""

    name: str          # "latency" or "power"
    target: float
    value: float
    unit: str          # "s" or "W"

    @property
    def met(self) -> bool:
        return self.value <= self.target

    @property
    def slack(self) -> float:
        return self.target - self.value

    def line(self) -> str:
        scale, unit = (1e3, "ms") if self.unit == "s" else (1e3, "mW")
        verdict = "met" if self.met else f"MISSED by {-self.slack * scale:.4g} {unit} ({self.value / self.target:.2f}x)"
        return (f"{self.name} target {self.target * scale:.4g} {unit}: {self.value * scale:.4g} {unit}, {verdict}; "
                f"slack {self.slack * scale:+.4g} {unit}")

    def to_dict(self) -> dict:
        return {"target": self.target, "value": self.value, "unit": self.unit, "met": self.met, "slack": self.slack}


@dataclass(frozen=True)
class Verdict:
    """Each target's check, what compile tried, and the layers that take the most time and energy."""

    checks: tuple[Check, ...]
    tried: tuple[str, ...]
    top_time: tuple[tuple[str, float], ...]     # (layer, share of the cycles)
    top_energy: tuple[tuple[str, float], ...]   # (layer, share of the energy)

    @property
    def met(self) -> bool:
        return all(c.met for c in self.checks)

    def lines(self) -> list[str]:
        out = [c.line() for c in self.checks]
        out += [f"compile tried: {'; '.join(self.tried)}"] if self.tried else []
        for what, top in (("time", self.top_time), ("energy", self.top_energy)):
            out.append(f"most {what}: " + ", ".join(f"{name} {100 * share:.0f}%" for name, share in top))
        return out

    def to_dict(self) -> dict:
        return {"met": self.met, **{c.name: c.to_dict() for c in self.checks}, "tried": list(self.tried),
                "top_time": [list(t) for t in self.top_time], "top_energy": [list(t) for t in self.top_energy]}


def verdict(report, targets: Targets) -> Verdict:
    """`targets` against a stagec.Report."""
    energy = sum(report.energy_pj.values())
    checks = []
    if targets.latency_s is not None:
        checks.append(Check("latency", targets.latency_s, report.latency_s, "s"))
    if targets.power_w is not None:
        watts = energy * 1e-12 / report.latency_s if report.latency_s > 0 else 0.0
        checks.append(Check("power", targets.power_w, watts, "W"))

    def top(value, total):
        ranked = sorted(report.layers, key=value, reverse=True)[:TOP_LAYERS]
        return tuple((layer.name, value(layer) / total if total else 0.0) for layer in ranked)

    return Verdict(tuple(checks), targets.tried, top(lambda layer: layer.cycles, report.cycles),
                   top(lambda layer: sum(layer.energy_pj.values()), energy))
