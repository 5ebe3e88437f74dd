"""Program-file mutants, for fuzzing `stagec.load` and everything a loaded program reaches
(simulate, the report, the disassembler): a mutant must be rejected with a StagecError or run;
any other exception is a bug.

    >>> import numpy as np, torch, stagec
    >>> x = torch.randn(2, 8)
    >>> data = stagec.compile(torch.nn.Linear(8, 4), (x,)).to_bytes()
    >>> what, mutant = mutate_program(data, np.random.default_rng(0))
    >>> outcome = run_mutant(mutant, [x.numpy()])    # "ok" or "rejected:<ErrorClass>"

A campaign runs each mutant in a subprocess with a timeout, to catch hangs as well as crashes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from stagec.api import load, simulate
from stagec.errors import StagecError
from stagec.frontend.trace import unflatten_inputs
from stagec.isa import assemble, disassemble
from stagec.isa.instructions import INSTRUCTION_BYTES
from stagec.isa.program import FORMAT_VERSION, MAGIC
from stagec.report import make_report

# --- the parts of a (valid) program file -------------------------------------------------------


@dataclass(frozen=True)
class _Parts:
    """A program file cut at its sections: the header (parsed), the rest by byte range."""

    data: bytes
    header: dict
    header_end: int     # the header's JSON ends here; the instructions start at the next multiple of 64
    code: range         # byte ranges of the sections
    layer_ids: range
    constants: range

    @staticmethod
    def of(data: bytes) -> _Parts:
        hlen = struct.unpack_from("<I", data, 12)[0]
        header = json.loads(data[16:16 + hlen])
        start = 16 + hlen + (-(16 + hlen) % INSTRUCTION_BYTES)
        n = header["instructions"]
        ids = start + n * INSTRUCTION_BYTES
        return _Parts(data, header, 16 + hlen, range(start, ids), range(ids, ids + 4 * n),
                      range(ids + 4 * n, len(data)))

    def with_header_text(self, text: str) -> bytes:
        """The file with another header (any text), the sections after it unchanged."""
        head = MAGIC + struct.pack("<II", FORMAT_VERSION, len(text.encode())) + text.encode()
        head += b"\0" * (-len(head) % INSTRUCTION_BYTES)
        return head + self.data[self.code.start:]

    def with_header(self, header: dict) -> bytes:
        return self.with_header_text(json.dumps(header))


# --- byte-level mutations ----------------------------------------------------------------------

_SECTION_WEIGHTS = {"fixed": 0.05, "header": 0.35, "code": 0.35, "layer_ids": 0.1, "constants": 0.1, "any": 0.05}


def _section(parts: _Parts, rng) -> tuple[str, range]:
    ranges = {"fixed": range(0, 16), "header": range(16, parts.header_end), "code": parts.code,
              "layer_ids": parts.layer_ids, "constants": parts.constants, "any": range(len(parts.data))}
    names = [k for k in _SECTION_WEIGHTS if len(ranges[k])]
    weights = np.array([_SECTION_WEIGHTS[k] for k in names])
    name = names[rng.choice(len(names), p=weights / weights.sum())]
    return name, ranges[name]


def _bit_flips(parts: _Parts, rng):
    name, where = _section(parts, rng)
    data = bytearray(parts.data)
    flips = [(int(rng.choice(where)), int(rng.integers(8))) for _ in range(int(rng.integers(1, 5)))]
    for pos, bit in flips:
        data[pos] ^= 1 << bit
    return f"bit flips in {name} at {[f'{p}.{b}' for p, b in flips]}", bytes(data)


_SPECIAL_BYTES = (0x00, 0xFF, 0x7F, 0x80, 0x01)


def _byte_overwrite(parts: _Parts, rng):
    name, where = _section(parts, rng)
    data = bytearray(parts.data)
    pos = int(rng.choice(where))
    count = min(int(rng.integers(1, 9)), len(data) - pos)
    values = [int(rng.choice(_SPECIAL_BYTES)) if rng.random() < 0.5 else int(rng.integers(256)) for _ in range(count)]
    data[pos:pos + count] = bytes(values)
    return f"bytes {pos}..{pos + count - 1} in {name} := {bytes(values).hex()}", bytes(data)


def _truncate(parts: _Parts, rng):
    cut = int(rng.integers(0, len(parts.data)))
    return f"truncated to {cut} bytes", parts.data[:cut]


def _extend(parts: _Parts, rng):
    extra = bytes(rng.integers(0, 256, int(rng.integers(1, 129)), np.uint8)) if rng.random() < 0.5 else \
        b"\0" * int(rng.choice([1, 4, 63, 64, 68]))
    return f"{len(extra)} bytes appended", parts.data + extra


def _layer_ids(parts: _Parts, rng):
    if not len(parts.layer_ids):
        return _extend(parts, rng)
    n_layers = len(parts.header["layers"])
    value = int(rng.choice([n_layers, n_layers + 1, -2, 2**31 - 1, -2**31, int(rng.integers(-5, n_layers + 5))]))
    i = int(rng.integers(len(parts.layer_ids) // 4))
    data = bytearray(parts.data)
    struct.pack_into("<i", data, parts.layer_ids.start + 4 * i, value)
    return f"layer id of instruction {i} := {value}", bytes(data)


# --- header mutations --------------------------------------------------------------------------

def _paths(node, path=()) -> list[tuple]:
    """Every key path into a JSON tree (the root excluded)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for key, value in items:
        out.append((*path, key))
        out += _paths(value, (*path, key))
    return out


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _put(tree, path, value):
    _get(tree, path[:-1])[path[-1]] = value


