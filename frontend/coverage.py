"""Which ATen ops a model uses and whether stagec has a rule for each, before any lowering."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch

from .aten import ATEN_RULES
from .torch_export import aten_calls, export


class OpCount(NamedTuple):
    op: str           # the ATen op overload, e.g. "aten.convolution.default"
    count: int        # how many times the exported, decomposed graph calls it
    supported: bool   # whether stagec has a rule for it


def coverage(model: torch.nn.Module, args, kwargs=None) -> list[OpCount]:
    """The model's core-ATen ops (after torch.export and decomposition), most used first.

    >>> import torch
    >>> coverage(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()), (torch.randn(3, 4),))
    [OpCount(op='aten.addmm.default', count=1, supported=True), ...]
    """
    ep = export(model, args if isinstance(args, (tuple, list)) else (args,), kwargs)
    counts = Counter(node.target for node in aten_calls(ep))
    rows = [OpCount(str(op), n, op in ATEN_RULES) for op, n in counts.items()]
    return sorted(rows, key=lambda row: (-row.count, row.op))


def format_coverage(rows: list[OpCount]) -> str:
    """A table of coverage() rows with a summary line naming the unsupported ops."""
    width = max([len(r.op) for r in rows] + [len("ATen op")])
    lines = [f"{'ATen op':<{width}}  {'count':>5}  supported"]
    lines += [f"{r.op:<{width}}  {r.count:>5}  {'yes' if r.supported else 'NO'}" for r in rows]
    missing = [r.op for r in rows if not r.supported]
    lines.append(f"{len(rows)} distinct ops, {sum(r.count for r in rows)} calls; "
                 + (f"{len(missing)} unsupported: {', '.join(missing)}" if missing else "all supported"))
    return "\n".join(lines) + "\n"
