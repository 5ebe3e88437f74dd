"""Elementwise expressions over one tile, on the vector unit.

Used by ELEMENTWISE nodes and by the epilogues fused into CONV/MATMUL.  Every
operand is a dense local tile of the iteration box (c0, c1, c2), or a smaller
tile broadcast along the dims where it has extent 1 (stride 0); a requant's
records tile counts its strides in records, as REQUANT does.  Results are
written in place over a tile whose value dies at that step, else into a
temporary; `plan` decides that once per expression, not per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagec.isa.instructions import DType, Operand, Space, VectorFunc
from stagec.isa.opcodes import VECTOR_FUNCS
from stagec.sim.costs import lane_bits

from ..graph.graph_ir import RESULT_DTYPES, VECTOR_FUNC_OF, Expr, Step
from ..schedule.tensors import DTYPE_OF


@dataclass(frozen=True)
class LocalTile:
    """A tile in local memory holding `extent` (<= the iteration box, 1 where broadcast)."""

    space: Space
    base: int
    extent: tuple[int, int, int]
    dtype: DType = DType.F32
    table_offset: int = 0   # a CLAMP table's (base: its header): the word of the tile's first bias, n3

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
    """In-place where a step is the last use of a writable tile (an input tile or an earlier result);
    a slot is then as wide as the widest value it holds (slot_itemsizes)."""
    last_use = {}
    for j, step in enumerate(expr):
        for a in step.args:
            last_use[a] = j
    slot_of = {k: ("arg", k) for k in writable}   # value -> storage slot (writable ones only)
    free, dst, temps = [], [], 0
    for j, step in enumerate(expr):
        # select(pred, on_false, on_true) first copies on_false to its destination: only that tile
        # may be overwritten in place
        candidates = step.args[1:2] if step.func == "select" else step.args
        chosen = next((slot_of[a] for a in candidates if a in slot_of and last_use.get(a) == j), None)
        dying = [slot_of[a] for a in dict.fromkeys(step.args)   # values dying here free their temporaries
                 if a in slot_of and last_use.get(a) == j and slot_of[a] != chosen and slot_of[a][0] == "tmp"]
        if step.func != "select":   # a select's predicate and on_true are read after on_false's copy
            free.extend(dying)
        if chosen is None:
            if free:
                chosen = free.pop()
            else:
                chosen = ("tmp", temps)
                temps += 1
        if step.func == "select":
            free.extend(dying)
        dst.append(chosen)
        slot_of[n_inputs + j] = chosen
    return ExprPlan(tuple(dst), temps)


def result_dtype(step: Step, args: list[DType]) -> DType:
    """The element type of a step's result, from its arguments' (a select's: its on_true's)."""
    if step.func in RESULT_DTYPES:
        return DTYPE_OF[RESULT_DTYPES[step.func]]
    return args[-1 if step.func == "select" else 0]


def value_dtypes(expr: Expr, dtypes) -> list[DType]:
    """The element type of every value of `expr`: its inputs' (`dtypes`), then each step's result's."""
    values = list(dtypes)
    for step in expr:
        values.append(result_dtype(step, [values[a] for a in step.args]))
    return values


def step_instructions(expr: Expr, dtypes) -> list[tuple[VectorFunc, DType, DType]]:
    """(function, dtype, out_dtype) of each step's instruction as `emit` emits it over inputs of `dtypes`
    (a select's SELECT, of its result's type, as the COPY of its on_false that may come first)."""
    values = value_dtypes(expr, dtypes)
    return [(_func(step), out if step.func == "select" else values[step.args[0]], out)
            for step, out in zip(expr, values[len(dtypes):], strict=True)]


def step_lane_bits(expr: Expr, dtypes) -> list[int]:
    """sim.costs.lane_bits of each step's instructions as `emit` emits them over inputs of `dtypes`."""
    return [int(lane_bits(int(f), int(d), int(o))) for f, d, o in step_instructions(expr, dtypes)]


def _func(step: Step) -> VectorFunc:
    return VectorFunc[VECTOR_FUNC_OF.get(step.func, step.func).upper()]


