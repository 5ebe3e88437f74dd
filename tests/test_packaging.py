import subprocess
import sys


def test_stages_install_only_under_stagec(tmp_path):
    code = ("import importlib.util as u, stagec.frontend, stagec.lower, stagec.isa, stagec.sim, stagec.costmodel;"
            "print([m for m in ('frontend', 'lower', 'isa', 'sim', 'costmodel') if u.find_spec(m)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_demo_entry_point_help(tmp_path):
    out = subprocess.run([sys.executable, "-m", "stagec", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert "demo" in out.stdout
