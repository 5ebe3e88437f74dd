"""What the attention matchers (lower.schedule.flash, lower.schedule.flash_int8) see of a graph: its emitted
nodes through the views between them (reshapes and broadcasts that emit nothing), the heads a mask is shared
by, row reductions, and a mask's inputs by role."""

from __future__ import annotations

from typing import NamedTuple

from ..graph.graph_ir import OpKind, Step

# a mask's expressions, by the inputs they take as (scale, predicate, fill, scores): select(pred, fill, S), or,
# where no view keeps S's matmul apart (one head's 3-D scores), the scale fused there: select(pred, fill, S * scale)
MASK_EXPRS = {(Step("select", (0, 1, 2)),): (None, 0, 1, 2),
              (Step("mul", (0, 1)), Step("select", (2, 3, 4))): (1, 2, 3, 0)}


class MaskInputs(NamedTuple):
    """A mask node's inputs by role (`MASK_EXPRS`); `scale` None where S's matmul scales S."""

    scale: object
    pred: object
    fill: object
    scores: object


def mask_inputs(mask) -> MaskInputs | None:
    """`mask`'s inputs by role, or None where its expression is not a mask's (`MASK_EXPRS`)."""
    at = MASK_EXPRS.get(mask.attr("expr"))
    return None if at is None else MaskInputs(*(None if i is None else mask.inputs[i] for i in at))


class Walk:
    """A graph as the attention matchers walk it: its emitted nodes, seen through the views between
    them (reshapes and broadcasts that emit nothing)."""

    def __init__(self, graph, layout):
        self.uses, self.producer, self.layout = graph.consumers(), graph.producer(), layout
        self.outputs = {v.id for v in graph.outputs}

    def view(self, p) -> bool:
        return p is not None and p.op in (OpKind.RESHAPE, OpKind.BROADCAST) and not self.layout.emits(p)

    def node_of(self, v, op):
        """The emitted node of `op` whose result `v` views."""
        p = self.producer.get(v.id)
        while self.view(p):
            p = self.producer.get(p.inputs[0].id)
        return p if p is not None and p.op == op and self.layout.emits(p) else None

    def readers(self, node) -> set | None:
        """The names of the emitted nodes that read `node`'s result (through views); None if a graph output."""
        out, todo = set(), [node.output]
        while todo:
            v = todo.pop()
            if v.id in self.outputs:
                return None
            for c in self.uses.get(v.id, ()):
                todo += [c.output] if self.view(c) else []
                out |= set() if self.view(c) else {c.name}
        return out


def shared_heads(mask, walk: Walk) -> int:
    """How many consecutive heads read one mask: the trailing batch dims of `mask` ([*batch, M, N]) that
    the BROADCASTs it views (its only views) do not vary it over."""
    chain, v = [], mask
    while walk.view(p := walk.producer.get(v.id)):
        if p.op != OpKind.BROADCAST:
            return 1
        chain.append(p)
        v = p.inputs[0]
    varies = [size > 1 for size in v.shape]
    for p in reversed(chain):       # from the source outwards: an output dim varies where its input dim does
        inner, varies = varies, [False] * len(p.output.shape)
        for i, d in enumerate(p.attr("dims")):
            varies[d] = inner[i]
    heads = 1
    for size, varying in zip(reversed(mask.shape[:-2]), reversed(varies[:-2]), strict=True):
        if varying:
            break
        heads *= size
    return heads


def row_reduce(node, func: str) -> bool:
    """Whether `node` (a REDUCE) takes `func` over its input's last dim."""
    return node.attr("func") == func and tuple(node.attr("axes")) == (len(node.inputs[0].shape) - 1,)
