"""The fuzz grammar's building blocks: small nn.Modules for what torch.nn has no module for (a
functional op as a layer, a residual, a concat or an elementwise combination of branches, a
per-feature affine, self-attention, a 1-d convolution over a sequence's time)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .spec import Shape, feature_dim


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
        size[feature_dim(shape)] = shape[feature_dim(shape)]
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
