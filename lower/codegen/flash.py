"""Flash attention (lower.schedule.flash) on the array and the vector unit.

Per batch (head) and query block: Q's block is LOADed; per key block, K^T's and V's blocks are
LOADed, the array computes S = Q K^T into the accumulator, the vector unit keeps the online
softmax in the scratchpad's row statistics (`block_vectors`' order: the row max; but for the first
block, the running max and alpha = exp(m_old - m_new); P = exp(S - m) into the scratchpad; l
scaled by alpha and P's row sums added; the output accumulator scaled by alpha), and the array
adds P V into the output accumulator.  Then r = 1/l, the output times r, one STORE.  The running
max alternates between two row buffers.  A bf16 graph's: Q, K^T and V LOADed as bf16 for the array,
S, P, l and r rounded to bf16 where the layers store them (lower.codegen.tile_expr.round_bf16; P's
rounding is the array's bf16 operand).  Each instruction belongs to the layer it stands for
(S's matmul, the max, the exp, the sum, the recip, the P·V matmul); the cascade is emitted at its
last layer, when V, its last input, has been computed.
"""

from __future__ import annotations

import itertools

import numpy as np

from stagec.isa.instructions import AccMode, DType, Operand, Space, VectorFunc

from ..schedule.attention_walk import mask_inputs
from ..schedule.flash import CONSTS, F32, ROWS, flash_buffers
from .tile_expr import LocalTile, round_bf16, widen_bf16


