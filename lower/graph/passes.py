"""Graph passes: dead-code elimination, reshape sinking, elementwise fusion, deferred row scales,
epilogue fusion, affine folding.

Each pass is Graph -> Graph; the compile driver lists them in order.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from .graph_ir import MATRIX_OPS, Expr, Graph, Node, OpKind, Step, Value


def dce(graph: Graph) -> Graph:
    """Drop nodes nothing reads (and constants no node reads)."""
    live = {v.id for v in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if node.output.id in live:
            kept.append(node)
            live.update(v.id for v in node.inputs)
    consts = {k: a for k, a in graph.constants.items() if k in live}
    return Graph(graph.inputs, graph.outputs, tuple(reversed(kept)), MappingProxyType(consts))


def _uses(graph: Graph) -> tuple[dict[int, int], set[int], dict[int, Node]]:
    """(how many nodes read each value, the graph's output ids, each value's producer)."""
    uses: dict[int, int] = {}
    for n in graph.nodes:
        for v in set(n.inputs):
            uses[v.id] = uses.get(v.id, 0) + 1
    return uses, {v.id for v in graph.outputs}, {n.output.id: n for n in graph.nodes}


def fold_pads(graph: Graph) -> Graph:
    """A zero PAD of a convolution's rows and columns alone, read by that convolution alone, becomes
    the convolution's own padding (which the DMA fills as it loads each halo): no padded copy of the
    tensor goes through DRAM (TF-style "same" padding, HF MobileNetV2's and EfficientNet's)."""
    uses, outputs, producer = _uses(graph)
    removed, nodes = set(), []
    for node in graph.nodes:
        p = producer.get(node.inputs[0].id) if node.op == OpKind.CONV else None
        if (p is not None and p.op == OpKind.PAD and uses[p.output.id] == 1 and p.output.id not in outputs
                and p.attr("value") == 0 and not any(p.attr("lo")[:-2] + p.attr("hi")[:-2])):
            (pt, pb), (pl, pr) = node.attr("padding")
            (lt, ll), (ht, hl) = p.attr("lo")[-2:], p.attr("hi")[-2:]
            padding = ((pt + lt, pb + ht), (pl + ll, pr + hl))
            node = Node(node.op, (p.inputs[0],) + node.inputs[1:], node.output, _attrs(node, padding=padding),
                        node.name)
            removed.add(p.name)
        nodes.append(node)
    return Graph(graph.inputs, graph.outputs, tuple(n for n in nodes if n.name not in removed), graph.constants)


def sink_reshapes(graph: Graph) -> Graph:
    """An elementwise op whose one tensor operand is a single-use RESHAPE (every other operand a
    scalar) runs before the reshape instead, so that it can fuse into the reshaped value's producer
    (the scale after an attention matmul, split into heads by a reshape)."""
    uses, outputs, producer = _uses(graph)
    ids = graph.fresh_ids()
    moved, nodes = False, []
    for node in graph.nodes:
        tensors = [v for v in node.inputs if v.size != 1]
        r = producer.get(tensors[0].id) if node.op == OpKind.ELEMENTWISE and len(tensors) == 1 else None
        if (r is None or r.op != OpKind.RESHAPE or uses[r.output.id] != 1 or r.output.id in outputs
                or node.output.shape != r.output.shape
                or any(v.size == 1 and len(v.shape) > len(r.inputs[0].shape) for v in node.inputs)):
            nodes.append(node)
            continue
        source = r.inputs[0]
        before = Value(next(ids), source.shape, node.output.dtype)
        nodes.append(Node(OpKind.ELEMENTWISE, tuple(source if v == r.output else v for v in node.inputs), before,
                          node.attrs, node.name))
        nodes.append(Node(OpKind.RESHAPE, (before,), node.output, r.attrs, r.name))
        moved = True
    # the moved reshapes' old nodes are read by nothing now
    return dce(Graph(graph.inputs, graph.outputs, tuple(nodes), graph.constants)) if moved else graph


def defer_row_scale(graph: Graph) -> Graph:
    """matmul(x * r, b) with r one scale per row of x becomes matmul(x, b) * r: the scale moves to
    the (fusable) output, N values a row instead of K (softmax's normalization before attention's
    P @ V, as flash attention defers it).  Exact up to rounding."""
    uses, outputs, producer = _uses(graph)

    def single(v: Value, op: OpKind) -> Node | None:
        p = producer.get(v.id)
        return p if p is not None and p.op == op and uses[v.id] == 1 and v.id not in outputs else None

    ids = graph.fresh_ids()
    nodes, changed = [], False
    for node in graph.nodes:
        deferred = _deferred_row_scale(node, single, ids) if node.op == OpKind.MATMUL else None
        nodes.extend(deferred or [node])
        changed = changed or bool(deferred)
    return dce(Graph(graph.inputs, graph.outputs, tuple(nodes), graph.constants)) if changed else graph


def _deferred_row_scale(node: Node, single, ids) -> list[Node] | None:
    """The nodes replacing MATMUL `node` whose left operand is (reshapes of) a single-use x * r,
    r one scale per row of x, or None."""
    a = node.inputs[0]
    view, source = single(a, OpKind.RESHAPE), a
    # one head's attention squeezes its head dim, then bmm its batch dim: two reshapes after x * r
    while (inner := single(source, OpKind.RESHAPE)) is not None:
        source = inner.inputs[0]
    scaled = single(source, OpKind.ELEMENTWISE)
    if (scaled is None or node.attr("epilogue") or len(node.inputs) != 2 or a.dtype != "float32"
            or scaled.attr("expr") != (Step("mul", (0, 1)),) or a.shape[-1] != scaled.output.shape[-1]):
        return None
    rows = scaled.output.shape[:-1] + (1,)
    x, r = scaled.inputs if scaled.inputs[1].shape == rows else scaled.inputs[::-1]
    if x.shape != scaled.output.shape or r.shape != rows:
        return None
    nodes = []
    if view:
        x_view = Value(next(ids), a.shape, a.dtype)
        nodes.append(Node(OpKind.RESHAPE, (x,), x_view, view.attrs, view.name))
        x = x_view
    row_shape = node.output.shape[:-1] + (1,)
    if r.shape != row_shape:
        r_view = Value(next(ids), row_shape, r.dtype)
        nodes.append(Node(OpKind.RESHAPE, (r,), r_view, (), f"{scaled.name}/rows"))
        r = r_view
    product = Value(next(ids), node.output.shape, node.output.dtype)
    nodes.append(Node(OpKind.MATMUL, (x, node.inputs[1]), product, node.attrs, node.name))
    nodes.append(Node(OpKind.ELEMENTWISE, (product, r), node.output, scaled.attrs, scaled.name))
    return nodes


def compose(outer_inputs, outer_expr: Expr, k: int, inner_inputs, inner_expr: Expr):
    """Substitute `inner` (an expr over inner_inputs) for input k of `outer`, and for every other
    input of `outer` that is the same value (`y * y` reads y twice and absorbs its producer once).

    Returns (inputs, expr) over inner_inputs + the other outer inputs, with repeated inputs merged.
    An empty inner expr is the identity on its input 0.
    """
    m, n = len(inner_inputs), len(outer_inputs)
    replaced = outer_inputs[k].id
    rest = [i for i in range(n) if outer_inputs[i].id != replaced]
    position = {i: m + j for j, i in enumerate(rest)}
    base = m + len(rest)
    inner_result = (base + len(inner_expr) - 1) if inner_expr else 0

    def outer_ref(a):
        if a < n:
            return position.get(a, inner_result)
        return base + len(inner_expr) + (a - n)

    def inner_ref(a):
        return a if a < m else base + (a - m)

    steps = [Step(s.func, tuple(inner_ref(a) for a in s.args)) for s in inner_expr]
    steps += [Step(s.func, tuple(outer_ref(a) for a in s.args)) for s in outer_expr]
    inputs = list(inner_inputs) + [outer_inputs[i] for i in rest]
    return dedupe(inputs, tuple(steps))


def dedupe(inputs, expr: Expr):
    """Merge repeated inputs of an expr (keeping input 0 first)."""
    first, keep = {}, []
    remap = {}
    for i, v in enumerate(inputs):
        key = v.id
        if key not in first:
            first[key] = len(keep)
            keep.append(v)
        remap[i] = first[key]
    n_old, n_new = len(inputs), len(keep)

    def ref(a):
        return remap[a] if a < n_old else n_new + (a - n_old)
    return keep, tuple(Step(s.func, tuple(ref(a) for a in s.args)) for s in expr)


def _fuse(graph: Graph, consumer_ok, absorb) -> Graph:
    """Absorb single-use producers into their consumer, at the consumer's position."""
    uses, outputs, producer = _uses(graph)
    removed = set()
    nodes = list(graph.nodes)
    for i, node in enumerate(nodes):
        if not consumer_ok(node):
            continue
        changed = True
        while changed and consumer_ok(node):
            changed = False
            for k, v in enumerate(node.inputs):
                p = producer.get(v.id)
                if (p is not None and p.name not in removed and uses.get(v.id) == 1 and v.id not in outputs
                        and p.output.shape == node.output.shape):
                    fused = absorb(p, node, k)
                    if fused is not None:
                        removed.add(p.name)
                        node = fused
                        changed = True
                        break
        nodes[i] = node
        producer[node.output.id] = node
    return Graph(graph.inputs, graph.outputs, tuple(n for n in nodes if n.name not in removed), graph.constants)


