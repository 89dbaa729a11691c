"""The course check, both ways (as rustlings checks its exercises): every exercise of the manifest
has its five places, and every file in those places belongs to an exercise of the manifest.

An exercise is: a stub (exercises/NAME.py), a reference (solutions/NAME.py), a spec
(grader/checks/NAME.py), a manifest entry, and its variants (tests/variants_NAME.py).
"""

import ast
import importlib

import pytest

from grader.checks.spec import Exercise as Spec
from grader.exercise import CHECKS_DIR, load_manifest
from tests.conftest import ROOT

EXERCISES = list(load_manifest().values())
ENGINE = {"__init__.py", "spec.py", "engine.py", "expect.py", "diagnose.py"}  # grader/checks/ beside the specs


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_exercise_has_its_five_places_and_100_points(exercise):
    assert exercise.stub_path.is_file() and exercise.checks_path.is_file()
    assert (ROOT / "solutions" / exercise.file).is_file()
    assert (ROOT / "tests" / f"variants_{exercise.name}.py").is_file()
    assert isinstance(importlib.import_module(f"grader.checks.{exercise.name}").EXERCISE, Spec)
    assert exercise.max_score == 100
    assert len({s.id for s in exercise.steps}) == len(exercise.steps)


def test_every_exercise_file_belongs_to_an_exercise_of_the_manifest():
    names = {e.name for e in EXERCISES}
    places = {
        "exercises": ({p.stem for p in (ROOT / "exercises").glob("*.py")} - {"__init__"}),
        "solutions": ({p.stem for p in (ROOT / "solutions").glob("*.py")} - {"__init__"}),
        "grader/checks": ({p.stem for p in CHECKS_DIR.glob("*.py")} - {p.removesuffix(".py") for p in ENGINE}),
        "tests/variants_*": {p.stem.removeprefix("variants_") for p in (ROOT / "tests").glob("variants_*.py")},
    }
    for place, stems in places.items():
        assert stems == names, f"{place} holds {sorted(stems - names)} and lacks {sorted(names - stems)}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_step_has_hints_checks_and_a_todo(exercise):
    spec = importlib.import_module(f"grader.checks.{exercise.name}").EXERCISE
    stub = exercise.stub_path.read_text()
    names = _top_level_names(stub)
    assert [s.id for s in spec.steps] == [s.id for s in exercise.steps], "the spec's steps are the manifest's, in order"
    for step, declared in zip(exercise.steps, spec.steps):
        assert len(step.hints) >= 2, step.id
        points = sum(c.points * max(len(c.dtypes), 1) for c in declared.checks)
        assert points == step.points, f"{step.id}: checks worth {points}, the manifest says {step.points}"
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
