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
    assert q == p
    assert q.to_bytes() == path.read_bytes()
    assert path.read_bytes()[:8] == MAGIC


def test_assembly_round_trip():
    p, _, _ = relu_matmul()
    text = disassemble(p)
    assert "matmul" in text and "vector.relu" in text and "pop=load" in text
    q = assemble(text)
    assert q == p and disassemble(q) == text


def test_compiled_program_round_trips(tmp_path):
    import torch
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.ReLU())
    p = stagec.compile(model, (torch.randn(1, 3, 9, 9),))
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
