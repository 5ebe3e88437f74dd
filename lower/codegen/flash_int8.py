"""int8 attention (lower.schedule.flash_int8) on the array and the vector unit.

Per head and query block: Q's block is LOADed; the first sweep over key blocks LOADs K^T's block,
computes S's block on the array (int32 in the accumulator), runs S's epilogue (its requantization)
into the block's place in the scratchpad's score row and folds the block into the row max; then the
max is dequantized; the second sweep runs E's expression over each kept block (rounded to bf16 where
the layers keep E bf16), adds its row sums into l, runs P's expression and adds P @ V (V's block
LOADed) into the output accumulator.  Then l rounded, r, P·V's epilogue (r and the requantization),
one STORE.  Pipelined (the mapper's choice), each block's first sweep is emitted between its
predecessor's second sweep's key blocks (`_Blocks`), so the array's work overlaps the vector unit's.
Every expression is the layer's own, emitted by lower.codegen.tile_expr; each instruction belongs
to the layer it stands for; the cascade is emitted at its last layer.
"""

from __future__ import annotations

from typing import NamedTuple

from stagec.isa.instructions import AccMode, DType, Operand, Space, VectorFunc

from ..graph.graph_ir import OpKind
from ..schedule.flash_int8 import F32, ROWS, Pattern, constants, expr_of, int8_flash_buffers, pattern_of, shape_of
from ..schedule.tensors import DTYPE_OF, local_type
from . import tile_expr
from .flash import _select, query_blocks

LocalTile = tile_expr.LocalTile


