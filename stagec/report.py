"""What a simulation reports: per-layer and total instructions, bytes and cycles."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stagec.isa.instructions import Queue
from stagec.isa.program import Program
from stagec.sim.timing import dram_bytes, instruction_cycles, queue_of

UNITS = tuple(q.name.lower() for q in Queue)


@dataclass(frozen=True)
class LayerReport:
    name: str
    op: str
    in_shapes: tuple
    out_shape: tuple
    macs: int
    instructions: dict          # unit -> count
    dram_read_bytes: int
    dram_write_bytes: int
    busy_cycles: dict           # unit -> cycles


@dataclass(frozen=True)
class Report:
    """Simulation report.  `cycles` is the busiest unit's total: exact when the units overlap
    perfectly, a lower bound otherwise (`serial_cycles` is the upper bound)."""

    layers: tuple[LayerReport, ...]
    instructions: dict
    busy_cycles: dict
    cycles: float
    serial_cycles: float
    dram_read_bytes: int
    dram_write_bytes: int
    clock_hz: float

    @property
    def latency_s(self) -> float:
        return self.cycles / self.clock_hz

    def to_dict(self) -> dict:
        d = asdict(self)
        d["latency_s"] = self.latency_s
        return d

    def summary(self) -> str:
        head = f"{'layer':<34} {'op':<11} {'output':<16} {'instr':>7} {'DRAM KiB':>9} {'MMACs':>8} {'cycles':>10}"
        lines = [head, "-" * len(head)]
        for layer in self.layers:
            lines.append(f"{layer.name[:34]:<34} {layer.op:<11} {'x'.join(map(str, layer.out_shape)):<16} "
                         f"{sum(layer.instructions.values()):>7} "
                         f"{(layer.dram_read_bytes + layer.dram_write_bytes) / 1024:>9.1f} {layer.macs / 1e6:>8.2f} "
                         f"{max(layer.busy_cycles.values()):>10.0f}")
        lines.append("-" * len(head))
        lines.append(f"instructions per unit: {self.instructions}")
        lines.append(f"busy cycles per unit:  {({k: int(v) for k, v in self.busy_cycles.items()})}")
        lines.append(f"cycles: {self.cycles:.0f} (busiest unit) .. {self.serial_cycles:.0f} (no overlap); "
                     f"{self.latency_s * 1e3:.3f} ms at {self.clock_hz / 1e9:g} GHz; "
                     f"DRAM read {self.dram_read_bytes / 2**20:.2f} MiB, "
                     f"written {self.dram_write_bytes / 2**20:.2f} MiB")
        return "\n".join(lines)


def make_report(program: Program) -> Report:
    code = program.code
    q = queue_of(code)
    cycles = instruction_cycles(code, program.hw)
    read, write = dram_bytes(code)
    ids = program.layer_ids
    n_layers = len(program.layers)
    # per (layer, unit) sums in one pass
    key = np.where(ids >= 0, ids, n_layers) * 4 + q
    counts = np.bincount(key, minlength=(n_layers + 1) * 4).reshape(-1, 4)
    busy = np.bincount(key, weights=cycles, minlength=(n_layers + 1) * 4).reshape(-1, 4)
    rd = np.bincount(np.where(ids >= 0, ids, n_layers), weights=read, minlength=n_layers + 1)
    wr = np.bincount(np.where(ids >= 0, ids, n_layers), weights=write, minlength=n_layers + 1)
    layers = tuple(
        LayerReport(layer.name, layer.op, layer.in_shapes, layer.out_shape, layer.macs,
                    dict(zip(UNITS, map(int, counts[i]), strict=True)), int(rd[i]), int(wr[i]),
                    dict(zip(UNITS, map(float, busy[i]), strict=True)))
        for i, layer in enumerate(program.layers))
    unit_busy = busy.sum(0)
    return Report(layers, dict(zip(UNITS, map(int, counts.sum(0)), strict=True)),
                  dict(zip(UNITS, map(float, unit_busy), strict=True)), float(unit_busy.max(initial=0.0)),
                  float(cycles.sum()), int(read.sum()), int(write.sum()), float(program.hw.clock_hz))