def emit_flash(ctx, cascade, nodes: list, layers: list[int]) -> None:
    """Emit `cascade` (a FlashAttention) whose layers are `nodes`, layer indices `layers`."""
    em = ctx.em
    where = {role: (layer, node.name) for role, layer, node in zip(cascade.roles, layers, nodes, strict=True)}

    def at(role: str) -> None:
        em.layer, em.layer_name = where[role]

    at("scores")
    _, _, n, d = cascade.dims
    tq, tk = cascade.tile
    masked = cascade.fill is not None
    bases = em.allocate(flash_buffers(tq, tk, d, masked, cascade.bf16, cascade.mask_row))
    consts = dict(zip(CONSTS, bases["consts"], strict=True))
    # a -inf fill held as float32's lowest: a key block whose every key a row masks then gives the row
    # a finite running max, which the next block's alpha = exp(m_old - m_new) = 0 wipes out (with -inf,
    # exp(-inf - -inf) would be NaN); exp(lowest - m) is 0 like exp(-inf - m)
    fill = None if cascade.fill is None else max(cascade.fill, float(np.finfo(np.float32).min))
    for name, value, role in (("scale", cascade.scale, "scores"), ("fill", fill, "mask"),
                              ("zero", 0.0 if masked else None, "mask")):
        if value is not None:
            at(role)
            ctx.fill(Operand(Space.SPAD, consts[name], (0, 0, 1)), (1, 1, 1), value)
    scores, pv = nodes[0], nodes[-1]
    views = [ctx.tensor(v) for v in (scores.inputs[0], scores.inputs[1], pv.inputs[1], pv.output)]
    views += [ctx.tensor(mask_inputs(nodes[1]).pred)] if masked else []
    zero = Operand(Space.SPAD, consts["zero"], (0, 0, 0)) if masked else None
    for block, (b, q0, qr, row) in enumerate(query_blocks(em, at, cascade, views, bases, zero)):
        _query_block(em, at, bases, cascade, [_select(t, b) for t in views], (q0, qr, row), block * -(-n // tk),
                     block)


def query_blocks(em, at, cascade, views: list, bases: dict, zero: Operand | None = None):
    """(head, q0, qr, the base of a resident mask row or 0) of each query block in emission order: the
    heads that share a resident mask row one after another per query block, the row LOADed (at the mask's
    layer) before the first of them (its zeros found against `zero` where given: the float cascade's
    CMP_EQ, lower.schedule.flash.mask_zeros)."""
    _, m, n, _ = cascade.dims
    tq, heads = cascade.tile[0], cascade.mask.heads if cascade.mask_row else 1
    for count, (outer, q0) in enumerate(itertools.product(range(0, cascade.dims[0], heads), range(0, m, tq))):
        qr, row = min(tq, m - q0), 0
        if cascade.mask_row:
            at("mask")
            row = bases["mask"][count % 2]
            em.load_box(_select(views[4], outer), (q0, 0), (0, 1), (qr, n), Space.SPAD, row)
            if zero is not None:
                found = Operand(Space.SPAD, row, (0, n, 1))
                em.vector(VectorFunc.CMP_EQ, found, found, zero, (1, qr, n))
        for b in range(outer, outer + heads):
            yield b, q0, qr, row


def _query_block(em, at, bases: dict, cascade, head: list, rows_at: tuple, step: int, block: int) -> None:
    """Rows q0..q0+qr of one head (`head`: its Q, K^T, V, output and mask views; `rows_at`: q0, qr and the
    base of a resident mask row, else 0): `step` key blocks and `block` query blocks came before (the
    double buffers' parities)."""
    q_t, kt_t, v_t, out_t, *mask_t = head
    q0, qr, mask_row = rows_at
    _, _, n, d = cascade.dims
    tk = cascade.tile[1]
    rows = dict(zip(ROWS, bases["rows"], strict=True))
    qb, ob, o = bases["q"][block % 2], bases["out"][block % 2], bases["o"][0]
    dtype = DType.BF16 if cascade.bf16 else DType.F32    # the array's operands, as LOADed
    local = dtype if cascade.bf16 else None

    def rounded(role: str, base: int, space: Space, counts) -> None:
        if cascade.bf16:
            at(role)
            round_bf16(em, LocalTile(space, base, counts), bases["round"][0])

    at("scores")
    em.load_box(q_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, qb, local=local)
    keys = range(0, n, tk)

    def scores(j: int) -> None:
        """K^T's block j and S_j = Q K^T_j (and the mask's block), into the buffers of block j's parity."""
        k0, slot = keys[j], (step + j) % 2
        kb, kt = min(tk, n - k0), bases["kt"][slot]
        at("scores")
        em.load_box(kt_t, (0, k0), (0, 1), (d, kb), Space.SPAD, kt, local=local)
        em.matmul(Operand(Space.SPAD, qb, (0, d, 1)), Operand(Space.SPAD, kt, (kb, 1, 0)),
                  Operand(Space.ACC, bases["s"][slot], (0, kb, 1)), 1, qr, d, kb, accumulate=False, dtype=dtype)
        if mask_t and not mask_row:
            at("mask")
            em.load_box(mask_t[0], (q0, k0), (0, 1), (qr, kb), Space.SPAD, bases["mask"][slot])

    scores(0)
    cur, nxt = rows["m"], rows["m_next"]
    for j, k0 in enumerate(keys):
        if j + 1 < len(keys):   # the array computes the next block's scores while the vector unit works
            scores(j + 1)
        kb, first, slot = min(tk, n - k0), j == 0, (step + j) % 2
        v, p = bases["v"][slot], bases["p"][slot]
        at("pv")
        em.load_box(v_t, (k0, 0), (0, 1), (kb, d), Space.SPAD, v, local=local)
        mask = mask_t and (Operand(Space.SPAD, mask_row + k0 * F32, (0, n, 1)) if mask_row
                           else Operand(Space.SPAD, bases["mask"][slot], (0, kb, 1)))
        _finish_scores(em, at, bases, cascade, (slot, qr, kb), mask, rounded)
        pb = bases["pb"][slot] if cascade.bf16 else None     # P rounded to bf16, the array's operand
        cur, nxt = _softmax_block(em, at, rows, cur, nxt, (bases["s"][slot], p, pb), o, qr, kb, d, first)
        at("pv")
        em.matmul(Operand(Space.SPAD, pb or p, (0, kb, 1)), Operand(Space.SPAD, v, (d, 1, 0)),
                  Operand(Space.ACC, o, (0, d, 1)), 1, qr, kb, d, accumulate=not first, dtype=dtype)
    rounded("sum", rows["l"], Space.SPAD, (1, 1, qr))
    at("recip")
    em.vector(VectorFunc.RECIP, _row(rows["rowwise"]), _row(rows["l"]), None, (1, 1, qr))
    rounded("recip", rows["rowwise"], Space.SPAD, (1, 1, qr))
    at("pv")
    em.vector(VectorFunc.MUL, Operand(Space.SPAD, ob, (0, d, 1)), Operand(Space.ACC, o, (0, d, 1)),
              _col(rows["rowwise"]), (1, qr, d))
    em.store_box(out_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, ob)


def _finish_scores(em, at, bases: dict, cascade, block: tuple, mask: Operand, rounded) -> None:
    """S's block (`block`: its slot, rows and keys) as the layers compute it (lower.schedule.flash.
    score_vectors): times the scale, rounded where the scores' layer stores it (bf16); the fill where
    the mask (`mask`, its block) is zero, its zeros found here but in a resident row (the fill held at
    float32's lowest, not rounded: bf16's would be -inf, and exp gives 0 for either)."""
    slot, qr, kb = block
    consts = dict(zip(CONSTS, bases["consts"], strict=True))
    tile = (1, qr, kb)
    s_op = Operand(Space.ACC, bases["s"][slot], (0, kb, 1))
    if cascade.scale is not None:
        at("scores")
        em.vector(VectorFunc.MUL, s_op, s_op, Operand(Space.SPAD, consts["scale"], (0, 0, 0)), tile)
    rounded("scores", bases["s"][slot], Space.ACC, tile)
    if cascade.fill is not None:
        at("mask")
        if not cascade.mask_row:
            em.vector(VectorFunc.CMP_EQ, mask, mask, Operand(Space.SPAD, consts["zero"], (0, 0, 0)), tile)
        em.vector(VectorFunc.SELECT, s_op, mask, Operand(Space.SPAD, consts["fill"], (0, 0, 0)), tile)


def _softmax_block(em, at, rows: dict, cur: int, nxt: int, blocks: tuple, o: int, qr: int, kb: int, d: int,
                   first: bool) -> tuple[int, int]:
    """One key block's online softmax (lower.schedule.flash.block_vectors), `blocks` the bases of its S,
    its P and P rounded to bf16 (None for float32); returns the (current, spare) running-max buffers
    after it."""
    s, p, pb = blocks
    line, tile = (1, 1, qr), (1, qr, kb)
    s_op, p_op = Operand(Space.ACC, s, (0, kb, 1)), Operand(Space.SPAD, p, (0, kb, 1))
    at("max")
    em.vector(VectorFunc.RMAX, _col(cur if first else rows["rowwise"]), s_op, None, tile)
    if not first:
        em.vector(VectorFunc.MAX, _row(nxt), _row(cur), _row(rows["rowwise"]), line)
        em.vector(VectorFunc.SUB, _row(rows["alpha"]), _row(cur), _row(nxt), line)
        em.vector(VectorFunc.EXP, _row(rows["alpha"]), _row(rows["alpha"]), None, line)
        cur, nxt = nxt, cur
    at("exp")
    em.vector(VectorFunc.SUB, p_op, s_op, _col(cur), tile)
    if pb is None:
        em.vector(VectorFunc.EXP, p_op, p_op, None, tile)
    else:   # P rounded as EXP writes it, the array's operand; widened back for its row sums
        em.vector(VectorFunc.EXP, Operand(Space.SPAD, pb, (0, kb, 1)), p_op, None, tile, out_dtype=DType.BF16)
        widen_bf16(em, LocalTile(Space.SPAD, pb, tile, DType.BF16), LocalTile(Space.SPAD, p, tile))
    at("sum")
    if not first:
        em.vector(VectorFunc.MUL, _row(rows["l"]), _row(rows["l"]), _row(rows["alpha"]), line)
    em.vector(VectorFunc.RSUM, _col(rows["l"]), p_op, None, tile, acc=AccMode.OVERWRITE if first else AccMode.ADD)
    if not first:
        at("pv")
        acc = Operand(Space.ACC, o, (0, d, 1))
        em.vector(VectorFunc.MUL, acc, acc, _col(rows["alpha"]), (1, qr, d))
    return cur, nxt


def _row(base: int) -> Operand:
    """A row statistic as a vector over i2."""
    return Operand(Space.SPAD, base, (0, 0, 1))


def _col(base: int) -> Operand:
    """A row statistic over i1 (one per query row), broadcast over i2."""
    return Operand(Space.SPAD, base, (0, 1, 0))


def _select(t, b: int):
    """Head `b` (a flat index over the leading dims) of a view."""
    for i in np.unravel_index(b, t.shape[:-2]):
        t = t.select(0, int(i))
    return t
