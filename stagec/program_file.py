"""A program file, read back: every header key, the recorded input and output structure and the
instruction stream checked.  Needs neither torch nor JAX (`stagec disasm`).

    >>> import stagec                                              # doctest: +SKIP
    >>> program = stagec.load("model.stgc")                        # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

from stagec.errors import ProgramFormatError
from stagec.isa import Program, verify


def load(path_or_data: str | Path | bytes | bytearray | memoryview) -> Program:
    """Read a program file written by `Program.save` (or its bytes).  Every header key is checked
    (`isa.program.HEADER`), the recorded input and output structure against the program's tensors,
    and the instruction stream by the verifier; a file that fails raises ProgramFormatError or
    VerificationError naming the key, byte offset or instruction."""
    data = bytes(path_or_data) if isinstance(path_or_data, (bytes, bytearray, memoryview)) else \
        Path(path_or_data).read_bytes()
    program = Program.from_bytes(data)
    check_metadata(program)
    verify(program)
    return program


def check_metadata(program: Program) -> None:
    """The recorded input and output structure against the program's tensors, and the records the
    report reads (once per program)."""
    if "io_checked" not in program.cache:
        check_io_metadata(program.metadata, len(program.inputs), len(program.outputs))
        check_report_metadata(program.metadata)
        program.cache["io_checked"] = True


def _count(x) -> bool:
    return type(x) is int and x >= 0


def _number(x) -> bool:
    return type(x) in (int, float) and x >= 0


# what the report reads of a program's metadata: key -> (what a well-formed value is, how to check one)
_REPORT_METADATA = {
    "local_peak_bytes": ("an object of layer name -> [scratchpad bytes, accumulator bytes]",
                         lambda v: type(v) is dict and all(type(p) is list and len(p) == 2 and all(map(_count, p))
                                                           for p in v.values())),
    "cascades": ("a list of {layers: [names], tile: [rows, cols], saved_bytes: number, and a halo cascade's "
                 "halo: \"recompute\" or \"line buffer\"}",
                 lambda v: type(v) is list and all(
                     type(c) is dict and set(c) - {"halo"} == {"layers", "tile", "saved_bytes"}
                     and c.get("halo", "recompute") in ("recompute", "line buffer")
                     and type(c["layers"]) is list and all(type(n) is str for n in c["layers"])
                     and type(c["tile"]) is list and len(c["tile"]) == 2 and all(map(_count, c["tile"]))
                     and _number(c["saved_bytes"]) for c in v)),
    "packed_weight_zeros": ("a byte count", _count),
    "targets": ("{latency_s: seconds or null, power_w: watts or null, tried: [what compile tried]}",
                lambda v: type(v) is dict and set(v) == {"latency_s", "power_w", "tried"}
                and all(v[k] is None or _number(v[k]) for k in ("latency_s", "power_w"))
                and type(v["tried"]) is list and all(type(t) is str for t in v["tried"])),
}


def check_report_metadata(metadata) -> None:
    """The metadata the report reads (stagec.report: peak local bytes, cascades, targets), well formed;
    ProgramFormatError naming the key and what it should be."""
    for key, (expected, ok) in _REPORT_METADATA.items():
        if key in metadata and not ok(metadata[key]):
            raise ProgramFormatError(f"header.metadata.{key}: expected {expected}")


def check_io_metadata(metadata, n_inputs: int, n_outputs: int) -> None:
    """Check a program's recorded input and output structure (in_tree, out_tree) against its
    number of input and output tensors, without rebuilding the trees: their container types need
    not be registered with torch in this process (a transformers model's outputs, say) until the
    program runs.  Raises ProgramFormatError naming the metadata key."""
    if "in_tree" in metadata:
        record = _json("in_tree", metadata["in_tree"])
        if type(record) is not dict or set(record) != {"treespec", "constants"}:
            raise ProgramFormatError("header.metadata.in_tree: expected an object with keys 'treespec' and "
                                     "'constants'")
        root = _json("in_tree.treespec", record["treespec"]) if type(record["treespec"]) is str else None
        leaves = _serialized_leaves("in_tree.treespec", root)
        if [root[1]["type"], *(c["type"] for c in root[1]["children_spec"])] != _CALL_TYPES:
            raise ProgramFormatError("header.metadata.in_tree.treespec: expected a tuple of (args tuple, kwargs dict)")
        constants = record["constants"]
        if type(constants) is not dict or any(not k.isdigit() or int(k) >= leaves for k in constants):
            raise ProgramFormatError(f"header.metadata.in_tree.constants: expected an object keyed by leaf "
                                     f"indices below {leaves}")
        if leaves - len(constants) != n_inputs:
            raise ProgramFormatError(f"header.metadata.in_tree: {leaves - len(constants)} tensor inputs, "
                                     f"the program has {n_inputs}")
    if "out_tree" in metadata:
        leaves = _serialized_leaves("out_tree", _json("out_tree", metadata["out_tree"]))
        if leaves != n_outputs:
            raise ProgramFormatError(f"header.metadata.out_tree: {leaves} outputs, the program has {n_outputs}")


_CALL_TYPES = ["builtins.tuple", "builtins.tuple", "builtins.dict"]
_NODE_KEYS = {"type", "context", "children_spec"}


def _json(key: str, text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProgramFormatError(f"header.metadata.{key}: not JSON ({e})") from None


def _serialized_leaves(key: str, data) -> int:
    """The leaves of a treespec as torch's treespec_dumps writes it ([protocol, node], a node
    {"type", "context", "children_spec"}, a leaf's type null), counted from the JSON alone."""
    if type(data) is not list or len(data) != 2 or data[0] != 1:
        raise ProgramFormatError(f"header.metadata.{key}: expected a torch treespec, [1, node]")
    leaves, stack = 0, [data[1]]
    while stack:
        node = stack.pop()
        if (type(node) is not dict or set(node) != _NODE_KEYS or type(node["children_spec"]) is not list
                or not all(node[k] is None or type(node[k]) is str for k in ("type", "context"))
                or (node["type"] is None and node["children_spec"])):
            raise ProgramFormatError(f"header.metadata.{key}: a treespec node is not "
                                     "{type: str or null, context: str or null, children_spec: [node, ...]}")
        leaves += node["type"] is None
        stack += node["children_spec"]
    return leaves
