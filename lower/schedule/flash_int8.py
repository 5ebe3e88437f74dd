"""int8 attention as one cascade: its int8 score rows stay in the scratchpad, never in DRAM.

What quantization makes of attention (lower.graph.quantize, its softmax a float island): S = requant(Q @ K^T)
(int8 x int8 -> int32 on the array, requantized to int8), m = max(S) over S's rows (int8), mf = m
dequantized (the island's float), E = exp(S * s - mf), l = sum(E) over the rows, r = recip(l), P =
quantize(E) (int8 at the fixed scale calibration gave E, in [0, 1]), O = (P @ V) times r and
requantized in P·V's epilogue.  Layer by layer S, E, P and their row vectors go to DRAM and back
(Whisper-tiny: 77% of the int8 encoder's DRAM traffic).  Masked (BERT's padding mask), the float
island starts one layer earlier: Sf = S dequantized with the fill SELECTed where the mask is 0 (one
ELEMENTWISE, bf16 or float32, `MASKED_ROLES`), m = max(Sf) a float row's, E = exp(Sf - m).

Here they run per head and query block of `tq` rows, in two sweeps over key blocks of `tk`:
the first computes S's blocks on the array (int8 Q, K^T) and keeps them, int8, in the scratchpad (a
query block's whole score row: tq x N bytes; masked, the mask's block LOADed per head and the masked
float scores kept instead: tq x N words), their row max running; then mf, and the second
computes each block's E, adds its row sums into l, quantizes it to P and adds P @ V into the output
accumulator (int32).  Last r, P·V's epilogue, one STORE.  The first sweep is the array's work, the
second the vector unit's: pipelined, a block's first sweep runs between the previous block's second
sweep's key blocks (two score rows and row maxes), so the units overlap; else one sweep after the other
(one score row: room for larger blocks).  The mapper chooses by the cost.  Every member computes what its layer
computes, in the same order (the max is the whole row's before any exp, as the layers'): no
online-softmax rescaling, whose exp(m_old - m_new) would change P's int8 values.  Each value the
layers keep in a bf16 island is rounded to bf16 where the layers' STORE rounds it.  The only
difference from the layers: l sums its key blocks in another order (float32), so a requantized
output can land one int8 step apart where a float lies on a rounding boundary.

`int8_flash_cost` counts the instructions lower.codegen.flash_int8 issues, composed as
lower.schedule.flash composes its own; `choose_int8_flash` searches (tq, tk) under the scratchpad and
accumulator and takes the cascade where it beats the layers' lower bound (lower.schedule.flash).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from stagec.isa.instructions import MAX_COUNT, REQUANT_RECORD_BYTES, DType, Space, VectorFunc
from stagec.sim.costs import array_per_pe, matmul_cycles, vector_instruction_cycles
from stagec.sim.energy import ActionCounts

from ..codegen import tile_expr  # the emitter's own expression plan, so both count the same temporaries
from ..graph.graph_ir import RECORDS, OpKind
from .attention_walk import Walk, row_reduce, shared_heads
from .buffers import Buffer, local_bytes, words
from .cascade import CascadeRecord
from .flash import UNSHARED, FlashCost, Mask, _sizes, mask_ways, pays, search_blocks
from .nest_cost import dma_cycles
from .search import objective_of
from .tensors import DTYPE_OF, local_type

F32 = 4
RECORD = REQUANT_RECORD_BYTES    # a constant's slot: a record's size and alignment, at least
ROLES = ("scores", "max", "dequant", "exp", "sum", "recip", "quant", "pv")
MASKED_ROLES = ("scores", "mask", "max", "exp", "sum", "recip", "quant", "pv")
# per query row: the int8 max and its float (masked: the float max), two of each (a block's and the next's,
# lower.codegen.flash_int8 pipelines them), the sum, 1/sum
ROWS = ("m0", "mf0", "m1", "mf1", "l", "r")


@dataclass(frozen=True)
class Int8Attention(CascadeRecord):
    """int8 attention's eight layers (`ROLES`, node names) run over query blocks of tile[0] rows and key
    blocks of tile[1]; `dims` (batch, queries M, keys N, head dim D); `saved_bytes`: the DRAM bytes
    of S, E, P and their row vectors that layer by layer moves."""

    layers: tuple[str, ...]
    tile: tuple[int, int]
    dims: tuple[int, int, int, int]
    saved_bytes: int
    mappings: tuple = ()          # its members keep their own tilings: the cascade's tile is its own
    roles: tuple[str, ...] = ROLES
    mask: Mask = UNSHARED         # how a masked cascade reads its mask
    pipelined: bool = True        # a block's first sweep runs in its predecessor's second (two score rows)

    @property
    def mask_row(self) -> int:
        """A resident mask row's length (the keys), else 0."""
        return self.dims[2] * self.mask.resident

    def __str__(self) -> str:
        return (f"cascade {' -> '.join(self.layers)}: int8 attention, score rows in the scratchpad, query block "
                f"{self.tile[0]}, key block {self.tile[1]}, saves {self.saved_bytes / 1024:.1f} KiB of DRAM")


