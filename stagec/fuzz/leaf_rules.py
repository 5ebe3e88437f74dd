"""The fuzz grammar's leaf rules, every layer kind but the composites (whose bodies are chains): how
to draw its parameters (`draw_<kind>(rng, shape, keep)`, None where it cannot apply) and how to
build it (`build_<kind>(shape, **params)`, an nn.Module, where torch.nn has no one-line
constructor for it); stagec.fuzz.models files them in RULES with their ranks and weights.
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

from .blocks import Apply, Attention, Combine, Conv1dOverTime
from .spec import feature_dim

MAX_FEATURES = 32      # channels / model width: tiles stay small, cases stay fast


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factor_pairs(n: int, limit: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in _divisors(n) if d <= limit and n // d <= limit]


def draw_features(rng: random.Random) -> int:
    """A layer's width: mostly a round number, now and then any up to MAX_FEATURES."""
    return rng.choice([1, 2, 3, 4, 5, 8, 12, 16, 24, 32]) if rng.random() < 0.9 else rng.randint(1, MAX_FEATURES)


def draw_conv(rng, shape, keep):
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
        out = groups * max(1, draw_features(rng) // groups)
    spans = [(k - 1) * dilation + 1 for k in (kh, kw)]
    if keep or (stride == 1 and rng.random() < 0.2):
        # odd spans pad evenly; "same" pads an even span asymmetrically (the extra row after)
        padding = tuple(s // 2 for s in spans) if all(s % 2 for s in spans) else "same"
    else:
        padding = tuple(rng.randint(0, s // 2) for s in spans)
        padding = padding[0] if padding[0] == padding[1] and rng.random() < 0.7 else padding
    return dict(out=out, kernel=(kh, kw), stride=stride, padding=padding, dilation=dilation, groups=groups,
                bias=rng.random() < 0.7)


def build_conv(shape, out, kernel, stride, padding, dilation, groups, bias):
    return nn.Conv2d(shape[1], out, kernel, stride, padding, dilation, groups, bias)


def draw_conv1d(rng, shape, keep):
    d = shape[2]
    k, dilation = rng.randint(1, 5), rng.choice([1, 1, 2])
    groups = rng.choice([1, 1, d, rng.choice(_divisors(d))])
    out = d if keep == "all" or groups == d else groups * max(1, draw_features(rng) // groups)
    span = (k - 1) * dilation + 1
    stride = 1 if keep else rng.choice([1, 1, 2])
    padding = span // 2 if keep == "all" and span % 2 else ("same" if keep == "all" else rng.randint(0, span // 2))
    return dict(out=out, kernel=k, stride=stride, padding=padding, dilation=dilation, groups=groups,
                bias=rng.random() < 0.7)


def build_conv1d(shape, out, kernel, stride, padding, dilation, groups, bias):
    return Conv1dOverTime(in_channels=shape[2], out_channels=out, kernel_size=kernel, stride=stride, padding=padding,
                          dilation=dilation, groups=groups, bias=bias)


def draw_pad(rng, shape, keep):
    if keep:
        return None
    pad = tuple(rng.choice([0, 0, 1, 1, 2, 3]) for _ in range(4))
    return dict(pad=pad, value=0.0 if rng.random() < 0.7 else round(rng.uniform(-1, 1), 2)) if any(pad) else None


def draw_linear(rng, shape, keep):
    return dict(out=shape[-1] if keep == "all" else draw_features(rng), bias=rng.random() < 0.8)


def draw_norm(rng, shape, keep):
    return {}


def build_batch_norm(shape, **_):
    return nn.BatchNorm2d(shape[1]) if len(shape) == 4 else nn.BatchNorm1d(shape[1])


def draw_group_norm(rng, shape, keep):
    return dict(groups=rng.choice(_divisors(shape[1])), affine=rng.random() < 0.8)


def draw_layer_norm(rng, shape, keep):
    dims = rng.choice([1, 1, 1, 2, 3][: len(shape)])
    return dict(dims=min(dims, len(shape) - 1), affine=rng.random() < 0.8, bias=rng.random() < 0.8)


def build_layer_norm(shape, dims, affine, bias):
    return nn.LayerNorm(shape[-dims:], elementwise_affine=affine, bias=bias)


ACTIVATIONS = {
    "relu": lambda: nn.ReLU(), "relu6": lambda: nn.ReLU6(), "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": lambda: nn.SiLU(), "sigmoid": lambda: nn.Sigmoid(),
    "tanh": lambda: nn.Tanh(), "hardswish": lambda: nn.Hardswish(), "hardsigmoid": lambda: nn.Hardsigmoid(),
    "leaky_relu": lambda: nn.LeakyReLU(0.1), "elu": lambda: nn.ELU(), "softplus": lambda: nn.Softplus(),
    "softplus_beta2": lambda: nn.Softplus(beta=2.0, threshold=5.0), "hardtanh": lambda: nn.Hardtanh(-0.5, 1.5),
    "mish": lambda: nn.Mish(), "selu": lambda: nn.SELU(),
}


def draw_activation(rng, shape, keep):
    return dict(fn=rng.choice(sorted(ACTIVATIONS)))


def draw_pool(rng, shape, keep):
    if keep == "all":
        return None
    k = rng.randint(1, 4)
    stride = 1 if keep else rng.randint(1, k)
    params = dict(kernel=k, stride=stride, padding=rng.randint(0, k // 2), ceil_mode=rng.random() < 0.3)
    return params


def build_max_pool(shape, **params):
    return nn.MaxPool2d(params["kernel"], params["stride"], params["padding"], ceil_mode=params["ceil_mode"])


def draw_avg_pool(rng, shape, keep):
    params = draw_pool(rng, shape, keep)
    return params and dict(params, count_include_pad=rng.random() < 0.5)


def build_avg_pool(shape, kernel, stride, padding, ceil_mode, count_include_pad):
    return nn.AvgPool2d(kernel, stride, padding, ceil_mode, count_include_pad)


def draw_adaptive(rng, shape, keep):
    if keep == "all":
        return None
    size = (1, 1) if rng.random() < 0.3 else tuple(rng.randint(1, max(1, d + (d > 2))) for d in shape[2:])
    return None if keep and size != shape[2:] else dict(size=size)


def draw_upsample(rng, shape, keep):
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


def draw_slice(rng, shape, keep):
    dims = [d for d in range(1, len(shape)) if shape[d] > 1 and not (keep == "all" or (
        keep == "spatial" and d != feature_dim(shape)))]
    if not dims:
        return None
    dim = rng.choice(dims)
    size = shape[dim]
    start = rng.randint(0, size - 1)
    return dict(dim=dim, start=start, stop=rng.randint(start + 1, size), step=rng.choice([1, 1, 1, 2, 3]))


def build_slice(shape, dim, start, stop, step):
    return Apply(_take, index=(slice(None),) * dim + (slice(start, stop, step),))


def _take(x, index):
    return x[index]


def draw_reduce(rng, shape, keep):
    if keep == "all":
        return None
    dims = {4: [(2, 3), (2, 3), (3,), (1,), (1, 2, 3)], 3: [(1,), (2,), (1,)], 2: [(1,)]}[len(shape)]
    dim = rng.choice(dims)
    keepdim = rng.random() < 0.5
    if keep == "spatial" and (feature_dim(shape) in dim or not keepdim):
        return None
    if len(shape) - (0 if keepdim else len(dim)) < 2:
        keepdim = True
    return dict(op=rng.choice(["mean", "sum", "amax"]), dim=dim, keepdim=keepdim)


def build_reduce(shape, op, dim, keepdim):
    return Apply(getattr(torch, op), dim=dim, keepdim=keepdim)


def draw_softmax(rng, shape, keep):
    return dict(dim=rng.randint(1, len(shape) - 1), log=rng.random() < 0.15)


def build_softmax(shape, dim, log):
    return nn.LogSoftmax(dim) if log else nn.Softmax(dim)


def draw_flatten(rng, shape, keep):
    return None if keep else {}


def build_flatten(shape):
    return nn.Flatten()


def draw_permute(rng, shape, keep):
    if keep:
        return None
    inner = list(range(1, len(shape)))
    rng.shuffle(inner)
    return dict(dims=(0, *inner)) if inner != sorted(inner) else None


def build_permute(shape, dims):
    return Apply(torch.permute, dims=dims)


def draw_reshape(rng, shape, keep):
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


def draw_to_sequence(rng, shape, keep):
    return None if keep else {}


def build_to_sequence(shape):
    return Apply(_image_to_sequence)


def _image_to_sequence(x):
    return x.flatten(2).transpose(1, 2)


def draw_attention(rng, shape, keep):
    d = shape[2]
    return dict(heads=rng.choice(_divisors(d)[:4]), impl=rng.choice(["matmul", "sdpa"]), causal=rng.random() < 0.3,
                bias=rng.random() < 0.7)


def build_attention(shape, heads, impl, causal, bias):
    return Attention(shape[2], heads, impl, causal, bias)


def draw_affine(rng, shape, keep):
    return {}


def draw_gate(rng, shape, keep):
    return dict(hidden=max(2, shape[feature_dim(shape)] // rng.choice([1, 2, 4])),
                fn=rng.choice(["sigmoid", "hardsigmoid"]))


def build_gate(shape, hidden, fn):
    """Squeeze-and-excitation: x times a per-feature gate from x's mean over its other dims (images,
    sequences), or a gated linear unit (vectors)."""
    f = shape[feature_dim(shape)]
    if len(shape) == 4:
        excite = [Apply(torch.mean, dim=(2, 3), keepdim=True), nn.Conv2d(f, hidden, 1), nn.ReLU(),
                  nn.Conv2d(hidden, f, 1)]
    else:
        excite = [nn.Linear(f, hidden), nn.ReLU(), nn.Linear(hidden, f)]
        if len(shape) == 3:
            excite.insert(0, Apply(torch.mean, dim=1, keepdim=True))
    return Combine(nn.Identity(), nn.Sequential(*excite, ACTIVATIONS[fn]()), "mul")
