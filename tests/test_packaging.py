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
