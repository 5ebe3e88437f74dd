"""Layout assignment: the physical dim order of every buffer, and which ops are views.

A value either owns a buffer (inputs, outputs, results of compute ops, copies)
or is a strided view of another value's buffer (transpose, broadcast, slice,
and reshapes numpy could do without a copy).  Convolution and pooling results
are stored channels-last (NHWC): the matrix and vector units tile over
(rows, cols, channels) with channels innermost.  Program inputs and outputs
are dense in their logical layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..graph.graph_ir import Graph, Node, OpKind
from .tensors import DTYPE_OF, DramRegion, DramTensor

ALWAYS_VIEWS = frozenset({OpKind.BROADCAST, OpKind.TRANSPOSE, OpKind.SLICE})


@dataclass(frozen=True)
class Placement:
    """Value bytes: `view` of the buffer owned by value `owner`, offsets relative to that buffer."""

    owner: int
    view: DramTensor


@dataclass(frozen=True)
class Layout:
    placements: MappingProxyType      # value id -> Placement
    copies: frozenset                 # names of view-kind nodes that must copy instead

    def emits(self, node: Node) -> bool:
        """Whether `node` runs as instructions: a view op only where it must copy."""
        return node.op not in ALWAYS_VIEWS | {OpKind.RESHAPE} or node.name in self.copies

    def __str__(self) -> str:
        lines = []
        for vid, pl in self.placements.items():
            how = "owns" if pl.owner == vid else f"view of %{pl.owner}"
            lines.append(f"  %{vid}: {how} shape={pl.view.shape} strides={pl.view.strides} +{pl.view.offset}")
        if self.copies:
            lines.append(f"  copies: {sorted(self.copies)}")
        return "layout {\n" + "\n".join(lines) + "\n}"


def _channels_last(rank: int) -> tuple[int, ...]:
    """[N, C, H, W] -> (N, H, W, C) order; for pooling's [..., lead, H, W] likewise."""
    return tuple(range(rank - 3)) + (rank - 2, rank - 1, rank - 3)


def _order(node: Node, placements) -> tuple[int, ...] | None:
    rank = len(node.output.shape)
    if node.op in (OpKind.CONV, OpKind.POOL) and rank >= 3:
        return _channels_last(rank)
    if node.op == OpKind.ELEMENTWISE:
        for v in node.inputs:
            pl = placements.get(v.id)
            if pl is not None and v.shape == node.output.shape and pl.owner == v.id:
                strides = pl.view.strides
                return tuple(sorted(range(rank), key=lambda d: -strides[d]))
    return None


def assign_layout(graph: Graph) -> Layout:
    placements: dict[int, Placement] = {}
    copies = set()
    outputs = {v.id for v in graph.outputs}
    for vid, arr in graph.constants.items():
        placements[vid] = Placement(vid, DramTensor.dense(DramRegion.CONST, 0, arr.shape,
                                                          dtype=DTYPE_OF[str(arr.dtype)]))
    for v in graph.inputs:
        placements[v.id] = Placement(v.id, DramTensor.dense(DramRegion.DATA, 0, v.shape, dtype=DTYPE_OF[v.dtype]))
    for node in graph.nodes:
        out = node.output
        view = None
        if out.id not in outputs and node.op in ALWAYS_VIEWS | {OpKind.RESHAPE}:
            src = placements[node.inputs[0].id]
            view = view_of(node, src.view)
            if view is not None:
                placements[out.id] = Placement(src.owner, view)
                continue
        if node.op in ALWAYS_VIEWS | {OpKind.RESHAPE}:
            copies.add(node.name)
        order = None if out.id in outputs else _order(node, placements)
        placements[out.id] = Placement(out.id, DramTensor.dense(DramRegion.DATA, 0, out.shape, order,
                                                                DTYPE_OF[out.dtype]))
    return Layout(MappingProxyType(placements), frozenset(copies))


def view_of(node: Node, src: DramTensor) -> DramTensor | None:
    op = node.op
    if op == OpKind.TRANSPOSE:
        return src.transpose(node.attr("perm"))
    if op == OpKind.BROADCAST:
        return src.broadcast(node.output.shape, node.attr("dims"))
    if op == OpKind.SLICE:
        return src.slice(node.attr("start"), node.attr("limit"), node.attr("step"))
    return src.reshape(node.output.shape)
