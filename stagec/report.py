"""What a simulation reports: cycles, utilization, bytes, energy and roofline, per layer and in total.

Per-layer time comes in two forms, because the queues let layers overlap:
`span_cycles` is from the layer's first instruction starting to its last one
ending; `cycles` is the layer's exclusive share of the timeline (how far the
latest end moves while this layer finishes), so per-layer `cycles` add up to
the total.  Roofline: a layer cannot beat max(MACs / peak MACs per cycle,
compulsory DRAM bytes / bandwidth), the peak its precision's (a packing array runs
int8 at four MACs a PE a cycle, bf16 at two: sim.costs.array_macs_per_cycle), where compulsory bytes are every input
(weights included) read once and the output written once; `achieved_over_bound`
is span / bound (1.0 = on the roofline).

`Report.to_dict()` keys (all JSON-ready numbers, strings, lists and dicts):

    hw                  the hardware config (HardwareConfig.to_dict)
    cycles              total cycles (last instruction's end)
    latency_s           cycles / clock_hz
    clock_hz
    instructions        unit -> instruction count (units: load, matrix, vector, store)
    busy_cycles         unit -> cycles the unit was running an instruction
    array_utilization   MACs / (peak MACs per cycle x cycles), each layer's at its precision's peak
    bytes               level -> {"read": bytes, "write": bytes} (levels: dram, scratchpad, accumulator)
    actions             action -> count (MACs by mode, vector ops, bytes per level and direction)
    energy_pj           component -> pJ (mac, vector, scratchpad, accumulator, dram, leakage), "total"
    area_mm2            component -> mm^2 (array, scratchpad, accumulator, vector, fixed), "total"
    macs_by_precision   precision (int8, bf16, fp32) -> MACs run in it, those with any
    mixed_precision     int8 programs: {fallback, pinned, chosen, target, cosine} (lower.graph.mixed_precision)
    memory              peak bytes in use: {scratchpad, accumulator (the largest layer's buffers), dram (the
                        program's whole DRAM: weights, inputs and outputs, intermediates at their peak),
                        weights, activations (intermediates at their peak)}; local peaks None for a program
                        that does not record them
    targets             with compile(latency_target_s=, power_budget_w=): {met, latency and/or power: {target,
                        value, unit, met, slack}, tried, top_time, top_energy} (stagec.targets), else None
    roofline_cycles     sum of the layers' roofline bounds
    cycles_over_roofline  cycles / roofline_cycles
    model_limit         the model's physical limit, every intermediate on chip: {macs, compute_cycles,
                        compulsory_bytes (weights + model inputs + model outputs), memory_cycles,
                        bound_cycles = max(compute, memory), bound}
    cycles_over_model_limit  cycles / model_limit["bound_cycles"]
    cascades            layers run depth-first (lower.schedule.cascade): [{layers, tile, saved_bytes, and
                        a halo cascade's halo strategy: "recompute" or "line buffer"}]
    layers              list of per-layer records:
        name, op, in_shapes, out_shape, macs,
        precision (what it computes in: int8, bf16 or fp32 -- a CONV/MATMUL its operands' type, another
                   layer int8 when all its data is integer, else bf16 when any of it is; from the program's
                   metadata, else from its MACs, None without),
        instructions (unit -> count),
        start_cycle, end_cycle, span_cycles, cycles, busy_cycles (unit -> cycles),
        array_utilization (MACs / (peak x span)), bytes (level -> read/write), actions,
        energy_pj (component -> pJ, leakage over the layer's `cycles`, "total"),
        roofline: {compute_cycles, memory_cycles, bound_cycles, bound ("compute" or "memory"),
                   compulsory_bytes, achieved_over_bound}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import ITEMSIZE, Opcode, Queue
from stagec.isa.program import Layer, Program
from stagec.sim.costs import array_macs_per_cycle
from stagec.sim.energy import ActionCounts, area_mm2, counts_of, energy_pj
from stagec.sim.timing import Timeline, timeline

from .targets import Targets, Verdict, verdict

UNITS = tuple(q.name.lower() for q in Queue)
LEVELS = ("dram", "scratchpad", "accumulator")
PRECISION_ITEMSIZE = {"int8": 1, "bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class LayerReport:
    name: str
    op: str
    in_shapes: tuple
    out_shape: tuple
    macs: int
    instructions: dict          # unit -> count
    start_cycle: float
    end_cycle: float
    cycles: float               # exclusive share of the timeline; adds up to Report.cycles
    busy_cycles: dict           # unit -> cycles
    actions: ActionCounts       # totals
    energy_pj: dict             # component -> pJ
    roofline: dict
    precision: str | None = None   # what it computes in (int8, bf16, fp32), None: unknown

    @property
    def span_cycles(self) -> float:
        return self.end_cycle - self.start_cycle

    def array_utilization(self, hw: HardwareConfig) -> float:
        return array_bound_cycles(self.macs, self.precision, hw) / self.span_cycles if self.span_cycles > 0 else 0.0

    def to_dict(self, hw: HardwareConfig) -> dict:
        return {
            "name": self.name, "op": self.op, "in_shapes": [list(s) for s in self.in_shapes],
            "out_shape": list(self.out_shape), "macs": self.macs,
            "precision": self.precision,
            "instructions": self.instructions,
            "start_cycle": self.start_cycle, "end_cycle": self.end_cycle, "span_cycles": self.span_cycles,
            "cycles": self.cycles, "busy_cycles": self.busy_cycles, "array_utilization": self.array_utilization(hw),
            "bytes": _bytes(self.actions), "actions": self.actions.to_dict(),
            "energy_pj": {**self.energy_pj, "total": sum(self.energy_pj.values())}, "roofline": self.roofline,
        }


@dataclass(frozen=True)
class Report:
    """Simulation report; `summary()` prints it, `to_dict()` has it as data, `stagec.plots` draws it."""

    layers: tuple[LayerReport, ...]
    hw: HardwareConfig
    instructions: dict          # unit -> count
    busy_cycles: dict           # unit -> cycles
    cycles: float
    actions: ActionCounts       # totals
    energy_pj: dict             # component -> pJ
    area_mm2: dict              # component -> mm^2
    timeline: Timeline = field(repr=False)
    layer_ids: np.ndarray = field(repr=False)   # layer of each instruction (-1: none)
    mixed_precision: dict | None = None         # an int8 program's float layers (module doc)
    model_limit: dict | None = None             # the model's physical limit (module doc)
    cascades: tuple = ()                        # the program's cascades (module doc)
    memory: dict = field(default_factory=dict)  # peak bytes in use (module doc)
    verdict: Verdict | None = None              # the targets compile was given, met or missed

    @property
    def clock_hz(self) -> float:
        return float(self.hw.clock_hz)

    @property
    def latency_s(self) -> float:
        return self.cycles / self.clock_hz

    @property
    def array_utilization(self) -> float:
        busy = sum(array_bound_cycles(layer.macs, layer.precision, self.hw) for layer in self.layers)
        return busy / self.cycles if self.cycles > 0 else 0.0

    @property
    def roofline_cycles(self) -> float:
        return sum(layer.roofline["bound_cycles"] for layer in self.layers)

    @property
    def cycles_over_model_limit(self) -> float | None:
        bound = (self.model_limit or {}).get("bound_cycles")
        return self.cycles / bound if bound else None

    def to_dict(self) -> dict:
        """The report as JSON-ready data; the keys are listed in this module's docstring."""
        return {
            "hw": self.hw.to_dict(), "cycles": self.cycles, "latency_s": self.latency_s, "clock_hz": self.clock_hz,
            "instructions": self.instructions, "busy_cycles": self.busy_cycles,
            "array_utilization": self.array_utilization, "bytes": _bytes(self.actions),
            "actions": self.actions.to_dict(), "macs_by_precision": macs_by_precision(self.actions),
            "energy_pj": {**self.energy_pj, "total": sum(self.energy_pj.values())},
            "area_mm2": {**self.area_mm2, "total": sum(self.area_mm2.values())},
            "roofline_cycles": self.roofline_cycles,
            "cycles_over_roofline": self.cycles / self.roofline_cycles if self.roofline_cycles else None,
            "model_limit": self.model_limit, "cycles_over_model_limit": self.cycles_over_model_limit,
            "cascades": list(self.cascades),
            "layers": [layer.to_dict(self.hw) for layer in self.layers], "mixed_precision": self.mixed_precision,
            "memory": self.memory, "targets": self.verdict.to_dict() if self.verdict is not None else None,
        }

    def summary(self) -> str:
        head = (f"{'layer':<30} {'op':<9} {'prec':<5} {'MMACs':>8} {'cycles':>10} {'span':>10} {'util%':>6} "
                f"{'bound':>4} {'x bound':>7} {'DRAM KiB':>9} {'energy uJ':>9}")
        lines = [head, "-" * len(head)]
        for layer in self.layers:
            roof = layer.roofline
            lines.append(
                f"{layer.name[:30]:<30} {layer.op[:9]:<9} {layer.precision or '-':<5} {layer.macs / 1e6:>8.2f} "
                f"{layer.cycles:>10.0f} {layer.span_cycles:>10.0f} {100 * layer.array_utilization(self.hw):>6.1f} "
                f"{roof['bound'][:3]:>4} {roof['achieved_over_bound'] or 0:>7.2f} "
                f"{(layer.actions.dram_read_bytes + layer.actions.dram_write_bytes) / 1024:>9.1f} "
                f"{sum(layer.energy_pj.values()) / 1e6:>9.2f}")
        lines.append("-" * len(head))
        total_pj = sum(self.energy_pj.values())
        b = _bytes(self.actions)
        lines += [
            f"cycles: {self.cycles:.0f} = {self.latency_s * 1e3:.3f} ms at {self.clock_hz / 1e9:g} GHz; "
            f"{self.cycles / self.roofline_cycles if self.roofline_cycles else float('nan'):.2f}x the sum of "
            f"per-layer roofline bounds ({self.roofline_cycles:.0f}); array utilization "
            f"{100 * self.array_utilization:.1f}%",
            *_model_limit_lines(self.model_limit, self.cycles),
            "MACs by precision: " + (", ".join(f"{p} {m / 1e6:.2f} M"
                                               for p, m in macs_by_precision(self.actions).items()) or "none"),
            "instructions per unit: " + ", ".join(f"{u} {c}" for u, c in self.instructions.items()),
            "busy cycles per unit:  " + ", ".join(f"{u} {c:.0f}" for u, c in self.busy_cycles.items()),
            "bytes:  " + "; ".join(f"{lvl} read {v['read'] / 2**20:.2f} MiB, written {v['write'] / 2**20:.2f} MiB"
                                   for lvl, v in b.items()),
            f"energy: {total_pj / 1e6:.2f} uJ = " + ", ".join(
                f"{k} {100 * v / total_pj if total_pj else 0:.0f}%" for k, v in self.energy_pj.items()),
            f"area:   {sum(self.area_mm2.values()):.2f} mm^2 = " + ", ".join(
                f"{k} {v:.2f}" for k, v in self.area_mm2.items()),
            _memory_line(self.memory),
        ]
        lines += _cascade_lines(self.cascades) + _mixed_precision_lines(self.mixed_precision)
        return "\n".join(lines + (self.verdict.lines() if self.verdict is not None else []))


