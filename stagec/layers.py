"""The tunable layers of a model: its conv-shaped nodes, as the cost model and the tuner see them,
and one-layer programs to measure a mapping of one of them in the simulator.

    >>> import torch
    >>> from stagec.layers import model_graph, model_layers
    >>> graph = model_graph(torch.nn.Conv2d(3, 8, 3), (torch.randn(1, 3, 8, 8),))
    >>> [(layer.kind, layer.problem.o) for layer in model_layers(graph)]
    [('matrix', 8)]
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from stagec.costmodel.problem import LayerShape, layer_shape
from stagec.isa import HardwareConfig, Program
from stagec.lower.graph.graph_ir import Graph, Node, OpKind
from stagec.lower.schedule.buffers import Extras
from stagec.lower.schedule.mapper import node_problem
from stagec.lower.schedule.nest import ConvProblem, TileMapping
from stagec.sim.energy import counts_of, energy_pj
from stagec.sim.timing import timeline

from .pipeline import build_graph, lower_graph


@dataclass(frozen=True)
class Layer:
    """A node that runs as a convolution, with what its emitted loop nest depends on besides the mapping.

    kind: 'matrix', 'depthwise' or 'pool' (lower.schedule.mapper.node_problem); extras: its epilogue
    (lower.schedule.buffers.Extras: buffers, loads, vector instructions); repeat: how many times the loop
    nest runs (a batched matmul's batch, a grouped conv's groups, a pooling's leading dims).
    """

    name: str
    kind: str
    problem: ConvProblem
    extras: Extras
    repeat: int
    node: Node

    def shape(self) -> LayerShape:
        """The layer as the cost model's LayerShape."""
        return layer_shape(self.kind, self.problem, self.extras, self.repeat)


def model_graph(model_or_fn, example_args, kwargs=None, **options) -> Graph:
    """The graph IR `stagec.compile` schedules (stagec.pipeline.build_graph; `options` are its
    fuse/quantize/calibration/percentile)."""
    return build_graph(model_or_fn, example_args, kwargs=kwargs, **options)[1]


def model_layers(graph: Graph) -> list[Layer]:
    """Every conv-shaped node of `graph`, in program order."""
    out = []
    for node in graph.nodes:
        found = node_problem(node)
        if found is not None:
            kind, p, extras = found
            out.append(Layer(node.name, kind, p, extras, _repeat(node), node))
    return out


def _repeat(node: Node) -> int:
    if node.op == OpKind.MATMUL:
        return int(np.prod(node.output.shape[:-2], dtype=np.int64))
    if node.op == OpKind.POOL:
        return int(np.prod(node.inputs[0].shape[:-3], dtype=np.int64))
    groups = node.attr("groups")
    return 1 if node_problem(node)[0] == "depthwise" else groups


def layer_graph(graph: Graph, layer: Layer) -> Graph:
    """A graph of just `layer`'s node: its non-constant inputs become graph inputs, its output the output."""
    node = layer.node
    consts = {v.id: graph.constants[v.id] for v in node.inputs if v.id in graph.constants}
    inputs = tuple(dict.fromkeys(v for v in node.inputs if v.id not in consts))
    return Graph(inputs, (node.output,), (node,), MappingProxyType(consts))


def layer_program(graph: Graph, layer: Layer, mapping: TileMapping, hw: HardwareConfig) -> Program:
    """The program of `layer` alone with `mapping`."""
    return lower_graph(layer_graph(graph, layer), hw, {layer.name: mapping})


def measure(graph: Graph, layer: Layer, mapping: TileMapping, hw: HardwareConfig) -> tuple[float, float]:
    """(cycles, energy pJ) the simulator gives `layer` alone under `mapping`: the ground truth the
    cost model predicts."""
    program = layer_program(graph, layer, mapping, hw)
    cycles = timeline(program).cycles
    return cycles, float(sum(energy_pj(counts_of(program).total(), cycles, hw).values()))
