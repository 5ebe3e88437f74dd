"""Depthwise convolutions on the array by channel packing, where that is cheaper than the vector unit.

A depthwise conv runs by default on the vector unit (lower.codegen.window: channels as lanes).  Packed,
it runs on the systolic array as a grouped conv of C/G groups, each G channels in and G out with
block-diagonal weights: one array pass reduces G channels' taps at once (K = G*kh*kw rows, G
columns), so a 1/G share of its MACs are useful.  That wins where the array is wide and the vector
unit narrow.  Per layer, the pass takes the cheapest of the vector mapping and every packing
G | C, G <= array columns, by the default mapper's estimate (lower.schedule.mapper), which both sides
share.  int8 layers pack too: the int32 sums of int8 products are exact, the zeros add nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from stagec.errors import TilingError
from stagec.isa.config import HardwareConfig

from ..graph.graph_ir import Graph, Node, OpKind, Value
from ..graph.passes import dce
from . import cascade_map
from .mapper import layer_label, node_problem
from .nest import ConvProblem
from .nest_map import map_conv, map_window
from .search import objective_of


def packing(p: ConvProblem, extras, hw: HardwareConfig, layer: str) -> int:
    """The channels per group G to pack the depthwise conv `p` by, or 0 for the vector unit: the
    cheapest that fits (where the vector unit's smallest tiling does not fit, a packing that does
    is the way to run the layer); if none fits, the vector unit's TilingError."""
    try:
        _, best = map_window(p, hw, extras, True, layer, with_cost=True)
        error = None
    except TilingError as e:
        best, error = math.inf, e
    choice = 0
    for g in range(2, min(p.c, hw.array_cols) + 1):
        if p.c % g:
            continue
        try:
            _, cost = map_conv(replace(p, c=g, o=g), hw, extras, layer, with_cost=True)
        except TilingError:
            continue
        if p.c // g * cost < best:
            best, choice = p.c // g * cost, g
    if error and not choice:
        raise error
    return choice


def block_diagonal(w: np.ndarray, g: int) -> np.ndarray:
    """Depthwise weights [C, 1, KH, KW] as a grouped conv's [C, g, KH, KW]: output channel o
    reads input channel o % g of its group through w[o], the other g - 1 through zeros."""
    c = w.shape[0]
    out = np.zeros((c, g) + w.shape[2:], w.dtype)
    out[np.arange(c), np.arange(c) % g] = w[:, 0]
    return out


def fuses_instead(graph: Graph, node: Node, g: int, hw: HardwareConfig, objective: str, links) -> bool:
    """Whether depthwise conv `node`, packed by `g`, is better left on the vector unit to run in one
    cascade with the convolution it alone reads and the 1x1 that alone reads it, where there are
    (an inverted residual block, lower.schedule.halo; with a squeeze-excite between the depthwise
    and the projection, the first two; a stem's depthwise, the full conv ahead of it too): by
    `objective` of the summed cycles and energy of the block's layers alone, the depthwise packed,
    against the cascade's.  `links`: (producer, consumers, outputs)."""
    producer, consumers, outputs = links

    def alone(v: Value) -> bool:
        return len(consumers.get(v.id, ())) == 1 and v.id not in outputs

    def joins(n: Node | None) -> bool:
        return n is not None and n.op == OpKind.CONV and cascade_map.member(n, graph, node_problem(n))

    ahead = producer.get(node.inputs[0].id)
    after = consumers[node.output.id][0] if alone(node.output) else None
    lead = [ahead] if joins(ahead) and alone(node.inputs[0]) else []
    block = lead + [node] + ([after] if joins(after) and cascade_map.follows(node_problem(node), node_problem(after))
                             else [])
    if len(block) < 2 or not joins(node):
        return False
    nests = [node_problem(n) for n in block]
    fused = cascade_map.map_cascade(nests, hw, objective)
    if fused is None:
        return False
    at = len(lead)
    dw = nests[at]
    nests[at] = dw._replace(kind="matrix", problem=replace(dw.problem, c=g, o=g))
    cycles = energy = 0.0
    for i, nest in enumerate(nests):
        times = dw.problem.c // g if i == at else 1
        c, e, _ = cascade_map.layer_cost(nest, map_conv(nest.problem, hw, nest.extras, objective=objective), hw,
                                         objective)
        cycles, energy = cycles + times * c, energy + times * e
    return fused.value < objective_of(cycles, energy, objective)


def pack_depthwise(graph: Graph, hw: HardwareConfig, keep=frozenset(), fuse: str | None = None) -> Graph:
    """Every fp32, bf16 or int8 depthwise conv with constant weights that packs cheaper than it runs on the
    vector unit, as its packed grouped conv (same name, same epilogue); the layers named in `keep`
    (those the caller maps itself) stay as they are, and with `fuse` (compile's objective, where
    cascades are on) those that run cheaper unpacked in their block's cascade (fuses_instead)."""
    consts = dict(graph.constants)
    ids = graph.fresh_ids()
    nodes = []
    links = graph.producer(), graph.consumers(), {v.id for v in graph.outputs}
    for node in graph.nodes:
        found = node_problem(node) if node.op == OpKind.CONV else None
        g = 0
        if (found and found[0] == "depthwise" and node.inputs[1].id in consts
                and node.inputs[0].dtype in ("float32", "bfloat16", "int8")
                and node.name not in keep):
            g = packing(found[1], found[2], hw, layer_label(node))
            if g and fuse and fuses_instead(graph, node, g, hw, fuse, links):
                g = 0
        if not g:
            nodes.append(node)
            continue
        w = node.inputs[1]
        packed = Value(next(ids), (w.shape[0], g) + w.shape[2:], w.dtype)
        consts[packed.id] = block_diagonal(np.asarray(consts[w.id]), g)
        inputs = (node.inputs[0], packed) + node.inputs[2:]
        # `packed`: the block-diagonal factor, so the report counts the layer's useful MACs and weights
        nodes.append(Node(node.op, inputs, node.output, node.attrs, node.name).with_attrs(groups=w.shape[0] // g,
                                                                                         packed=g))
    if len(consts) == len(graph.constants):   # nothing packed: each packing adds its weights
        return graph
    return dce(Graph(graph.inputs, graph.outputs, tuple(nodes), MappingProxyType(consts)))