def _model_limit_lines(limit: dict | None, cycles: float) -> list[str]:
    if not limit:
        return []
    return [f"model limit: {limit['bound_cycles']:.0f} cycles ({limit['bound']}: {limit['macs'] / 1e6:.2f} MMACs, "
            f"{limit['compulsory_bytes'] / 2**20:.2f} MiB of weights, inputs and outputs); cycles are "
            f"{cycles / limit['bound_cycles'] if limit['bound_cycles'] else float('nan'):.2f}x it"]


def _cascade_lines(cascades) -> list[str]:
    return [f"cascade {' -> '.join(c['layers'])}: tile {c['tile'][0]}x{c['tile'][1]}"
            + (f", halo {c['halo']}" if c.get("halo") else "") + f", saves {c['saved_bytes'] / 1024:.1f} KiB of DRAM"
            for c in cascades]


def _memory_line(memory: dict) -> str:
    local = ", ".join(f"{m} {memory[m] / 1024:.1f} KiB" for m in ("scratchpad", "accumulator")
                      if memory.get(m) is not None)
    return (f"memory: peak {local or 'local use not recorded'}; DRAM {memory['dram'] / 2**20:.2f} MiB "
            f"(weights {memory['weights'] / 2**20:.2f} MiB, activations at peak "
            f"{memory['activations'] / 2**20:.2f} MiB)")