def emit_int8_flash(ctx, cascade, nodes: list, layers: list[int]) -> None:
    """Emit `cascade` (an Int8Attention) whose layers are `nodes`, layer indices `layers`."""
    em, p = ctx.em, pattern_of(nodes, cascade.roles)
    where = {role: (layer, node.name) for role, layer, node in zip(cascade.roles, layers, nodes, strict=True)}

    def at(role: str) -> None:
        em.layer, em.layer_name = where[role]

    at("scores")
    n, (tq, tk) = cascade.dims[2], cascade.tile
    bases = em.allocate(int8_flash_buffers(shape_of(p, ctx.graph, ctx.layout, cascade.mask.resident,
                                                    cascade.pipelined), tq, tk))
    consts, loaded = {}, {}     # by the input that reads it; by the constant
    for role, node in zip(cascade.roles, nodes, strict=True):
        at(role)
        for v, source in constants(node, ctx.graph).items():     # by value id
            if source.id not in loaded:
                loaded[source.id] = _load_constant(ctx, source, bases["consts"][len(loaded)])
            consts[v] = loaded[source.id]
    views = [ctx.tensor(v) for v in (p.scores.inputs[0], p.scores.inputs[1], p.pv.inputs[1], p.pv.output)]
    views += [ctx.tensor(p.mask_input(ctx.graph))] if p.mask else []
    run = _Blocks(em, at, bases, consts, p, cascade)
    pending = None      # the query block whose second sweep is still to emit
    for block, (b, q0, qr, row) in enumerate(query_blocks(em, at, cascade, views, bases)):
        now = _Block([_select(t, b) for t in views], q0, qr, row, block, block * -(-n // tk))
        run.start(now)
        if pending is None:
            for j in range(len(run.keys)):
                run.scores(now, j)
                run.scores_vectors(now, j)
        else:
            run.sweep(pending, now)
        pending = now
        if not cascade.pipelined:
            run.sweep(pending, None)
            pending = None
    if pending is not None:
        run.sweep(pending, None)


def _load_constant(ctx, v, base: int) -> LocalTile:
    """LOAD a one-element constant (a scalar, or one record of words) once; its tile, broadcast over any box."""
    t = ctx.tensor(v)
    words = v.shape[-1] if len(v.shape) and v.size == v.shape[-1] else 1
    ctx.em.load(t.reshape((v.size,)), (0,), (None, None, 0), (1, 1, words), Operand(Space.SPAD, base, (0, 0, 1)))
    return LocalTile(Space.SPAD, base, (1, 1, 1), local_type(t.dtype))


class _Block(NamedTuple):
    """One head's query rows q0 .. q0 + qr: its Q, K^T, V, output and mask views (`head`), a resident
    mask row's base (else 0), its index among the blocks and the key blocks before it (the double
    buffers' parities)."""

    head: list
    q0: int
    qr: int
    row: int
    index: int
    step: int


class _Blocks:
    """The query blocks' instructions, software-pipelined where the cascade is: a block's first sweep (S on
    the array, its requantization and row max: the array's work) runs a key block at a time between its
    predecessor's second sweep's key blocks (E, P and P @ V: the vector unit's), so the two units overlap;
    each block's score row and row maxes are double-buffered (by its index's parity) for that."""

    def __init__(self, em, at, bases: dict, consts: dict, p: Pattern, cascade):
        self.em, self.at, self.bases, self.consts, self.p = em, at, bases, consts, p
        (self.tk, (_, _, self.n, self.d)) = cascade.tile[1], cascade.dims
        self.keys = list(range(0, self.n, self.tk))
        self.rows = dict(zip(ROWS, bases["rows"], strict=True))
        self.parities = 1 + cascade.pipelined     # of the score rows and row maxes

    def expr(self, node, operands: list, counts, final: LocalTile) -> None:
        """`node`'s expression over the box `counts`: its operands that are not constants, in order, are
        `operands` (a MATMUL's: its result first), its result into `final`, rounded as the layer stores it
        (by its last step, tile_expr.emit_rounded)."""
        first = 2 * (node.op == OpKind.MATMUL)      # a MATMUL's epilogue: its result, then its trailing inputs
        rest = iter(operands[first // 2:])
        args = operands[:first // 2] + [self.consts[v.id] if v.id in self.consts else next(rest)
                                        for v in node.inputs[first:]]
        plan = tile_expr.plan(expr_of(node), len(args), frozenset())
        temps = [LocalTile(Space.SPAD, b, tuple(counts)) for b in self.bases["temps"]]
        if node.output.dtype == "bfloat16":
            tile_expr.emit_rounded(self.em, expr_of(node), plan, args, temps, counts, final, self.bases["round"][0])
        else:
            tile_expr.emit(self.em, expr_of(node), plan, args, temps, counts, final)

    def line(self, b: _Block, name: str, dtype: DType = DType.F32) -> LocalTile:
        """Row statistic `name` of block `b` (the maxes: of its parity, ROWS)."""
        key = f"{name}{b.index % self.parities}" if name in ("m", "mf") else name
        return LocalTile(Space.SPAD, self.rows[key], (1, b.qr, 1), dtype)

    def kept(self, b: _Block, j: int) -> LocalTile:
        """Key block j of `b`'s score row: the int8 scores, or (masked) the float island's masked scores."""
        counts, at = (1, b.qr, min(self.tk, self.n - self.keys[j])), (b.index % self.parities) * len(self.keys) + j
        return (LocalTile(Space.SPAD, self.bases["sf"][at], counts) if self.p.mask is not None
                else LocalTile(Space.SPAD, self.bases["s8"][at], counts, DType.I8))

    def start(self, b: _Block) -> None:
        self.at("scores")
        self.em.load_box(b.head[0], (b.q0, 0), (0, 1), (b.qr, self.d), Space.SPAD, self.bases["q"][b.index % 2])

    def scores(self, b: _Block, j: int) -> None:
        """S's key block j on the array: K^T's block LOADed, int32 into the accumulator."""
        k0, slot = self.keys[j], (b.step + j) % 2
        kb, kt, qb = min(self.tk, self.n - k0), self.bases["kt"][slot], self.bases["q"][b.index % 2]
        self.at("scores")
        self.em.load_box(b.head[1], (0, k0), (0, 1), (self.d, kb), Space.SPAD, kt)
        self.em.matmul(Operand(Space.SPAD, qb, (0, self.d, 1)), Operand(Space.SPAD, kt, (kb, 1, 0)),
                       Operand(Space.ACC, self.bases["s"][slot], (0, kb, 1)), 1, b.qr, self.d, kb,
                       accumulate=False, dtype=DType.I8)

    def scores_vectors(self, b: _Block, j: int) -> None:
        """S's key block j requantized into its place in the score row (masked: into the int8 block, then
        the mask's expression into the row), folded into the row max."""
        em, p, slot, row = self.em, self.p, (b.step + j) % 2, self.kept(b, j)
        counts = row.extent
        s8 = row if p.mask is None else LocalTile(Space.SPAD, self.bases["s8"][0], counts, DType.I8)
        self.at("scores")
        self.expr(p.scores, [LocalTile(Space.ACC, self.bases["s"][slot], counts, DType.I32)], counts, s8)
        if p.mask is not None:
            self.at("mask")
            mask = _mask_block(em, self.bases, b.head[4], (b.q0, b.qr, b.row), (self.keys[j], slot), counts)
            self.expr(p.mask, [s8, mask], counts, row)
        self.at("max")
        top = self.line(b, "m", DType.I8) if p.mask is None else self.line(b, "mf")
        em.vector(VectorFunc.RMAX, top.operand(counts), row.operand(counts), None, counts,
                  acc=AccMode.MAX if j else AccMode.OVERWRITE, dtype=top.dtype)

    def sweep(self, b: _Block, after: _Block | None) -> None:
        """`b`'s second sweep, then its end; `after`'s first sweep (if any) between its key blocks: S's
        block on the array before the vector unit's work on b's, its requantization and max after."""
        em, p = self.em, self.p
        mf, total, r = self.line(b, "mf"), self.line(b, "l"), self.line(b, "r")
        if p.mask is None:
            self.at("dequant")
            self.expr(p.dequant, [self.line(b, "m", DType.I8)], mf.extent, mf)
        for j, k0 in enumerate(self.keys):
            if after is not None:
                self.scores(after, j)
            kb, slot = min(self.tk, self.n - k0), (b.step + j) % 2
            counts, v = (1, b.qr, kb), self.bases["v"][slot]
            e = LocalTile(Space.SPAD, self.bases["e"][slot], counts)
            pt = LocalTile(Space.SPAD, self.bases["p"][slot], counts, DType.I8)
            self.at("exp")
            self.expr(p.exp, [self.kept(b, j), mf], counts, e)
            self.at("sum")
            em.vector(VectorFunc.RSUM, total.operand(counts), e.operand(counts), None, counts,
                      acc=AccMode.ADD if j else AccMode.OVERWRITE)
            self.at("quant")
            self.expr(p.quant, [e], counts, pt)
            self.at("pv")
            em.load_box(b.head[2], (k0, 0), (0, 1), (kb, self.d), Space.SPAD, v)
            em.matmul(Operand(Space.SPAD, pt.base, (0, kb, 1)), Operand(Space.SPAD, v, (self.d, 1, 0)),
                      Operand(Space.ACC, self.bases["o"][0], (0, self.d, 1)), 1, b.qr, kb, self.d,
                      accumulate=j > 0, dtype=DType.I8)
            if after is not None:
                self.scores_vectors(after, j)
        self.at("sum")
        if p.row_sum.output.dtype == "bfloat16":
            tile_expr.round_bf16(em, total, self.bases["round"][0])
        self.at("recip")
        self.expr(p.recip, [total], total.extent, r)
        self.at("pv")
        counts, ob = (1, b.qr, self.d), self.bases["out"][0]
        out = LocalTile(Space.SPAD, ob, counts, local_type(DTYPE_OF[p.pv.output.dtype]))
        self.expr(p.pv, [LocalTile(Space.ACC, self.bases["o"][0], counts, DType.I32), r], counts, out)
        em.store_box(b.head[3], (b.q0, 0), (0, 1), (b.qr, self.d), Space.SPAD, ob)


def _mask_block(em, bases: dict, mask_t, rows_at: tuple, keys: tuple, counts) -> LocalTile:
    """The mask's block of `counts` at query rows `rows_at` (q0, qr, a resident row's base or 0) and keys
    from `keys`[0]: a resident row's keys from there on, else LOADed into the block's slot `keys`[1]."""
    (q0, qr, row), (k0, slot) = rows_at, keys
    if row:
        return LocalTile(Space.SPAD, row + k0 * F32, (1, qr, mask_t.shape[-1]))
    em.load_box(mask_t, (q0, k0), (0, 1), (qr, counts[2]), Space.SPAD, bases["mask"][slot])
    return LocalTile(Space.SPAD, bases["mask"][slot], counts)
