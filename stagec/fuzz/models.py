"""A random model grammar: a seed -> a frozen, printable model spec -> a torch.nn.Module with weights.

A spec is a chain of layers over one tensor, whose rank says what it is: an image (N, C, H, W), a
sequence (N, T, D) or a flat vector (N, F).  Each layer kind is one rule in `RULES`: which ranks it
applies to, how to draw its parameters (`draw(rng, shape, keep)`, None where it cannot apply) and
how to build it (`build(shape, **params)`, an nn.Module).  Composite layers (a residual around a
body, a concat of branches) draw their bodies from the same rules under a `keep` constraint: "all"
(the body keeps the shape) or "spatial" (only the feature dim may change: 1 for images, the last
for sequences and vectors).  A drawn layer's output shape comes from running it on a zero tensor,
so no shape formula is written twice; a layer torch rejects (a kernel larger than its padded
input) is drawn again.

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

MAX_FEATURES = 32      # channels / model width: tiles stay small, cases stay fast
MAX_ELEMENTS = 12288   # per tensor (batch included)
DRAWS_PER_LAYER = 20

Shape = tuple[int, ...]


# --- the spec -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """One layer: a rule's name and its parameters; composite layers hold layers in their parameters."""

    kind: str
    params: tuple[tuple[str, object], ...] = ()

    def insides(self) -> tuple[tuple[Layer, ...], ...]:
        """The chains inside this layer: a residual's body, each of a concat's branches."""
        return tuple(chain for _, value in self.params
                     for chain in ((value,) if _is_chain(value) else value if _is_chains(value) else ()))

    def nested(self) -> tuple[Layer, ...]:
        """The layers inside this one, at every depth."""
        return tuple(x for chain in self.insides() for layer in chain for x in (layer, *layer.nested()))

    def __str__(self) -> str:
        parts = []
        for name, value in self.params:
            if _is_chain(value) or value == ():
                parts.append(f"{name}=[{'; '.join(map(str, value)) or 'identity'}]")
            elif _is_chains(value):
                parts.append(f"{name}=[{' | '.join('; '.join(map(str, c)) or 'identity' for c in value)}]")
            else:
                parts.append(f"{name}={value!r}")
        return f"{self.kind}({', '.join(parts)})"


def _is_chain(value) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(v, Layer) for v in value)


def _is_chains(value) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(v, tuple) and all(
        isinstance(x, Layer) for x in v) for v in value) and not _is_chain(value)


@dataclass(frozen=True)
class ModelSpec:
    """A model of the grammar: its input shape, layers and each layer's output shape."""

    seed: int
    input_shape: Shape
    layers: tuple[Layer, ...]
    shapes: tuple[Shape, ...]

    def kinds(self) -> frozenset[str]:
        """The rules the model uses, composites' insides included."""
        return frozenset(x.kind for layer in self.layers for x in (layer, *layer.nested()))

    def __str__(self) -> str:
        lines = [f"input {self.input_shape}"]
        lines += [f"  {layer}  -> {shape}" for layer, shape in zip(self.layers, self.shapes, strict=True)]
        return "\n".join(lines)


# --- small modules for what torch.nn has no module for --------------------------------------------

class Apply(nn.Module):
    """fn(x, **kwargs): a functional op (F.pad, permute, slicing, softmax...) as a layer."""

    def __init__(self, fn: Callable, **kwargs):
        super().__init__()
        self.fn, self.kwargs = fn, kwargs

    def forward(self, x):
        return self.fn(x, **self.kwargs)


class Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Concat(nn.Module):
    def __init__(self, branches: list[nn.Module], dim: int):
        super().__init__()
        self.branches, self.dim = nn.ModuleList(branches), dim

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], self.dim)


BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum}


class Combine(nn.Module):
    """op(a(x), b(x)): two branches meeting in an elementwise op, b's output broadcast to a's."""

    def __init__(self, a: nn.Module, b: nn.Module, op: str):
        super().__init__()
        self.a, self.b, self.op = a, b, op

    def forward(self, x):
        return BINARY[self.op](self.a(x), self.b(x))