class Pattern(NamedTuple):
    """A matched int8 attention's nodes (`roles`); masked, `mask` the node that masks the int8 scores,
    the float island's first (BERT's: S dequantized, the fill SELECTed where the mask is 0), and the max
    the float row's (no `dequant`)."""

    scores: object
    row_max: object
    exp: object
    row_sum: object
    recip: object
    quant: object
    pv: object
    dequant: object = None
    mask: object = None

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES if self.mask is None else MASKED_ROLES

    @property
    def nodes(self) -> list:
        return [getattr(self, FIELDS[role]) for role in self.roles]

    def mask_input(self, graph):
        """The mask that the mask node reads (its tensor operand after the scores)."""
        ones = constants(self.mask, graph)
        return [v for v in self.mask.inputs if v.id not in ones][1]


FIELDS = {"scores": "scores", "mask": "mask", "max": "row_max", "dequant": "dequant", "exp": "exp", "sum": "row_sum",
          "recip": "recip", "quant": "quant", "pv": "pv"}


def pattern_of(nodes: list, roles: tuple[str, ...]) -> Pattern:
    """The pattern whose nodes in `roles`' order are `nodes`."""
    return Pattern(**{FIELDS[role]: node for role, node in zip(roles, nodes, strict=True)})


def expr_of(node):
    return node.attr("epilogue") if node.op == OpKind.MATMUL else node.attr("expr")


def constants(node, graph) -> dict:
    """The one-element constants (a scalar, or one record) that `node`'s expression reads, by the input
    that reads each: the constant itself, or a view of one (a mask's fill, broadcast to the scores)."""
    producer, found = graph.producer(), {}
    for v in node.inputs:
        source, p = v, producer.get(v.id)
        while source.id not in graph.constants and p is not None and p.op in (OpKind.BROADCAST, OpKind.RESHAPE):
            source = p.inputs[0]
            p = producer.get(source.id)
        if source.id in graph.constants and (_one(v, node) if source is v else source.size == 1):
            found[v.id] = source
    return found


def n_args(node) -> int:
    """How many arguments `node`'s expression takes: a MATMUL's epilogue, the result and its trailing inputs."""
    return len(node.inputs) - (node.op == OpKind.MATMUL)


def _one(v, node) -> bool:
    records = {s.args[1] for s in expr_of(node) or () if s.func in RECORDS}
    k = node.inputs.index(v) - (node.op == OpKind.MATMUL)     # its argument in the expression
    return math.prod(v.shape[:-1] if k in records else v.shape) == 1


