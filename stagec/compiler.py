"""The compile driver: every stage, top to bottom; `dump=` prints each stage's IR by these names."""

from __future__ import annotations

import contextlib
import gc
import inspect
import warnings
from pathlib import Path

import torch

from stagec.errors import InputError
from stagec.frontend import TracedModel, flatten_inputs, trace_jax, trace_torch
from stagec.isa import HardwareConfig, Program, disassemble, verify
from stagec.lower.calibrate import calibrate
from stagec.lower.canonicalize import canonicalize
from stagec.lower.layout import assign_layout
from stagec.lower.lowering import lower_to_program
from stagec.lower.pack import pack_depthwise
from stagec.lower.passes import dce, defer_row_scale, fold_affine, fuse_elementwise, fuse_epilogues, sink_reshapes
from stagec.lower.quantize import quantize as quantize_graph
from stagec.lower.schedule import make_schedule

GRAPH_PASSES = [
    ("dce", dce),                            # drop what no output needs
    ("sink_reshapes", sink_reshapes),        # scalar elementwise ops before a reshape -> after it, to fuse
    ("fuse_elementwise", fuse_elementwise),  # elementwise chains -> one node
    ("defer_row_scale", defer_row_scale),    # matmul(x * row scale, b) -> matmul(x, b) * row scale
    ("fuse_epilogues", fuse_epilogues),      # bias/activation/residual -> the conv/matmul's accumulator tile
    ("fold_affine", fold_affine),            # per-channel scale and shift (batch norm) -> weights and bias
]
FUSION_PASSES = {"sink_reshapes", "fuse_elementwise", "defer_row_scale", "fuse_epilogues"}
QUANTIZE_STAGES = (   # quantize="int8" only; _quantize runs them
    "calibrate",         # every fp32 value's range over the calibration batches
    "quantize",          # int8 CONV/MATMUL, QUANTIZE/DEQUANTIZE at the fp32 islands' boundaries
    "fuse_quantized",    # the boundaries -> their neighbours' expressions and epilogues
)
STAGES = ("jaxpr", "graph", *(name for name, _ in GRAPH_PASSES), *QUANTIZE_STAGES,
          "pack",   # depthwise convs that run cheaper packed on the array -> grouped convs (lower.pack)
          "layout", "schedule", "program")
QUANTIZE_MODES = (None, "int8")


class _Dump:
    """dump=True prints every stage; a str/Path writes one file per stage there; a collection
    of stage names prints just those."""

    def __init__(self, dump):
        self.dump = dump
        if isinstance(dump, (str, Path)):
            Path(dump).mkdir(parents=True, exist_ok=True)
        elif dump not in (None, False, True):
            unknown = set(dump) - set(STAGES)
            if unknown:
                raise InputError(f"unknown dump stages {sorted(unknown)}; stages are {STAGES}")

    def __call__(self, stage: str, ir) -> None:
        if self.dump in (None, False):
            return
        text = ir() if inspect.isfunction(ir) else str(ir)
        if isinstance(self.dump, (str, Path)):
            (Path(self.dump) / f"{STAGES.index(stage):02d}-{stage}.txt").write_text(text + "\n")
        elif self.dump is True or stage in self.dump:
            print(f"==== {stage} ====\n{text}")


