"""int8 attention (lower.schedule.flash_int8) on the array and the vector unit.

Per head and query block: Q's block is LOADed; the first sweep over key blocks LOADs K^T's block,
computes S's block on the array (int32 in the accumulator), runs S's epilogue (its requantization)
into the block's place in the scratchpad's score row and folds the block into the row max; then the
max is dequantized; the second sweep runs E's expression over each kept block (rounded to bf16 where
the layers keep E bf16), adds its row sums into l, runs P's expression and adds P @ V (V's block
LOADed) into the output accumulator.  Then l rounded, r, P·V's epilogue (r and the requantization),
one STORE.  Every expression is the layer's own, emitted by lower.codegen.tile_expr; each
instruction belongs to the layer it stands for; the cascade is emitted at its last layer.
"""

from __future__ import annotations

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
    bases = em.allocate(int8_flash_buffers(shape_of(p, ctx.graph, ctx.layout, cascade.mask.resident), tq, tk))
    consts, loaded = {}, {}     # by the input that reads it; by the constant
    for role, node in zip(cascade.roles, nodes, strict=True):
        at(role)
        for v, source in constants(node, ctx.graph).items():     # by value id
            if source.id not in loaded:
                loaded[source.id] = _load_constant(ctx, source, bases["consts"][len(loaded)])
            consts[v] = loaded[source.id]
    views = [ctx.tensor(v) for v in (p.scores.inputs[0], p.scores.inputs[1], p.pv.inputs[1], p.pv.output)]
    views += [ctx.tensor(p.mask_input(ctx.graph))] if p.mask else []
    for block, (b, q0, qr, row) in enumerate(query_blocks(em, at, cascade, views, bases)):
        _query_block(em, at, bases, consts, p, [_select(t, b) for t in views], (q0, qr, row), cascade,
                     block * -(-n // tk), block)


def _load_constant(ctx, v, base: int) -> LocalTile:
    """LOAD a one-element constant (a scalar, or one record of words) once; its tile, broadcast over any box."""
    t = ctx.tensor(v)
    words = v.shape[-1] if len(v.shape) and v.size == v.shape[-1] else 1
    ctx.em.load(t.reshape((v.size,)), (0,), (None, None, 0), (1, 1, words), Operand(Space.SPAD, base, (0, 0, 1)))
    return LocalTile(Space.SPAD, base, (1, 1, 1), local_type(t.dtype))


def _query_block(em, at, bases: dict, consts: dict, p: Pattern, head: list, rows_at: tuple, cascade, step: int,
                 block: int) -> None:
    """Query rows q0 .. q0 + qr of one head (`head`: its Q, K^T, V, output and mask views; `rows_at`: q0, qr
    and a resident mask row's base, else 0): `step` key blocks and `block` query blocks came before (the
    double buffers' parities)."""
    (q0, qr, _), (tk, (_, _, n, d)) = rows_at, (cascade.tile[1], cascade.dims)
    q_t, kt_t, v_t, out_t, *mask_t = head
    rows = dict(zip(ROWS, bases["rows"], strict=True))
    qb, ob, o = bases["q"][block % 2], bases["out"][block % 2], bases["o"][0]
    line = (1, qr, 1)

    def expr(node, operands: list, counts, final: LocalTile) -> None:
        """`node`'s expression over the box `counts`: its operands that are not constants, in order, are
        `operands` (a MATMUL's: its result first), its result into `final`, rounded as the layer stores it."""
        first = 2 * (node.op == OpKind.MATMUL)      # a MATMUL's epilogue: its result, then its trailing inputs
        rest = iter(operands[first // 2:])
        args = operands[:first // 2] + [consts[v.id] if v.id in consts else next(rest) for v in node.inputs[first:]]
        plan = tile_expr.plan(expr_of(node), len(args), frozenset())
        temps = [LocalTile(Space.SPAD, b, tuple(counts)) for b in bases["temps"]]
        tile_expr.emit(em, expr_of(node), plan, args, temps, counts, final)
        rounded(node, final)

    def rounded(node, tile: LocalTile) -> None:
        if node.output.dtype == "bfloat16":
            tile_expr.round_bf16(em, tile, bases["round"][0])

    at("scores")
    em.load_box(q_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, qb)
    keys = list(enumerate(range(0, n, tk)))
    # the row the max runs over and exp reads: the int8 scores, or (masked) the float island's masked scores
    masked, kept = p.mask is not None, []
    m8, mf = LocalTile(Space.SPAD, rows["m"], line, DType.I8), LocalTile(Space.SPAD, rows["mf"], line)
    for j, k0 in keys:
        kb, slot = min(tk, n - k0), (step + j) % 2
        counts, kt = (1, qr, kb), bases["kt"][slot]
        at("scores")
        em.load_box(kt_t, (0, k0), (0, 1), (d, kb), Space.SPAD, kt)
        em.matmul(Operand(Space.SPAD, qb, (0, d, 1)), Operand(Space.SPAD, kt, (kb, 1, 0)),
                  Operand(Space.ACC, bases["s"][slot], (0, kb, 1)), 1, qr, d, kb, accumulate=False, dtype=DType.I8)
        s8 = LocalTile(Space.SPAD, bases["s8"][0 if masked else j], counts, DType.I8)
        expr(p.scores, [LocalTile(Space.ACC, bases["s"][slot], counts, DType.I32)], counts, s8)
        row = s8
        if masked:
            at("mask")
            row = LocalTile(Space.SPAD, bases["sf"][j], counts)
            expr(p.mask, [s8, _mask_block(em, bases, mask_t[0], rows_at, (k0, slot), counts)], counts, row)
        kept.append(row)
        at("max")
        top = mf if masked else m8
        em.vector(VectorFunc.RMAX, top.operand(counts), row.operand(counts), None, counts,
                  acc=AccMode.MAX if j else AccMode.OVERWRITE, dtype=top.dtype)
    if not masked:
        at("dequant")
        expr(p.dequant, [m8], line, mf)
    total, r = LocalTile(Space.SPAD, rows["l"], line), LocalTile(Space.SPAD, rows["r"], line)
    for j, k0 in keys:
        kb, slot = min(tk, n - k0), (step + j) % 2
        counts, v = (1, qr, kb), bases["v"][slot]
        e = LocalTile(Space.SPAD, bases["e"][slot], counts)
        pt = LocalTile(Space.SPAD, bases["p"][slot], counts, DType.I8)
        at("exp")
        expr(p.exp, [kept[j], mf], counts, e)
        at("sum")
        em.vector(VectorFunc.RSUM, total.operand(counts), e.operand(counts), None, counts,
                  acc=AccMode.ADD if j else AccMode.OVERWRITE)
        at("quant")
        expr(p.quant, [e], counts, pt)
        at("pv")
        em.load_box(v_t, (k0, 0), (0, 1), (kb, d), Space.SPAD, v)
        em.matmul(Operand(Space.SPAD, pt.base, (0, kb, 1)), Operand(Space.SPAD, v, (d, 1, 0)),
                  Operand(Space.ACC, o, (0, d, 1)), 1, qr, kb, d, accumulate=j > 0, dtype=DType.I8)
    at("sum")
    rounded(p.row_sum, total)
    at("recip")
    expr(p.recip, [total], line, r)
    at("pv")
    counts = (1, qr, d)
    out = LocalTile(Space.SPAD, ob, counts, local_type(DTYPE_OF[p.pv.output.dtype]))
    expr(p.pv, [LocalTile(Space.ACC, o, counts, DType.I32), r], counts, out)
    em.store_box(out_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, ob)


def _mask_block(em, bases: dict, mask_t, rows_at: tuple, keys: tuple, counts) -> LocalTile:
    """The mask's block of `counts` at query rows `rows_at` (q0, qr, a resident row's base or 0) and keys
    from `keys`[0]: a resident row's keys from there on, else LOADed into the block's slot `keys`[1]."""
    (q0, qr, row), (k0, slot) = rows_at, keys
    if row:
        return LocalTile(Space.SPAD, row + k0 * F32, (1, qr, mask_t.shape[-1]))
    em.load_box(mask_t, (q0, k0), (0, 1), (qr, counts[2]), Space.SPAD, bases["mask"][slot])
    return LocalTile(Space.SPAD, bases["mask"][slot], counts)
