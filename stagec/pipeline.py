"""The compiler's pipeline: one list of named stages, walked top to bottom.

Each stage takes the Compilation so far and returns it with its own product; its name is what
`compile(..., dump=...)` prints it as.  A new pass is one function and one entry in PIPELINE (or
in a copy of it, given to `compile(..., stages=...)`):

    >>> import torch, stagec
    >>> from stagec.pipeline import PIPELINE, GraphPass, Stage, position
    >>> def count_nodes(graph):                         # a Graph -> Graph pass
    ...     print(len(graph.nodes), "nodes")
    ...     return graph
    >>> stages = list(PIPELINE)
    >>> stages.insert(position("fold_affine") + 1, Stage("count_nodes", GraphPass(count_nodes)))
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    >>> program = stagec.compile(model, (torch.randn(2, 8),), stages=stages)   # bias and ReLU fused
    1 nodes

`compile` walks all of PIPELINE; `build_graph` (what the tuner, codesign and the int8 reference
take) walks it up to `pack`, and `lower_graph` from `pack` on.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import torch

from stagec.errors import AccuracyWarning, InputError, PrecisionWarning
from stagec.frontend import TracedModel, flatten_inputs, trace_model
from stagec.isa import HardwareConfig, Program, disassemble, verify
from stagec.lower.codegen.lowering import lower_to_program
from stagec.lower.graph.activations import split_activations
from stagec.lower.graph.bfloat16 import to_bfloat16
from stagec.lower.graph.calibrate import calibrate, channel_ranges
from stagec.lower.graph.canonicalize import canonicalize
from stagec.lower.graph.clamp import fold_clamps
from stagec.lower.graph.graph_ir import Graph, check_graph
from stagec.lower.graph.hoist_affine import hoist_affine
from stagec.lower.graph.integer_ops import integer_op_set
from stagec.lower.graph.mixed_precision import (
    DEFAULT_FALLBACK,
    FALLBACKS,
    LayerPrecision,
    choose,
    layer_precisions,
    pin_layers,
    unquantized_pins,
)
from stagec.lower.graph.passes import (
    dce,
    defer_row_scale,
    fold_affine,
    fold_pads,
    fuse_elementwise,
    fuse_epilogues,
    sink_reshapes,
)
from stagec.lower.graph.quantize import QuantParams, split_residuals
from stagec.lower.graph.quantize import quantize as quantize_graph
from stagec.lower.graph.scale_weights import scale_weights
from stagec.lower.schedule.layout import Layout, assign_layout
from stagec.lower.schedule.mapper import Schedule, make_schedule
from stagec.lower.schedule.pack import pack_depthwise
from stagec.progress import bar

QUANTIZE_MODES = (None, "int8", "bf16")
ACTIVATION_RANGES = (None, "tensor", "channel")
_PACKAGE = str(Path(__file__).parent)


@dataclass(frozen=True)
class Request:
    """What to compile, for which hardware and how: compile's arguments, checked.  `model` is None
    when the pipeline starts from a graph (lower_graph)."""

    model: object                            # a torch.nn.Module or a JAX function
    args: tuple = ()
    kwargs: dict | None = None
    hw: HardwareConfig = field(default_factory=HardwareConfig)
    fuse: bool = True                        # False: the fusion passes leave the graph as it is
    quantize: str | None = None              # None (fp32), "int8" or "bf16"
    calibration: Sequence | None = None      # int8: batches of the model's inputs; None: the example inputs
    percentile: float | None = None          # int8: the percentile of |x| that is its range; None: max |x|
    # layer name -> TileMapping: the caller's, kept as given (not packed, not tuned)
    mappings: Mapping = field(default_factory=lambda: MappingProxyType({}))
    tuner: Callable | None = None            # (graph, hw) -> a stagec.Tuning, for the layers not in `mappings`
    objective: str = "edp"                   # what the default mapper minimizes (mapper.OBJECTIVES)
    fallback: str | None = None              # int8: the float islands' type, "bf16" or "fp32" (None: the default)
    layer_precision: Mapping | None = None   # int8: layer name -> "int8", "bf16" or "fp32"
    accuracy_target: float | None = None     # int8: the cosine against the float graph to keep layers bf16 for
    int8_scores: bool | None = None          # int8: attention scores int8 in DRAM (None: yes; lower.graph.quantize)
    integer_ops: object = None               # int8: ops run integer-only (lower.graph.integer_ops.integer_op_set)
    activation_ranges: str | None = None     # int8: "tensor" (the default) or "channel" (integer layer norms' inputs)
    fuse_layers: bool = True                 # False: no cascades, every layer's result goes to DRAM

    def __post_init__(self):
        if not isinstance(self.hw, HardwareConfig):
            raise InputError(f"hw must be a HardwareConfig, not {type(self.hw).__name__}")
        if self.quantize not in QUANTIZE_MODES:
            raise InputError(f"quantize must be one of {QUANTIZE_MODES}, not {self.quantize!r}")
        if self.quantize != "int8" and (self.calibration is not None or self.percentile is not None):
            raise InputError("calibration and percentile need quantize='int8'")
        if self.calibration is not None and (not isinstance(self.calibration, (list, tuple)) or not self.calibration):
            got = f"an empty {type(self.calibration).__name__}" if isinstance(self.calibration, (list, tuple)) \
                else f"a {type(self.calibration).__name__}"
            raise InputError(f"calibration must be a non-empty list of batches (each the model's inputs); got {got}")
        self._check_mixed_precision()

    def _check_mixed_precision(self):
        given = [k for k in ("fallback", "layer_precision", "accuracy_target", "int8_scores", "integer_ops",
                             "activation_ranges")
                 if getattr(self, k) is not None]
        if given and self.quantize != "int8":
            raise InputError(f"{', '.join(given)} need quantize='int8'")
        if self.int8_scores not in (None, True, False):
            raise InputError(f"int8_scores must be True or False, not {self.int8_scores!r}")
        if self.fallback is not None and self.fallback not in FALLBACKS:
            raise InputError(f"fallback must be one of {FALLBACKS}, not {self.fallback!r}")
        if self.layer_precision is not None and not isinstance(self.layer_precision, Mapping):
            raise InputError(f"layer_precision must be a dict of layer name -> precision, not "
                             f"{type(self.layer_precision).__name__}")
        integer = integer_op_set(self.integer_ops)
        if self.activation_ranges not in ACTIVATION_RANGES:
            raise InputError(f"activation_ranges must be one of {ACTIVATION_RANGES}, not {self.activation_ranges!r}")
        if self.activation_ranges == "channel" and "layer_norm" not in integer:
            raise InputError("activation_ranges='channel' gives integer layer norms' inputs per-channel ranges: "
                             "it needs 'layer_norm' in integer_ops")
        target = self.accuracy_target
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                                   or not 0 < target <= 1):
            raise InputError(f"accuracy_target must be a cosine similarity in (0, 1], not {target!r}")


@dataclass(frozen=True)
class Compilation:
    """What the stages pass along: the request, then each stage's product (None before it runs)."""

    request: Request
    traced: TracedModel | None = None        # jaxpr
    graph: Graph | None = None               # graph, its passes, the int8 stages, pack
    amax: Mapping | None = None              # calibrate: value id -> range
    channel_amax: Mapping | None = None      # calibrate (activation_ranges="channel"): value id -> range per channel
    precision: LayerPrecision | None = None  # precision: what int8 keeps float, and in which type
    quantization: QuantParams | None = None  # quantize
    tuning: object = None                    # tune: a stagec.Tuning (its .mappings)
    layout: Layout | None = None
    schedule: Schedule | None = None
    program: Program | None = None


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline."""

    name: str                                      # dump= and the dump folder's files call it this
    run: Callable[[Compilation], Compilation]
    show: Callable[[Compilation], object] = lambda c: c.graph   # what the dump prints
    when: Callable[[Request], bool] | None = None  # False: skipped, and not dumped
    collects: bool = False                         # runs with the garbage collector on (see garbage_collection)


@dataclass(frozen=True)
class GraphPass:
    """A Graph -> Graph function as a stage's run; a fusion pass is skipped under fuse=False."""

    fn: Callable[[Graph], Graph]
    fusion: bool = False

    def __call__(self, c: Compilation) -> Compilation:
        return c if self.fusion and not c.request.fuse else replace(c, graph=self.fn(c.graph))


