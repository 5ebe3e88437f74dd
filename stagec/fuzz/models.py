"""A random model grammar: a seed -> a frozen, printable model spec -> a torch.nn.Module with weights.

A spec is a chain of layers over one tensor, whose rank says what it is: an image (N, C, H, W), a
sequence (N, T, D) or a flat vector (N, F).  Each layer kind is one rule in `RULES`: which ranks it
applies to, how to draw its parameters (`draw(rng, shape, keep)`, None where it cannot apply) and
how to build it (`build(shape, **params)`, an nn.Module).  Composite layers (a residual around a
body, a concat of branches) draw their bodies from the same rules under a `keep` constraint: "all"
(the body keeps the shape) or "spatial" (only the feature dim may change: 1 for images, the last
for sequences and vectors).  A drawn layer's output shape comes from running it on a zero tensor,
so no shape formula is written twice; a layer torch rejects (a kernel larger than its padded
input) is drawn again.  The composites' rules are here, with the table; the other rules' draw and
build functions are stagec.fuzz.leaf_rules', the nn.Modules torch lacks stagec.fuzz.blocks', the
spec's data (Layer, ModelSpec) stagec.fuzz.spec's.

    >>> spec = generate_model(7)
    >>> model, (x,) = build_model(spec)
    >>> print(spec)  # doctest: +SKIP
    input (1, 4, 9, 11)
      conv(out=6, kernel=(3, 3), stride=2, padding=1, dilation=1, groups=2, bias=True)  -> (1, 6, 5, 6)
      ...
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import leaf_rules as leaf
from .blocks import BINARY, Affine, Apply, Combine, Concat, Residual
from .spec import Layer, ModelSpec, Shape, feature_dim

MAX_ELEMENTS = 12288   # per tensor (batch included)
DRAWS_PER_LAYER = 20


# --- the rules ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    ranks: tuple[int, ...]
    weight: float
    draw: Callable      # (rng, shape, keep) -> dict of params, or None where the rule cannot apply
    build: Callable     # (shape, **params) -> nn.Module


# the composites: bodies drawn from the same rules under a `keep` constraint

def _draw_residual(rng, shape, keep):
    body = draw_chain(rng, shape, rng.randint(1, 3), "all")
    return dict(body=body) if body else None


def _build_residual(shape, body):
    return Residual(build_chain(shape, body))


def _draw_concat(rng, shape, keep):
    if keep == "all":
        return None
    branches = [() if rng.random() < 0.25 else draw_chain(rng, shape, rng.randint(1, 2), "spatial")
                for _ in range(rng.randint(2, 3))]
    return dict(branches=tuple(branches))


def _build_concat(shape, branches):
    return Concat([build_chain(shape, b) for b in branches], feature_dim(shape))


def _draw_combine(rng, shape, keep):
    a, b = (() if rng.random() < 0.3 else draw_chain(rng, shape, rng.randint(1, 2), "all") for _ in range(2))
    return dict(op=rng.choice(sorted(BINARY)), a=a, b=b) if a or b else None


def _build_combine(shape, op, a, b):
    return Combine(build_chain(shape, a), build_chain(shape, b), op)


RULES: dict[str, Rule] = {
    "conv": Rule((4,), 6.0, leaf.draw_conv, leaf.build_conv),
    "conv1d": Rule((3,), 1.0, leaf.draw_conv1d, leaf.build_conv1d),
    "pad": Rule((4,), 1.0, leaf.draw_pad, lambda shape, pad, value: Apply(F.pad, pad=pad, value=value)),
    "linear": Rule((2, 3, 4), 2.0, leaf.draw_linear, lambda shape, out, bias: nn.Linear(shape[-1], out, bias)),
    "batch_norm": Rule((2, 3, 4), 1.0, leaf.draw_norm, leaf.build_batch_norm),
    "group_norm": Rule((3, 4), 0.5, leaf.draw_group_norm,
                       lambda shape, groups, affine: nn.GroupNorm(groups, shape[1], affine=affine)),
    "layer_norm": Rule((2, 3, 4), 1.0, leaf.draw_layer_norm, leaf.build_layer_norm),
    "activation": Rule((2, 3, 4), 4.0, leaf.draw_activation, lambda shape, fn: leaf.ACTIVATIONS[fn]()),
    "max_pool": Rule((4,), 1.0, leaf.draw_pool, leaf.build_max_pool),
    "avg_pool": Rule((4,), 1.0, leaf.draw_avg_pool, leaf.build_avg_pool),
    "adaptive_avg_pool": Rule((4,), 0.5, leaf.draw_adaptive, lambda shape, size: nn.AdaptiveAvgPool2d(size)),
    "adaptive_max_pool": Rule((4,), 0.5, leaf.draw_adaptive, lambda shape, size: nn.AdaptiveMaxPool2d(size)),
    "upsample": Rule((4,), 0.7, leaf.draw_upsample, lambda shape, **params: nn.Upsample(**params)),
    "slice": Rule((2, 3, 4), 0.7, leaf.draw_slice, leaf.build_slice),
    "reduce": Rule((2, 3, 4), 0.5, leaf.draw_reduce, leaf.build_reduce),
    "softmax": Rule((2, 3, 4), 0.7, leaf.draw_softmax, leaf.build_softmax),
    "flatten": Rule((4,), 0.3, leaf.draw_flatten, leaf.build_flatten),
    "permute": Rule((3, 4), 0.5, leaf.draw_permute, leaf.build_permute),
    "reshape": Rule((2, 3, 4), 0.5, leaf.draw_reshape, lambda shape, to: Apply(torch.reshape, shape=to)),
    "to_sequence": Rule((4,), 0.5, leaf.draw_to_sequence, leaf.build_to_sequence),
    "attention": Rule((3,), 2.0, leaf.draw_attention, leaf.build_attention),
    "affine": Rule((2, 3, 4), 0.5, leaf.draw_affine, lambda shape: Affine(shape)),
    "residual": Rule((2, 3, 4), 1.5, _draw_residual, _build_residual),
    "concat": Rule((2, 3, 4), 1.0, _draw_concat, _build_concat),
    "combine": Rule((2, 3, 4), 0.7, _draw_combine, _build_combine),
    "gate": Rule((2, 3, 4), 0.5, leaf.draw_gate, leaf.build_gate),
}


# --- drawing a model ----------------------------------------------------------------------------

def draw_chain(rng: random.Random, shape: Shape, count: int, keep: str | None) -> tuple[Layer, ...]:
    """Up to `count` layers from `shape`, each keeping `keep` (None, "spatial" or "all")."""
    layers: list[Layer] = []
    for _ in range(count):
        drawn = _draw_layer(rng, shape, keep, layers[-1].kind if layers else None)
        if drawn is None:
            break
        layers.append(drawn[0])
        shape = drawn[1]
    return tuple(layers)


def _draw_layer(rng, shape, keep, previous) -> tuple[Layer, Shape] | None:
    kinds = [k for k, r in RULES.items() if len(shape) in r.ranks]
    weights = [RULES[k].weight for k in kinds]
    for _ in range(DRAWS_PER_LAYER):
        # a pad most often feeds a conv: the pair is how a model writes asymmetric padding
        kind = "conv" if previous == "pad" and rng.random() < 0.7 else rng.choices(kinds, weights)[0]
        params = RULES[kind].draw(rng, shape, keep)
        if params is None:
            continue
        layer = Layer(kind, tuple(params.items()))
        out = output_shape(layer, shape)
        if out is not None and _fits(out) and _keeps(shape, out, keep):
            return layer, out
    return None


def output_shape(layer: Layer, shape: Shape) -> Shape | None:
    """The layer's output shape on an input of `shape`, None where torch rejects the combination."""
    try:
        with torch.no_grad(), torch.device("meta"):
            return tuple(build_layer(layer, shape)(torch.zeros(shape)).shape)
    except (RuntimeError, ValueError):   # a kernel over its padded input, groups that do not divide...
        return None