def fuse_elementwise(graph: Graph) -> Graph:
    """Chains of elementwise nodes become one node: no DRAM round trip between them."""
    def absorb(p: Node, node: Node, k: int):
        if p.op != OpKind.ELEMENTWISE:
            return None
        inputs, expr = compose(node.inputs, node.attr("expr"), k, p.inputs, p.attr("expr"))
        return Node(OpKind.ELEMENTWISE, tuple(inputs), node.output, (("expr", expr),), node.name)
    return _fuse(graph, lambda n: n.op == OpKind.ELEMENTWISE, absorb)


def fuse_epilogues(graph: Graph) -> Graph:
    """An elementwise consumer of a CONV/MATMUL result runs on the accumulator tile before the
    store; the fused node takes the consumer's place in the node order."""
    def absorb(p: Node, node: Node, k: int):
        if p.op not in MATRIX_OPS or _masks_scores(p, node, graph):
            return None
        acc = p.output
        inputs, expr = compose(node.inputs, node.attr("expr"), k, (acc,) + p.inputs[2:], p.attr("epilogue") or ())
        if inputs[0] != acc or acc in inputs[1:]:
            return None
        return Node(p.op, p.inputs[:2] + tuple(inputs[1:]), node.output,
                    _attrs(p, epilogue=expr), f"{p.name}+{node.name}")
    return _fuse(graph, lambda n: n.op == OpKind.ELEMENTWISE, absorb)