def memory_use(program: Program) -> dict:
    """Peak bytes in use (the report's `memory`): the compiler's record of each layer's local
    buffers, the program's DRAM layout."""
    local = program.metadata.get("local_peak_bytes")
    peaks = [max((p[i] for p in local.values()), default=0) if local is not None else None for i in (0, 1)]
    activations = sum(r.nbytes for r in program.regions if r.name == "activations")
    return {"scratchpad": peaks[0], "accumulator": peaks[1], "dram": program.dram_bytes,
            "weights": len(program.constants), "activations": activations}


def _mixed_precision_lines(mixed: dict | None) -> list[str]:
    """An int8 program's pinned layers and what accuracy_target chose, for the summary."""
    if not mixed:
        return []
    lines = [f"int8 float islands: {mixed['fallback']}"]
    lines += ["pinned: " + ", ".join(f"{name} {p}" for name, p in mixed["pinned"].items())] if mixed["pinned"] else []
    if mixed["target"] is not None:
        lines.append(f"accuracy target {mixed['target']:g}: cosine {mixed['cosine']:.6f} on the calibration batches "
                     f"with {len(mixed['chosen'])} layers bf16" + "".join(f"\n  {name}" for name in mixed["chosen"]))
    return lines


def _layer_precision(program: Program, layer: Layer, actions: ActionCounts) -> str | None:
    """The layer's precision as the compiler recorded it, else the precision of most of its MACs."""
    recorded = program.metadata.get("layer_precision") or {}
    if layer.name in recorded:
        return recorded[layer.name]
    return max(macs_by_precision(actions).items(), key=lambda kv: kv[1], default=(None,))[0]