def _name(path) -> str:
    return "header" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)


def _pick(paths: list, rng):
    return paths[int(rng.integers(len(paths)))]


def _delete_key(parts: _Parts, rng):
    h = parts.header
    path = _pick([p for p in _paths(h) if isinstance(p[-1], str)], rng)
    del _get(h, path[:-1])[path[-1]]
    return f"deleted {_name(path)}", parts.with_header(h)


_KEY_NAMES = ("name", "shape", "offset", "dtype", "kind", "nbytes", "in_tree", "out_tree", "layers", "hw", "x")


def _rename_key(parts: _Parts, rng):
    h = parts.header
    path = _pick([p for p in _paths(h) if isinstance(p[-1], str)], rng)
    parent = _get(h, path[:-1])
    new = str(rng.choice(_KEY_NAMES)) if rng.random() < 0.5 else path[-1] + "_"
    parent[new] = parent.pop(path[-1])
    return f"renamed {_name(path)} to {new!r}", parts.with_header(h)


def _duplicate_key(parts: _Parts, rng):
    h = parts.header
    path = _pick([p for p in _paths(h) if isinstance(p[-1], str)], rng)
    parent = _get(h, path[:-1])
    marker = "\0duplicate\0"
    parent[marker] = _random_value(rng) if rng.random() < 0.5 else parent[path[-1]]
    text = json.dumps(h).replace(json.dumps(marker), json.dumps(path[-1]))
    return f"duplicated {_name(path)}", parts.with_header_text(text)


def _random_value(rng):
    return [None, True, False, 0, -1, 1.5, float("nan"), "x", "", [], [1, 2], {}, {"a": 1}, 2**64][
        int(rng.integers(14))]


def _change_type(parts: _Parts, rng):
    h = parts.header
    path = _pick(_paths(h), rng)
    old = _get(h, path)
    value = _random_value(rng)
    while type(value) is type(old):
        value = _random_value(rng)
    _put(h, path, value)
    return f"{_name(path)} := {value!r} (was a {type(old).__name__})", parts.with_header(h)


def _enum_fields(h: dict) -> list[tuple]:
    paths = [("hw", "dataflow"), ("metadata", "quantize")]
    paths += [("hw", "dtypes", i) for i in range(len(h.get("hw", {}).get("dtypes", [])))]
    paths += [("regions", i, "kind") for i in range(len(h["regions"]))]
    paths += [(kind, i, "dtype") for kind in ("inputs", "outputs") for i in range(len(h[kind]))]
    paths += [("metadata", key, i) for key in ("in_dtypes", "out_dtypes")
              for i in range(len(h["metadata"].get(key, [])))]
    return [p for p in paths if _has(h, p)]


