"""Where a fused model's DRAM bytes and cycles go (issue 19's map): per cascade, or layer run alone, the
bytes its DMAs move by what they move, and the unit that bounds it, from the compiled program and the
timing simulator (stagec.report.make_report); nothing is executed.

    python experiments/fusion_map.py [--full] [--config default] [--layer-by-layer] model

Columns (KiB): `W` the group's weights, `W x` how many times its DMAs read them (above 1: re-read per
spatial tile), `in` its first input's size, `halo` what its first member read beyond that (windows
recomputed, halos overlapping), `epi` what later members read from DRAM (a residual add's input), `out`
what it writes; then its cycles (the timeline's exclusive share) and each unit's busy cycles, the
busiest named.  The last lines: the totals, the compulsory bytes (weights, model inputs and outputs:
stagec.report.model_limit) and what is above them by kind.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from bench_fusion import CONFIGS, MODELS

import stagec
from stagec.isa import opcodes
from stagec.isa.program import RegionKind
from stagec.report import UNITS, make_report
from stagec.sim.energy import Fields

KINDS = ("weights", "activations", "written")
PRECISION_BYTES = {"int8": 1, "bf16": 2, "fp32": 4}


def dma_bytes(program) -> np.ndarray:
    """[instruction, kind] DRAM bytes: read from the constants (weights), read from inputs and
    intermediates (activations), written."""
    code = program.code
    out = np.zeros((len(code), len(KINDS)))
    bounds = [(r.offset, r.offset + r.nbytes, r.kind) for r in program.regions]
    for d in opcodes.OPCODES.values():
        slot = d.dram_slot
        rows = np.flatnonzero(code["opcode"] == d.opcode)
        if slot is None or not rows.size:
            continue
        moved = np.asarray(d.unit.moved(Fields(code[rows])), np.float64)
        if slot.write:
            out[rows, 2] = moved
            continue
        base = code[f"{slot.operand}_base"][rows]
        const = np.zeros(len(rows), bool)
        for lo, hi, kind in bounds:
            const |= (kind == RegionKind.CONST) & (base >= lo) & (base < hi)
        out[rows, 0] = np.where(const, moved, 0)
        out[rows, 1] = np.where(const, 0, moved)
    return out


def groups(program) -> list[list[int]]:
    """Layer indices per cascade (program metadata) or alone, in program order."""
    index = {layer.name: i for i, layer in enumerate(program.layers)}
    of = {index[name]: k for k, c in enumerate(program.metadata.get("cascades") or ()) for name in c["layers"]}
    out = []
    for i in range(len(program.layers)):
        if out and i in of and of.get(out[-1][-1]) == of[i]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def layer_map(program) -> list[dict]:
    """One row per group (module doc)."""
    r = make_report(program)
    per = np.zeros((len(program.layers) + 1, len(KINDS)))
    np.add.at(per, np.where(program.layer_ids >= 0, program.layer_ids, len(program.layers)), dma_bytes(program))
    rows = []
    for g in groups(program):
        item = PRECISION_BYTES.get(r.layers[g[0]].precision, 4)   # its operands' (int8 epilogues run in int32)
        weights = sum(math.prod(program.layers[i].in_shapes[1]) * item for i in g
                      if len(program.layers[i].in_shapes) > 1 and per[i, 0])
        first_in = math.prod(program.layers[g[0]].in_shapes[0]) * item if program.layers[g[0]].in_shapes else 0
        first_in = min(first_in, per[g[0], 1])    # none of it where the first input is a constant
        busy = {u: sum(r.layers[i].busy_cycles[u] for i in g) for u in UNITS}
        rows.append({"name": program.layers[g[0]].name.split("/")[0] + (f" +{len(g) - 1}" if len(g) > 1 else ""),
                     "weights": weights, "weights_read": per[g, 0].sum(), "in": first_in,
                     "halo": per[g[0], 1] - first_in, "epilogue": per[g[1:], 1].sum(), "out": per[g, 2].sum(),
                     "cycles": sum(r.layers[i].cycles for i in g), "busy": busy})
    return rows, r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--full", action="store_true", help="full-size zoo model")
    parser.add_argument("--config", default="default", choices=list(CONFIGS))
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--layer-by-layer", action="store_true", help="compile(fuse_layers=False)")
    opts = parser.parse_args()
    model, args, kwargs = MODELS[opts.model](opts.full)
    program = stagec.compile(model, args, kwargs=kwargs, hw=CONFIGS[opts.config],
                             quantize="int8" if opts.int8 else None, fuse_layers=not opts.layer_by_layer)
    rows, r = layer_map(program)
    kib = 1024
    print(f"{'group':<52} {'W':>6} {'W x':>5} {'in':>6} {'halo':>6} {'epi':>6} {'out':>6} {'cycles':>8} "
          + " ".join(f"{u:>7}" for u in UNITS) + "  bound")
    for row in rows:
        w = row["weights"]
        print(f"{row['name'][-52:]:<52} {w / kib:6.0f} {row['weights_read'] / w if w else 0:5.2f} "
              f"{row['in'] / kib:6.0f} {row['halo'] / kib:6.0f} {row['epilogue'] / kib:6.0f} {row['out'] / kib:6.0f} "
              f"{row['cycles']:8.0f} " + " ".join(f"{row['busy'][u]:7.0f}" for u in UNITS)
              + f"  {max(row['busy'], key=row['busy'].get)}")
    total = {k: sum(row[k] for row in rows) for k in ("weights", "weights_read", "in", "halo", "epilogue", "out")}
    dram = r.actions.dram_read_bytes + r.actions.dram_write_bytes
    limit, mib = r.model_limit, 2**20
    inputs, outputs = (sum(t.nbytes for t in ts) for ts in (program.inputs, program.outputs))
    print(f"\nDRAM {dram / mib:.2f} MiB, compulsory {limit['compulsory_bytes'] / mib:.2f} MiB; above it (MiB): "
          f"weights re-read {(total['weights_read'] - total['weights']) / mib:.2f}, activations read "
          f"{(total['in'] - inputs) / mib:.2f} + halo {total['halo'] / mib:.2f} + epilogue "
          f"{total['epilogue'] / mib:.2f}, written {(total['out'] - outputs) / mib:.2f}")
    print(f"cycles {r.cycles:.0f}, model limit {limit['bound_cycles']:.0f} ({limit['bound']}), "
          f"x{r.cycles_over_model_limit:.2f}; busy " + ", ".join(f"{u} {r.busy_cycles[u]:.0f}" for u in UNITS))


if __name__ == "__main__":
    main()
