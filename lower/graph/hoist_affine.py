"""hoist_affine: a per-channel scale and shift applied to another layer's result moves into that
layer's epilogue, where fold_affine folds it into the weights.

A ResNet basic block adds two convolutions' batch-normed results; fuse_epilogues fuses the add
(and both batch norms) into one of them, so the other conv's batch norm runs in its reader's
epilogue, on a value fold_affine cannot reach: that conv keeps unfolded weights, its result
leaves the accumulator raw (int8: dequantized to fp32, and the add runs in fp32).  Hoisted,
the batch norm folds away and the reader's epilogue is bias + residual add + ReLU (int8: an
integer TFLite Add).
"""

from __future__ import annotations

from collections import Counter

from .graph_ir import MATRIX_OPS, Graph, Node, OpKind, Step, Value
from .passes import _attrs, _per_channel, _uses, compose, prune

AFFINE = ("add", "sub", "mul")


def hoist_affine(graph: Graph) -> Graph:
    """In a CONV/MATMUL epilogue or an ELEMENTWISE expr, a chain of mul/add/sub by per-channel
    constants applied to an input that is the single-use result of a CONV/MATMUL with constant
    weights moves into that producer's epilogue.  Only into a producer whose epilogue is empty or
    itself such a chain: fold_affine folds a leading affine only, so a chain moved behind a ReLU
    would run the same steps in another place, for nothing."""
    uses, outputs, producer = _uses(graph)
    ids, nodes = graph.fresh_ids(), list(graph.nodes)
    where = {n.output.id: i for i, n in enumerate(nodes)}
    for i in range(len(nodes)):
        hoisted = True
        while hoisted:
            hoisted = False
            node = nodes[i]
            first = 1 if node.op in MATRIX_OPS else 0
            if node.op not in MATRIX_OPS and node.op != OpKind.ELEMENTWISE:
                break
            expr = node.attr("epilogue" if first else "expr") or ()
            for a in range(first, len(node.inputs) - first):
                v = node.inputs[a + first]
                p = producer.get(v.id)
                # read once in all (a node reading it twice, as a conv's input and in its epilogue,
                # counts as one use): the hoisted chain replaces the value everywhere it is read
                if (p is None or p.op not in MATRIX_OPS or uses.get(v.id) != 1 or v.id in outputs
                        or node.inputs.count(v) != 1 or v.shape != node.output.shape or v.dtype != "float32"
                        or not _foldable(p, graph)):
                    continue
                chain = _chain(node, expr, a, graph.constants, _axis(p))
                if not chain or chain[-1] == len(expr) - 1:
                    continue
                moved = Value(next(ids), v.shape, v.dtype)
                nodes[where[v.id]] = _extended(p, node, expr, chain, a, moved)
                nodes[i] = _shortened(node, expr, a, chain, moved)
                producer[moved.id], uses[moved.id] = nodes[where[v.id]], 1
                where[moved.id] = where[v.id]
                hoisted = True
                break
    return Graph(graph.inputs, graph.outputs, tuple(nodes), graph.constants)


def _axis(node: Node) -> int:
    return 1 if node.op == OpKind.CONV else -1


def _foldable(p: Node, graph: Graph) -> bool:
    """Whether a chain hoisted into `p` folds: constant weights, an epilogue none or all affine."""
    if len(p.inputs) < 2 or p.inputs[1].id not in graph.constants:
        return False
    expr = p.attr("epilogue") or ()
    return not expr or len(_chain(p, expr, 0, graph.constants, _axis(p))) == len(expr)


def _chain(node: Node, expr, start: int, consts, axis: int) -> list[int]:
    """The steps of `expr` that apply per-channel constants, one after another, to expr argument
    `start`, each value on the way read by the next step alone."""
    first = 1 if node.op in MATRIX_OPS else 0
    n_in = len(node.inputs) - first
    reads = Counter(a for s in expr for a in s.args)
    cur, steps = start, []
    while reads[cur] == 1:
        j = next(j for j, s in enumerate(expr) if cur in s.args)
        s = expr[j]
        if s.func not in AFFINE or len(set(s.args)) != 2 or s.func == "sub" and s.args[0] != cur:
            break
        arg = s.args[1] if s.args[0] == cur else s.args[0]
        if arg >= n_in or arg < first:   # a step's result, or an epilogue's accumulator
            break
        other = node.inputs[first + arg]
        if other.id not in consts or _per_channel(consts[other.id], node.output.shape, axis) is None:
            break
        steps.append(j)
        cur = n_in + j
    return steps


def _extended(p: Node, node: Node, expr, chain: list[int], start: int, moved: Value) -> Node:
    """Producer `p`, its result `moved`, with the chain (steps of `node`'s expr from argument
    `start`) appended to its epilogue."""
    first = 1 if node.op in MATRIX_OPS else 0
    n_in = len(node.inputs) - first
    links = [start] + [n_in + j for j in chain[:-1]]   # the value each chain step carries on
    constants = [node.inputs[first + a] for j, cur in zip(chain, links, strict=True) for a in expr[j].args if a != cur]
    inputs = [p.output] + list(dict.fromkeys(constants))
    n = len(inputs)
    steps = tuple(Step(expr[j].func, tuple((n + k - 1 if k else 0) if a == cur else inputs.index(node.inputs[first + a])
                                           for a in expr[j].args))
                  for k, (j, cur) in enumerate(zip(chain, links, strict=True)))
    both, epilogue = compose(inputs, steps, 0, (p.output,) + p.inputs[2:], p.attr("epilogue") or ())
    return Node(p.op, p.inputs[:2] + tuple(both[1:]), moved, _attrs(p, epilogue=epilogue), p.name)


def _shortened(node: Node, expr, start: int, chain: list[int], moved: Value) -> Node:
    """`node` without the chain: what read its end reads argument `start`, now `moved`."""
    first = 1 if node.op in MATRIX_OPS else 0
    n_in = len(node.inputs) - first
    end, gone = n_in + chain[-1], set(chain)
    kept = [j for j in range(len(expr)) if j not in gone]
    index = {n_in + j: n_in + k for k, j in enumerate(kept)} | {end: start}
    steps = tuple(Step(expr[j].func, tuple(index.get(a, a) for a in expr[j].args)) for j in kept)
    inputs = [node.output, *node.inputs[2:]] if first else list(node.inputs)
    inputs[start] = moved
    inputs, steps = prune(inputs, steps)
    if first:
        return Node(node.op, node.inputs[:2] + tuple(inputs[1:]), node.output, _attrs(node, epilogue=steps or None),
                    node.name)
    return Node(node.op, tuple(inputs), node.output, _attrs(node, expr=steps), node.name)
