import subprocess
import sys
import tomllib
from pathlib import Path


def test_stages_install_only_under_stagec(tmp_path):
    code = ("import importlib.util as u, stagec.frontend, stagec.lower, stagec.isa, stagec.sim, stagec.costmodel;"
            "print([m for m in ('frontend', 'lower', 'isa', 'sim', 'costmodel') if u.find_spec(m)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_demo_entry_point_help(tmp_path):
    out = subprocess.run([sys.executable, "-m", "stagec", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert "demo" in out.stdout


def test_every_package_folder_is_in_the_wheel():
    """setuptools installs only the packages pyproject.toml lists: a subpackage missing there (lower.codegen,
    say) imports from a checkout and is absent from the wheel."""
    root = Path(__file__).resolve().parent.parent
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join([package, *init.parent.relative_to(root / folder).parts])
               for package, folder in setuptools["package-dir"].items()
               for init in (root / folder).rglob("__init__.py")}
    assert on_disk == set(setuptools["packages"])


def test_torch_is_a_closed_range_and_the_reproducible_setup_pins_it():
    """pip install stagec keeps the torch an environment has (a closed range around it, never a pin that
    downgrades, never an open one that pulls a CUDA build); README and CI pin the CPU build through
    constraints.txt."""
    from importlib.metadata import version

    from packaging.requirements import Requirement
    root = Path(__file__).resolve().parent.parent
    deps = [Requirement(d) for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]]
    (torch_req,) = [r for r in deps if r.name == "torch"]
    operators = {s.operator for s in torch_req.specifier}
    assert operators == {">=", "<"}, torch_req
    assert version("torch").split("+")[0] in torch_req.specifier
    pins = [Requirement(line) for line in (root / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    (pin,) = [r for r in pins if r.name == "torch"]
    assert [s.operator for s in pin.specifier] == ["=="] and next(iter(pin.specifier)).version in torch_req.specifier
    for command_file in ("README.md", ".ci/run"):
        installs = [line for line in (root / command_file).read_text().splitlines() if "pip install" in line
                    and line.lstrip().startswith(("python3", ".venv"))]
        assert installs and all("-c constraints.txt" in line for line in installs), command_file
