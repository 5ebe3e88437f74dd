"""Fast start: `import stagec.isa`, `stagec --help` and `stagec disasm` load neither torch nor JAX;
stagec's public names still resolve, and HardwareConfig is a pytree once JAX is imported."""

import subprocess
import sys
import textwrap

import torch

import stagec
from stagec.isa import disassemble

HEAVY = "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"


def run_python(code: str, cwd) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                         check=True)
    return out.stdout


def test_isa_and_the_cli_help_import_neither_torch_nor_jax(tmp_path):
    out = run_python(f"""
        import sys
        import stagec.isa
        stagec.isa.HardwareConfig(array_rows=8)
        {HEAVY}
        from stagec.cli import main
        try:
            main(["--help"])
        except SystemExit as e:
            assert e.code == 0
        {HEAVY}
    """, tmp_path)
    assert out.startswith("[]\n") and "usage: stagec" in out and out.endswith("[]\n")


def test_disasm_of_a_compiled_program_imports_neither_torch_nor_jax(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    program = stagec.compile(model, (torch.randn(2, 8),))
    program.save(tmp_path / "p.stgc")
    out = run_python(f"""
        import sys
        from stagec.cli import main
        assert main(["disasm", "p.stgc"]) == 0
        {HEAVY}
    """, tmp_path)
    assert out == disassemble(program) + "[]\n"


def test_hardware_config_is_a_pytree_when_jax_comes_after_it(tmp_path):
    out = run_python("""
        from stagec.isa import HardwareConfig
        import jax
        hw = HardwareConfig(clock_hz=5e8)
        leaves, tree = jax.tree_util.tree_flatten(hw)
        assert jax.tree_util.tree_unflatten(tree, leaves) == hw and 5e8 in leaves
        print(len(leaves), type(jax.__loader__).__name__)
    """, tmp_path)
    n_leaves = len(__import__("jax").tree_util.tree_leaves(stagec.HardwareConfig()))
    assert out == f"{n_leaves} SourceFileLoader\n" and n_leaves > 0


def test_every_public_name_resolves_and_codesign_stays_the_function(tmp_path):
    out = run_python("""
        import stagec, stagec.codesigning
        assert set(stagec.__all__) <= set(dir(stagec))
        missing = [n for n in stagec.__all__ if getattr(stagec, n, None) is None]
        print(missing, callable(stagec.codesign), stagec.compile.__module__, stagec.load.__module__)
    """, tmp_path)
    assert out == "[] True stagec.compiler stagec.program_file\n"