def _masks_scores(p: Node, node: Node, graph: Graph) -> bool:
    """Whether `node` selects over `p`'s result, a MATMUL of two activations (attention's scores and
    their mask): the mask stays a layer of its own, which flash attention (lower.schedule.flash)
    matches, as where a view between them keeps it apart (heads as a 4-D batch)."""
    return (p.op == OpKind.MATMUL and p.inputs[1].id not in graph.constants
            and any(s.func == "select" for s in node.attr("expr")))


def _attrs(node: Node, **changes) -> tuple:
    attrs = dict(node.attrs)
    attrs.update(changes)
    return tuple(sorted((k, v) for k, v in attrs.items() if v is not None))


def prune(inputs, expr: Expr):
    """Drop expr inputs no step reads (input 0 always stays)."""
    used = {0} | {a for s in expr for a in s.args if a < len(inputs)}
    keep = [i for i in range(len(inputs)) if i in used]
    remap = {old: new for new, old in enumerate(keep)}
    n_old, n_new = len(inputs), len(keep)

    def ref(a):
        return remap[a] if a < n_old else n_new + (a - n_old)
    return [inputs[i] for i in keep], tuple(Step(s.func, tuple(ref(a) for a in s.args)) for s in expr)


def fold_affine(graph: Graph) -> Graph:
    """Per-channel scales and shifts leading a CONV/MATMUL epilogue fold into its constant
    weights and one bias (batch norm in inference disappears into the convolution)."""
    consts = dict(graph.constants)
    ids = graph.fresh_ids()
    nodes = []
    for node in graph.nodes:
        folded = _fold_node(node, consts) if node.op in MATRIX_OPS else None
        if folded is None:
            nodes.append(node)
            continue
        w_new, bias, used, cur = folded
        expr, n_in = node.attr("epilogue"), len(node.inputs) - 1
        new_w = Value(next(ids), node.inputs[1].shape)
        consts[new_w.id] = w_new
        inputs, steps = [node.output] + list(node.inputs[2:]), []   # input 0: the accumulator placeholder
        if bias is not None:
            b = Value(next(ids), bias.shape)
            consts[b.id] = bias
            inputs.append(b)
            steps.append(Step("add", (0, n_in)))
        n_new, lead = len(inputs), len(steps)
        cur_new = n_new if bias is not None else 0

        def ref(a, cur=cur, cur_new=cur_new, n_in=n_in, n_new=n_new, lead=lead, used=used):
            if a == cur:
                return cur_new
            return a if a < n_in else n_new + lead + (a - n_in - used)
        steps += [Step(s.func, tuple(ref(a) for a in s.args)) for s in expr[used:]]
        inputs, steps = prune(inputs, tuple(steps))
        nodes.append(Node(node.op, (node.inputs[0], new_w) + tuple(inputs[1:]), node.output,
                          _attrs(node, epilogue=steps or None), node.name))
    return dce(Graph(graph.inputs, graph.outputs, tuple(nodes), MappingProxyType(consts)))


