"""Row cascades (lower.schedule.rowwise) on the vector unit.

The columns, scalars and requant records read from outside are LOADed once.  Per block of rows: the outside full
and per-row values are LOADed (each at the first member that reads it), every member computes
its block in the scratchpad in turn (an elementwise member through lower.codegen.tile_expr, its
last step into the member's result tile; a reduce member, one RSUM or RMAX over the block's
rows; a result the layers keep bf16 rounded to bf16 and widened back, as their STORE and LOAD
would), and the results read outside the cascade are STOREd.  Every block-sized buffer is
doubled, the parity alternating by block, so one block's loads overlap the last one's work.
Each instruction belongs to the member it stands for; the cascade is emitted at its last member.
"""

from __future__ import annotations

import dataclasses

from stagec.isa.instructions import AccMode, Space, VectorFunc

from ..graph.graph_ir import OpKind
from ..schedule.rowwise import RowPlan, flat, row_buffers
from ..schedule.tensors import DTYPE_OF, local_type
from . import tile_expr

_REDUCE = {"sum": VectorFunc.RSUM, "max": VectorFunc.RMAX}


def emit_rows(ctx, cascade, p: RowPlan, layers: list[int]) -> None:
    """Emit `cascade` (a RowCascade) of plan `p`, its members' layer indices `layers`."""
    em = ctx.em
    rows, c = p.dims
    r = cascade.tile[0]
    em.layer, em.layer_name = layers[0], p.members[0].node.name
    bases = em.allocate(row_buffers(p, r))
    # the block-sized values (outside ones, then the results): id -> (kind, its two bases); the rest temporaries
    slots, free = {}, {"full": list(bases["full"]), "row": list(bases["row"])}
    for key in [(k, vid) for vid, (k, _) in p.externals.items() if k in ("full", "row")] + [
            (m.out, m.node.output.id) for m in p.members]:
        slots[key[1]] = (key[0], [free[key[0]].pop(0), free[key[0]].pop(0)])
    temps = [free["full"][i::2] for i in range(2)]
    held = {vid: local_type(DTYPE_OF[v.dtype]) for vid, (_, v) in p.externals.items()} | {
        m.node.output.id: local_type(DTYPE_OF[m.node.output.dtype]) for m in p.members}
    where = {}     # the columns, scalars and records, each LOADed once, by the first member that reads it
    for kind, extent in (("col", (1, 1, c)), ("scalar", (1, 1, 1)), ("record", (1, 1, 1))):
        ids = [vid for vid, (k, _) in p.externals.items() if k == kind]
        where |= {vid: tile_expr.LocalTile(Space.SPAD, base, extent, held[vid])
                  for vid, base in zip(ids, bases[kind], strict=True)}
    once = set()
    for member, layer in zip(p.members, layers, strict=True):
        em.layer, em.layer_name = layer, member.node.name
        _load_first_reads(ctx, member, ("col", "scalar", "record"), once, where.__getitem__, 0, p.dims)
    for block, row0 in enumerate(range(0, rows, r)):
        q, parity = min(r, rows - row0), block % 2

        def tile(vid, q=q, parity=parity):
            kind, pair = slots[vid]
            return tile_expr.LocalTile(Space.SPAD, pair[parity], (1, q, c if kind == "full" else 1), held[vid])

        loaded = set()
        for member, layer in zip(p.members, layers, strict=True):
            em.layer, em.layer_name = layer, member.node.name
            _load_first_reads(ctx, member, ("full", "row"), loaded, tile, row0, p.dims)
            args = [tile(a.value) if a.kind == "member" else tile(a.value.id) if a.kind in ("full", "row")
                    else where[a.value.id] for a in member.args]
            out = tile(member.node.output.id)
            if member.node.op == OpKind.REDUCE:
                counts = (1, q, c)
                em.vector(_REDUCE[member.node.attr("func")], out.operand(counts), args[0].operand(counts), None,
                          counts, acc=AccMode.OVERWRITE)
            else:
                expr = member.node.attr("expr")
                plan = tile_expr.plan(expr, len(args), frozenset())
                scratch = [tile_expr.LocalTile(Space.SPAD, b, out.extent) for b in temps[parity]]
                tile_expr.emit(em, expr, plan, args, scratch, out.extent, final=out)
            if member.node.output.dtype == "bfloat16":
                tile_expr.round_bf16(em, out, bases["round"][0])
            if member.node.output.id in p.stored:
                em.store(flat(ctx.tensor(member.node.output), member.out, p.dims), (row0, 0), (None, 0, 1),
                         out.extent, out.operand(out.extent))


def _load_first_reads(ctx, member, kinds: tuple[str, ...], loaded: set, tile_of, row0: int, dims) -> None:
    """LOAD, from row `row0`, each outside value of `kinds` that `member` reads and no member before it
    LOADed (`loaded`, updated) into its tile (`tile_of(value id)`; a record's words, its whole row)."""
    for a in member.args:
        if a.kind in kinds and a.value.id not in loaded:
            loaded.add(a.value.id)
            t, view = tile_of(a.value.id), flat(ctx.tensor(a.value), a.kind, dims)
            if a.kind == "record":     # its words in a row, read as one record (stride 0) by REQUANT
                t = dataclasses.replace(t, extent=(1, 1, view.shape[1]))
            ctx.em.load(view, (row0, 0), (None, 0, 1), t.extent, t.operand(t.extent))
