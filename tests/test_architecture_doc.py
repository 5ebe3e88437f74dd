"""docs/architecture.md stays true: every file it names exists, and every `module:name` it points to
is defined there."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_file_the_architecture_names_exists():
    named = set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md))(?::\w+)?`", DOC))
    named |= set(re.findall(r"^\s*[├└]?─*\s*\w*\s*((?:[\w.-]+/)+[\w.-]+\.py)", DOC, re.M))
    assert len(named) > 30
    missing = sorted(p for p in named if "<" not in p and not (ROOT / p).is_file())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_definition_the_architecture_points_to_exists():
    pointed = re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.py):(\w+)`", DOC)
    assert pointed
    for path, name in pointed:
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        assert name in defined, f"docs/architecture.md: {path} has no {name}"


def test_the_stage_names_are_the_pipelines():
    from stagec.pipeline import PIPELINE
    for stage in PIPELINE:
        assert re.search(rf"\b{stage.name}\b", DOC), f"docs/architecture.md does not name the stage {stage.name!r}"