def layer_precisions(program: Program, by_layer: list | None = None) -> list[str | None]:
    """Each layer's precision (_layer_precision), from its action counts (`by_layer`: the program's
    per layer, counted where not given)."""
    if by_layer is None:
        by_layer = counts_of(program).by_group(program.layer_ids, len(program.layers))
    return [_layer_precision(program, layer, counts) for layer, counts in zip(program.layers, by_layer, strict=True)]


def array_bound_cycles(macs: float, precision: str | None, hw: HardwareConfig) -> float:
    """Cycles the array needs for `macs` at its peak in `precision` (an unknown one: fp32's, one a PE)."""
    return macs / array_macs_per_cycle(hw, PRECISION_ITEMSIZE.get(precision, 4))


def macs_by_precision(actions: ActionCounts) -> dict:
    """{precision: MACs} of the precisions the array ran MACs in."""
    counts = {p: float(getattr(actions, f"macs_{p}")) for p in ("int8", "bf16", "fp32")}
    return {p: m for p, m in counts.items() if m > 0}


def _bytes(actions: ActionCounts) -> dict:
    return {lvl: {"read": getattr(actions, f"{lvl}_read_bytes"), "write": getattr(actions, f"{lvl}_write_bytes")}
            for lvl in LEVELS}


def make_report(program: Program) -> Report:
    """Time `program` on the config it was compiled for, count its actions, and assemble the report."""
    hw = program.hw
    tl = timeline(program)
    counts = counts_of(program)
    ids = program.layer_ids
    n_layers = len(program.layers)
    group = np.where(ids >= 0, ids, n_layers)       # instructions of no layer go to one extra group
    key = group * 4 + tl.queue
    shape = (n_layers + 1, 4)
    count = np.bincount(key, minlength=shape[0] * 4).reshape(shape)
    busy = np.bincount(key, weights=tl.end - tl.start, minlength=shape[0] * 4).reshape(shape)
    first = np.full(n_layers + 1, np.inf)
    last = np.zeros(n_layers + 1)
    np.minimum.at(first, group, tl.start)
    np.maximum.at(last, group, tl.end)
    first = np.where(np.isfinite(first), first, 0.0)
    frontier = np.maximum.accumulate(last[:n_layers]) if n_layers else last[:0]
    exclusive = np.diff(frontier, prepend=0.0)
    layer_counts = counts.by_group(ids, n_layers)
    precisions = layer_precisions(program, layer_counts)
    itemsize = np.zeros(n_layers + 1, np.int64)    # DRAM element size of the layer's tensors (its LOADs')
    loads = program.code["opcode"] == Opcode.LOAD
    np.maximum.at(itemsize, group[loads], ITEMSIZE[program.code["dtype"][loads]])
    layers = tuple(
        LayerReport(layer.name, layer.op, layer.in_shapes, layer.out_shape, layer.macs,
                    dict(zip(UNITS, map(int, count[i]), strict=True)), float(first[i]), float(last[i]),
                    float(exclusive[i]), dict(zip(UNITS, map(float, busy[i]), strict=True)), layer_counts[i],
                    {k: float(v) for k, v in energy_pj(layer_counts[i], exclusive[i], hw).items()},
                    _roofline(layer, precisions[i], hw, itemsize[i], last[i] - first[i]), precisions[i])
        for i, layer in enumerate(program.layers))
    total = counts.total()
    report = Report(layers, hw, dict(zip(UNITS, map(int, count.sum(0)), strict=True)),
                  dict(zip(UNITS, map(float, busy.sum(0)), strict=True)), tl.cycles, total,
                  {k: float(v) for k, v in energy_pj(total, tl.cycles, hw).items()},
                  {k: float(v) for k, v in area_mm2(hw).items()}, tl, ids, program.metadata.get("mixed_precision"),
                  model_limit(program, precisions), tuple(program.metadata.get("cascades") or ()), memory_use(program))
    targets = Targets.from_dict(program.metadata["targets"]) if "targets" in program.metadata else None
    return replace(report, verdict=verdict(report, targets)) if targets else report


