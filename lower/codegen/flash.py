"""Flash attention (lower.schedule.flash) on the array and the vector unit.

Per batch (head) and query block: Q's block is LOADed; per key block, K^T's and V's blocks are
LOADed, the array computes S = Q K^T into the accumulator, the vector unit keeps the online
softmax in the scratchpad's row statistics (`block_vectors`' order: the row max; but for the first
block, the running max and alpha = exp(m_old - m_new); P = exp(S - m) into the scratchpad; l
scaled by alpha and P's row sums added; the output accumulator scaled by alpha), and the array
adds P V into the output accumulator.  Then r = 1/l, the output times r, one STORE.  The running
max alternates between two row buffers.  Each instruction belongs to the layer it stands for
(S's matmul, the max, the exp, the sum, the recip, the P·V matmul); the cascade is emitted at its
last layer, when V, its last input, has been computed.
"""

from __future__ import annotations

import numpy as np

from stagec.isa.instructions import AccMode, Operand, Space, VectorFunc

from ..schedule.flash import ROWS, flash_buffers

S_LAYER, MAX_LAYER, EXP_LAYER, SUM_LAYER, RECIP_LAYER, PV_LAYER = range(6)


def emit_flash(ctx, cascade, nodes: list, layers: list[int]) -> None:
    """Emit `cascade` (a FlashAttention) whose layers are `nodes`, layer indices `layers`."""
    em = ctx.em

    def at(i: int) -> None:
        em.layer, em.layer_name = layers[i], nodes[i].name

    at(S_LAYER)
    _, m, n, d = cascade.dims
    tq, tk = cascade.tile
    bases = em.allocate(flash_buffers(tq, tk, d))
    scores, pv = nodes[S_LAYER], nodes[PV_LAYER]
    views = [ctx.tensor(v) for v in (scores.inputs[0], scores.inputs[1], pv.inputs[1], pv.output)]
    step = block = 0
    for idx in np.ndindex(*views[-1].shape[:-2]):
        head = [_select(t, idx) for t in views]
        for q0 in range(0, m, tq):
            _query_block(em, at, bases, head, q0, min(tq, m - q0), tk, n, d, step, block)
            step, block = step + -(-n // tk), block + 1


def _query_block(em, at, bases: dict, head: list, q0: int, qr: int, tk: int, n: int, d: int, step: int,
                 block: int) -> None:
    """Rows q0..q0+qr of one head (`head`: its Q, K^T, V and output views): `step` key blocks and
    `block` query blocks came before (the double buffers' parities)."""
    q_t, kt_t, v_t, out_t = head
    rows = dict(zip(ROWS, bases["rows"], strict=True))
    qb, ob, o = bases["q"][block % 2], bases["out"][block % 2], bases["o"][0]
    at(S_LAYER)
    em.load_box(q_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, qb)
    keys = range(0, n, tk)

    def scores(j: int) -> None:
        """K^T's block j and S_j = Q K^T_j, into the buffers of block j's parity."""
        k0, slot = keys[j], (step + j) % 2
        kb, kt = min(tk, n - k0), bases["kt"][slot]
        at(S_LAYER)
        em.load_box(kt_t, (0, k0), (0, 1), (d, kb), Space.SPAD, kt)
        em.matmul(Operand(Space.SPAD, qb, (0, d, 1)), Operand(Space.SPAD, kt, (kb, 1, 0)),
                  Operand(Space.ACC, bases["s"][slot], (0, kb, 1)), 1, qr, d, kb, accumulate=False)

    scores(0)
    cur, nxt = rows["m"], rows["m_next"]
    for j, k0 in enumerate(keys):
        if j + 1 < len(keys):   # the array computes the next block's scores while the vector unit works
            scores(j + 1)
        kb, first, slot = min(tk, n - k0), j == 0, (step + j) % 2
        v, p = bases["v"][slot], bases["p"][slot]
        at(PV_LAYER)
        em.load_box(v_t, (k0, 0), (0, 1), (kb, d), Space.SPAD, v)
        cur, nxt = _softmax_block(em, at, rows, cur, nxt, bases["s"][slot], p, o, qr, kb, d, first)
        at(PV_LAYER)
        em.matmul(Operand(Space.SPAD, p, (0, kb, 1)), Operand(Space.SPAD, v, (d, 1, 0)),
                  Operand(Space.ACC, o, (0, d, 1)), 1, qr, kb, d, accumulate=not first)
    at(RECIP_LAYER)
    em.vector(VectorFunc.RECIP, _row(rows["rowwise"]), _row(rows["l"]), None, (1, 1, qr))
    at(PV_LAYER)
    em.vector(VectorFunc.MUL, Operand(Space.SPAD, ob, (0, d, 1)), Operand(Space.ACC, o, (0, d, 1)),
              _col(rows["rowwise"]), (1, qr, d))
    em.store_box(out_t, (q0, 0), (0, 1), (qr, d), Space.SPAD, ob)


def _softmax_block(em, at, rows: dict, cur: int, nxt: int, s: int, p: int, o: int, qr: int, kb: int, d: int,
                   first: bool) -> tuple[int, int]:
    """One key block's online softmax (lower.schedule.flash.block_vectors); returns the (current,
    spare) running-max buffers after it."""
    line, tile = (1, 1, qr), (1, qr, kb)
    s_op, p_op = Operand(Space.ACC, s, (0, kb, 1)), Operand(Space.SPAD, p, (0, kb, 1))
    at(MAX_LAYER)
    em.vector(VectorFunc.RMAX, _col(cur if first else rows["rowwise"]), s_op, None, tile)
    if not first:
        em.vector(VectorFunc.MAX, _row(nxt), _row(cur), _row(rows["rowwise"]), line)
        em.vector(VectorFunc.SUB, _row(rows["alpha"]), _row(cur), _row(nxt), line)
        em.vector(VectorFunc.EXP, _row(rows["alpha"]), _row(rows["alpha"]), None, line)
        cur, nxt = nxt, cur
    at(EXP_LAYER)
    em.vector(VectorFunc.SUB, p_op, s_op, _col(cur), tile)
    em.vector(VectorFunc.EXP, p_op, p_op, None, tile)
    at(SUM_LAYER)
    if not first:
        em.vector(VectorFunc.MUL, _row(rows["l"]), _row(rows["l"]), _row(rows["alpha"]), line)
    em.vector(VectorFunc.RSUM, _col(rows["l"]), p_op, None, tile, acc=AccMode.OVERWRITE if first else AccMode.ADD)
    if not first:
        at(PV_LAYER)
        acc = Operand(Space.ACC, o, (0, d, 1))
        em.vector(VectorFunc.MUL, acc, acc, _col(rows["alpha"]), (1, qr, d))
    return cur, nxt


def _row(base: int) -> Operand:
    """A row statistic as a vector over i2."""
    return Operand(Space.SPAD, base, (0, 0, 1))


def _col(base: int) -> Operand:
    """A row statistic over i1 (one per query row), broadcast over i2."""
    return Operand(Space.SPAD, base, (0, 1, 0))


def _select(t, idx):
    for i in idx:
        t = t.select(0, i)
    return t
