"""The command line: a user's mistake is one line on stderr and a non-zero exit, --debug shows the
traceback, a bug always does."""

import re
import subprocess
import sys
import textwrap

import pytest
from programs import relu_matmul

from stagec.cli import main


@pytest.fixture
def program_file(tmp_path):
    path = tmp_path / "p.stgc"
    relu_matmul()[0].save(path)
    return path


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"stagec {command}: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err.removeprefix(f"stagec {command}: ").strip()


@pytest.mark.parametrize("command", ["disasm", "report"])
@pytest.mark.parametrize("content, message", [
    (None, "No such file or directory"),
    (b"GARBAGE!" * 4, "not a stagec program: bytes 0-7 are b'GARBAGE!'"),
    ("truncated", "bytes; its header promises 5 instructions at byte offset"),
    ("bad header", "header.dram_bytes = -1: expected an integer"),
])
def test_a_bad_program_file_is_one_line(command, content, message, program_file, tmp_path, capsys):
    path = tmp_path / "bad.stgc"
    if content == "truncated":
        path.write_bytes(program_file.read_bytes()[:-10])
    elif content == "bad header":
        path.write_bytes(program_file.read_bytes().replace(b'"dram_bytes": 512', b'"dram_bytes": -1 '))
    elif content is not None:
        path.write_bytes(content)
    assert main([command, str(path), *(["--out", str(tmp_path / "out")] if command == "report" else [])]) == 1
    assert message in one_line_error(capsys, command)


@pytest.mark.parametrize("yaml_text, message", [
    ("array_rows: [16\n", "while parsing a flow sequence"),
    ("array_rows: 0\n", "HardwareConfig.array_rows = 0: expected an integer in [1, 1024]"),
    ("- 16\n", "a hardware config must be a mapping"),
])
def test_demo_with_a_bad_hardware_config_is_one_line(yaml_text, message, tmp_path, capsys):
    path = tmp_path / "hw.yaml"
    path.write_text(yaml_text)
    assert main(["demo", "--hw", str(path)]) == 1
    err = one_line_error(capsys, "demo")
    assert err.startswith(f"{path}: ") and message in err


FACTORIES = textwrap.dedent('''
    import torch

    def raises():
        raise ValueError("no weights here")

    def returns_a_pair_of_ints():
        return 1, 2

    def returns_a_model():
        return torch.nn.Linear(2, 2)
''')


@pytest.mark.parametrize("spec, message", [
    ("{path}:raises", "{path}:raises: raises() raised ValueError: no weights here"),
    ("{path}:returns_a_pair_of_ints", "returns_a_pair_of_ints() returned (int, int); expected (torch.nn.Module, args)"),
    ("{path}:returns_a_model", "returns_a_model() returned Linear; expected (torch.nn.Module, args)"),
    ("{broken}:f", "{broken} failed to import: ZeroDivisionError: division by zero"),
])
def test_ops_with_a_failing_factory_is_one_line(spec, message, tmp_path, capsys):
    path, broken = tmp_path / "models.py", tmp_path / "broken.py"
    path.write_text(FACTORIES)
    broken.write_text("x = 1 / 0\n")
    assert main(["ops", spec.format(path=path, broken=broken)]) == 2
    assert message.format(path=path, broken=broken) in one_line_error(capsys, "ops")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where, tmp_path):
    argv = ["disasm", str(tmp_path / "missing.stgc")]
    with pytest.raises(FileNotFoundError):
        main(["--debug", *argv] if where == "before" else [*argv, "--debug"])


def test_a_bug_is_a_traceback_not_a_line(program_file, monkeypatch):
    def broken(program):
        raise KeyError("a bug")
    monkeypatch.setattr("stagec.isa.disassemble", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["disasm", str(program_file)])


def test_usage_errors_exit_2_and_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit) as e:
        main(["disasm"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "exit status: 0 on success; 1 when a file" in capsys.readouterr().out


def test_the_installed_command_prints_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "stagec", "disasm", "missing.stgc"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "stagec disasm: missing.stgc: No such file or directory\n"


def test_demo_in_bf16_shows_bf16_beside_fp32_and_meets_its_bound(capsys):
    assert main(["demo", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    rows = {m[1]: m[2] for m in re.finditer(r"^(bf16|fp32) +([\d.]+) ", out, re.M)}   # precision: DRAM KiB
    assert set(rows) == {"bf16", "fp32"}
    assert float(rows["bf16"]) < 0.7 * float(rows["fp32"])   # two-byte activations and weights
    assert "bf16 cosine similarity" in out and "within the demo's bound 0.999" in out