def _fits(shape: Shape) -> bool:
    return min(shape) >= 1 and math.prod(shape) <= MAX_ELEMENTS and len(shape) in (2, 3, 4)


def _keeps(shape: Shape, out: Shape, keep: str | None) -> bool:
    if keep == "all":
        return out == shape
    if keep == "spatial":
        f = feature_dim(shape)
        return len(out) == len(shape) and all(a == b for i, (a, b) in enumerate(zip(shape, out, strict=True)) if i != f)
    return True


def _input_shape(rng: random.Random) -> Shape:
    n = rng.choice([1, 1, 1, 2])
    rank = rng.choices([4, 3, 2], [6, 3, 1])[0]
    if rank == 4:
        return n, rng.choice([1, 2, 3, 4, 8, 16]), rng.randint(1, 16), rng.randint(1, 16)
    if rank == 3:
        return n, rng.randint(1, 12), leaf.draw_features(rng)
    return n, leaf.draw_features(rng)


def generate_model(seed: int, max_layers: int = 8) -> ModelSpec:
    """The model of `seed`: 1 to `max_layers` layers (composites count once) over a random input."""
    rng = random.Random(seed)
    shape = _input_shape(rng)
    return model_spec(seed, shape, draw_chain(rng, shape, rng.randint(1, max_layers), None))


