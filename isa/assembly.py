"""Readable assembly text for programs: `disassemble` and `assemble` round-trip exactly.

    .hw {...}                       hardware config (JSON)
    .dram 1048576                   DRAM footprint in bytes
    .region const weights 0x0 4096  DRAM regions: kind, name, offset, bytes
    .input x f32 0x1000 1,3,32,32   program inputs/outputs: name, dtype, offset, shape
    .layer {...}                    one per layer (JSON), numbered from 0
    .meta {...}
    .const <base64>                 the constant blob, in lines
    .text
    @layer 0                        instructions below belong to layer 0
    load f32>f32 n=16,18,8 x=dram:0x1200/1152,64,1 y=spad:0x0/144,8,1 pad=1,1,1,1,0,0 push=matrix

An operand is `space:base/s0,s1,s2` (base in bytes, strides in elements).
"""

from __future__ import annotations

import base64
import json
import shlex

import numpy as np

from stagec.errors import AssemblyError

from . import opcodes
from .instructions import DType, Opcode, Operand, Queue, Space, VectorFunc, encode
from .instructions import Instruction as Ins
from .opcodes import decode
from .program import Program

_DT = {d: d.name.lower() for d in DType}
_DT_BACK = {v: k for k, v in _DT.items()}
_CONST_LINE = 57  # bytes per base64 line (76 characters)


def _queues(mask: int) -> str:
    return "+".join(q.name.lower() for q in Queue if mask >> q & 1)


def _operand(o: Operand) -> str:
    return f"{o.space.name.lower()}:{o.base:#x}/{','.join(map(str, o.strides))}"


def format_instruction(ins: Ins) -> str:
    d = opcodes.OPCODES[ins.opcode]
    name = ins.opcode.name.lower() + (f".{ins.func.name.lower()}" if d.takes_func else "")
    rank = d.rank + bool(d.takes_func and opcodes.VECTOR_FUNCS[ins.func].src2_table)   # a table's n3 too
    parts = [f"{name:<13}", f"{_DT[ins.dtype]}>{_DT[ins.out_dtype]}", "n=" + ",".join(map(str, ins.n[:rank]))]
    parts += [f"{o}={_operand(v)}" for o, v in zip("xyz", (ins.x, ins.y, ins.z), strict=True) if v is not None]
    if any(ins.pad):
        parts.append("pad=" + ",".join(map(str, ins.pad)))
    if ins.mode:
        parts.append(f"{d.mode_key}={d.mode(ins.mode).name.lower()}")
    if ins.pop:
        parts.append(f"pop={_queues(ins.pop)}")
    if ins.push:
        parts.append(f"push={_queues(ins.push)}")
    return " ".join(parts)


def disassemble(program: Program) -> str:
    h = program._header()
    lines = ["; stagec assembly", f".hw {json.dumps(h['hw'])}", f".dram {program.dram_bytes}"]
    lines += [f".region {r.kind.value} {shlex.quote(r.name)} {r.offset:#x} {r.nbytes}" for r in program.regions]
    for kind, refs in (("input", program.inputs), ("output", program.outputs)):
        lines += [f".{kind} {shlex.quote(t.name)} {_DT[t.dtype]} {t.offset:#x} {','.join(map(str, t.shape))}"
                  for t in refs]
    lines += [f".layer {json.dumps(d)}" for d in h["layers"]]
    lines.append(f".meta {json.dumps(h['metadata'], sort_keys=True)}")
    blob = program.constants
    lines += [f".const {base64.b64encode(blob[i:i + _CONST_LINE]).decode()}" for i in range(0, len(blob), _CONST_LINE)]
    lines.append(".text")
    current = None
    for i, record in enumerate(program.code):
        layer = int(program.layer_ids[i])
        if layer != current:
            note = f"  ; {program.layers[layer].name}" if 0 <= layer < len(program.layers) else ""
            lines.append(f"@layer {layer}{note}")
            current = layer
        lines.append("    " + format_instruction(decode(record)))
    return "\n".join(lines) + "\n"


def _parse_operand(text: str) -> Operand:
    space, rest = text.split(":", 1)
    base, strides = rest.split("/", 1)
    return Operand(Space[space.upper()], int(base, 0), tuple(int(s) for s in strides.split(",")))