def _trace(c: Compilation) -> Compilation:
    """The frontend (frontend.trace_model): a torch.nn.Module, a saved torch.export program or a JAX function."""
    traced = trace_model(c.request.model, c.request.args, c.request.kwargs)
    if traced.note:
        warnings.warn(traced.note, stacklevel=_outside_stagec())
    return replace(c, traced=traced)


def _outside_stagec() -> int:
    """The stacklevel, for a warning its caller issues, of the innermost frame outside stagec/: the
    warning then names the user's line, whichever of compile, build_graph or tune was called."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _calibration_batches(c: Compilation) -> list:
    """The calibration batches, flattened as the traced model takes them."""
    request = c.request
    given = request.calibration or [(tuple(request.args), request.kwargs or {})]
    batches = []
    for i, batch in enumerate(given):
        args, kwargs = batch if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], dict) else (
            ((), batch) if isinstance(batch, dict) else (batch, None))
        try:
            batches.append(flatten_inputs(c.traced, args, kwargs))
        except (TypeError, ValueError) as e:
            raise InputError(f"calibration batch {i}: {e}") from e
    return batches


def _calibrate(c: Compilation) -> Compilation:
    """Every fp32 value's range over the calibration batches (per channel too, for activation_ranges="channel")."""
    batches = _calibration_batches(c)
    channels = channel_ranges(c.graph, batches) if c.request.activation_ranges == "channel" else {}
    return replace(c, amax=MappingProxyType(calibrate(c.graph, batches, c.request.percentile)),
                   channel_amax=MappingProxyType(channels))