def _has(tree, path) -> bool:
    try:
        _get(tree, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _unknown_enum(parts: _Parts, rng):
    h = parts.header
    path = _pick(_enum_fields(h), rng)
    old = _get(h, path)
    value = int(rng.choice([4, 7, 255, -1])) if isinstance(old, int) else str(rng.choice(
        ["bogus", "float64", "int4", "row_stationary", "CONST", "", "input "]))
    _put(h, path, value)
    return f"{_name(path)} := {value!r}", parts.with_header(h)


def _numbers(h: dict) -> list[tuple]:
    return [p for p in _paths(h) if type(_get(h, p)) in (int, float)]


def _number(parts: _Parts, rng):
    h = parts.header
    path = _pick(_numbers(h), rng)
    v = _get(h, path)
    choices = [-v, -1, 0, v + 1, v - 1, 2 * v, v + 0.5, float(v), float("nan"), float("inf"), 2**31, 2**32,
               2**63, 10**30, 1e300]
    value = choices[int(rng.integers(len(choices)))]
    _put(h, path, value)
    return f"{_name(path)} := {value!r} (was {v!r})", parts.with_header(h)


def _shape(parts: _Parts, rng):
    h = parts.header
    shapes = [(k, i, "shape") for k in ("inputs", "outputs") for i in range(len(h[k]))]
    shapes += [("layers", i, "out_shape") for i in range(len(h["layers"]))]
    shapes += [("layers", i, "in_shapes", j) for i, layer in enumerate(h["layers"])
               for j in range(len(layer["in_shapes"]))]
    path = _pick(shapes, rng)
    shape = list(_get(h, path))
    edit = int(rng.integers(6))
    if edit == 0 or not shape:
        shape.append(int(rng.choice([1, 2, 0])))
    elif edit == 1:
        shape.pop(int(rng.integers(len(shape))))
    else:
        i = int(rng.integers(len(shape)))
        shape[i] = [shape[i] + 1, shape[i] * 2, 0, max(shape[i] - 1, 0), 2**31 + 1][edit - 2 if edit < 5 else 4]
    _put(h, path, shape)
    return f"{_name(path)} := {shape}", parts.with_header(h)


def _offset(parts: _Parts, rng):
    h = parts.header
    paths = [(k, i, key) for k in ("inputs", "outputs", "regions") for i in range(len(h[k]))
             for key in ("offset", "nbytes") if key in h[k][i]]
    paths.append(("dram_bytes",))
    path = _pick(paths, rng)
    v = _get(h, path)
    value = int(rng.choice([v + 1, v + 4, v + 64, v - 64, v * 2, h["dram_bytes"], h["dram_bytes"] - 4, 0]))
    _put(h, path, value)
    return f"{_name(path)} := {value} (was {v})", parts.with_header(h)


def _hw_field(parts: _Parts, rng):
    h = parts.header
    key = str(rng.choice(sorted(h["hw"])))
    value = [0, -1, 1, 3, 2**40, 1e-9, 1e30, "fast", None, [], True, {"a": 1}, float("nan")][int(rng.integers(13))]
    h["hw"][key] = value
    return f"header.hw.{key} := {value!r}", parts.with_header(h)


def _tree(parts: _Parts, rng):
    """Corrupt metadata.in_tree or out_tree: as text, or as the JSON of its torch treespec."""
    h = parts.header
    keys = [k for k in ("in_tree", "out_tree") if k in h["metadata"]]
    if not keys:
        return _change_type(parts, rng)
    key = str(rng.choice(keys))
    text = h["metadata"][key]
    if rng.random() < 0.3:   # as text: a character dropped, changed or inserted
        i = int(rng.integers(len(text) + 1))
        c = str(rng.choice(list('[]{}",:0aZ\\')))
        text = [text[:i] + text[i + 1:], text[:i] + c + text[i + 1:], text[:i] + c + text[i:]][int(rng.integers(3))]
        what = f"edited at character {i}"
    else:
        record = json.loads(text)
        spec_text = record["treespec"] if key == "in_tree" else text
        spec = json.loads(spec_text)
        edit, spec, record = _edit_treespec(spec, record, rng)
        spec_text = json.dumps(spec)
        text = json.dumps({**record, "treespec": spec_text}) if key == "in_tree" else spec_text
        what = edit
    h["metadata"][key] = text
    return f"header.metadata.{key} {what}", parts.with_header(h)


def _edit_treespec(spec, record, rng):
    nodes = [p for p in _paths(spec) if isinstance(_get(spec, p), dict)]
    path = _pick(nodes, rng)
    node = _get(spec, path)
    edit = int(rng.integers(7))
    if edit == 0:
        node["type"] = str(rng.choice(["builtins.list", "builtins.dict", "collections.OrderedDict", "no.such.Type",
                                       "builtins.tuple"]))
    elif edit == 1:
        node["children_spec"].append({"type": None, "context": None, "children_spec": []})
    elif edit == 2 and node["children_spec"]:
        node["children_spec"].pop()
    elif edit == 3:
        node["context"] = str(rng.choice(['["a"]', "[]", "null", "{", '["x", "y", "z"]', "7"]))
    elif edit == 4:
        node[str(rng.choice(["type", "context", "children_spec"]))] = _random_value(rng)
    elif edit == 5 and isinstance(record, dict) and "constants" in record:
        record = {**record, "constants": {str(int(rng.integers(-1, 6))): _random_value(rng)}}
    else:
        spec[0] = int(rng.choice([0, 2, -1]))
    return f"treespec node {list(path)} edit {edit}", spec, record


_MUTATIONS = {   # name -> (weight, mutation(parts, rng) -> (description, bytes))
    "bit_flips": (3, _bit_flips),
    "byte_overwrite": (3, _byte_overwrite),
    "truncate": (1, _truncate),
    "extend": (1, _extend),
    "layer_ids": (1, _layer_ids),
    "delete_key": (1, _delete_key),
    "rename_key": (1, _rename_key),
    "duplicate_key": (1, _duplicate_key),
    "change_type": (2, _change_type),
    "unknown_enum": (1, _unknown_enum),
    "number": (2, _number),
    "shape": (1, _shape),
    "offset": (1, _offset),
    "hw_field": (1, _hw_field),
    "tree": (2, _tree),
}
_NAMES = list(_MUTATIONS)
_WEIGHTS = np.array([_MUTATIONS[k][0] for k in _NAMES], float) / sum(w for w, _ in _MUTATIONS.values())


def mutate_program(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One random mutation of a valid program file: (a short description of it, the mutant)."""
    name = _NAMES[rng.choice(len(_NAMES), p=_WEIGHTS)]
    description, mutant = _MUTATIONS[name][1](_Parts.of(data), rng)
    return f"{name}: {description}", mutant


# --- running a mutant ----------------------------------------------------------------------------

def run_mutant(data: bytes, inputs) -> str:
    """Load `data`, simulate it on `inputs` (arrays, one per input of the original program; skipped
    when they no longer fit the mutant's inputs), make its report (summary and JSON) and disassemble
    it (and assemble that back): "rejected:<ErrorClass>" when stagec raised a StagecError, "ok"
    when all of it ran.  Any other exception propagates: that is a bug."""
    try:
        program = load(data)
        report = None
        if _fits(program, inputs):
            in_tree = program.metadata.get("in_tree")
            args, kwargs = unflatten_inputs(in_tree, inputs) if in_tree else (tuple(inputs), {})
            _, report = simulate(program, *args, **kwargs)
        report = report or make_report(program)
        report.summary()
        json.dumps(report.to_dict(), allow_nan=False)
        text = disassemble(program)
        if assemble(text) != program:
            raise AssertionError("the disassembly does not assemble back to the program")
    except StagecError as e:
        return f"rejected:{type(e).__name__}"
    return "ok"


def _fits(program, inputs) -> bool:
    """Whether `inputs` have the count and shapes of the program's inputs (the mutant's may differ)."""
    return len(inputs) == len(program.inputs) and all(
        tuple(np.shape(x)) == ref.shape for x, ref in zip(inputs, program.inputs, strict=True))