def model_limit(program: Program, precisions: list | None = None) -> dict:
    """The model's physical limit: max(total MACs / peak MACs per cycle, compulsory bytes / DRAM bandwidth),
    each layer's MACs at the peak of its precision (`precisions`, layer_precisions' where not given: a
    packing array runs int8 at four times fp32's).

    Compulsory bytes are what no schedule avoids moving: the weights (the constant blob, less the zeros
    that packing depthwise convs adds) read once,
    the model's inputs read once and its outputs written once; every intermediate stays on chip.  MACs
    are the useful ones (a packed conv's zeros are not).
    """
    hw = program.hw
    macs = sum(layer.macs for layer in program.layers)
    weights = len(program.constants) - program.metadata.get("packed_weight_zeros", 0)
    compulsory = weights + sum(t.nbytes for t in (*program.inputs, *program.outputs))
    precisions = layer_precisions(program) if precisions is None else precisions
    compute = sum(array_bound_cycles(layer.macs, p, hw) for layer, p in zip(program.layers, precisions, strict=True))
    memory = compulsory / hw.dma_bandwidth_bytes_per_cycle
    return {"macs": macs, "compute_cycles": compute, "compulsory_bytes": compulsory, "memory_cycles": memory,
            "bound_cycles": max(compute, memory), "bound": "compute" if compute >= memory else "memory"}


def _roofline(layer: Layer, precision: str | None, hw: HardwareConfig, itemsize: int, span: float) -> dict:
    """The layer's roofline bound: compute (MACs / its precision's peak) or memory (compulsory bytes /
    bandwidth)."""
    elements = sum(math.prod(s) for s in layer.in_shapes) + math.prod(layer.out_shape)   # exact: no int64 wrap
    compulsory = elements * (int(itemsize) or 4)
    compute, memory = array_bound_cycles(layer.macs, precision, hw), compulsory / hw.dma_bandwidth_bytes_per_cycle
    bound = max(compute, memory)
    return {"compute_cycles": compute, "memory_cycles": memory, "bound_cycles": bound,
            "bound": "compute" if compute >= memory else "memory", "compulsory_bytes": compulsory,
            "achieved_over_bound": span / bound if bound > 0 else None}