def slot_itemsizes(expr: Expr, p: ExprPlan, dtypes, owned) -> list[int]:
    """Bytes per element of each tile buffer of `p`'s slots: of the arguments in `owned` (the inputs
    loaded into a tile buffer of their own), in that order, then of each temporary; given the
    element type of every input (`dtypes`).  A slot is as wide as the widest value it holds: a
    to_f32 over an int8 tile widens it in place, so that tile's buffer takes four bytes an element."""
    values, widths = value_dtypes(expr, dtypes), {("arg", k): dtypes[k].itemsize for k in owned}
    for slot, dtype in zip(p.dst, values[len(dtypes):], strict=True):
        widths[slot] = max(widths.get(slot, 0), dtype.itemsize)
    return [widths[("arg", k)] for k in owned] + [widths.get(("tmp", t), 0) for t in range(p.temps)]


def emit(em, expr: Expr, p: ExprPlan, args: list[LocalTile], temps: list[LocalTile], counts,
         final: LocalTile | None = None, rounded: bool = False) -> LocalTile:
    """Emit one vector instruction per step over the box `counts`; returns the result's tile (in
    `final`'s place when given, instead of the plan's slot for the last step).  `rounded`: a float32
    result is written as bf16, rounded by its last step (isa.opcodes.ROUNDING), where a layer would
    round it by its STORE."""
    values = list(args)
    for j, (step, (kind, k)) in enumerate(zip(expr, p.dst, strict=True)):
        last = j == len(expr) - 1
        slot = final if final is not None and last else args[k] if kind == "arg" else temps[k]
        src = [values[a] for a in step.args]
        out_type = result_dtype(step, [t.dtype for t in src])
        if rounded and last and out_type == DType.F32:
            out_type = DType.BF16
        out = LocalTile(slot.space, slot.base, tuple(counts), out_type)
        if step.func == "select":   # out = on_false, then on_true where pred
            pred, on_false, on_true = src
            if on_false != out:
                em.vector(VectorFunc.COPY, out.operand(counts), on_false.operand(counts), None, counts,
                          dtype=on_false.dtype, out_dtype=out_type)
            em.vector(VectorFunc.SELECT, out.operand(counts), pred.operand(counts), on_true.operand(counts), counts,
                      dtype=on_true.dtype, out_dtype=out_type)
        elif step.func == "copy" and src[0] == out:   # a copy onto itself is no instruction
            pass
        else:
            func = _func(step)
            second = src[1].operand(counts) if len(src) > 1 else None
            if second is not None and VECTOR_FUNCS[func].src2_once:   # one record (a table) for the whole tile
                second = Operand(second.space, second.base, (0, 0, 0))
            table = {"table_offset": src[1].table_offset} if VECTOR_FUNCS[func].src2_table else {}
            em.vector(func, out.operand(counts), src[0].operand(counts), second, counts, dtype=src[0].dtype,
                      out_dtype=out_type, **table)
        values.append(out)
    return values[-1]


# the (function, dtype, out_dtype) of the instructions round_bf16 emits, for the costs that count them
ROUNDING = ((VectorFunc.COPY, DType.F32, DType.BF16), (VectorFunc.COPY, DType.BF16, DType.F32))


def round_bf16(em, tile: LocalTile, scratch: int) -> None:
    """A float32 `tile` as a bf16 value the layers STORE and LOAD back: rounded to bf16 (into the
    scratchpad at `scratch`) and widened back in place, so a cascade's member sees what the next layer
    would."""
    counts = tile.extent
    rounded = LocalTile(Space.SPAD, scratch, counts, DType.BF16)
    em.vector(VectorFunc.COPY, rounded.operand(counts), tile.operand(counts), None, counts, out_dtype=DType.BF16)
    widen_bf16(em, rounded, tile)


def emit_rounded(em, expr: Expr, p: ExprPlan, args: list[LocalTile], temps: list[LocalTile], counts,
                 final: LocalTile, scratch: int) -> None:
    """`emit` of an expression whose float32 result the layers STORE as bf16: its last step writes it
    rounded (into the scratchpad at `scratch`), widened back into `final`: one COPY, not round_bf16's two."""
    rounded = emit(em, expr, p, args, temps, counts, LocalTile(Space.SPAD, scratch, tuple(counts), DType.BF16),
                   rounded=True)
    widen_bf16(em, rounded, final)


def widen_bf16(em, rounded: LocalTile, tile: LocalTile) -> None:
    """The bf16 `rounded` as float32 in `tile`'s place (exact)."""
    counts = rounded.extent
    em.vector(VectorFunc.COPY, tile.operand(counts), rounded.operand(counts), None, counts, dtype=DType.BF16,
              out_dtype=DType.F32)
