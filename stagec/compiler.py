"""stagec.compile: a model, through every stage of stagec.pipeline.PIPELINE, to a program."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from types import MappingProxyType

from stagec.errors import InputError, TargetWarning
from stagec.isa import HardwareConfig, Program
from stagec.lower.schedule.search import TUNABLE

from .pipeline import PIPELINE, Compilation, Request, Stage, position, run
from .targets import Targets, verdict


def compile(model_or_fn, example_args, hw: HardwareConfig | None = None, dump=None,  # noqa: A001
            fuse: bool = True, mappings: dict | None = None, kwargs: dict | None = None,
            tune=None, objective: str = "edp", quantize: str | None = None, calibration=None,
            percentile: float | None = None, fallback: str | None = None, layer_precision: dict | None = None,
            accuracy_target: float | None = None, int8_scores: bool | None = None, integer_ops=None,
            activation_ranges: str | None = None, fuse_layers: bool = True, latency_target_s: float | None = None,
            power_budget_w: float | None = None, progress: bool = True,
            stages: Sequence[Stage] = PIPELINE) -> Program:
    """Compile a PyTorch model (called with `example_args` and `kwargs`) or a JAX function for the
    accelerator; `stagec.simulate` then takes and returns the model's own input and output structure.

    `dump` prints the IR of the stages it names (a name or a list; all with True; a folder, a Path or a
    str that names no stage: one file per stage).
    `fuse=False` skips the fusion passes (every elementwise op then round-trips through DRAM),
    to measure what fusion saves.  `fuse_layers=False` runs every layer alone, its result through DRAM;
    by default the mapper runs chains of pointwise layers (a feed-forward block's matmuls, 1x1 convs)
    as cascades (lower.schedule.cascade) where that lowers `objective`.  `mappings` ({layer name:
    lower.schedule.nest.TileMapping}; names as the schedule dump's; a vector layer of several nests
    takes one for all or a tuple of one each) replaces the default mapper's choice for those layers.
    The default mapper and the tuner minimize `objective`: "latency" (cycles), "energy" (pJ per
    inference: DRAM traffic dominates it) or "edp" (their product, the default: on a power-bound
    device energy counts as much as time), layer by layer; "size" (the default mapper only, not the
    tuner) takes each conv/matmul/pool nest's smallest scratchpad plus accumulator footprint, and
    the fastest of those (vector-unit nests keep their latency ranking; DRAM use is the DRAM plan's,
    which no mapping changes: the report gives both peaks).
    `tune="gradient"` maps the other layers with stagec.tune (cost model, optax) for `objective`;
    a stagec.TuneSettings instead of "gradient" does so with those settings.  With `quantize`, it
    tunes the quantized graph's layers, each priced at its own element sizes.

    `quantize="int8"` quantizes after training (lower.graph.quantize): int8 weights per output channel,
    int8 activations per tensor with ranges from `calibration` (a list of batches, each a tuple of
    the model's positional inputs or a dict of its keyword inputs; default: the example inputs
    alone), the largest |x| seen or, with `percentile` (e.g. 99.99), that percentile of |x|.
    Ops int8 cannot take (softmax, layer norm, attention matmuls) run as float islands between
    QUANTIZE and DEQUANTIZE, in `fallback`'s type: "bf16" (the default; bf16 in DRAM, computed in
    float32 on the vector unit, bf16 x bf16 -> float32 on the matrix unit; graph outputs float32)
    or "fp32".  `layer_precision` ({layer name: "int8" | "bf16" | "fp32"}; names as the schedule
    dump and the report give them, a fused `a+b` or a module's name such as "encoder.0.linear1"
    standing for its parts) keeps layers out of int8 in that type.  `accuracy_target` (e.g. 0.99)
    measures each int8 layer's effect on the output (cosine against the float graph over the
    calibration batches, graphs evaluated by lower.graph.evaluate) and keeps the fewest, most
    sensitive layers bf16 until the whole graph meets it (greedy, deterministic; progress on
    stderr); if even all of them bf16 miss, a stagec.AccuracyWarning and the best mix found.  The
    report shows each layer's precision and the chosen layers (lower.graph.mixed_precision).
    `int8_scores=False` keeps attention's scores (Q K^T, which softmax takes) float in DRAM; by default
    they are requantized to int8 (half bf16's bytes; no accuracy cost measured on the zoo).
    `integer_ops` ("all", or names from ("softmax", "layer_norm", "gelu")) runs those ops integer-only instead
    of as float islands: I-BERT's integer softmax (polynomial exp, integer division) and layer norm
    (integer Newton square root), and GELU (I-BERT's i-GELU polynomial in place of the 256-entry
    table), int8 in and out, int32 inside (lower.graph.integer_kernels).  `activation_ranges="channel"`
    (with "layer_norm" among them) gives an integer layer norm whose input is a float value per-channel
    ranges: FQ-ViT's power-of-two factors, channel c on the grid s * 2**alpha_c, alpha_c in 0..3,
    which the integer kernel shifts onto one grid exactly; it helps when a few channels have far
    larger ranges than the rest (transformers' residual streams).  Other values stay per tensor.
    `quantize="bf16"` holds activations and weights as bfloat16 (lower.graph.bfloat16): half the
    DRAM and scratchpad bytes of fp32, bf16 MACs into float32 accumulators, no calibration.

    `latency_target_s` (seconds per inference) and `power_budget_w` (average watts over one
    inference: energy over latency) are checked on the simulator's timing of the program.  When one
    is missed, compile tries, keeping the closest: the default mapper for the missed target's own
    objective (latency, or energy for power) if `objective` was another, then, unless `tune` was
    given, the gradient tuner's mappings for it.  It changes no precision (`quantize` is the
    caller's choice: int8 is the big lever for both).  A target still missed is a
    stagec.TargetWarning; the program's report (stagec.simulate, make_report) says met or missed,
    by how much, the slack, what was tried and the layers that take the most time and energy.
    `progress` draws a bar over the stages (and the tuner's rounds) when stderr is a terminal.
    `stages` is the pipeline to walk: stagec.pipeline.PIPELINE, or a copy with a pass of one's own.

    >>> import torch, stagec
    >>> program = stagec.compile(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
    >>> program.outputs[0].shape
    (2, 4)
    """
    targets = Targets(latency_target_s, power_budget_w)
    request = Request(model_or_fn, example_args, kwargs, hw or HardwareConfig(), fuse, quantize, calibration,
                      percentile, MappingProxyType(dict(mappings or {})), _tuner(tune, objective, progress), objective,
                      fallback, layer_precision, accuracy_target, int8_scores, integer_ops, activation_ranges,
                      fuse_layers)
    c = run(stages, Compilation(request), dump, progress)
    return _meet(stages, c, targets, progress) if targets else c.program


def _tuner(tune, objective: str, progress: bool = True):
    """The tune stage's (graph, hw) -> stagec.Tuning, or None."""
    if tune is None:
        return None
    # NOTE: imported here: the cost model and optax load only to tune
    from .tuning import DEFAULT_SETTINGS, TuneSettings, print_progress, tune_graph
    if tune != "gradient" and not isinstance(tune, TuneSettings):
        raise InputError(f"unknown tune={tune!r}; expected None, 'gradient' or a stagec.TuneSettings")
    if objective not in TUNABLE:
        raise InputError(f"tune= minimizes one of {TUNABLE}, not objective={objective!r}")
    settings = tune if isinstance(tune, TuneSettings) else DEFAULT_SETTINGS
    return partial(tune_graph, objective=objective, settings=settings, progress=print_progress if progress else None)


def _meet(stages: Sequence[Stage], c: Compilation, targets: Targets, progress: bool) -> Program:
    """The program of `c`, or of the first retry (module doc of compile) that meets `targets`, else
    the closest; its metadata records the targets and what was tried."""
    request = c.request
    tries = [(f"the {'tuned' if request.tuner else 'default'} mappings for {request.objective}", c.program)]
    if _miss(c.program, targets) > 1:
        want = "latency" if targets.latency_s is not None and _miss(c.program, targets, "latency") > 1 else "energy"
        if request.objective != want:
            retry = replace(request, objective=want)
            c = run(stages[position("layout", stages):], replace(c, request=retry), None, progress)
            tries.append((f"the default mapper for {want}", c.program))
        if request.tuner is None and "tune" in (s.name for s in stages) and _miss(c.program, targets) > 1:
            retry = replace(request, objective=want, tuner=_tuner("gradient", want, progress))
            c = run(stages[position("tune", stages):], replace(c, request=retry), None, progress)
            tries.append((f"the gradient tuner's mappings for {want}", c.program))
    best = min((p for _, p in tries), key=lambda p: _miss(p, targets))
    targets = replace(targets, tried=tuple(name for name, _ in tries))
    # NOTE: the same instructions: the verifier's and planner's entries hold; the report gains its verdict
    program = dataclasses.replace(best, metadata={**best.metadata, "targets": targets.to_dict()},
                                  cache=dict(best.cache))
    report = program.cache["report"] = dataclasses.replace(best.cache["report"],
                                                           verdict=verdict(best.cache["report"], targets))
    if not report.verdict.met:
        warnings.warn("missed: " + "; ".join(ch.line() for ch in report.verdict.checks if not ch.met),
                      TargetWarning, stacklevel=3)
    return program


def _miss(program: Program, targets: Targets, only: str | None = None) -> float:
    """How far `program` is from `targets`: the largest of value / target (at most 1: all met)."""
    from .report import make_report
    if "report" not in program.cache:   # NOTE: the timing is the costly part; simulate reuses it
        program.cache["report"] = make_report(program)
    checks = verdict(program.cache["report"], targets).checks
    return max(ch.value / ch.target for ch in checks if only in (None, ch.name))
