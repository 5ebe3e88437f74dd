"""The verifier: a program that passes it cannot read out of bounds, overflow a
memory, deadlock on tokens, read memory nothing wrote, or race between queues.

It runs before every simulation and at load.  Per-field checks are vectorized
over the instruction stream and read each opcode's definition (isa.opcodes):
its fields' legal values, its operands' memories and encoded bytes, its further
rules.  The dataflow checks (isa.dataflow) then walk the stream once.
"""

from __future__ import annotations

import numpy as np

from stagec.errors import VerificationError

from . import opcodes
from .access import Access, accesses, overlapping_patterns
from .dataflow import MULTIPLE, Dataflow, DataflowWalk, check_dataflow, const_bytes
from .instructions import ENCODING, MEMORY_NAMES, RECORD_ALIGN, DType, Opcode, Space
from .opcodes import OPERANDS, Fields, OpcodeDef, func_table, opcode_table, queues_of
from .program import Program, RegionKind

__all__ = ["MULTIPLE", "Dataflow", "DataflowWalk", "check_static", "const_bytes", "verify"]


def verify(program: Program) -> Dataflow:
    """Check every rule; return the dataflow facts.  Cached on the (immutable) program."""
    if "dataflow" not in program.cache:
        program.cache["dataflow"] = check_dataflow(program, check_static(program))
    return program.cache["dataflow"]


def check_static(program: Program) -> list[Access]:
    """The per-field rules (vectorized, no walk); returns the program's accesses."""
    _check_layout(program)
    accs = accesses(program.code)
    _check_fields(program, accs)
    return accs


# --- program layout ---------------------------------------------------------------------------

def _check_layout(p: Program) -> None:
    if p.dram_bytes > p.hw.dram_bytes:
        raise VerificationError(f"program needs {p.dram_bytes} bytes of DRAM, hardware has {p.hw.dram_bytes}")
    for r in p.regions:
        if r.offset < 0 or r.nbytes < 0 or r.offset + r.nbytes > p.dram_bytes:
            raise VerificationError(f"DRAM region '{r.name}' [{r.offset:#x}, {r.offset + r.nbytes:#x}) "
                                    f"lies outside the program's {p.dram_bytes} bytes")
    consts = [r for r in p.regions if r.kind == RegionKind.CONST]
    if len(consts) > 1 or (consts and consts[0].offset != 0):
        raise VerificationError("the constant blob must be one region at DRAM offset 0")
    if const_bytes(p) != len(p.constants):
        raise VerificationError(f"constant region holds {const_bytes(p)} bytes, the blob has {len(p.constants)}")
    for kind, refs in (("input", p.inputs), ("output", p.outputs)):
        for t in refs:
            if t.offset % t.dtype.itemsize or t.offset < const_bytes(p) or t.offset + t.nbytes > p.dram_bytes:
                raise VerificationError(f"{kind} '{t.name}' at {t.offset:#x} ({t.nbytes} bytes) is misaligned or "
                                        f"outside the data part of DRAM [{const_bytes(p):#x}, {p.dram_bytes:#x})")


# --- per-instruction fields (vectorized) ------------------------------------------------------

_MODE_OF_DTYPE = {DType.F32: "fp32", DType.BF16: "bf16", DType.I8: "int8", DType.I32: None}
_FIELD_AT = {}  # byte offset -> field name, for "unused byte set" errors
for _name in ENCODING.names:
    _fmt, _off = ENCODING.fields[_name][:2]
    for _b in range(_off, _off + _fmt.itemsize):
        _FIELD_AT.setdefault(_b, _name)


def _fail(mask: np.ndarray, field: str, message) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        raise VerificationError(message(i) if callable(message) else message, i, field)