def match(graph, layout, excluded=frozenset()) -> list[Pattern]:
    """Every int8 attention of the module doc's pattern, its layers emitted (views between them emit
    nothing), every intermediate read by the pattern alone, none of them in `excluded`."""
    walk = Walk(graph, layout)
    node_of, readers = walk.node_of, walk.readers

    def others(node, first: int = 0) -> list:
        """The inputs of `node` from `first` on that are not its one-element constants."""
        ones = constants(node, graph)
        return [v for v in node.inputs[first:] if v.id not in ones]

    def single(node, op):
        """The emitted node of `op` that `node`'s one operand (not a constant) views, else None."""
        rest = others(node) if node is not None else ()
        return node_of(rest[0], op) if len(rest) == 1 else None

    found = []
    for pv in graph.nodes:
        if pv.op != OpKind.MATMUL or any(v.dtype != "int8" for v in pv.inputs[:2]) or len(others(pv, 2)) != 1:
            continue
        quant, recip = node_of(pv.inputs[0], OpKind.ELEMENTWISE), node_of(others(pv, 2)[0], OpKind.ELEMENTWISE)
        exp, total = single(quant, OpKind.ELEMENTWISE), single(recip, OpKind.REDUCE)
        if exp is None or total is None or not any(s.func == "exp" for s in exp.attr("expr")):
            continue
        operands = others(exp)     # the scores (masked: the float scores), then the row max (its float)
        if len(operands) != 2:
            continue
        mask = node_of(operands[0], OpKind.ELEMENTWISE)
        if mask is not None:       # the float scores: the int8 scores masked, then the mask (the emitter's order)
            masked_from, dq, mx = others(mask), None, node_of(operands[1], OpKind.REDUCE)
            s = node_of(masked_from[0], OpKind.MATMUL) if _masks(mask, masked_from) else None
        else:
            s, dq = node_of(operands[0], OpKind.MATMUL), node_of(operands[1], OpKind.ELEMENTWISE)
            mx = single(dq, OpKind.REDUCE)
        if s is None or mx is None or any(v.dtype != "int8" for v in (*s.inputs[:2], s.output)) or others(s, 2):
            continue
        p = Pattern(s, mx, exp, total, recip, quant, pv, dq, mask)
        expected = ([{mask.name}, {mx.name, exp.name}] if mask else [{mx.name, exp.name}, {dq.name}]) + [
            {exp.name}, {total.name, quant.name}, {recip.name}, {pv.name}, {pv.name}]
        if (not row_reduce(mx, "max") or not row_reduce(total, "sum")
                or node_of(mx.inputs[0], OpKind.ELEMENTWISE if mask else OpKind.MATMUL) is not (mask or s)
                or node_of(total.inputs[0], OpKind.ELEMENTWISE) is not exp
                or any(readers(n) != want for n, want in zip(p.nodes[:-1], expected, strict=True))
                or any(n.name in excluded for n in p.nodes) or s.output.shape[-1] > MAX_COUNT):
            continue
        found.append(p)
    return found


def _masks(mask, operands: list) -> bool:
    """Whether `mask`'s tensor operands are the scores and then a float mask of their [*batch, M, N] (its
    batch dims' shape may differ: the emitter selects a head of each by its flat index)."""
    if len(operands) != 2 or mask.output.dtype not in FLOATS or operands[1].dtype not in FLOATS:
        return False
    scores, m = mask.output.shape, operands[1].shape
    return m[-2:] == scores[-2:] and math.prod(m[:-2]) == math.prod(scores[:-2])


FLOATS = ("float32", "bfloat16")


def dims_of(p: Pattern) -> tuple[int, int, int, int]:
    *batch, m, n = p.scores.output.shape
    return math.prod(batch), m, n, p.pv.output.shape[-1]


class Shape(NamedTuple):
    """What the cost and the buffers need of a pattern: dims, each member's expression steps (their
    instructions' function, dtype, out_dtype: lower.codegen.tile_expr.step_instructions),
    the roles whose values round to bf16, the temporaries an expression needs, the output's bytes per
    element, the number of constants, the bytes of the largest and of them all, how it reads a mask
    (None: unmasked)."""

    dims: tuple[int, int, int, int]
    steps: dict
    rounded: frozenset
    temps: int
    out_itemsize: int
    n_consts: int
    const_bytes: int
    const_read: int
    mask: Mask | None = None
    pipelined: bool = True