def _precision(c: Compilation) -> Compilation:
    """The caller's pinned layers, and with accuracy_target the layers kept bf16 to meet it: each
    candidate mix is compiled by this pipeline's own stages from quantize to bf16 and evaluated."""
    r = c.request
    precision = pin_layers(c.graph, r.layer_precision or {}, r.fallback or DEFAULT_FALLBACK)
    if r.accuracy_target is not None:
        stages = PIPELINE[position("quantize"):position("bf16") + 1]
        precision = choose(c.graph, _calibration_batches(c), lambda p: run(stages, replace(c, precision=p)).graph,
                           precision, r.accuracy_target)
        if precision.cosine < r.accuracy_target:
            warnings.warn(f"accuracy_target={r.accuracy_target}: the best mix found reaches cosine "
                          f"{precision.cosine:.6f} (with {len(precision.chosen)} layers bf16); compiling it",
                          AccuracyWarning, stacklevel=_outside_stagec())
    return replace(c, precision=precision)


def _quantize(c: Compilation) -> Compilation:
    graph, params = quantize_graph(c.graph, dict(c.amax), c.precision.float_layers(c.graph),
                                   c.request.int8_scores is not False, integer_op_set(c.request.integer_ops),
                                   dict(c.channel_amax or {}))
    missed = unquantized_pins(c.precision, c.graph, graph)
    if missed:
        warnings.warn(f"layer_precision pins {', '.join(missed)} int8, but stagec has no int8 kernel for "
                      f"{'it' if len(missed) == 1 else 'them'}: {c.precision.fallback} instead",
                      PrecisionWarning, stacklevel=_outside_stagec())
    return replace(c, graph=graph, quantization=params)


def _bf16(c: Compilation) -> Compilation:
    """quantize="bf16": the whole graph bf16; "int8": its float islands, as c.precision says."""
    if c.request.quantize == "bf16":
        return replace(c, graph=to_bfloat16(c.graph))
    return replace(c, graph=to_bfloat16(c.graph, c.precision.keeps_fp32)) if c.precision.has_bf16() else c


def _pack(c: Compilation) -> Compilation:
    r = c.request
    fuse = r.objective if r.fuse_layers and r.objective != "size" else None   # as make_schedule's cascades
    return replace(c, graph=pack_depthwise(c.graph, r.hw, keep=frozenset(r.mappings), fuse=fuse))


def _tune(c: Compilation) -> Compilation:
    return replace(c, tuning=c.request.tuner(c.graph, c.request.hw))


def _schedule(c: Compilation) -> Compilation:
    """A tiling per layer: the caller's, else the tuner's, else the default mapper's."""
    mappings = {**(c.tuning.mappings if c.tuning is not None else {}), **c.request.mappings}
    return replace(c, schedule=make_schedule(c.graph, c.layout, c.request.hw, mappings, c.request.objective,
                                                    c.request.fuse_layers))


def _lower(c: Compilation) -> Compilation:
    program = lower_to_program(c.graph, c.layout, c.schedule, c.request.hw, _metadata(c))
    verify(program)   # cached: the token-inserting walk verified the program
    return replace(c, program=program)


