"""SCALE-Sim as a reference: the matrix layers of a compiled program as a SCALE-Sim run.

SCALE-Sim (github.com/scalesim-project, `pip install scalesim`) is an optional
benchmark dependency, never a test one.  It pins old numpy behaviour (3.0.0
fails on numpy >= 2.3), so it is run as a subprocess with any Python that has
it: `--scalesim-python /path/to/venv/bin/python`.

SCALE-Sim maps a conv as Sr = K = FH*FW*C (reduction), Sc = N = filters,
T = M = OFMAP pixels, and reports, per layer, the last compute cycle with
ample bandwidth: one less than the folds x per-fold cycles of sim.costs.
It has no padding, so each layer is given the padded input extent that
yields the program's output size.
"""

from __future__ import annotations

import csv
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from stagec.isa.program import Program

_CONFIG = """[general]
run_name = stagec

[architecture_presets]
ArrayHeight: {rows}
ArrayWidth: {cols}
IfmapSramSzkB: 65536
FilterSramSzkB: 65536
OfmapSramSzkB: 65536
IfmapOffset: 0
FilterOffset: 10000000
OfmapOffset: 20000000
Bandwidth: 100000
Dataflow: {dataflow}
MemoryBanks: 1
ReadRequestBuffer: 512
WriteRequestBuffer: 512

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport: false
SparseRep: ellpack_block
OptimizedMapping: false
BlockSize: 8
RandomNumberGeneratorSeed: 40

[run_presets]
InterfaceBandwidth: USER
UseRamulatorTrace: False
"""


@dataclass(frozen=True)
class ConvLayer:
    """One matrix layer in SCALE-Sim's terms (input extent already padded)."""

    name: str
    layer: int          # index in Program.layers
    ifmap_h: int
    ifmap_w: int
    filter_h: int
    filter_w: int
    channels: int
    filters: int
    stride: int

    @property
    def mkn(self) -> tuple[int, int, int]:
        oh = (self.ifmap_h - self.filter_h) // self.stride + 1
        ow = (self.ifmap_w - self.filter_w) // self.stride + 1
        return oh * ow, self.filter_h * self.filter_w * self.channels, self.filters


def matrix_layers(program: Program) -> list[ConvLayer]:
    """The program's conv and matmul layers (groups of 1), as SCALE-Sim topology rows."""
    out = []
    for i, layer in enumerate(program.layers):
        if layer.op == "conv" and len(layer.in_shapes[1]) == 4 and layer.in_shapes[1][1] == layer.in_shapes[0][1]:
            (_, c, h, _), (o, _, fh, fw) = layer.in_shapes[0], layer.in_shapes[1]
            _, _, oh, ow = layer.out_shape
            s = max(1, round(h / oh))
            out.append(ConvLayer(layer.name, i, (oh - 1) * s + fh, (ow - 1) * s + fw, fh, fw, c, o, s))
        elif layer.op == "matmul":
            (m, k), n = layer.in_shapes[0][-2:], layer.in_shapes[1][-1]
            out.append(ConvLayer(layer.name, i, m, 1, 1, 1, k, n, 1))
    return out


def run_scalesim(layers: list[ConvLayer], rows: int, cols: int, dataflow: str, python: str,
                 timeout_s: float = 3600) -> tuple[float, float, list[int]]:
    """Run SCALE-Sim on `layers`: (wall seconds, CPU seconds, compute cycles per layer)."""
    df = {"weight_stationary": "ws", "output_stationary": "os"}[dataflow]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "scale.cfg").write_text(_CONFIG.format(rows=rows, cols=cols, dataflow=df))
        topo = "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
        topo += "".join(f"L{i}, {c.ifmap_h}, {c.ifmap_w}, {c.filter_h}, {c.filter_w}, {c.channels}, {c.filters}, "
                        f"{c.stride},\n" for i, c in enumerate(layers))
        (tmp / "topology.csv").write_text(topo)
        (tmp / "layout.csv").write_text(topo)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run([python, "-m", "scalesim.scale", "-c", str(tmp / "scale.cfg"), "-t", str(tmp / "topology.csv"),
                        "-l", str(tmp / "layout.csv"), "-p", str(tmp / "out"), "-i", "conv", "-s", "N"],
                       check=True, capture_output=True, timeout=timeout_s, cwd=tmp)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        report = next((tmp / "out").rglob("COMPUTE_REPORT.csv"))
        with report.open() as f:
            rows_ = list(csv.reader(f, skipinitialspace=True))
        col = next(i for i, h in enumerate(rows_[0]) if h.strip() == "Total Cycles")
        return wall, cpu, [int(r[col]) for r in rows_[1:] if r]