def model_spec(seed: int, input_shape: Shape, layers: tuple[Layer, ...]) -> ModelSpec | None:
    """The spec of these layers over `input_shape`; None where one does not build on its input."""
    shapes, shape = [], input_shape
    for layer in layers:
        shape = output_shape(layer, shape)
        if shape is None:
            return None
        shapes.append(shape)
    return ModelSpec(seed, input_shape, layers, tuple(shapes))


# --- building it --------------------------------------------------------------------------------

def build_layer(layer: Layer, shape: Shape) -> nn.Module:
    return RULES[layer.kind].build(shape, **dict(layer.params))


def build_chain(shape: Shape, layers: tuple[Layer, ...]) -> nn.Sequential:
    modules = []
    with torch.no_grad():
        x = torch.zeros(shape)
        for layer in layers:
            modules.append(build_layer(layer, tuple(x.shape)))
            x = modules[-1](x)
    return nn.Sequential(*modules)


def build_model(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """(model in eval mode, (input,)): weights random from the spec's seed, scaled so every conv and
    linear layer's output has unit RMS on this input and batch norms see statistics like their input's
    (a random deep net otherwise explodes or vanishes, and hides bugs in huge or tiny numbers)."""
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        model = build_chain(spec.input_shape, spec.layers).eval()
        x = torch.randn(spec.input_shape)
        _randomize_affine(model)
        _normalize(model, x)
    return model, (x,)


NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)
SCALED = (nn.Conv1d, nn.Conv2d, nn.Linear)


def _randomize_affine(model: nn.Module) -> None:
    """Norm layers' scale and shift away from (1, 0), so a dropped affine shows."""
    for m in model.modules():
        if isinstance(m, NORMS) and m.weight is not None:
            m.weight.data.uniform_(0.5, 1.5)
        if isinstance(m, NORMS) and m.bias is not None:
            m.bias.data.uniform_(-0.3, 0.3)


def _normalize(model: nn.Module, x: torch.Tensor) -> None:
    hooks = [m.register_forward_hook(_unit_rms) for m in model.modules() if isinstance(m, SCALED)]
    hooks += [m.register_forward_pre_hook(_statistics_like_input) for m in model.modules()
              if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()


def _unit_rms(module, args, out):
    rms = float(out.pow(2).mean().sqrt())
    if rms == 0 or not math.isfinite(rms):
        return None
    module.weight.data /= rms
    if module.bias is not None:
        module.bias.data /= rms
    return out / rms


def _statistics_like_input(module, args):
    """Running mean and variance near the input's own per-channel ones (perturbed, so batch norm
    is not a plain standardization)."""
    (x,) = args
    dims = [d for d in range(x.ndim) if d != 1]
    mean, var = x.mean(dims), x.var(dims, unbiased=False)
    spread = var + 0.1 * x.pow(2).mean() + 1e-3
    module.running_mean.copy_(mean + 0.2 * torch.randn_like(mean) * spread.sqrt())
    module.running_var.copy_(spread * torch.empty_like(spread).uniform_(0.5, 2.0))