def _check_fields(p: Program, accs: list[Access]) -> None:
    f = Fields(p.code)
    op = f.field("opcode")
    _fail(~np.isin(op, list(opcodes.OPCODES)), "opcode", lambda i: f"unknown opcode {op[i]}")
    takes_func = opcode_table("takes_func")[op].astype(bool)
    _fail(takes_func & ~np.isin(f.func, list(opcodes.VECTOR_FUNCS)), "func",
          lambda i: f"unknown vector function {f.func[i]}")
    _check_types(p, f, op, takes_func)
    present = _present(f, op)
    _check_unused_bytes(p.code, op, present)
    takers = " and ".join(d.name for d in opcodes.OPCODES.values() if d.takes_func)
    _fail(~takes_func & (f.func != 0), "func", f"only {takers} instructions take a function")
    for d in opcodes.OPCODES.values():
        rows = op == d.opcode
        _fail(rows & ~np.isin(f.mode, list(d.modes)), "mode", lambda i, d=d: _mode_message(d, f.mode[i]))
    queue = queues_of(op)
    for name in ("push", "pop"):
        mask = f.field(name)
        _fail(mask >= 16, name, "token masks have one bit per queue (4 queues)")
        _fail((mask >> queue) & 1 == 1, name, "an instruction cannot send a token to its own queue")
    rank = opcode_table("rank")[op]
    _fail(((f.n == 0) & (np.arange(4) < rank[:, None])).any(1), "n",
          lambda i: f"{_def(op[i]).name} needs {', '.join(_def(op[i]).counts)} >= 1")
    _check_spaces(f, op, present)
    for d in opcodes.OPCODES.values():
        for check in d.checks:
            _fail((op == d.opcode) & check.failing(f), check.field, check.message)
    _check_addresses(p, accs)


def _def(op) -> OpcodeDef:
    return opcodes.OPCODES[int(op)]


# A vector function that computes float32 may write its result rounded to bf16 (to nearest even, as a
# STORE rounds it): a bf16 value kept on chip (a cascade's intermediate, flash attention's P) needs no COPY.
ROUNDING = "float32 to bf16 by a float32 vector function, rounding as it writes"


def _check_types(p: Program, f: Fields, op: np.ndarray, takes_func: np.ndarray) -> None:
    """Known element types the hardware has, in the pairs each opcode (or vector function) allows, and
    ROUNDING."""
    dt, odt = f.field("dtype"), f.field("out_dtype")
    for name, values in (("dtype", dt), ("out_dtype", odt)):
        _fail(~np.isin(values, list(DType)), name, lambda i, v=values: f"unknown element type {v[i]}")
        for t, mode in _MODE_OF_DTYPE.items():
            if mode and mode not in p.hw.dtypes:
                _fail(values == t, name, f"{t.name} needs the '{mode}' mode, which this hardware lacks "
                                         f"(HardwareConfig.dtypes = {p.hw.dtypes})")
    rules = [(op == d.opcode, d.types, d.name) for d in opcodes.OPCODES.values() if not d.takes_func]
    rules += [(takes_func & (f.func == v.func), v.types, v.name) for v in opcodes.VECTOR_FUNCS.values()]
    converters = ", ".join(who for _, types, who in rules if types is not None)
    rounding = takes_func & (dt == DType.F32) & (odt == DType.BF16)
    for rows, types, who in rules:
        if types is None:
            _fail(rows & (dt != odt) & ~rounding, "out_dtype",
                  f"element type conversion is done by {converters} only (and {ROUNDING})")
            continue
        legal = rounding & ((DType.F32, DType.F32) in types)
        for a, b in types:
            legal |= (dt == a) & (odt == b)
        pairs = ", ".join(f"{a.name.lower()} to {b.name.lower()}" for a, b in sorted(types))
        _fail(rows & ~legal, "dtype", lambda i, who=who, pairs=pairs:
              f"{who.lower()} {DType(dt[i]).name}->{DType(odt[i]).name} is not supported: {who} converts {pairs}")


def _mode_message(d: OpcodeDef, mode: int) -> str:
    if d.mode is None:
        return f"{d.name} takes no mode, not {mode}"
    return f"{d.name} takes {d.mode_key}={' or '.join(d.mode(m).name.lower() for m in sorted(d.modes))}, not {mode}"


def _present(f: Fields, op: np.ndarray) -> np.ndarray:
    """(N, 3): the operands x, y, z each instruction has (by its opcode and vector function)."""
    present = np.zeros((len(op), 3), bool)
    for d in opcodes.OPCODES.values():
        rows = op == d.opcode
        for s in d.slots:
            has = rows if s.present is None else rows & s.present(f.func)
            present[:, OPERANDS.index(s.operand)] |= has
    return present


def _used_bytes(d: OpcodeDef, present: tuple[bool, ...], table: bool = False) -> np.ndarray:
    """The bytes an instruction of opcode `d` with operands `present` uses (ENCODING's layout); `table`:
    a table function's (opcodes' src2_table), which reads n3 too."""
    used = np.zeros(64, bool)
    used[:8 + 2 * (4 if table else len(d.counts))] = True   # header and the iteration counts it has
    for k, o in enumerate(OPERANDS):
        if present[k]:
            strides = max(s.strides for s in d.slots if s.operand == o)
            used[16 * (k + 1):16 * (k + 1) + 4 + 4 * strides] = True   # base and the strides it uses
    if d.pads:
        used[48:54] = True                            # six pad counts overlay z
    return used


