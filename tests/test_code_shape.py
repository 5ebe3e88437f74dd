"""The package's sources stay readable: no module over MAX_MODULE_LINES lines, no function over
MAX_FUNCTION_LINES (tests and experiments aside).  Every folder that installs as part of stagec is
scanned, as pyproject.toml's package-dir maps them."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def package_folders() -> list[Path]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return sorted({ROOT / folder for folder in setuptools["package-dir"].values()})


def sources() -> list[Path]:
    return sorted(path for folder in package_folders() for path in folder.rglob("*.py"))


def too_long(path: Path, root: Path = ROOT) -> list[str]:
    """`path:line: what` for the module, and each function (methods and nested ones too), over its limit."""
    text = path.read_text()
    where = path.relative_to(root)
    found = []
    if len(text.splitlines()) > MAX_MODULE_LINES:
        found.append(f"{where}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno}: {node.name} is {lines} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_the_scan_covers_every_stage():
    assert {p.name for p in package_folders()} >= {"stagec", "frontend", "lower", "costmodel", "isa", "sim"}
    assert ROOT / "lower" / "codegen" / "matrix.py" in sources()


def test_no_module_or_function_is_too_long():
    found = [line for path in sources() for line in too_long(path)]
    assert not found, "split these by concern:\n" + "\n".join(found)


def test_a_long_function_and_a_long_module_are_found(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))

    fits = tmp_path / "fits.py"
    fits.write_text(function("at_the_limit", MAX_FUNCTION_LINES) + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    assert len(fits.read_text().splitlines()) == MAX_MODULE_LINES and too_long(fits, tmp_path) == []
    long = tmp_path / "long.py"
    long.write_text("class C:\n" + function("method", MAX_FUNCTION_LINES + 1, "    ") + "\n" * MAX_MODULE_LINES)
    assert too_long(long, tmp_path) == [
        f"long.py: {MAX_MODULE_LINES + MAX_FUNCTION_LINES + 2} lines (at most {MAX_MODULE_LINES})",
        f"long.py:2: method is {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]
