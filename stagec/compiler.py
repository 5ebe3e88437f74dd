"""stagec.compile: a model, through every stage of stagec.pipeline.PIPELINE, to a program."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from types import MappingProxyType

from stagec.errors import InputError
from stagec.isa import HardwareConfig, Program

from .pipeline import PIPELINE, Compilation, Request, Stage, run


def compile(model_or_fn, example_args, hw: HardwareConfig | None = None, dump=None,  # noqa: A001
            fuse: bool = True, mappings: dict | None = None, kwargs: dict | None = None,
            tune=None, objective: str = "edp", quantize: str | None = None, calibration=None,
            percentile: float | None = None, fallback: str | None = None, layer_precision: dict | None = None,
            accuracy_target: float | None = None, int8_scores: bool | None = None, integer_ops=None,
            activation_ranges: str | None = None, stages: Sequence[Stage] = PIPELINE,
            fuse_layers: bool = True) -> Program:
    """Compile a PyTorch model (called with `example_args` and `kwargs`) or a JAX function for the
    accelerator; `stagec.simulate` then takes and returns the model's own input and output structure.

    `dump` prints the IR of the stages it names (a name or a list; all with True; a folder, a Path or a
    str that names no stage: one file per stage).
    `fuse=False` skips the fusion passes (every elementwise op then round-trips through DRAM),
    to measure what fusion saves.  `fuse_layers=False` runs every layer alone, its result through DRAM;
    by default the mapper runs chains of pointwise layers (a feed-forward block's matmuls, 1x1 convs)
    as cascades (lower.schedule.cascade) where that lowers `objective`.
    `mappings` ({layer name: lower.schedule.nest.TileMapping}) replaces
    the default mapper's choice for those layers (the names are the schedule dump's; a vector
    layer of several nests, a pad or a concat, takes one mapping for all or a tuple of one each).
    The default mapper and the tuner minimize `objective`: "latency" (cycles), "energy" (pJ per
    inference: DRAM traffic dominates it) or "edp" (their product, the default: on a power-bound
    device energy counts as much as time), layer by layer.
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
    `int8_scores=False` keeps attention's scores (a product of two activations that softmax, not a
    matmul, takes) float in DRAM, dequantized from the accumulator; by default they are requantized
    to int8 (half the bytes of bf16; no accuracy cost measured on the zoo: lower.graph.quantize).
    `integer_ops` ("all", or names from ("softmax", "layernorm", "gelu")) runs those ops integer-only instead
    of as float islands: I-BERT's integer softmax (polynomial exp, integer division) and layer norm
    (integer Newton square root), and GELU (I-BERT's i-GELU polynomial in place of the 256-entry
    table), int8 in and out, int32 inside (lower.graph.integer_kernels).  `activation_ranges="channel"`
    (with "layernorm" among them) gives an integer layer norm whose input is a float value per-channel
    ranges: FQ-ViT's power-of-two factors, channel c on the grid s * 2**alpha_c, alpha_c in 0..3,
    which the integer kernel shifts onto one grid exactly; it helps when a few channels have far
    larger ranges than the rest (transformers' residual streams).  Other values stay per tensor.
    `quantize="bf16"` holds activations and weights as bfloat16 (lower.graph.bfloat16): half the
    DRAM and scratchpad bytes of fp32, bf16 MACs into float32 accumulators, no calibration.

    `stages` is the pipeline to walk: stagec.pipeline.PIPELINE, or a copy with a pass of one's own.

    >>> import torch, stagec
    >>> program = stagec.compile(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
    >>> program.outputs[0].shape
    (2, 4)
    """
    request = Request(model_or_fn, example_args, kwargs, hw or HardwareConfig(), fuse, quantize, calibration,
                      percentile, MappingProxyType(dict(mappings or {})), _tuner(tune, objective), objective,
                      fallback, layer_precision, accuracy_target, int8_scores, integer_ops, activation_ranges,
                      fuse_layers)
    return run(stages, Compilation(request), dump).program


def _tuner(tune, objective: str):
    """The tune stage's (graph, hw) -> stagec.Tuning, or None."""
    if tune is None:
        return None
    # NOTE: imported here: the cost model and optax load only to tune
    from .tuning import DEFAULT_SETTINGS, TuneSettings, tune_graph
    if tune != "gradient" and not isinstance(tune, TuneSettings):
        raise InputError(f"unknown tune={tune!r}; expected None, 'gradient' or a stagec.TuneSettings")
    settings = tune if isinstance(tune, TuneSettings) else DEFAULT_SETTINGS
    return partial(tune_graph, objective=objective, settings=settings)