def _parse_queues(text: str) -> int:
    return sum(1 << Queue[q.upper()] for q in text.split("+"))


def parse_instruction(text: str) -> Ins:
    tokens = text.split()
    name, types, fields = tokens[0], tokens[1], dict(t.split("=", 1) for t in tokens[2:])
    op_name, _, func = name.partition(".")
    op = Opcode[op_name.upper()]
    d = opcodes.OPCODES[op]
    dtype, out_dtype = (_DT_BACK[t] for t in types.split(">"))
    n = tuple(int(v) for v in fields.pop("n").split(","))
    x, y, z = (_parse_operand(fields.pop(o)) if o in fields else None for o in "xyz")
    pad = tuple(int(p) for p in fields.pop("pad").split(",")) if "pad" in fields else (0,) * 6
    mode = int(d.mode[fields.pop(d.mode_key).upper()]) if d.mode is not None and d.mode_key in fields else 0
    push = _parse_queues(fields.pop("push")) if "push" in fields else 0
    pop = _parse_queues(fields.pop("pop")) if "pop" in fields else 0
    if fields:
        raise ValueError(f"unknown fields {sorted(fields)}")
    vfunc = VectorFunc[func.upper()] if func else VectorFunc.COPY
    if missing := [o for o, v in zip("xyz", (x, y, z), strict=True) if v is None and o in d.operands(int(vfunc))]:
        raise ValueError(f"{name} needs operand {' and '.join(missing)}")
    return Ins(op, n + (0,) * (4 - len(n)), x, y, z, func=vfunc, dtype=dtype, out_dtype=out_dtype, mode=mode,
               pad=pad, push=push, pop=pop)


def assemble(text: str) -> Program:
    """Parse `disassemble` output (or hand-written assembly) back into a Program."""
    from .config import HardwareConfig

    header = {"regions": [], "inputs": [], "outputs": [], "layers": [], "metadata": {}}
    blob, instructions, layer_ids, layer = [], [], [], -1
    in_text = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line.startswith((".hw", ".layer", ".meta")):   # JSON directives may hold ';' themselves
            line = line.split(";", 1)[0].strip()
        if not line:
            continue
        try:
            if in_text:
                if line.startswith("@layer"):
                    layer = int(line.split()[1])
                    if not -1 <= layer < len(header["layers"]):
                        raise ValueError(f"no layer {layer}; the .layer directives define {len(header['layers'])}")
                else:
                    instructions.append(parse_instruction(line))
                    layer_ids.append(layer)
                continue
            directive, _, rest = line.partition(" ")
            if directive == ".hw":
                header["hw"] = HardwareConfig.from_dict(json.loads(rest)).to_dict()
            elif directive == ".dram":
                header["dram_bytes"] = int(rest, 0)
            elif directive == ".region":
                kind, name, offset, nbytes = shlex.split(rest)
                header["regions"].append({"name": name, "kind": kind, "offset": int(offset, 0),
                                          "nbytes": int(nbytes, 0)})
            elif directive in (".input", ".output"):
                name, dt, offset, shape = shlex.split(rest)
                header[directive[1:] + "s"].append({"name": name, "dtype": int(_DT_BACK[dt]), "offset": int(offset, 0),
                                                    "shape": [int(d) for d in shape.split(",") if d]})
            elif directive == ".layer":
                header["layers"].append(json.loads(rest))
            elif directive == ".meta":
                header["metadata"] = json.loads(rest)
            elif directive == ".const":
                blob.append(base64.b64decode(rest, validate=True))
            elif directive == ".text":
                in_text = True
            else:
                raise ValueError(f"unknown directive {directive}")
        except (ValueError, KeyError, IndexError) as e:
            raise AssemblyError(f"line {lineno}: {raw.strip()!r}: {e}") from None
    for key in ("hw", "dram_bytes"):
        if key not in header:
            raise AssemblyError(f"missing .{key.split('_')[0]} directive")
    blob = b"".join(blob)
    header.update(instructions=len(instructions), constant_bytes=len(blob))
    return Program.from_header(header, encode(instructions), np.array(layer_ids, np.int32), blob)