class Affine(nn.Module):
    """x * scale + shift, one of each per feature (the feature dim: 1 for images, the last otherwise)."""

    def __init__(self, shape: Shape):
        super().__init__()
        size = [1] * len(shape)
        size[_feature_dim(shape)] = shape[_feature_dim(shape)]
        self.scale = nn.Parameter(torch.empty(size).uniform_(0.5, 1.5) * torch.randint(0, 2, size).mul(2).sub(1))
        self.shift = nn.Parameter(torch.empty(size).uniform_(-0.5, 0.5))

    def forward(self, x):
        return x * self.scale + self.shift


class Attention(nn.Module):
    """Multi-head self-attention over (N, T, D): projections, q @ k^T / sqrt(d), softmax, @ v
    (or F.scaled_dot_product_attention), heads merged, output projection."""

    def __init__(self, dim: int, heads: int, impl: str, causal: bool, bias: bool):
        super().__init__()
        self.heads, self.impl, self.causal = heads, impl, causal
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim, bias=bias) for _ in range(4))

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = (p(x).reshape(n, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.impl == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            s = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            if self.causal:
                s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            o = s.softmax(-1) @ v
        return self.out(o.transpose(1, 2).reshape(n, t, d))


class Conv1dOverTime(nn.Module):
    """A 1-d convolution of a sequence (N, T, D) over T, D as channels."""

    def __init__(self, **kwargs):
        super().__init__()
        self.conv = nn.Conv1d(**kwargs)

    def forward(self, x):
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


# --- the rules ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    ranks: tuple[int, ...]
    weight: float
    draw: Callable      # (rng, shape, keep) -> dict of params, or None where the rule cannot apply
    build: Callable     # (shape, **params) -> nn.Module


def _feature_dim(shape: Shape) -> int:
    return 1 if len(shape) == 4 else len(shape) - 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factor_pairs(n: int, limit: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in _divisors(n) if d <= limit and n // d <= limit]


def _features(rng: random.Random) -> int:
    return rng.choice([1, 2, 3, 4, 5, 8, 12, 16, 24, 32]) if rng.random() < 0.9 else rng.randint(1, MAX_FEATURES)


def _draw_conv(rng, shape, keep):
    c = shape[1]
    kh = rng.randint(1, 7)
    kw = kh if rng.random() < 0.8 else rng.randint(1, 7)
    dilation = rng.choice([1, 1, 1, 2, 3])
    stride = 1 if keep else rng.choice([1, 1, 2, 3])
    style = rng.choice(["dense", "dense", "grouped", "depthwise"])
    groups = {"dense": 1, "grouped": rng.choice(_divisors(c)), "depthwise": c}[style]
    if keep == "all":
        out = c
    elif style == "depthwise":
        out = c * rng.choice([1, 1, 1, 2])
    else:
        out = groups * max(1, _features(rng) // groups)
    spans = [(k - 1) * dilation + 1 for k in (kh, kw)]
    if keep or (stride == 1 and rng.random() < 0.2):
        # odd spans pad evenly; "same" pads an even span asymmetrically (the extra row after)
        padding = tuple(s // 2 for s in spans) if all(s % 2 for s in spans) else "same"
    else:
        padding = tuple(rng.randint(0, s // 2) for s in spans)
        padding = padding[0] if padding[0] == padding[1] and rng.random() < 0.7 else padding
    return dict(out=out, kernel=(kh, kw), stride=stride, padding=padding, dilation=dilation, groups=groups,
                bias=rng.random() < 0.7)


def _build_conv(shape, out, kernel, stride, padding, dilation, groups, bias):
    return nn.Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias)


def _draw_conv1d(rng, shape, keep):
    d = shape[2]
    k, dilation = rng.randint(1, 5), rng.choice([1, 1, 2])
    groups = rng.choice([1, 1, d, rng.choice(_divisors(d))])
    out = d if keep == "all" or groups == d else groups * max(1, _features(rng) // groups)
    span = (k - 1) * dilation + 1
    stride = 1 if keep else rng.choice([1, 1, 2])
    padding = span // 2 if keep == "all" and span % 2 else ("same" if keep == "all" else rng.randint(0, span // 2))
    return dict(out=out, kernel=k, stride=stride, padding=padding, dilation=dilation, groups=groups,
                bias=rng.random() < 0.7)


def _build_conv1d(shape, out, kernel, stride, padding, dilation, groups, bias):
    return Conv1dOverTime(in_channels=shape[2], out_channels=out, kernel_size=kernel, stride=stride, padding=padding,
                          dilation=dilation, groups=groups, bias=bias)


def _draw_pad(rng, shape, keep):
    if keep:
        return None
    pad = tuple(rng.choice([0, 0, 1, 1, 2, 3]) for _ in range(4))
    return dict(pad=pad, value=0.0 if rng.random() < 0.7 else round(rng.uniform(-1, 1), 2)) if any(pad) else None


def _draw_linear(rng, shape, keep):
    return dict(out=shape[-1] if keep == "all" else _features(rng), bias=rng.random() < 0.8)


def _draw_norm(rng, shape, keep):
    return {}


def _build_batch_norm(shape, **_):
    return nn.BatchNorm2d(shape[1]) if len(shape) == 4 else nn.BatchNorm1d(shape[1])


def _draw_group_norm(rng, shape, keep):
    return dict(groups=rng.choice(_divisors(shape[1])), affine=rng.random() < 0.8)


def _draw_layer_norm(rng, shape, keep):
    dims = rng.choice([1, 1, 1, 2, 3][: len(shape)])
    return dict(dims=min(dims, len(shape) - 1), affine=rng.random() < 0.8, bias=rng.random() < 0.8)


def _build_layer_norm(shape, dims, affine, bias):
    return nn.LayerNorm(shape[-dims:], elementwise_affine=affine, bias=bias)


ACTIVATIONS = {
    "relu": lambda: nn.ReLU(), "relu6": lambda: nn.ReLU6(), "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": lambda: nn.SiLU(), "sigmoid": lambda: nn.Sigmoid(),
    "tanh": lambda: nn.Tanh(), "hardswish": lambda: nn.Hardswish(), "hardsigmoid": lambda: nn.Hardsigmoid(),
    "leaky_relu": lambda: nn.LeakyReLU(0.1), "elu": lambda: nn.ELU(), "softplus": lambda: nn.Softplus(),
    "softplus_beta2": lambda: nn.Softplus(beta=2.0, threshold=5.0), "hardtanh": lambda: nn.Hardtanh(-0.5, 1.5),
    "mish": lambda: nn.Mish(), "selu": lambda: nn.SELU(),
}


def _draw_activation(rng, shape, keep):
    return dict(fn=rng.choice(sorted(ACTIVATIONS)))


def _draw_pool(rng, shape, keep):
    if keep == "all":
        return None
    k = rng.randint(1, 4)
    stride = 1 if keep else rng.randint(1, k)
    params = dict(kernel=k, stride=stride, padding=rng.randint(0, k // 2), ceil_mode=rng.random() < 0.3)
    return params


def _build_max_pool(shape, **params):
    return nn.MaxPool2d(params["kernel"], params["stride"], params["padding"], ceil_mode=params["ceil_mode"])


def _draw_avg_pool(rng, shape, keep):
    params = _draw_pool(rng, shape, keep)
    return params and dict(params, count_include_pad=rng.random() < 0.5)


def _build_avg_pool(shape, kernel, stride, padding, ceil_mode, count_include_pad):
    return nn.AvgPool2d(kernel, stride, padding, ceil_mode, count_include_pad)


def _draw_adaptive(rng, shape, keep):
    if keep == "all":
        return None
    size = (1, 1) if rng.random() < 0.3 else tuple(rng.randint(1, max(1, d + (d > 2))) for d in shape[2:])
    return None if keep and size != shape[2:] else dict(size=size)


def _draw_upsample(rng, shape, keep):
    if keep:
        return None
    mode = rng.choice(["nearest", "bilinear"])
    params = dict(mode=mode)
    if rng.random() < 0.5:
        params["scale_factor"] = rng.choice([2.0, 2.0, 3.0])
    else:
        params["size"] = tuple(rng.randint(1, 2 * d + 1) for d in shape[2:])
    if mode == "bilinear":
        params["align_corners"] = rng.random() < 0.5
    return params


def _draw_slice(rng, shape, keep):
    dims = [d for d in range(1, len(shape)) if shape[d] > 1 and not (keep == "all" or (
        keep == "spatial" and d != _feature_dim(shape)))]
    if not dims:
        return None
    dim = rng.choice(dims)
    size = shape[dim]
    start = rng.randint(0, size - 1)
    return dict(dim=dim, start=start, stop=rng.randint(start + 1, size), step=rng.choice([1, 1, 1, 2, 3]))


def _build_slice(shape, dim, start, stop, step):
    return Apply(_take, index=(slice(None),) * dim + (slice(start, stop, step),))


def _take(x, index):
    return x[index]


def _draw_reduce(rng, shape, keep):
    if keep == "all":
        return None
    dims = {4: [(2, 3), (2, 3), (3,), (1,), (1, 2, 3)], 3: [(1,), (2,), (1,)], 2: [(1,)]}[len(shape)]
    dim = rng.choice(dims)
    keepdim = rng.random() < 0.5
    if keep == "spatial" and (_feature_dim(shape) in dim or not keepdim):
        return None
    if len(shape) - (0 if keepdim else len(dim)) < 2:
        keepdim = True
    return dict(op=rng.choice(["mean", "sum", "amax"]), dim=dim, keepdim=keepdim)


def _build_reduce(shape, op, dim, keepdim):
    return Apply(getattr(torch, op), dim=dim, keepdim=keepdim)


def _draw_softmax(rng, shape, keep):
    return dict(dim=rng.randint(1, len(shape) - 1), log=rng.random() < 0.15)


def _build_softmax(shape, dim, log):
    return nn.LogSoftmax(dim) if log else nn.Softmax(dim)


def _draw_flatten(rng, shape, keep):
    return None if keep else {}


def _build_flatten(shape):
    return nn.Flatten()


def _draw_permute(rng, shape, keep):
    if keep:
        return None
    inner = list(range(1, len(shape)))
    rng.shuffle(inner)
    return dict(dims=(0, *inner)) if inner != sorted(inner) else None


def _build_permute(shape, dims):
    return Apply(torch.permute, dims=dims)


def _draw_reshape(rng, shape, keep):
    """A new factorization of a sample's elements into rank 2, 3 or 4 (images to sequences and back)."""
    if keep:
        return None
    n, size = shape[0], math.prod(shape[1:])
    rank = rng.choice([2, 3, 3, 4, 4])
    if rank == 2:
        return dict(to=(n, size)) if len(shape) != 2 else None
    if rank == 3:
        pairs = _factor_pairs(size, 4 * MAX_FEATURES)
        return dict(to=(n, *rng.choice(pairs))) if pairs else None
    triples = [(c, *hw) for c in _divisors(size) if c <= MAX_FEATURES for hw in _factor_pairs(size // c, 64)]
    return dict(to=(n, *rng.choice(triples))) if triples else None


def _draw_to_sequence(rng, shape, keep):
    return None if keep else {}


def _build_to_sequence(shape):
    return Apply(_image_to_sequence)


def _image_to_sequence(x):
    return x.flatten(2).transpose(1, 2)


def _draw_attention(rng, shape, keep):
    d = shape[2]
    return dict(heads=rng.choice(_divisors(d)[:4]), impl=rng.choice(["matmul", "sdpa"]), causal=rng.random() < 0.3,
                bias=rng.random() < 0.7)


def _build_attention(shape, heads, impl, causal, bias):
    return Attention(shape[2], heads, impl, causal, bias)


def _draw_affine(rng, shape, keep):
    return {}


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
    return Concat([build_chain(shape, b) for b in branches], _feature_dim(shape))


def _draw_combine(rng, shape, keep):
    a, b = (() if rng.random() < 0.3 else draw_chain(rng, shape, rng.randint(1, 2), "all") for _ in range(2))
    return dict(op=rng.choice(sorted(BINARY)), a=a, b=b) if a or b else None


def _build_combine(shape, op, a, b):
    return Combine(build_chain(shape, a), build_chain(shape, b), op)


def _draw_gate(rng, shape, keep):
    return dict(hidden=max(2, shape[_feature_dim(shape)] // rng.choice([1, 2, 4])),
                fn=rng.choice(["sigmoid", "hardsigmoid"]))


def _build_gate(shape, hidden, fn):
    """Squeeze-and-excitation: x times a per-feature gate from x's mean over its other dims (images,
    sequences), or a gated linear unit (vectors)."""
    f = shape[_feature_dim(shape)]
    if len(shape) == 4:
        excite = [Apply(torch.mean, dim=(2, 3), keepdim=True), nn.Conv2d(f, hidden, 1), nn.ReLU(),
                  nn.Conv2d(hidden, f, 1)]
    else:
        excite = [nn.Linear(f, hidden), nn.ReLU(), nn.Linear(hidden, f)]
        if len(shape) == 3:
            excite.insert(0, Apply(torch.mean, dim=1, keepdim=True))
    return Combine(nn.Identity(), nn.Sequential(*excite, ACTIVATIONS[fn]()), "mul")


RULES: dict[str, Rule] = {
    "conv": Rule((4,), 6.0, _draw_conv, _build_conv),
    "conv1d": Rule((3,), 1.0, _draw_conv1d, _build_conv1d),
    "pad": Rule((4,), 1.0, _draw_pad, lambda shape, pad, value: Apply(F.pad, pad=pad, value=value)),
    "linear": Rule((2, 3, 4), 2.0, _draw_linear, lambda shape, out, bias: nn.Linear(shape[-1], out, bias)),
    "batch_norm": Rule((2, 3, 4), 1.0, _draw_norm, _build_batch_norm),
    "group_norm": Rule((3, 4), 0.5, _draw_group_norm,
                       lambda shape, groups, affine: nn.GroupNorm(groups, shape[1], affine=affine)),
    "layer_norm": Rule((2, 3, 4), 1.0, _draw_layer_norm, _build_layer_norm),
    "activation": Rule((2, 3, 4), 4.0, _draw_activation, lambda shape, fn: ACTIVATIONS[fn]()),
    "max_pool": Rule((4,), 1.0, _draw_pool, _build_max_pool),
    "avg_pool": Rule((4,), 1.0, _draw_avg_pool, _build_avg_pool),
    "adaptive_avg_pool": Rule((4,), 0.5, _draw_adaptive, lambda shape, size: nn.AdaptiveAvgPool2d(size)),
    "adaptive_max_pool": Rule((4,), 0.5, _draw_adaptive, lambda shape, size: nn.AdaptiveMaxPool2d(size)),
    "upsample": Rule((4,), 0.7, _draw_upsample, lambda shape, **params: nn.Upsample(**params)),
    "slice": Rule((2, 3, 4), 0.7, _draw_slice, _build_slice),
    "reduce": Rule((2, 3, 4), 0.5, _draw_reduce, _build_reduce),
    "softmax": Rule((2, 3, 4), 0.7, _draw_softmax, _build_softmax),
    "flatten": Rule((4,), 0.3, _draw_flatten, _build_flatten),
    "permute": Rule((3, 4), 0.5, _draw_permute, _build_permute),
    "reshape": Rule((2, 3, 4), 0.5, _draw_reshape, lambda shape, to: Apply(torch.reshape, shape=to)),
    "to_sequence": Rule((4,), 0.5, _draw_to_sequence, _build_to_sequence),
    "attention": Rule((3,), 2.0, _draw_attention, _build_attention),
    "affine": Rule((2, 3, 4), 0.5, _draw_affine, lambda shape: Affine(shape)),
    "residual": Rule((2, 3, 4), 1.5, _draw_residual, _build_residual),
    "concat": Rule((2, 3, 4), 1.0, _draw_concat, _build_concat),
    "combine": Rule((2, 3, 4), 0.7, _draw_combine, _build_combine),
    "gate": Rule((2, 3, 4), 0.5, _draw_gate, _build_gate),
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
        f = _feature_dim(shape)
        return len(out) == len(shape) and all(a == b for i, (a, b) in enumerate(zip(shape, out, strict=True)) if i != f)
    return True


def _input_shape(rng: random.Random) -> Shape:
    n = rng.choice([1, 1, 1, 2])
    rank = rng.choices([4, 3, 2], [6, 3, 1])[0]
    if rank == 4:
        return n, rng.choice([1, 2, 3, 4, 8, 16]), rng.randint(1, 16), rng.randint(1, 16)
    if rank == 3:
        return n, rng.randint(1, 12), _features(rng)
    return n, _features(rng)


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