def _check_unused_bytes(code: np.ndarray, op: np.ndarray, present: np.ndarray) -> None:
    """Unused bits must be zero: an encoding has exactly one spelling."""
    raw = code.view(np.uint8).reshape(len(code), 64)
    # the operands an instruction has, as 3 bits, and whether it is a table function's
    table = (op == Opcode.VECTOR) & func_table("src2_table")[code["func"].astype(np.int64)].astype(bool)
    variants = present @ np.array([1, 2, 4]) + 8 * table
    for d in opcodes.OPCODES.values():
        for v in np.unique(variants[op == d.opcode]).tolist():
            rows = (op == d.opcode) & (variants == v)
            unused = ~_used_bytes(d, tuple(bool(v >> k & 1) for k in range(3)), bool(v >> 3))
            stray = (raw[rows][:, unused] != 0).any(0)
            if stray.any():
                byte = int(np.flatnonzero(unused)[np.flatnonzero(stray)[0]])
                i = int(np.flatnonzero(rows)[np.flatnonzero(raw[rows][:, byte])[0]])
                raise VerificationError(f"byte {byte} is unused by {d.name} and must be zero", i, _FIELD_AT.get(byte))


def _check_spaces(f: Fields, op: np.ndarray, present: np.ndarray) -> None:
    """Each operand in a memory its slots allow; no space bits for an operand the instruction lacks."""
    spaces = f.field("spaces")
    for d in opcodes.OPCODES.values():
        for s in d.slots:
            rows = (op == d.opcode) & (True if s.present is None else s.present(f.func))
            allowed = " or ".join(MEMORY_NAMES[m] for m in sorted(s.spaces))
            _fail(rows & ~np.isin(f.space(s.operand), list(s.spaces)), s.operand,
                  f"{d.name}'s {s.role} operand ({s.operand}) lies in the {allowed}")
    absent = np.stack([spaces >> 2 * k & 3 for k in range(3)], 1) * ~present
    _fail((spaces >> 6 != 0) | absent.any(1), "spaces",
          "the space bits of an operand the instruction does not have must be zero")


def _check_addresses(p: Program, accs: list[Access]) -> None:
    """Alignment, bounds and fit of every operand; reports the earliest failing instruction."""
    capacity = {Space.DRAM: p.dram_bytes, Space.SPAD: p.hw.scratchpad_bytes, Space.ACC: p.hw.accumulator_bytes}
    consts = const_bytes(p)
    failures = []   # (mask, field, message(i))

    for a in accs:
        lo, hi = a.extent()
        align = np.clip(a.itemsize, 1, RECORD_ALIGN)
        failures.append((a.valid & (a.base % align != 0), f"{a.operand}_base", lambda i, a=a, align=align:
                         f"address {a.base[i]:#x} is not aligned to {align[i]} bytes ({a.itemsize[i]}-byte elements)"))
        for space, cap in capacity.items():
            rows = a.valid & (a.space == space)
            failures.append((rows & (hi - lo > cap), a.operand, lambda i, lo=lo, hi=hi, s=space, c=cap:
                             f"tile of {hi[i] - lo[i]} bytes does not fit the {MEMORY_NAMES[s]} ({c} bytes)"))
            failures.append((rows & ((lo < 0) | (hi > cap)), a.operand, lambda i, lo=lo, hi=hi, s=space, c=cap, a=a:
                             f"{'writes' if a.write else 'reads'} {MEMORY_NAMES[s]} bytes [{lo[i]:#x}, {hi[i]:#x}) "
                             f"outside [0, {c:#x})"))
        if a.write:   # each element once, or the result depends on the order of the inner loop
            failures.append((a.valid & overlapping_patterns(a.strides, a.dims), a.operand, lambda i, a=a:
                             f"the written pattern (n={a.dims[i].tolist()}, strides={a.strides[i].tolist()}) "
                             "visits some element more than once"))
        dram = a.valid & (a.space == Space.DRAM)
        failures.append((dram & (lo < consts) & (hi > consts), a.operand, lambda i, lo=lo, hi=hi:
                         f"DRAM pattern [{lo[i]:#x}, {hi[i]:#x}) straddles the end of the constant region at "
                         f"{consts:#x}"))
        if a.write:
            failures.append((dram & (lo < consts), a.operand, lambda i: "writes the constant region"))
    first = [(int(np.flatnonzero(mask)[0]), k) for k, (mask, _, _) in enumerate(failures) if mask.any()]
    if first:
        i, k = min(first)
        raise VerificationError(failures[k][2](i), i, failures[k][1])
