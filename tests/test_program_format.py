import dataclasses
import json

import numpy as np
import pytest
from programs import relu_matmul

import stagec
from stagec.isa import AssemblyError, Program, ProgramFormatError, assemble, disassemble
from stagec.isa.program import MAGIC


def test_binary_round_trip_is_bit_exact(tmp_path):
    p, _, _ = relu_matmul()
    path = tmp_path / "p.stgc"
    p.save(path)
    q = stagec.load(path)
    assert q == p and stagec.load(path.read_bytes()) == p and stagec.load(bytearray(path.read_bytes())) == p
    assert q.to_bytes() == path.read_bytes()
    assert path.read_bytes()[:8] == MAGIC


def test_assembly_round_trip():
    p, _, _ = relu_matmul()
    text = disassemble(p)
    assert "matmul" in text and "vector.relu" in text and "pop=load" in text
    q = assemble(text)
    assert q == p and disassemble(q) == text


@pytest.mark.parametrize("model, x", [
    ("conv", (1, 3, 9, 9)),
    ("embedding", (2, 5)),    # GATHER, with its table's row count in n[3]
])
def test_compiled_program_round_trips(tmp_path, model, x):
    import torch
    if model == "conv":
        model, x = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.ReLU()), torch.randn(*x)
    else:
        model, x = torch.nn.Embedding(10, 4), torch.randint(0, 10, x)
    p = stagec.compile(model.eval(), (x,))
    assert assemble(disassemble(p)) == p
    p.save(tmp_path / "m.stgc")
    assert stagec.load(tmp_path / "m.stgc") == p


def test_corrupt_files_name_the_byte_offset(tmp_path):
    p, _, _ = relu_matmul()
    data = p.to_bytes()
    with pytest.raises(ProgramFormatError, match="not a stagec program: bytes 0-7"):
        Program.from_bytes(b"GARBAGE!" + data[8:])
    with pytest.raises(ProgramFormatError, match="byte offset 8: format version 7"):
        Program.from_bytes(data[:8] + (7).to_bytes(4, "little") + data[12:])
    with pytest.raises(ProgramFormatError, match=r"file is \d+ bytes; its header promises 5 instructions at byte "
                                                 r"offset \d+"):
        Program.from_bytes(data[:-10])


def test_bad_assembly_names_the_line():
    p, _, _ = relu_matmul()
    lines = disassemble(p).splitlines()
    lines[-1] = lines[-1].replace("store", "stor")
    with pytest.raises(AssemblyError, match=f"line {len(lines)}"):
        assemble("\n".join(lines))


def test_program_is_immutable():
    p, _, _ = relu_matmul()
    with pytest.raises(ValueError):
        p.code["opcode"][0] = 2
    assert np.array_equal(p.layer_ids, np.zeros(5))


def _with_header(data: bytes, edit) -> bytes:
    """The file with its JSON header edited in place by `edit(header)`, or replaced by the text it
    returns (the sections after it kept)."""
    hlen = int.from_bytes(data[12:16], "little")
    header = json.loads(data[16:16 + hlen])
    start = 16 + hlen + (-(16 + hlen) % 64)
    text = edit(header)
    text = text if isinstance(text, str) else json.dumps(header)
    head = data[:12] + len(text).to_bytes(4, "little") + text.encode()
    return head + b"\0" * (-len(head) % 64) + data[start:]


def _set(path, value):
    def edit(h):
        *parents, last = path
        for key in parents:
            h = h[key]
        h[last] = value
    return edit


def _delete(*path):
    def edit(h):
        *parents, last = path
        for key in parents:
            h = h[key]
        del h[last]
    return edit


@pytest.mark.parametrize("edit, message", [
    (_delete("dram_bytes"), "header: missing key 'dram_bytes'"),
    (_set(["dram_byte"], 512), "header: unknown key 'dram_byte'; did you mean 'dram_bytes'?"),
    (_set(["dram_bytes"], "512"), "header.dram_bytes = '512': expected an integer in [0, 4294967296]"),
    (_set(["dram_bytes"], float("nan")), "header.dram_bytes = nan: expected an integer"),
    (_set(["dram_bytes"], True), "header.dram_bytes = True: expected an integer"),
    (_set(["instructions"], -1), "header.instructions = -1: expected an integer in [0, 4294967296]"),
    (_set(["inputs", 0, "shape", 1], -1), "header.inputs[0].shape[1] = -1: expected an integer in [0, 4294967296]"),
    (_set(["inputs", 0, "shape"], 8), "header.inputs[0].shape = 8: expected a list"),
    (_set(["outputs", 0, "dtype"], 9), "header.outputs[0].dtype = 9: expected one of 0, 1, 2, 3"),
    (_set(["outputs", 0, "name"], None), "header.outputs[0].name = None: expected a string"),
    (_delete("inputs", 0, "offset"), "header.inputs[0]: missing key 'offset'"),
    (_set(["regions", 1, "kind"], "bogus"), "header.regions[1].kind = 'bogus': expected one of 'const', 'input'"),
    (_set(["regions"], {}), "header.regions = {}: expected a list"),
    (_set(["layers", 0, "macs"], 1.5), "header.layers[0].macs = 1.5: expected an integer"),
    (_set(["layers", 0, "in_shapes", 1], [4, "5"]), "header.layers[0].in_shapes[1][1] = '5': expected an integer"),
    (_set(["hw", "clock_hz"], "fast"), "header.hw: HardwareConfig.clock_hz = 'fast': expected a finite number"),
    (_set(["hw", "array_rows"], 0), "header.hw: HardwareConfig.array_rows = 0: expected an integer in [1, 1024]"),
    (_delete("hw", "clock_hz"), "header.hw: missing key 'clock_hz'"),
    (_set(["hw", "clock"], 1e9), "header.hw: unknown hardware config field 'clock'"),
    (_set(["metadata"], []), "header.metadata = []: expected an object"),
    (_set(["metadata", "out_dtypes"], ["complex64"]), "header.metadata.out_dtypes[0] = 'complex64': expected one of"),
    (_set(["metadata", "out_dtypes"], []), "header.metadata.out_dtypes has 0 entries, one per outputs (1)"),
    (_set(["metadata", "in_tree"], 7), "header.metadata.in_tree = 7: expected a string"),
    (_set(["metadata", "quantize"], 8), "header.metadata.quantize = 8: expected a string"),
])
def test_every_header_key_is_checked_and_named(edit, message):
    p, _, _ = relu_matmul()
    with pytest.raises(ProgramFormatError) as e:
        Program.from_bytes(_with_header(p.to_bytes(), edit))
    assert str(e.value).startswith(message)


