"""Plots of a report, as PNG and SVG: a Gantt timeline, a roofline with every layer, per-layer stacked bars.

    >>> import stagec
    >>> from stagec.models import hand_keypoint_net
    >>> model, (x,) = hand_keypoint_net()
    >>> _, report = stagec.simulate(stagec.compile(model, (x,)), x)
    >>> paths = write_plots(report, "/tmp/stagec-report")     # timeline.png, timeline.svg, roofline.png, ...

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so
they render headless with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from stagec.sim.costs import array_macs_per_cycle, lane_elements
from stagec.sim.energy import COMPONENTS

from .exports import runs
from .report import PRECISION_ITEMSIZE, UNITS, Report

UNIT_ROWS = UNITS + ("dram",)     # the four queues, and the DRAM channel they share
MAX_SEGMENTS_PER_ROW = 4000       # merge instructions closer than a pixel or so into one bar


def timeline_figure(report: Report, name: str = "") -> Figure:
    """Gantt chart: one row per unit (and one for the DRAM channel), bars colored by layer."""
    tl = report.timeline
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax = fig.add_subplot()
    colors = _layer_colors(len(report.layers))
    resolution = max(report.cycles, 1.0) / MAX_SEGMENTS_PER_ROW
    for row, unit in enumerate(UNIT_ROWS):
        if unit == "dram":
            mine = tl.dram_transfers()
            start, end = tl.grant[mine], tl.end[mine]
        else:
            mine = np.flatnonzero(tl.queue == UNITS.index(unit))
            start, end = tl.start[mine], tl.end[mine]
        starts, ends, layers, _ = runs(start, end, report.layer_ids[mine], resolution)
        widths = ends - starts
        # NOTE: layer id -1 (no layer) indexes the last color, the gray.
        ax.broken_barh(np.stack([starts, widths], 1), (row - 0.4, 0.8), facecolors=colors[layers], linewidth=0)
    ax.set_yticks(range(len(UNIT_ROWS)), UNIT_ROWS)
    ax.invert_yaxis()
    ax.set_xlim(0, max(report.cycles, 1.0))
    ax.set_xlabel("cycle")
    ax.set_title(f"{_prefix(name)}timeline: {report.cycles:.0f} cycles = {report.latency_s * 1e3:.3f} ms "
                 "(colors: layers, in order)")
    return fig


def roofline_figure(report: Report, name: str = "") -> Figure:
    """Achieved ops per cycle against ops per compulsory DRAM byte, for every layer, under the roofs."""
    hw = report.hw
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.add_subplot()
    intensity, perf, matrix = [], [], []
    for layer in report.layers:
        ops = layer.macs or layer.actions.vector_ops
        if ops and layer.span_cycles > 0:
            intensity.append(ops / layer.roofline["compulsory_bytes"])
            perf.append(ops / layer.span_cycles)
            matrix.append(layer.macs > 0)
    intensity, perf, matrix = np.array(intensity), np.array(perf), np.array(matrix, bool)
    # the array's peak in each precision its layers ran (a packing array's int8 is 4x fp32's)
    peaks: dict[int, list] = {}
    for p in sorted({layer.precision for layer in report.layers if layer.macs and layer.precision} or {"fp32"},
                    key=PRECISION_ITEMSIZE.get, reverse=True):
        peaks.setdefault(array_macs_per_cycle(hw, PRECISION_ITEMSIZE[p]), []).append(p)
    lo = min(intensity.min(initial=1.0), 1.0) / 4
    hi = max(intensity.max(initial=1.0), max(peaks) / hw.dma_bandwidth_bytes_per_cycle) * 4
    x = np.geomspace(lo, hi, 200)
    # int8's: each 32-bit lane takes four with sub-word packing
    vector_peak = hw.vector_lanes * int(lane_elements(8, hw.vector_subword_packing))
    roofs = [(peak, f"array peak {peak} MAC/cycle ({', '.join(ps)})", style)
             for (peak, ps), style in zip(peaks.items(), ("-", "--", "-."), strict=False)]
    for peak, label, style in (*roofs, (vector_peak, f"vector peak {vector_peak} int8 op/cycle", ":")):
        ax.plot(x, np.minimum(peak, hw.dma_bandwidth_bytes_per_cycle * x), "k" + style, lw=1.2, label=label)
    ax.scatter(intensity[matrix], perf[matrix], c="tab:blue", label="matrix layers (MACs)", zorder=3)
    ax.scatter(intensity[~matrix], perf[~matrix], c="tab:orange", marker="s", label="vector layers (element ops)",
               zorder=3)
    for i, (xi, yi) in enumerate(zip(intensity, perf, strict=True)):
        ax.annotate(str(i), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (ops per compulsory DRAM byte)")
    ax.set_ylabel("achieved ops per cycle (over the layer's span)")
    ax.set_title(f"{_prefix(name)}roofline: {hw.array_rows}x{hw.array_cols} array, "
                 f"{hw.dma_bandwidth_bytes_per_cycle:g} B/cycle DRAM")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def layers_figure(report: Report, name: str = "") -> Figure:
    """Per layer: busy cycles stacked by unit (with span and roofline bound), energy stacked by component."""
    fig = Figure(figsize=(max(8.0, 0.35 * len(report.layers) + 3), 7), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    idx = np.arange(len(report.layers))
    base = np.zeros(len(idx))
    for unit in UNITS:
        values = np.array([layer.busy_cycles[unit] for layer in report.layers])
        top.bar(idx, values, bottom=base, label=f"{unit} busy")
        base += values
    top.plot(idx, [layer.span_cycles for layer in report.layers], "k_", ms=12, mew=2, label="span")
    top.plot(idx, [layer.roofline["bound_cycles"] for layer in report.layers], "r.", ms=8, label="roofline bound")
    top.set_ylabel("cycles")
    top.legend(fontsize=8, ncol=3)
    base = np.zeros(len(idx))
    for component in COMPONENTS:
        values = np.array([layer.energy_pj[component] for layer in report.layers]) / 1e6
        bottom.bar(idx, values, bottom=base, label=component)
        base += values
    bottom.set_ylabel("energy (uJ)")
    bottom.legend(fontsize=8, ncol=3)
    names = [layer.name if len(report.layers) <= 40 else str(i) for i, layer in enumerate(report.layers)]
    bottom.set_xticks(idx, [n[:28] for n in names], rotation=80, fontsize=7)
    top.set_title(f"{_prefix(name)}per layer")
    return fig


def sensitivity_figure(sens, name: str = "") -> Figure:
    """Bars per hardware field (stagec.sensitivity.Sensitivities): the relative change of latency,
    energy and EDP per relative change of the field, and the latency each mm^2 it adds buys (% of
    the latency per mm^2; fields that add no area left out); fields that change nothing left out."""
    moving = [f for f in sens.fields if any(getattr(f, m) != 0 for m in ("latency_s", "energy_pj", "edp"))]
    fig = Figure(figsize=(14, max(3.0, 0.3 * len(moving) + 1.5)), layout="constrained")
    axes = fig.subplots(1, 4, sharey=True)
    idx = np.arange(len(moving))
    for ax, metric, label in zip(axes, ("latency_s", "energy_pj", "edp"), ("latency", "energy", "EDP"), strict=False):
        values = [f.elasticity(sens, metric) for f in moving]
        ax.barh(idx, values, color=np.where(np.array(values) < 0, "tab:green", "tab:red"))
        ax.set_title(f"d ln {label} / d ln field", fontsize=9)
        ax.axvline(0, color="k", lw=0.5)
    per_mm2 = [100 * f.latency_per_mm2 / sens.latency_s if np.isfinite(f.latency_per_mm2) else 0.0 for f in moving]
    axes[3].barh(idx, per_mm2, color="tab:blue")
    axes[3].set_title("latency saved per mm^2 (%)", fontsize=9)
    axes[3].axvline(0, color="k", lw=0.5)
    axes[0].set_yticks(idx, [f"{f.name}{' (step)' if f.kind == 'step' else ''}" for f in moving], fontsize=8)
    fig.suptitle(f"{_prefix(name)}sensitivities")
    return fig


def _prefix(name: str) -> str:
    return f"{name}: " if name else ""


def _layer_colors(n: int) -> np.ndarray:
    """A color per layer (alternating hues, so neighbours differ) and a gray for instructions of no layer."""
    from matplotlib import colormaps
    palette = colormaps["tab20"](np.arange(20))
    return np.concatenate([palette[(np.arange(n) * 7) % 20], [[0.6, 0.6, 0.6, 1.0]]])


def write_plots(report: Report, out_dir: str | Path, name: str = "") -> list[Path]:
    """Write timeline, roofline and layers plots as PNG and SVG into `out_dir` (titles start with `name`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, make in (("timeline", timeline_figure), ("roofline", roofline_figure), ("layers", layers_figure)):
        fig = make(report, name)
        for suffix in ("png", "svg"):
            path = out / f"{kind}.{suffix}"
            fig.savefig(path, dpi=120)
            paths.append(path)
    return paths