def _per_channel(arr: np.ndarray, out_shape, axis: int) -> np.ndarray | None:
    """arr as a vector over the channel axis of out_shape (broadcast), or None."""
    arr = np.asarray(arr, np.float32)
    rank = len(out_shape)
    if arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + arr.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis % rank):
        return None
    return np.broadcast_to(arr.reshape(-1), (out_shape[axis],)).astype(np.float32)


def _fold_node(node: Node, consts):
    """(scaled weights, bias or None, steps consumed, index of the folded value) or None."""
    expr = node.attr("epilogue")
    w = node.inputs[1]
    if not expr or w.id not in consts:
        return None
    axis = 1 if node.op == OpKind.CONV else -1
    channels = node.output.shape[axis]
    scale = np.ones(channels, np.float32)
    shift = np.zeros(channels, np.float32)
    n_in = len(node.inputs) - 1   # epilogue inputs: acc + extras
    cur, prefixes = 0, []   # (scale, shift, steps used, the value they give) after each affine step
    for j, step in enumerate(expr):
        if step.func not in ("add", "sub", "mul") or cur not in step.args or len(set(step.args)) != 2:
            break
        other = step.args[1] if step.args[0] == cur else step.args[0]
        if other >= n_in or (step.func == "sub" and step.args[0] != cur):
            break
        v = node.inputs[1 + other]
        vec = _per_channel(consts[v.id], node.output.shape, axis) if v.id in consts else None
        if vec is None:
            break
        if step.func == "mul":
            scale, shift = scale * vec, shift * vec
        else:
            shift = shift + vec if step.func == "add" else shift - vec
        cur = n_in + j
        prefixes.append((scale, shift, j + 1, cur))
    # Folding changes the accumulator; nothing after may read it or a value folded on the way, so
    # fold the longest prefix whose values the rest does not read (hardswish reads x after x + 3).
    legal = [p for p in prefixes
             if not any(a < n_in + p[2] and a != p[3] and a >= n_in or a == 0 for s in expr[p[2]:] for a in s.args)]
    if not legal:
        return None
    scale, shift, used, cur = legal[-1]
    w_new = np.asarray(consts[w.id], np.float32)
    if (scale != 1).any():   # a bias alone (every linear layer) leaves the weights as they are: no copy
        w_new = w_new * (scale.reshape(-1, 1, 1, 1) if node.op == OpKind.CONV else scale)
    bias = shift.reshape((1, -1, 1, 1) if node.op == OpKind.CONV else (-1,)) if shift.any() else None
    return w_new, bias, used, cur
