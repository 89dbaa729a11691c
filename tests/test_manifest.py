"""The course check: the manifest, the stubs, the references and the hidden checks line up."""

import ast
import re

import pytest

from grader.exercise import load_manifest
from tests.conftest import ROOT

EXERCISES = list(load_manifest().values())


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_exercise_has_its_four_places_and_100_points(exercise):
    assert exercise.stub_path.is_file() and exercise.checks_path.is_file()
    assert (ROOT / "solutions" / exercise.file).is_file()
    assert exercise.max_score == 100
    assert len({s.id for s in exercise.steps}) == len(exercise.steps)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_step_has_hints_checks_and_a_todo(exercise):
    checks = exercise.checks_path.read_text()
    stub = exercise.stub_path.read_text()
    names = _top_level_names(stub)
    for step in exercise.steps:
        assert len(step.hints) >= 2, step.id
        points = sum(int(p) for p in re.findall(rf'@step\("{step.id}", points=(\d+)\)', checks))
        assert points > 0, f"no checks for {step.id}"
        assert step.id in names, f"the stub has no {step.id}"
        assert "# TODO" in _source_of(stub, step.id), f"the stub's {step.id} has no TODO"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_reference_and_stub_share_signatures_and_docstrings(exercise):
    stub = ast.parse(exercise.stub_path.read_text())
    reference = ast.parse((ROOT / "solutions" / exercise.file).read_text())
    assert _interface(stub) == _interface(reference)


def _top_level_names(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _source_of(source: str, name: str) -> str:
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == name)
    return "\n".join(source.splitlines()[node.lineno - 1 : node.end_lineno])


def _interface(tree) -> list:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            args = ast.dump(node.args) if isinstance(node, ast.FunctionDef) else ""
            out.append((node.name, args, ast.get_docstring(node)))
    return out
