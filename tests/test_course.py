"""The course check, both ways (as rustlings checks its exercises): every exercise of the course
has its places, and every file in those places belongs to an exercise of the course.

An exercise is: a stub (exercises/NAME.py), a reference (solutions/NAME.py), a course folder
(grader/course/NAME/: exercise.toml, spec.py, contract.md, and any stand-ins), its tests
(tests/exercises/NAME/: variants.py and test_oracle.py), and one line in grader/course/course.toml.
A spec imports only the engine's public surface (grader.engine) and its own reference.
"""

import ast
import importlib
import sys

import pytest

from grader.engine import Spec
from grader.exercise import COURSE_DIR, load_course
from tests.conftest import ROOT

EXERCISES = list(load_course().values())
COURSE_FILES = {"exercise.toml", "spec.py", "contract.md", "__init__.py"}  # and any modules the spec splits into
NOT_AN_EXERCISE = {"__pycache__"}


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_exercise_has_its_places_and_100_points(exercise):
    assert exercise.stub_path.is_file() and exercise.checks_path.is_file()
    assert (ROOT / "solutions" / exercise.file).is_file()
    assert (exercise.folder / "contract.md").is_file(), "every exercise has a contract (the source of its docs page)"
    tests = ROOT / "tests" / "exercises" / exercise.name
    assert (tests / "variants.py").is_file() and (tests / "test_oracle.py").is_file()
    assert isinstance(importlib.import_module(exercise.spec_module).SPEC, Spec)
    assert exercise.max_score == 100
    assert len({s.id for s in exercise.steps}) == len(exercise.steps)


def test_every_exercise_file_belongs_to_an_exercise_of_the_course():
    names = {e.name for e in EXERCISES}
    places = {
        "exercises": ({p.stem for p in (ROOT / "exercises").glob("*.py")} - {"__init__"}),
        "solutions": ({p.stem for p in (ROOT / "solutions").glob("*.py")} - {"__init__"}),
        "grader/course": {p.name for p in COURSE_DIR.iterdir() if p.is_dir()} - NOT_AN_EXERCISE,
        "tests/exercises": {p.name for p in (ROOT / "tests" / "exercises").iterdir() if p.is_dir()} - NOT_AN_EXERCISE,
    }
    for place, stems in places.items():
        assert stems == names, f"{place} holds {sorted(stems - names)} and lacks {sorted(names - stems)}"
    for name in names:
        files = {p.name for p in (COURSE_DIR / name).iterdir() if p.is_file()}
        extra = {f for f in files - COURSE_FILES if not f.endswith(".py")}  # modules of the spec, stand_ins.py
        assert not extra, f"grader/course/{name} holds {sorted(extra)}: only {sorted(COURSE_FILES)} and modules"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_spec_imports_only_the_engine_and_its_own_reference(exercise):
    """What a new exercise may lean on is the engine's public surface: never the worker, the process layer,
    another exercise's spec or another exercise's reference."""
    allowed = {"grader.engine", f"solutions.{exercise.name}", "torch", "torch.nn.functional", "numpy"}
    if exercise.extends:  # an exercise that varies another (mha_numpy) may reuse that one's spec, and say so
        allowed.add(f"grader.course.{exercise.extends}.spec")
    for path in exercise.folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module] if node.level == 0 else []
                if node.level == 1 and node.module:  # from .stand_ins import ...: its own folder
                    continue
                if node.module == "solutions" or (node.module or "").startswith("grader.course."):
                    modules = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                ok = module in allowed or module.split(".")[0] in sys.stdlib_module_names
                assert ok, f"{path.relative_to(ROOT)} imports {module}: a spec may import only grader.engine, " \
                           "its own reference, torch, numpy and the standard library"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_every_step_has_hints_checks_and_a_todo(exercise):
    spec = importlib.import_module(exercise.spec_module).SPEC
    stub = exercise.stub_path.read_text()
    names = _top_level_names(stub)
    in_order = [s.id for s in spec.steps] == [s.id for s in exercise.steps]
    assert in_order, "the spec's steps are exercise.toml's, in order"
    for step, declared in zip(exercise.steps, spec.steps, strict=True):
        assert len(step.hints) >= 3, f"{step.id}: the idea, the plan, code (tests/test_hints.py)"
        points = sum(c.points * max(len(c.dtypes), 1) for c in declared.checks)
        assert points == step.points, f"{step.id}: checks worth {points}, exercise.toml says {step.points}"
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


def test_no_module_binds_a_top_level_name_twice():
    """A constant bound twice in one module makes the first binding's readers see the second: two tests' candidates
    of one name once turned a Triton test's kernel into a paged module. `X = replace(X, …)`, which builds on the
    first binding, is allowed."""
    rebound = []
    for path in sorted([*(ROOT / "grader").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        seen = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                reads = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} if node.value else set()
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names, reads = {node.name}, set()
            else:
                continue
            rebound += [f"{path.relative_to(ROOT)}: {name}" for name in names & seen - reads]
            seen |= names
    assert not rebound, rebound