def test_a_header_with_a_key_twice_is_rejected():
    p, _, _ = relu_matmul()
    data = _with_header(p.to_bytes(), lambda h: None)
    text = data[16:16 + int.from_bytes(data[12:16], "little")].decode()
    doubled = text.replace('"dram_bytes": 512', '"dram_bytes": 512, "dram_bytes": 4096')
    with pytest.raises(ProgramFormatError, match="byte offset 16: the header has key 'dram_bytes' twice"):
        Program.from_bytes(_with_header(data, lambda h: doubled))


def test_layer_index_out_of_the_layer_table_names_its_byte_offset():
    p, _, _ = relu_matmul()
    data = bytearray(p.to_bytes())
    ids_at = len(data) - len(p.constants) - 4 * len(p)
    data[ids_at + 8:ids_at + 12] = (3).to_bytes(4, "little", signed=True)
    with pytest.raises(ProgramFormatError, match=f"layer index table at byte offset {ids_at}: instruction 2 names "
                                                 r"layer 3; the program has 1 layers \(-1: none\)"):
        Program.from_bytes(bytes(data))
    with pytest.raises(ProgramFormatError, match="instruction 4 names layer -2"):
        dataclasses.replace(p, layer_ids=np.array([0, 0, 0, 0, -2]), cache={})
    text = disassemble(p).replace("@layer 0", "@layer 1")
    with pytest.raises(AssemblyError, match=r"line \d+: '@layer 1  ; mm': no layer 1; the .layer directives define 1$"):
        assemble(text)


@pytest.fixture(scope="module")
def structured_program():
    import torch

    class TwoHeads(torch.nn.Module):
        def forward(self, x, *, scale):
            return {"double": x * 2, "scaled": (x * scale).sum(-1)}

    x, scale = torch.randn(2, 8), torch.randn(2, 8)
    return stagec.compile(TwoHeads(), (x,), kwargs={"scale": scale}), x, scale


@pytest.mark.parametrize("key, edit, message", [
    ("in_tree", lambda t: t[:-3], "header.metadata.in_tree: not JSON"),
    ("in_tree", lambda t: json.dumps({"treespec": json.loads(t)["treespec"]}),
     "header.metadata.in_tree: expected an object with keys 'treespec' and 'constants'"),
    ("in_tree", lambda t: json.dumps({**json.loads(t), "constants": {"9": 1}}),
     "header.metadata.in_tree.constants: expected an object keyed by leaf indices below 2"),
    ("in_tree", lambda t: json.dumps({**json.loads(t), "constants": {"1": 1}}),
     "header.metadata.in_tree: 1 tensor inputs, the program has 2"),
    ("in_tree", lambda t: json.dumps({**json.loads(t), "treespec": "[1, 7]"}),
     "header.metadata.in_tree.treespec: a treespec node is not"),
    ("out_tree", lambda t: t.replace('"children_spec": [{', '"children_spec": [{"type": null, "context": null, '
                                     '"children_spec": []}, {', 1), "header.metadata.out_tree: 3 outputs, the "
     "program has 2"),
    ("out_tree", lambda t: "[2" + t[2:], "header.metadata.out_tree: expected a torch treespec, [1, node]"),
])
def test_corrupt_input_and_output_structure_is_rejected_at_load(structured_program, key, edit, message):
    p, _, _ = structured_program
    data = _with_header(p.to_bytes(), lambda h: h["metadata"].update({key: edit(h["metadata"][key])}))
    with pytest.raises(ProgramFormatError) as e:
        stagec.load(data)
    assert str(e.value).startswith(message)


def test_a_container_type_torch_cannot_rebuild_fails_when_the_program_runs(structured_program):
    """Container types (a transformers ModelOutput, say) need not be registered to load a program:
    only to run it, and then the error says what to import."""
    p, x, scale = structured_program
    unknown = _with_header(p.to_bytes(), lambda h: h["metadata"].update(
        out_tree=h["metadata"]["out_tree"].replace("builtins.dict", "no_such_module.Output")))
    q = stagec.load(unknown)
    with pytest.raises(ProgramFormatError, match="header.metadata.out_tree: .*not registered.* import the module"):
        stagec.simulate(q, x, scale=scale)
    mismatched = _with_header(p.to_bytes(), lambda h: h["metadata"].update(
        out_tree=h["metadata"]["out_tree"].replace("builtins.dict", "builtins.list")))
    with pytest.raises(ProgramFormatError, match="header.metadata.out_tree: "):
        stagec.simulate(stagec.load(mismatched), x, scale=scale)
