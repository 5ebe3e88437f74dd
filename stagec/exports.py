"""Files other tools open: the timeline as a Chrome/Perfetto trace, the per-layer table as CSV, the
frontend's graph as StableHLO.

    >>> import stagec
    >>> from stagec.models import hand_keypoint_net
    >>> model, (x,) = hand_keypoint_net()
    >>> _, report = stagec.simulate(stagec.compile(model, (x,)), x)
    >>> write_trace(report, "/tmp/trace.json")      # open in https://ui.perfetto.dev or chrome://tracing
    >>> write_csv(report, "/tmp/layers.csv")
    >>> text = stablehlo_text(model, (x,))          # "module @jit_... { func.func public @main(...) ..."

The trace follows the Chrome trace event format: one process (the accelerator), one thread per
unit (load, matrix, vector, store) and one for the DRAM channel they share, one complete ("X")
event per run of back-to-back instructions of one layer on one unit (named by the layer), with
`ts` and `dur` in microseconds at the config's clock and the exact cycles in `args`.  Only
instructions that touch end to start are merged, so each unit's slices add up to its busy cycles.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .report import UNITS, Report

TRACKS = UNITS + ("dram",)   # thread ids 0..4: the four queues, then the DRAM channel (grant to end of each DMA)
NO_LAYER = "(no layer)"


def runs(start: np.ndarray, end: np.ndarray, layer: np.ndarray, resolution: float = 0.0):
    """One unit's intervals merged into runs of one layer whose gaps are at most `resolution` (0: only
    intervals that touch end to start), in time order: (starts, ends, layers, interval counts)."""
    order = np.argsort(start, kind="stable")
    start, end, layer = start[order], end[order], layer[order]
    new = np.ones(len(start), bool)
    new[1:] = (layer[1:] != layer[:-1]) | (start[1:] - end[:-1] > resolution)
    first = np.flatnonzero(new)
    ends = np.maximum.reduceat(end, first) if len(first) else end[:0]
    return start[first], ends, layer[first], np.diff(np.append(first, len(start)))


def trace_events(report: Report) -> list[dict]:
    """The report's timeline as Chrome trace events (metadata events first)."""
    tl = report.timeline
    us_per_cycle = 1e6 / report.clock_hz
    names = [layer.name for layer in report.layers] + [NO_LAYER]
    events = [{"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "stagec accelerator"}}]
    for tid, track in enumerate(TRACKS):
        events += [{"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": track}},
                   {"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]
        mine = tl.dram_transfers() if track == "dram" else np.flatnonzero(tl.queue == tid)
        begin = tl.grant if track == "dram" else tl.start
        for s, e, layer, n in zip(*runs(begin[mine], tl.end[mine], report.layer_ids[mine]), strict=True):
            events.append({"ph": "X", "pid": 0, "tid": tid, "name": names[layer], "cat": track,
                           "ts": float(s) * us_per_cycle, "dur": float(e - s) * us_per_cycle,
                           "args": {"start_cycle": float(s), "cycles": float(e - s), "instructions": int(n)}})
    return events


def write_trace(report: Report, path: str | Path) -> Path:
    """Write the timeline as Chrome trace JSON (opens in the Perfetto UI and chrome://tracing)."""
    path = Path(path)
    trace = {"traceEvents": trace_events(report), "displayTimeUnit": "ns",
             "otherData": {"clock_hz": report.clock_hz, "cycles": report.cycles}}
    path.write_text(json.dumps(trace, allow_nan=False))
    return path


CSV_COLUMNS = ("layer", "op", "precision", "macs", "cycles", "start_cycle", "end_cycle", "span_cycles",
               "array_utilization", "bound", "bound_cycles", "achieved_over_bound", "dram_read_bytes",
               "dram_write_bytes", *(f"{u}_busy_cycles" for u in UNITS), *(f"{u}_instructions" for u in UNITS),
               "energy_pj")


def layer_rows(report: Report) -> list[dict]:
    """One row per layer with CSV_COLUMNS' keys, plus energy_<component>_pj columns."""
    rows = []
    for layer in report.layers:
        roof = layer.roofline
        rows.append({
            "layer": layer.name, "op": layer.op, "precision": layer.precision or "", "macs": layer.macs,
            "cycles": layer.cycles, "start_cycle": layer.start_cycle, "end_cycle": layer.end_cycle,
            "span_cycles": layer.span_cycles, "array_utilization": layer.array_utilization(report.hw),
            "bound": roof["bound"], "bound_cycles": roof["bound_cycles"],
            "achieved_over_bound": roof["achieved_over_bound"],
            "dram_read_bytes": layer.actions.dram_read_bytes, "dram_write_bytes": layer.actions.dram_write_bytes,
            **{f"{u}_busy_cycles": layer.busy_cycles[u] for u in UNITS},
            **{f"{u}_instructions": layer.instructions[u] for u in UNITS},
            "energy_pj": sum(layer.energy_pj.values()),
            **{f"energy_{k}_pj": v for k, v in layer.energy_pj.items()}})
    return rows


def write_csv(report: Report, path: str | Path) -> Path:
    """Write the per-layer table (Vela's --verbose-performance, as CSV): one row per layer."""
    path = Path(path)
    rows = layer_rows(report)
    columns = list(rows[0]) if rows else list(CSV_COLUMNS)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_report(report: Report, out: str | Path) -> list[Path]:
    """The report as files in folder `out`: summary.txt, report.json, layers.csv and trace.json (what
    `stagec report`, `stagec run --report` and `stagec codesign` write)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(report.summary() + "\n")
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    return [out / "summary.txt", out / "report.json", write_csv(report, out / "layers.csv"),
            write_trace(report, out / "trace.json")]


def stablehlo_text(model, args, kwargs=None) -> str:
    """The frontend's graph of `model` (a torch.nn.Module or a JAX function) as StableHLO text, through
    jax.export: what stagec compiles, for other compilers to take (`TracedModel.export()` gives the
    portable `jax.export.Exported` itself)."""
    from stagec.frontend import trace_model
    return trace_model(model, args, kwargs).export().mlir_module()