def _held(node) -> list[DType]:
    """The element types of `node`'s expression inputs as lower.codegen.flash_int8 holds them: a MATMUL's
    int32 accumulator, then its trailing inputs; each LOADed value as the vector unit holds it."""
    first = 2 * (node.op == OpKind.MATMUL)
    return [DType.I32] * (first // 2) + [local_type(DTYPE_OF[v.dtype]) for v in node.inputs[first:]]


def shape_of(p: Pattern, graph, layout, resident: bool = False, pipelined: bool = True) -> Shape:
    """`p`'s Shape, a mask its heads share read `resident` or per key block, its blocks `pipelined` or not."""
    steps = {role: tuple(tile_expr.step_instructions(expr_of(n) or (), _held(n)))
             for role, n in zip(p.roles, p.nodes, strict=True) if n.op != OpKind.REDUCE}
    temps = max(tile_expr.plan(expr_of(n) or (), n_args(n), frozenset()).temps
                for n in p.nodes if n.op != OpKind.REDUCE)
    consts = {v.id: v for n in p.nodes for v in constants(n, graph).values()}
    mask = p.mask and Mask(DTYPE_OF[p.mask_input(graph).dtype].itemsize,
                           shared_heads(p.mask_input(graph), Walk(graph, layout)), resident)
    return Shape(dims_of(p), steps,
                 frozenset(r for r, n in zip(p.roles, p.nodes, strict=True) if n.output.dtype == "bfloat16"),
                 max(temps, 1), DTYPE_OF[p.pv.output.dtype].itemsize, len(consts),
                 -(-max((graph.constants[v].nbytes for v in consts), default=F32) // RECORD) * RECORD,
                 sum(graph.constants[v].nbytes for v in consts), mask or None, pipelined)


def int8_flash_buffers(sh: Shape, tq: int, tk: int) -> list[Buffer]:
    """Q's block, K^T's and V's blocks (two each), the score row (two where pipelined: a block's and the
    next's; int8, every key block; masked, the float scores' rows, an int8 block and the mask's blocks,
    two), E's and P's blocks (two each), the temporaries and the bf16 rounding's scratch, the row
    statistics, the output's block (one: its STORE has a whole sweep to finish before the next block's
    epilogue), the constants; S's blocks (two) and the output accumulator."""
    _, _, n, d = sh.dims
    wide, nk = max(tk, d) * tq, -(-n // tk)

    def int8(name: str, elements: int, count: int) -> Buffer:
        return Buffer(name, Space.SPAD, words(elements, 1), count)
    rows = (1 + sh.pipelined) * nk
    row = ([Buffer("sf", Space.SPAD, tq * tk * F32, rows), int8("s8", tq * tk, 1),
            Buffer("mask", Space.SPAD, tq * (n if sh.mask.resident else tk) * F32, 2)] if sh.mask
           else [int8("s8", tq * tk, rows)])
    return [int8("q", tq * d, 2), int8("kt", d * tk, 2), int8("v", tk * d, 2), *row,
            Buffer("e", Space.SPAD, tq * tk * F32, 2), int8("p", tq * tk, 2),
            Buffer("temps", Space.SPAD, wide * F32, sh.temps), Buffer("round", Space.SPAD, words(wide * 2, 2)),
            Buffer("rows", Space.SPAD, tq * F32, len(ROWS)),
            Buffer("out", Space.SPAD, words(tq * d * sh.out_itemsize, sh.out_itemsize)),
            Buffer("consts", Space.SPAD, sh.const_bytes, sh.n_consts, align=RECORD),
            Buffer("s", Space.ACC, tq * tk * F32, 2), Buffer("o", Space.ACC, tq * d * F32)]


def _expr(sh: Shape, role: str, elements: int) -> list:
    """(elements, function, dtype, out_dtype, reduced run) of the vector instructions of a member's expression
    over `elements`, and of its bf16 rounding where the layers keep its value bf16: the widening COPY back
    after a last step that rounds as it writes (lower.codegen.tile_expr.emit_rounded), or, with no step (a
    reduction's), tile_expr.ROUNDING's two COPYs.  A select COPYs its on_false (of its operands' type) first,
    as its output's type (lower.codegen.tile_expr.emit; a mask's fill, a constant, is never computed in
    place)."""
    steps, rounded = list(sh.steps.get(role, ())), role in sh.rounded
    if rounded and steps and steps[-1][2] == DType.F32:
        steps[-1] = (*steps[-1][:2], DType.BF16)
    rounding = (tile_expr.ROUNDING[1:] if steps else tile_expr.ROUNDING) if rounded else ()
    return ([(elements, *ins, 1) for ins in steps]
            + [(elements, VectorFunc.COPY, dtype, out, 1) for f, dtype, out in steps if f == VectorFunc.SELECT]
            + [(elements, *ins, 1) for ins in rounding])


def _sweep_vectors(sh: Shape, q: int, t: int) -> tuple[list, list]:
    """One key block of t columns for q query rows (lower.codegen.flash_int8's), in its first sweep: S's
    epilogue, the mask's expression, the running max; in its second: E's expression, its row sums, P's
    expression."""
    top = DType.F32 if sh.mask else DType.I8       # the max runs over the masked float scores, or the int8 ones
    return (_expr(sh, "scores", q * t) + _expr(sh, "mask", q * t) + [(q * t, VectorFunc.RMAX, top, top, t)],
            _expr(sh, "exp", q * t) + [(q * t, VectorFunc.RSUM, DType.F32, DType.F32, t)]
            + _expr(sh, "quant", q * t))


def _end_vectors(sh: Shape, q: int, d: int) -> list:
    """A query block's end: the max dequantized, the sum rounded, r, P·V's epilogue."""
    return _expr(sh, "dequant", q) + _expr(sh, "sum", q) + _expr(sh, "recip", q) + _expr(sh, "pv", q * d)


def int8_flash_cost(sh: Shape, tq: int, tk: int, hw, footprint=None) -> FlashCost:
    """The cost of the cascade in blocks of tq x tk, as lower.codegen.flash_int8 emits it: cycles the
    busiest of the load queue, the DRAM channel, the array and the vector unit (`sh.pipelined`; else the
    first sweeps' busiest plus the second sweeps'), plus the first block's loads.  Its instructions, DRAM
    bytes, MACs and vector ops are the program's exactly; its scratchpad and accumulator bytes (energy
    only) an estimate; `footprint`: those bytes where the caller has them
    (lower.schedule.flash.search_blocks)."""
    b, m, n, d = sh.dims
    per_pe = int(array_per_pe(1, hw))     # int8 x int8 -> int32 matmuls
    t = dict.fromkeys(("ops", "macs", "instructions"), 0.0)
    sweeps = [dict.fromkeys(("matrix", "vector"), 0.0) for _ in range(2)]

    def add(vectors: list, times: int, sweep: int) -> None:
        for elements, func, dtype, out_dtype, run in vectors:
            sweeps[sweep]["vector"] += times * vector_instruction_cycles(func, dtype, out_dtype, elements, hw, run)
            t["ops"] += times * elements
        t["instructions"] += times * len(vectors)

    for q, q_times in _sizes(m, tq):
        for kb, times in _sizes(n, tk):
            reps = b * q_times * times
            for sweep, (inner, outer) in enumerate(((d, kb), (kb, d))):     # Q·K^T, then P·V
                sweeps[sweep]["matrix"] += reps * float(matmul_cycles(q, inner, outer, hw.array_rows, hw.array_cols,
                                                                      hw.dataflow, per_pe=per_pe))
            t["macs"] += reps * 2 * q * kb * d
            t["instructions"] += reps * 2               # two MATMULs (the LOADs: `loads`)
            for sweep, vectors in enumerate(_sweep_vectors(sh, q, kb)):
                add(vectors, reps, sweep)
        add(_end_vectors(sh, q, d), b * q_times, 1)
    nq, nk = -(-m // tq), -(-n // tk)
    mask = sh.mask or Mask(0)
    reads_of_mask = b // mask.heads if mask.resident else b     # heads that LOAD a mask (a resident: per row)
    mask_loads = (sh.mask is not None) * reads_of_mask * nq * (1 if mask.resident else nk)
    firsts = (b * nq * (1 + nk) + sh.n_consts + mask_loads,     # (LOADs, bytes) of Q, K, the constants, the mask
              b * m * d + b * nq * n * d + sh.const_read + reads_of_mask * m * n * mask.itemsize)
    seconds = (b * nq * nk, b * nq * n * d)
    written = b * m * d * sh.out_itemsize
    for sweep, (loads, read), out in ((sweeps[0], firsts, 0), (sweeps[1], seconds, written)):
        sweep.update(load=dma_cycles(loads, read, hw), channel=(read + out) / hw.dma_bandwidth_bytes_per_cycle)
    sweeps[1]["store"] = dma_cycles(b * nq, written, hw)
    units = {u: sum(sweep.get(u, 0.0) for sweep in sweeps) for u in ("load", "store", "channel", "matrix", "vector")}
    busiest = max(units.values()) if sh.pipelined else sum(max(sweep.values()) for sweep in sweeps)
    q0, k0 = min(tq, m), min(tk, n)
    cycles = busiest + dma_cycles(3 + (sh.mask is not None), (q0 + 2 * k0) * d + q0 * (
        n if mask.resident else k0) * mask.itemsize, hw)
    read = firsts[1] + seconds[1]
    acts = ActionCounts(macs_int8=t["macs"], macs_bf16=0.0, macs_fp32=0.0, vector_ops=t["ops"],
                        scratchpad_read_bytes=2 * t["ops"] * F32 + t["macs"] / hw.array_cols,
                        scratchpad_write_bytes=t["ops"] * F32 + read, accumulator_read_bytes=t["ops"] * F32 / 2,
                        accumulator_write_bytes=t["macs"] * F32 / (hw.array_rows * per_pe), dram_read_bytes=read,
                        dram_write_bytes=written)
    return FlashCost(cycles, int(t["instructions"] + firsts[0] + seconds[0] + b * nq), acts, units,
                     *map(int, footprint or local_bytes(int8_flash_buffers(sh, tq, tk))))


def map_int8_flash(sh: Shape, hw, objective: str):
    """(the (tq, tk) of least objective that fits, with its (charged cycles, energy), or None; the shape
    with the way it reads its mask, lower.schedule.flash.mask_ways, and whether its blocks pipeline: two
    score rows overlap the array and the vector unit, one leaves room for larger blocks)."""
    def search(pipelined: bool):
        def blocks(way):
            shape = sh._replace(mask=sh.mask and way, pipelined=pipelined)    # unmasked: no mask's buffers
            return search_blocks(sh.dims[1], sh.dims[2], lambda tq, tk: int8_flash_buffers(shape, tq, tk),
                                 lambda tq, tk, footprint: int8_flash_cost(shape, tq, tk, hw, footprint).charged,
                                 hw, objective)
        mapped, way = mask_ways(sh.mask or UNSHARED, sh.mask is not None, blocks, objective)
        return mapped, sh._replace(mask=sh.mask and way, pipelined=pipelined)
    options = [search(pipelined) for pipelined in (True, False)]
    return min(options, key=lambda o: objective_of(*o[0][1:], objective) if o[0] else math.inf)


def choose_int8_flash(graph, layout, tilings: dict, hw, objective: str, excluded) -> list[Int8Attention]:
    """The int8 attentions (`match`) run as one cascade where a tiling fits and its objective is below a
    lower bound of the layers' own; one that does not fit is never emitted: the layers run alone."""
    chosen = []
    for p in match(graph, layout, excluded):
        mapped, sh = map_int8_flash(shape_of(p, graph, layout), hw, objective)
        taken = pays(p, mapped, tilings, hw, objective)
        if taken is not None:
            chosen.append(Int8Attention(tuple(n.name for n in p.nodes), taken[0], dims_of(p), taken[1], roles=p.roles,
                                        mask=sh.mask or UNSHARED, pipelined=sh.pipelined))
    return chosen