def trace(model_or_fn, example_args, kwargs=None) -> TracedModel:
    """The frontend: a torch.nn.Module through torch.export, a JAX function through make_jaxpr."""
    if isinstance(model_or_fn, torch.nn.Module):
        return trace_torch(model_or_fn, example_args, kwargs)
    if callable(model_or_fn):
        if kwargs:
            raise InputError("a JAX function is compiled with positional arrays only")
        return trace_jax(model_or_fn, example_args)
    raise InputError(f"compile takes a torch.nn.Module or a JAX function, not {type(model_or_fn).__name__}")


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector paused: compiling (or a first simulation) allocates millions
    of long-lived objects (graph nodes, instructions and their operands, the walk's and the plan's
    tables) and frees no cycle a later stage needs, so the full collections their allocation count
    triggers are pure cost (a quarter of BERT-base's lowering time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compile(model_or_fn, example_args, hw: HardwareConfig | None = None, dump=None,  # noqa: A001
            fuse: bool = True, mappings: dict | None = None, kwargs: dict | None = None,
            tune=None, objective: str = "latency", quantize: str | None = None, calibration=None,
            percentile: float | None = None) -> Program:
    """Compile a PyTorch model (called with `example_args` and `kwargs`) or a JAX function for the
    accelerator; `stagec.simulate` then takes and returns the model's own input and output structure.

    `fuse=False` skips the fusion passes (every elementwise op then round-trips through DRAM),
    to measure what fusion saves.  `mappings` ({layer name: lower.schedule.TileMapping}) replaces
    the default mapper's choice for those layers (the names are the schedule dump's).
    `tune="gradient"` maps the other layers with stagec.tune (cost model, optax) for `objective`;
    a stagec.TuneSettings instead of "gradient" does so with those settings.

    `quantize="int8"` quantizes after training (lower.quantize): int8 weights per output channel,
    int8 activations per tensor with ranges from `calibration` (a list of batches, each a tuple of
    the model's positional inputs or a dict of its keyword inputs; default: the example inputs
    alone), the largest |x| seen or, with `percentile` (e.g. 99.99), that percentile of |x|.

    >>> import torch, stagec
    >>> program = stagec.compile(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
    >>> program.outputs[0].shape
    (2, 4)
    """
    hw = hw or HardwareConfig()
    if not isinstance(hw, HardwareConfig):
        raise InputError(f"hw must be a HardwareConfig, not {type(hw).__name__}")
    if tune is not None and quantize is not None:
        raise InputError("tune with quantize: the cost model (stagec.costmodel) models fp32 layers only; "
                         "tune the fp32 model or pass int8 mappings=")
    out = _Dump(dump)
    with paused_gc():
        traced, graph = build_graph(model_or_fn, example_args, kwargs=kwargs, fuse=fuse, quantize=quantize,
                                    calibration=calibration, percentile=percentile, out=out)
    closed = traced.closed
    graph = pack_depthwise(graph, hw, keep=frozenset(mappings or ()))
    out("pack", graph)
    if tune is not None:   # with the collector on: a long optimization, whose JAX tracing makes cycles
        from .tuning import DEFAULT_SETTINGS, TuneSettings, tune_graph
        if tune != "gradient" and not isinstance(tune, TuneSettings):
            raise InputError(f"unknown tune={tune!r}; expected None, 'gradient' or a stagec.TuneSettings")
        settings = tune if isinstance(tune, TuneSettings) else DEFAULT_SETTINGS
        mappings = {**tune_graph(graph, hw, objective, settings).mappings, **(mappings or {})}
    with paused_gc():
        layout = assign_layout(graph)
        out("layout", layout)
        schedule = make_schedule(graph, hw, mappings)
        out("schedule", schedule)
        name = type(model_or_fn).__name__ if isinstance(model_or_fn, torch.nn.Module) else getattr(
            model_or_fn, "__name__", "function")
        meta = {"model": name, "in_tree": traced.in_tree, "out_tree": traced.out_tree, "note": traced.note,
                "in_dtypes": [str(v.aval.dtype) for v in closed.jaxpr.invars],
                "out_dtypes": [str(v.aval.dtype) for v in closed.jaxpr.outvars], "quantize": quantize}
        program = lower_to_program(graph, layout, schedule, hw, meta)
        out("program", lambda: disassemble(program))
        verify(program)   # cached: the token-inserting walk verified the program
    return program


def build_graph(model_or_fn, example_args, *, kwargs=None, fuse: bool = True, quantize: str | None = None,
                calibration=None, percentile: float | None = None, out: _Dump | None = None):
    """(traced model, graph) after the graph passes (and quantization): what the later stages lower;
    the int8 reference (stagec.int8_reference) evaluates the same graph."""
    if quantize not in QUANTIZE_MODES:
        raise InputError(f"quantize must be one of {QUANTIZE_MODES}, not {quantize!r}")
    if quantize is None and (calibration is not None or percentile is not None):
        raise InputError("calibration and percentile need quantize='int8'")
    out = out or _Dump(None)
    traced = trace(model_or_fn, example_args, kwargs)
    if traced.note:
        warnings.warn(traced.note, stacklevel=3)
    out("jaxpr", traced.closed)
    graph = canonicalize(traced.closed)
    out("graph", graph)
    for name, run in GRAPH_PASSES:
        if fuse or name not in FUSION_PASSES:
            graph = run(graph)
        out(name, graph)
    if quantize:
        batches = [(tuple(example_args), kwargs or {})] if calibration is None else calibration
        graph = _quantize(graph, traced, batches, percentile, fuse, out)
    return traced, graph


def _quantize(graph, traced: TracedModel, calibration, percentile, fuse: bool, out):
    """The QUANTIZE_STAGES: calibrate on the model's own inputs, quantize, fuse the boundaries."""
    if not isinstance(calibration, (list, tuple)) or not calibration:
        got = f"an empty {type(calibration).__name__}" if isinstance(calibration, (list, tuple)) else \
            f"a {type(calibration).__name__}"
        raise InputError(f"calibration must be a non-empty list of batches (each the model's inputs); got {got}")
    batches = []
    for i, batch in enumerate(calibration):
        args, kwargs = batch if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], dict) else (
            ((), batch) if isinstance(batch, dict) else (batch, None))
        try:
            batches.append(flatten_inputs(traced, args, kwargs))
        except (TypeError, ValueError) as e:
            raise InputError(f"calibration batch {i}: {e}") from e
    amax = calibrate(graph, batches, percentile)
    out("calibrate", lambda: "\n".join(f"%{vid}: amax {a:.6g}" for vid, a in sorted(amax.items())))
    graph, params = quantize_graph(graph, amax)
    out("quantize", lambda: f"{graph}\n{params}")
    if fuse:
        graph = fuse_epilogues(fuse_elementwise(graph))
    out("fuse_quantized", graph)
    return graph
