"""Which softmax and layer norm islands of a float graph int8 runs integer-only (`integer_ops=`).

`compile(..., quantize="int8", integer_ops=("softmax", "layer_norm"))` runs those ops as I-BERT's
integer kernels (lower.graph.integer_kernels) instead of float islands.  An island is found by
its shape, then confirmed by what it computes: from a REDUCE (max for softmax, sum for layer norm)
over the last axis of a value x, the nodes that compute only from x, constants and each other
(elementwise, reductions, broadcasts), with one result of x's shape that anything else reads.
That sub-graph is evaluated (lower.graph.evaluate) on probe inputs: it must equal softmax(x), or
(x - mean) / std * gamma + beta with gamma and beta read off the probes.  Whatever fusion made of
the ops, an island that passes computes the op; one that does not stays a float island.

A softmax whose x is select(mask, fill, scores) with a very negative constant fill (an attention
mask) takes the int8 scores and the mask: masked scores are the row's smallest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from stagec.errors import InputError

from .activations import scalar, unary_input
from .evaluate import eval_expr, evaluate
from .graph_ir import Graph, Node, OpKind, Step, Value
from .integer_kernels import gelu, gelu_fits, layer_norm, layer_norm_fits, ptf_levels, softmax
from .requant import QUANTIZE_EXPR, QUANTIZE_FRACTION_BITS, QUANTIZE_RECORD

INTEGER_OPS = ("softmax", "layer_norm", "gelu")
_ISLAND_OPS = frozenset({OpKind.ELEMENTWISE, OpKind.REDUCE, OpKind.BROADCAST})
_KINDS = {"max": "softmax", "sum": "layer_norm"}
MASK_FILL_BELOW = -1e4      # a select's constant fill at most this is a mask


def integer_op_set(value) -> frozenset[str]:
    """compile's `integer_ops` as a set of op names: None (none), "all", one name or a collection of
    names from INTEGER_OPS; anything else an InputError naming it."""
    if value is None:
        return frozenset()
    if value == "all":
        return frozenset(INTEGER_OPS)
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Iterable):
        raise InputError(f"integer_ops must be 'all' or names from {INTEGER_OPS}, not {value!r}")
    names = tuple(names)
    bad = [n for n in names if n not in INTEGER_OPS]
    if bad:
        raise InputError(f"integer_ops: unknown op {bad[0]!r}; expected 'all' or names from {INTEGER_OPS}")
    return frozenset(names)


@dataclass(frozen=True)
class Island:
    kind: str                        # "softmax" or "layer_norm"
    x: Value                         # the op's input
    final: Node                      # the node whose result the op's is
    inner: frozenset[int]            # output ids of the island's other nodes (a mask's select among them)
    mask: tuple | None = None        # (scores, predicate, keep where nonzero) of a masked softmax
    gamma: np.ndarray | None = None  # layer norm's per-channel scale and shift
    beta: np.ndarray | None = None


def find_islands(graph: Graph, ops: frozenset[str], keep: frozenset[str] = frozenset()) -> dict[int, Island]:
    """{final node's output id: Island} of the islands of `ops` in `graph`; none with a node in `keep`."""
    if not ops:
        return {}
    uses, producer = graph.consumers(), graph.producer()
    outputs = {v.id for v in graph.outputs}
    found, taken = {}, set()
    for at, node in enumerate(graph.nodes):
        kind = _KINDS.get(node.attr("func")) if node.op == OpKind.REDUCE else None
        x = node.inputs[0] if kind in ops else None
        if x is None or x.dtype != "float32" or node.attr("axes") != (len(x.shape) - 1,):
            continue
        island = _island(graph, at, x, kind, uses, outputs)
        if island is None or taken & (island.inner | {island.final.output.id}):
            continue
        if kind == "softmax":
            island = _with_mask(island, producer, uses, outputs, graph.constants)
        names = {n.name for n in graph.nodes if n.output.id in island.inner | {island.final.output.id}}
        if names & keep:
            continue
        found[island.final.output.id] = island
        taken |= island.inner | {island.final.output.id}
    return found


def _island(graph: Graph, at: int, x: Value, kind: str, uses, outputs) -> Island | None:
    """The island from the REDUCE at graph.nodes[at] over x, confirmed by probes, or None: the first
    node of x's shape computed from it whose ancestors there nothing else reads."""
    members = {graph.nodes[at].output.id: graph.nodes[at]}
    for node in graph.nodes[at + 1:]:
        ins = [v.id for v in node.inputs if v.id not in graph.constants]
        if node.op in _ISLAND_OPS and any(i in members for i in ins) and all(i in members or i == x.id for i in ins):
            members[node.output.id] = node
    for final in members.values():
        if final.op != OpKind.ELEMENTWISE or final.output.shape != x.shape:
            continue
        inner = _ancestors(final, members)
        if graph.nodes[at].output.id not in inner or any(
                v in outputs or any(u.output.id not in inner and u is not final for u in uses[v]) for v in inner):
            continue
        nodes = tuple(n for n in members.values() if n.output.id in inner or n is final)
        sub = Graph((x,), (final.output,), nodes, MappingProxyType(
            {v.id: graph.constants[v.id] for n in nodes for v in n.inputs if v.id in graph.constants}))
        gamma_beta = _confirm(sub, kind, x.shape)
        if gamma_beta is not None:
            return Island(kind, x, final, frozenset(inner), None, *gamma_beta)
    return None


def _ancestors(node: Node, members: dict[int, Node]) -> set[int]:
    """The output ids of the members `node` is computed from."""
    found, todo = set(), [v.id for v in node.inputs]
    while todo:
        vid = todo.pop()
        if vid in members and vid not in found:
            found.add(vid)
            todo.extend(v.id for v in members[vid].inputs)
    return found


def _probe(sub: Graph, x: np.ndarray) -> np.ndarray:
    """The sub-graph's result on x; NaN everywhere where any of it is not finite (no match then)."""
    y = np.asarray(evaluate(sub, x.astype(np.float32))[0], np.float64)
    return y if np.isfinite(y).all() else np.full_like(y, np.nan)


def _confirm(sub: Graph, kind: str, shape) -> tuple | None:
    """(gamma, beta) of a layer norm, (None, None) of a softmax, when the sub-graph computes it on
    probe inputs; else None."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 3 + rng.standard_normal(shape[:-1] + (1,))
    if kind == "softmax":
        want = np.exp(x - x.max(-1, keepdims=True))
        ok = np.allclose(_probe(sub, x), want / want.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
        return (None, None) if ok else None
    beta = _probe(sub, np.zeros(shape)).reshape(-1, shape[-1])
    units = [_standard(rng.standard_normal(shape)) for _ in range(4)]
    got = [(_probe(sub, 100 * u).reshape(-1, shape[-1]) - beta, u.reshape(-1, shape[-1])) for u in units]
    gamma = sum((f * u).sum(0) for f, u in got) / sum((u * u).sum(0) for _, u in got)
    beta = beta[0]
    want = _standard(x) * gamma + beta
    scale = np.abs(gamma).max() + np.abs(beta).max()
    ok = np.isfinite(scale) and np.allclose(_probe(sub, x), want, rtol=1e-3, atol=1e-3 * scale)
    ok = ok and layer_norm_fits(gamma, beta)
    return (gamma, beta) if ok else None


def _standard(x: np.ndarray) -> np.ndarray:
    """x with each row (last axis) at mean 0 and variance 1."""
    x = x - x.mean(-1, keepdims=True)
    return x / np.sqrt((x * x).mean(-1, keepdims=True))


def _with_mask(island: Island, producer, uses, outputs, consts) -> Island:
    """A softmax whose x only it reads, x = select(pred, fill, scores) or select(pred, scores, fill)
    with a very negative constant fill: the island takes the scores and the predicate."""
    sel = producer.get(island.x.id)
    inside = island.inner | {island.final.output.id}
    if (sel is None or sel.op != OpKind.ELEMENTWISE or sel.attr("expr") != (Step("select", (0, 1, 2)),)
            or island.x.id in outputs or any(u.output.id not in inside for u in uses[island.x.id])):
        return island
    pred, on_false, on_true = sel.inputs
    for fill, scores, keep_nonzero in ((on_false, on_true, True), (on_true, on_false, False)):
        value = _constant_fill(fill, producer, consts)
        if value is not None and value <= MASK_FILL_BELOW and scores.shape == island.x.shape:
            return Island(island.kind, island.x, island.final, island.inner | {island.x.id},
                          (scores, pred, keep_nonzero))
    return island


def _constant_fill(v: Value, producer, consts) -> float | None:
    """The value of a scalar constant, or of a broadcast of one; else None."""
    node = producer.get(v.id)
    if node is not None and node.op == OpKind.BROADCAST:
        v = node.inputs[0]
    arr = consts.get(v.id)
    return float(np.asarray(arr).reshape(-1)[0]) if arr is not None and np.size(arr) == 1 else None


def int8_inputs(islands: dict[int, Island]) -> set[int]:
    """The value ids the islands read as int8 (so a MATMUL producing one requantizes it)."""
    return {(i.mask[0] if i.mask else i.x).id for i in islands.values()}


def emit_island(rw, island: Island) -> None:
    """The island's integer kernel, emitted through the quantize pass's rewriter `rw`; its result
    int8 at the final value's calibrated scale.  A layer norm of a float value with per-channel ranges
    (`rw.channel_amax`) quantizes it for itself with power-of-two factors per channel (`ptf_quantize`)."""
    final, x = island.final, island.x
    s_out = rw.scale_of(final.output)
    if island.kind == "softmax":
        q = rw.as_int8(island.mask[0] if island.mask else x)
        mask = (rw.as_fp32(island.mask[1]), island.mask[2]) if island.mask else None
        out = softmax(rw, q, rw.scales[q.id], s_out, final.name, mask)
    elif x.id in rw.channel_amax and x.id not in rw.int8 and x.id not in rw.sums:
        q, alpha = ptf_quantize(rw, x, rw.channel_amax[x.id], final.name)
        out = layer_norm(rw, q, s_out, island.gamma, island.beta, final.name, alpha)
    else:
        out = layer_norm(rw, rw.as_int8(x), s_out, island.gamma, island.beta, final.name)
    rw.int8[final.output.id], rw.scales[out.id] = out, s_out


def int8_gelu(rw, node: Node) -> bool:
    """An ELEMENTWISE GELU (exact or tanh form: confirmed on probes) of one int8 value and scalar
    constants as I-BERT's i-GELU, where `rw.integer` asks for it; False, emitting nothing, otherwise."""
    expr = node.attr("expr")
    k = unary_input(expr, node.inputs, rw.consts) if "gelu" in rw.integer else None
    if k is None or node.inputs[k].id not in rw.int8 or node.output.dtype != "float32":
        return False
    q = rw.int8[node.inputs[k].id]
    t = np.linspace(-6, 6, 97, dtype=np.float32)
    args = [t if i == k else np.float32(scalar(v, rw.consts)) for i, v in enumerate(node.inputs)]
    got = np.asarray(eval_expr(expr, [np.asarray(a) for a in args]), np.float64)
    want = 0.5 * t * (1 + np.vectorize(math.erf)(t / math.sqrt(2)))
    if got.shape != t.shape or not np.allclose(got, want, atol=2e-3) or not gelu_fits(rw.scales[q.id]):
        return False
    s_out = rw.scale_of(node.output)
    out = gelu(rw, q, rw.scales[q.id], s_out, node.name)
    rw.int8[node.output.id], rw.scales[out.id] = out, s_out
    return True


def ptf_factors(amax: np.ndarray) -> tuple[float, np.ndarray]:
    """(s, alpha): FQ-ViT's power-of-two factors of per-channel ranges `amax`: channel c on the grid
    s 2**alpha[c], alpha in [0, K] (integer_kernels.ptf_levels), the widest channel at alpha = K, each
    other at the smallest factor whose grid holds its range."""
    levels = ptf_levels(len(amax))
    s = float(amax.max()) / (127 * 2**levels)
    need = np.ceil(np.log2(np.maximum(amax, 1e-30) / (127 * s)) - 1e-9)
    return s, np.clip(need, 0, levels).astype(np.int64)


def ptf_quantize(rw, x: Value, amax: np.ndarray, name: str) -> tuple[Value, np.ndarray]:
    """(int8 x, alpha): float `x` quantized per channel at s 2**alpha (`ptf_factors`) by QUANTIZE
    with a gain per channel, for a layer norm alone (no other node reads this int8 version)."""
    s, alpha = ptf_factors(np.asarray(amax, np.float64))
    gain = rw.const((2**QUANTIZE_FRACTION_BITS / (s * 2.0**alpha)).astype(np.float32))
    q = rw.fresh(x.shape, "int8")
    rw.emit(OpKind.ELEMENTWISE, (rw.fp32.get(x.id, x), gain, rw.const(QUANTIZE_RECORD.copy())), q,
            f"{name}/quantize_channels", expr=QUANTIZE_EXPR)
    return q, alpha
