"""Elementwise expressions over one tile, on the vector unit.

Used by ELEMENTWISE nodes and by the epilogues fused into CONV/MATMUL.  Every
operand is a dense local tile of the iteration box (c0, c1, c2), or a smaller
tile broadcast along the dims where it has extent 1 (stride 0).  Results are
written in place over a tile whose value dies at that step, else into a
temporary; `plan` decides that once per expression, not per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagec.isa.instructions import Operand, Space, VectorFunc

from .graph_ir import Expr


@dataclass(frozen=True)
class LocalTile:
    """A tile in local memory holding `extent` (<= the iteration box, 1 where broadcast)."""

    space: Space
    base: int
    extent: tuple[int, int, int]

    def operand(self, counts) -> Operand:
        e0, e1, e2 = self.extent
        strides = (e1 * e2, e2, 1)
        return Operand(self.space, self.base, tuple(0 if e == 1 and c > 1 else s
                                                   for e, c, s in zip(self.extent, counts, strides, strict=True)))

    def full(self, counts) -> bool:
        return tuple(self.extent) == tuple(counts)


@dataclass(frozen=True)
class ExprPlan:
    """Where each step writes: ('arg', k) reuses argument k's tile, ('tmp', t) a temporary."""

    dst: tuple[tuple[str, int], ...]
    temps: int


def plan(expr: Expr, n_inputs: int, writable: frozenset[int]) -> ExprPlan:
    """In-place where a step is the last use of a writable tile (an input tile or an earlier result)."""
    last_use = {}
    for j, step in enumerate(expr):
        for a in step.args:
            last_use[a] = j
    slot_of = {k: ("arg", k) for k in writable}   # value -> storage slot (writable ones only)
    free, dst, temps = [], [], 0
    for j, step in enumerate(expr):
        chosen = next((slot_of[a] for a in step.args if a in slot_of and last_use.get(a) == j), None)
        for a in step.args:   # values dying here free their temporaries for later steps
            if a in slot_of and last_use.get(a) == j and slot_of[a] != chosen and slot_of[a][0] == "tmp":
                free.append(slot_of[a])
        if chosen is None:
            if free:
                chosen = free.pop()
            else:
                chosen = ("tmp", temps)
                temps += 1
        dst.append(chosen)
        slot_of[n_inputs + j] = chosen
    return ExprPlan(tuple(dst), temps)


def emit(em, expr: Expr, p: ExprPlan, args: list[LocalTile], temps: list[LocalTile], counts) -> LocalTile:
    """Emit one vector instruction per step over the box `counts`; returns the result's tile."""
    values = list(args)
    for step, (kind, k) in zip(expr, p.dst, strict=True):
        out = args[k] if kind == "arg" else temps[k]
        out = LocalTile(out.space, out.base, tuple(counts))
        if step.func == "copy" and values[step.args[0]] == out:   # a copy onto itself is no instruction
            values.append(out)
            continue
        srcs = [values[a].operand(counts) for a in step.args]
        em.vector(VectorFunc[step.func.upper()], out.operand(counts), srcs[0], srcs[1] if len(srcs) > 1 else None,
                  counts)
        values.append(out)
    return values[-1]
