"""Mixed precision for int8 graphs: which layers stay float, and which float type each island takes.

`compile(..., quantize="int8")` quantizes every layer a rule of lower.graph.quantize can; the rest
(softmax, layer norm, attention matmuls) are float islands between DEQUANTIZE and QUANTIZE.  A
`LayerPrecision` says three things on top:

- `fallback`: the islands' type, "bf16" (lower.graph.bfloat16 on the int8 graph: float values and
  float weights bf16, int8 and int32 values and the dequantization scales as they are, graph
  outputs float32) or "fp32";
- `pinned`: layers the caller named (`layer_precision=`): "bf16" and "fp32" keep a layer out of
  int8 (the quantize stage keeps it float) in that type, "int8" quantizes it where a rule can (the
  default, so it only matters against `chosen`);
- `chosen`: the layers `choose` keeps bf16 to meet an accuracy target: it measures how much
  keeping each int8 layer bf16 alone brings the output back towards the float graph's (cosine of
  all outputs over the calibration batches, the graphs evaluated by lower.graph.evaluate), then
  keeps the most sensitive layers bf16, one more at a time, until the whole graph meets the target.

Layers are named as the graph the quantize stage takes names its nodes (the schedule dump and the
report name a fused layer `a+b`: each part is a layer here); a module's name stands for its nodes.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from stagec.errors import InputError
from stagec.progress import Reporter

from .evaluate import evaluate
from .graph_ir import MATRIX_OPS, Graph, Node, OpKind

PRECISIONS = ("int8", "bf16", "fp32")
FALLBACKS = ("bf16", "fp32")
DEFAULT_FALLBACK = "bf16"
# Ops whose int8 version is their input's bytes: keeping one float moves a boundary, changes no value.
_MOVES = frozenset({OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.BROADCAST, OpKind.PAD})
_NAMES = {"int8": "int8", "int32": "int32", "bfloat16": "bf16", "float32": "fp32"}


@dataclass(frozen=True)
class LayerPrecision:
    """What stays float in an int8 graph, and in which type (module doc)."""

    fallback: str = DEFAULT_FALLBACK
    pinned: Mapping = field(default_factory=lambda: MappingProxyType({}))   # node name part -> precision
    chosen: tuple[str, ...] = ()        # node names, bf16 for accuracy_target, most sensitive first
    target: float | None = None         # accuracy_target
    cosine: float | None = None         # what `chosen` achieves, on the calibration batches

    def of(self, name: str) -> str | None:
        """The precision pinned or chosen for a node (of any of a fused node's parts), or None."""
        chosen = {part for n in self.chosen for part in n.split("+")}
        parts = {self.pinned.get(part, "bf16" if part in chosen else None) for part in name.split("+")}
        return next((p for p in ("bf16", "fp32", "int8") if p in parts), None)

    def float_layers(self, graph: Graph) -> frozenset[str]:
        """The nodes of `graph` the quantize stage keeps float."""
        return frozenset(n.name for n in graph.nodes if self.of(n.name) in FALLBACKS)

    def keeps_fp32(self, name: str) -> bool:
        """Whether a node that is float in the int8 graph stays float32 (else it is bf16)."""
        return (self.of(name) or self.fallback) == "fp32"

    def has_bf16(self) -> bool:
        return self.fallback == "bf16" or "bf16" in self.pinned.values() or bool(self.chosen)

    def to_dict(self) -> dict:
        """As a program's metadata holds it (JSON)."""
        return {"fallback": self.fallback, "pinned": dict(self.pinned), "chosen": list(self.chosen),
                "target": self.target, "cosine": self.cosine}

    def __str__(self) -> str:
        lines = [f"float islands: {self.fallback}"]
        lines += [f"  {name}: {p} (pinned)" for name, p in self.pinned.items()]
        if self.target is not None:
            lines.append(f"accuracy target {self.target:g}: cosine {self.cosine:.6f} with {len(self.chosen)} "
                         f"layers bf16")
            lines += [f"  {name}: bf16 (chosen)" for name in self.chosen]
        return "\n".join(lines)


def pin_layers(graph: Graph, layer_precision: Mapping, fallback: str) -> LayerPrecision:
    """compile's `layer_precision` checked against `graph`'s node names, as a LayerPrecision with
    `fallback`.  A fused name `a+b` pins each part; a module's name (`linear1`) every node in it
    (`linear1/matmul`, ...)."""
    known = [n.name for n in graph.nodes]
    parts = list(dict.fromkeys(part for n in known for part in n.split("+")))
    pinned = {}
    for name, precision in layer_precision.items():
        if precision not in PRECISIONS:
            raise InputError(f"layer_precision[{name!r}] = {precision!r}: expected one of {PRECISIONS}")
        for part in str(name).split("+"):
            nodes = [p for p in parts if p == part or p.startswith(f"{part}/")]
            if not nodes:
                near = difflib.get_close_matches(part, known, n=3) or known[:5]
                raise InputError(f"layer_precision names no layer {part!r}; layers are named e.g. "
                                 f"{', '.join(map(repr, near))} (as in the schedule dump and the report)")
            pinned.update(dict.fromkeys(nodes, precision))
    return LayerPrecision(fallback, MappingProxyType(pinned))


def node_precision(node: Node, constants) -> str:
    """What a node computes in: a CONV/MATMUL its operands' type; another node int8 (or int32) when
    all of its data is integer, else bf16 when any of its float data is, else fp32."""
    if node.op in MATRIX_OPS:
        return _NAMES.get(node.inputs[0].dtype, node.inputs[0].dtype)
    types = {v.dtype for v in node.inputs if v.id not in constants} | {node.output.dtype}
    if types <= {"int8", "int32"}:
        return "int8" if "int8" in types else "int32"
    return "bf16" if "bfloat16" in types else "fp32"


def layer_precisions(graph: Graph) -> dict[str, str]:
    """{node name: node_precision} of every node of a graph."""
    return {n.name: node_precision(n, graph.constants) for n in graph.nodes}


def quantized_layers(graph: Graph, quantized: Graph) -> list[str]:
    """The layers of `graph` that `quantized` (its int8 graph) runs in int8, views and padding aside."""
    names = {n.name for n in graph.nodes}
    return list(dict.fromkeys(n.name for n in quantized.nodes if n.name in names and n.op not in _MOVES
                              and node_precision(n, quantized.constants) in ("int8", "int32")))


def unquantized_pins(precision: LayerPrecision, graph: Graph, quantized: Graph) -> list[str]:
    """The layers pinned int8 (views and padding aside) that `quantized`, `graph`'s int8 graph, still
    runs in float: ops without an int8 kernel."""
    computing = {part for n in graph.nodes if n.op not in _MOVES for part in n.name.split("+")}
    int8 = {part for name in quantized_layers(graph, quantized) for part in name.split("+")}
    return [name for name, p in precision.pinned.items() if p == "int8" and name in computing - int8]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


# The default progress report (as the tuner's): a bar over the graphs evaluated (stagec.progress)
print_progress = Reporter("accuracy_target", "best cosine", ".6f")


def choose(graph: Graph, batches: Sequence, build: Callable[[LayerPrecision], Graph], base: LayerPrecision,
           target: float, progress: Callable | None = print_progress) -> LayerPrecision:
    """`base` with the fewest int8 layers of `graph` kept bf16 (most sensitive first) for the output of
    `build(precision)` (the int8 graph as compiled) to reach `target` cosine against `graph`'s on
    `batches` (flattened inputs); if even every one bf16 misses, the best found (its `cosine` says so).
    The first graph kept bf16 is always the most sensitive one: the search is greedy, not exhaustive."""
    reference = np.concatenate([np.ravel(o) for b in batches for o in evaluate(graph, *b)])
    start, best = time.perf_counter(), [0, 0.0]   # graphs evaluated, best cosine
    candidates = [n for n in quantized_layers(graph, build(base)) if base.of(n) not in FALLBACKS]
    total = 2 * len(candidates) + 1

    def score(chosen: tuple[str, ...]) -> float:
        g = build(replace(base, chosen=chosen))
        got = cosine(np.concatenate([np.ravel(o) for b in batches for o in evaluate(g, *b)]), reference)
        best[0], best[1] = best[0] + 1, max(best[1], got)
        if progress is not None:
            progress(best[0], total, best[1], time.perf_counter() - start)
        return got

    found = (), score(())
    if found[1] < target:
        gain = {name: score((name,)) for name in candidates}
        order = sorted(candidates, key=lambda n: -gain[n])   # stable: ties in graph order
        for k in range(1, len(order) + 1):
            found = max(found, (tuple(order[:k]), score(tuple(order[:k]))), key=lambda t: t[1])
            if found[1] >= target:
                break
    return replace(base, chosen=found[0], target=target, cosine=found[1])