def _metadata(c: Compilation) -> dict | None:
    """What a program records of the model it came from (None for a graph alone)."""
    traced, model = c.traced, c.request.model
    if traced is None:
        return None
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "function")
    return {"model": name, "in_tree": traced.in_tree, "out_tree": traced.out_tree, "note": traced.note,
            "in_dtypes": [str(v.aval.dtype) for v in traced.closed.jaxpr.invars],
            "out_dtypes": [str(v.aval.dtype) for v in traced.closed.jaxpr.outvars], "quantize": c.request.quantize,
            "layer_precision": layer_precisions(c.graph),
            **({"mixed_precision": c.precision.to_dict()} if c.precision is not None else {})}


def _softmax_stays(request: Request) -> bool:
    """Whether softmax stays softmax: an integer softmax normalizes before P @ V (deferring it would
    leave nothing to find)."""
    return "softmax" not in integer_op_set(request.integer_ops)


def _quantizing(request: Request) -> bool:
    return request.quantize == "int8"


def _amax_table(c: Compilation) -> str:
    return "\n".join(f"%{vid}: amax {a:.6g}" for vid, a in sorted(c.amax.items()))


PIPELINE: tuple[Stage, ...] = (
    # the frontend: torch.export (a JAX function: make_jaxpr) -> ClosedJaxpr
    Stage("jaxpr", _trace, show=lambda c: c.traced.closed),
    # jaxpr -> graph IR (lower.graph.canonicalize)
    Stage("graph", lambda c: replace(c, graph=canonicalize(c.traced.closed))),
    # drop what no output needs
    Stage("dce", GraphPass(dce)),
    # a zero pad of a conv's rows and columns -> the conv's padding
    Stage("fold_pads", GraphPass(fold_pads, fusion=True)),
    # scalar elementwise ops before a reshape -> after it, to fuse
    Stage("sink_reshapes", GraphPass(sink_reshapes, fusion=True)),
    # elementwise chains -> one node; one that reads a reshape alone (a GELU reads its input several times, so
    # its pieces could not sink one by one) then sinks before it, to fuse into the reshaped value's producer
    Stage("fuse_elementwise", GraphPass(lambda g: sink_reshapes(fuse_elementwise(g)), fusion=True)),
    # matmul(x * row scale, b) -> matmul(x, b) * row scale
    Stage("defer_row_scale", GraphPass(defer_row_scale, fusion=True), when=_softmax_stays),
    # bias/activation/residual -> the conv/matmul's accumulator tile
    Stage("fuse_epilogues", GraphPass(fuse_epilogues, fusion=True)),
    # a per-channel scale and shift of another conv/matmul's result -> that layer's epilogue, to fold
    Stage("hoist_affine", GraphPass(hoist_affine, fusion=True)),
    # per-channel scale and shift (batch norm) -> weights and bias
    Stage("fold_affine", GraphPass(fold_affine)),
    # layers fused: a run-time per-channel scale of a 1x1 conv's input (squeeze-excite) -> its weights, where
    # they are smaller (the scaled input never goes to DRAM; int8: requantized per output channel)
    Stage("scale_weights", GraphPass(scale_weights, fusion=True), when=lambda r: r.fuse_layers),
    # int8: residual adds out of conv/matmul epilogues, so the conv's own result is calibrated
    Stage("split_residuals", GraphPass(split_residuals), when=_quantizing),
    # int8: a conv/matmul's activation function (not a clamp) -> an elementwise node, calibrated apart
    Stage("split_activations", GraphPass(split_activations), when=_quantizing),
    # int8: every fp32 value's range over the calibration batches
    Stage("calibrate", _calibrate, show=_amax_table, when=_quantizing),
    # int8: the layers kept float (layer_precision=, accuracy_target=) and the islands' type (fallback=)
    Stage("precision", _precision, show=lambda c: c.precision, when=_quantizing),
    # int8: int8 CONV/MATMUL, QUANTIZE/DEQUANTIZE at the fp32 islands' boundaries
    Stage("quantize", _quantize, show=lambda c: f"{c.graph}\n{c.quantization}", when=_quantizing),
    # int8: the boundaries -> their neighbours' expressions and epilogues
    Stage("fuse_quantized", GraphPass(lambda g: fuse_epilogues(fuse_elementwise(g)), fusion=True), when=_quantizing),
    # bf16: activations and weights bf16 in DRAM, inputs and outputs as the model has them (int8: the islands')
    Stage("bf16", _bf16, when=lambda r: r.quantize in ("int8", "bf16")),
    # float32 and bf16: a conv/matmul's bias add and ReLU/ReLU6/hardtanh -> one clamp step (isa CLAMP)
    Stage("fold_clamps", GraphPass(fold_clamps, fusion=True), when=lambda r: r.quantize in (None, "bf16")),
    # depthwise convs that run cheaper packed on the array -> grouped convs (lower.schedule.pack)
    Stage("pack", _pack),
    # tune=: mappings by gradient on the cost model (stagec.tune), with the collector on
    Stage("tune", _tune, show=lambda c: c.tuning, when=lambda r: r.tuner is not None, collects=True),
    # buffer layouts (NHWC for activations)
    Stage("layout", lambda c: replace(c, layout=assign_layout(c.graph)), show=lambda c: c.layout),
    # every layer's tiling, vector ops' too: the caller's, the tuner's, else the default mapper's
    Stage("schedule", _schedule, show=lambda c: c.schedule),
    # instructions, DRAM layout, constants (verified)
    Stage("program", _lower, show=lambda c: disassemble(c.program)),
)


def position(name: str, stages: Sequence[Stage] = PIPELINE) -> int:
    """Where the stage called `name` is in `stages`."""
    names = [s.name for s in stages]
    if name not in names:
        raise InputError(f"no stage {name!r}; stages are {names}")
    return names.index(name)


class Dump:
    """dump=True prints every stage; a stage's name prints that one, a collection of names just those;
    a Path or any other str (a folder) writes one file per stage there."""

    def __init__(self, dump, stages: Sequence[Stage]):
        self.names = [s.name for s in stages]
        # NOTE: dump="schedule" meaning a folder called schedule surprised even us: a name is a stage.
        self.dump = (dump,) if isinstance(dump, str) and dump in self.names else dump
        if isinstance(self.dump, (str, Path)):
            Path(dump).mkdir(parents=True, exist_ok=True)
        elif self.dump not in (None, False, True):
            unknown = set(self.dump) - set(self.names)
            if unknown:
                raise InputError(f"unknown dump stages {sorted(unknown)}; stages are {tuple(self.names)}")

    def __call__(self, stage: Stage, c: Compilation) -> None:
        if self.dump in (None, False):
            return
        if isinstance(self.dump, (str, Path)):
            (Path(self.dump) / f"{self.names.index(stage.name):02d}-{stage.name}.txt").write_text(f"{stage.show(c)}\n")
        elif self.dump is True or stage.name in self.dump:
            print(f"==== {stage.name} ====\n{stage.show(c)}")


@contextlib.contextmanager
def garbage_collection(enabled: bool):
    """Python's cyclic garbage collector on or off within, as it was after.  Off while compiling
    (or a first simulation): they allocate millions of long-lived objects (graph nodes,
    instructions and their operands, the walk's and the plan's tables) and free no cycle a later
    stage needs, so the full collections their allocation count triggers are pure cost (a quarter
    of BERT-base's lowering time).  On for a long optimization, whose JAX tracing makes cycles."""
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def run(stages: Sequence[Stage], c: Compilation, dump=None, progress: bool = False) -> Compilation:
    """`c` through each of `stages` that applies to its request, each dumped as `dump` asks; with
    `progress`, a bar over the stages (stagec.progress: on a terminal only)."""
    out = Dump(dump, stages)
    with garbage_collection(False), bar(total=len(stages), desc="compile", enabled=progress) as shown:
        for stage in stages:
            shown.set_postfix_str(stage.name)
            if stage.when is None or stage.when(c.request):
                graph = c.graph
                with garbage_collection(stage.collects):
                    c = stage.run(c)
                if c.graph is not graph and c.graph is not None:
                    check_graph(c.graph, stage.name)
                out(stage, c)
            shown.update()
    return c


def build_graph(model_or_fn, example_args, *, kwargs=None, **options) -> tuple[TracedModel, Graph]:
    """(traced model, graph) after the graph passes and quantization (the stages before `pack`;
    `options` are compile's fuse/quantize/calibration/percentile): what the tuner and codesign map,
    and what the int8 reference (stagec.int8_reference) evaluates."""
    c = run(PIPELINE[:position("pack")], Compilation(Request(model_or_fn, example_args, kwargs, **options)))
    return c.traced, c.graph


def lower_graph(graph: Graph, hw: HardwareConfig, mappings: Mapping | None = None, objective: str = "edp") -> Program:
    """A graph's program: the stages from `pack` on (layers named in `mappings` mapped so, checked to
    fit; the rest by the default mapper for `objective`)."""
    request = Request(None, hw=hw, mappings=MappingProxyType(dict(mappings or {})), objective=objective)
    return run(PIPELINE[position("pack"):], Compilation(request, graph=graph)).program
