"""Every exercise, graded on its variants (tests/exercises/NAME/variants.py, one per exercise of the course).

- Each buggy variant loses points in its own step and nowhere else, with the named mistake it
  is written to show; the only exception is a composite step's end-to-end check, which runs
  the candidate's own steps and so says, in its message, that the steps it lost through are
  charged already.
- Each unusual but correct variant scores 100; a device bug loses only device checks; a rule
  breaker loses its whole step (a file-level rule only its rules checks).
- Every check of every exercise is failed by some buggy variant, and every named mistake of
  the catalogue, the exercise's own and the general ones, is shown by some variant.
"""

import ast
import importlib
import textwrap
from dataclasses import dataclass
from types import ModuleType

import pytest

from grader import catalogue
from grader.exercise import load_course
from tests.conftest import ROOT, explain, lost, mistakes

MANIFEST = load_course()


@dataclass(frozen=True)
class Course:
    exercise: str
    variants: ModuleType
    composer: str | None  # the step whose end-to-end check runs the candidate's own steps (gqa's grouped_attention
    # is answered repeat_kv too, but has no such check)

    @property
    def base(self) -> str:
        return (ROOT / "solutions" / f"{self.exercise}.py").read_text()

    def buggy(self) -> list:
        extra = getattr(self.variants, "DEVICE_BUGGY", []) + getattr(self.variants, "RULES_ONLY", [])
        return self.variants.BUGGY + extra

    def all(self) -> list:
        return self.buggy() + getattr(self.variants, "CORRECT", []) + getattr(self.variants, "DEVICE_CORRECT", [])


def _course(name: str) -> Course:
    spec = importlib.import_module(f"grader.course.{name}.spec").SPEC
    composer = next((s.id for s in spec.steps if any(c.end_to_end for c in s.checks)), None)
    return Course(name, importlib.import_module(f"tests.exercises.{name}.variants"), composer)


COURSES = [_course(name) for name in MANIFEST]
LOST_CHECKS: dict[str, dict[str, set[str]]] = {c.exercise: {} for c in COURSES}  # for the coverage tests
ALL_CHECKS: dict[str, set[str]] = {c.exercise: set() for c in COURSES}
SHOWN: dict[str, dict[str, set[str]]] = {c.exercise: {} for c in COURSES}  # variant -> named mistakes shown


# The exercises this module grades. Triton's, the slowest by far, are tests/test_variants_triton.py's, and the ladder's
# part 4 (the next slowest) tests/test_variants_part4.py's: those modules import this one's tests, so that under
# `--dist loadfile` the processes share the work, while an exercise's variants and the coverage test that reads what
# they recorded stay in one module, hence one process.
TRITON = ("triton_attention",)
PART4 = ("attention_backward", "mla", "paged_attention")
EXERCISES = tuple(name for name in MANIFEST if name not in TRITON + PART4)


def of(attribute: str):
    """The test runs on each variant in the list `attribute` of the module's exercises (pytest_generate_tests)."""
    def mark(test):
        test.variants = attribute
        return test

    return mark


def pytest_generate_tests(metafunc):
    courses = [c for c in COURSES if c.exercise in metafunc.module.EXERCISES]
    attribute = getattr(metafunc.function, "variants", None)
    if attribute is not None:
        variants = [(c, v) for c in courses for v in getattr(c.variants, attribute, [])]
        metafunc.parametrize("course, variant", [pytest.param(c, v, id=f"{c.exercise}-{v.name}") for c, v in variants])
    elif "course" in metafunc.fixturenames:
        metafunc.parametrize("course", courses, ids=lambda c: c.exercise)


# One cache of check results per exercise, as `attn-grade watch` keeps one per file (grader/run_checks.py): a check
# of a step the variant leaves as the reference's, reaching nothing it changed, is taken from an earlier grade
CACHES: dict[str, dict] = {c.exercise: {} for c in COURSES}


def edited(base: str, code: str) -> str:
    """The reference with the variant's functions in place of its own, as a candidate edits a file, and the rest of
    the variant appended. The grade is the same as with the whole variant appended (later definitions win), but for
    the cache: a decorator run once more (a second @triton.jit) is code that runs at import, in every step's key, so
    an appended kernel would regrade every step (grader/run_checks.py check_keys). A function stays appended where
    code that runs at import may read it (a statement, a class body, in the reference or the variant), since in
    place it would read the variant's, and where its own decorators or defaults read what the variant defines."""
    code = textwrap.dedent(code)
    base_tree, tree = ast.parse(base), ast.parse(code)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    read_at_import = {n.id for node in (*base_tree.body, *tree.body) if not isinstance(node, functions)
                      for n in ast.walk(_without_bodies(node)) if isinstance(n, ast.Name)}
    own = {}
    for node in base_tree.body:
        if isinstance(node, functions):
            own.setdefault(node.name, []).append(node)
    new = [n for n in tree.body if isinstance(n, functions)]
    names = [n.name for n in new]
    defined = {n.name for n in tree.body if isinstance(n, (*functions, ast.ClassDef))} | {
        t.id for n in tree.body for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    swapped = {n.name: n for n in new if names.count(n.name) == 1 and len(own.get(n.name, ())) == 1
               and n.name not in read_at_import  # nor may it read, at import, what the variant defines after it
               and not {t.id for t in ast.walk(_without_bodies(n)) if isinstance(t, ast.Name)} & (defined - {n.name})}

    def span(node):
        return min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1, node.end_lineno

    base_lines, code_lines = base.splitlines(), code.splitlines()
    for name in sorted(swapped, key=lambda n: -own[n][0].lineno):  # from the last, so that earlier lines stay put
        (start, end), (new_start, new_end) = span(own[name][0]), span(swapped[name])
        base_lines[start:end] = code_lines[new_start:new_end]
    for node in sorted(swapped.values(), key=lambda n: -n.lineno):
        start, end = span(node)
        del code_lines[start:end]
    return "\n".join(base_lines) + "\n\n" + "\n".join(code_lines) + "\n"


def _without_bodies(node: ast.AST) -> ast.AST:
    """The node with its functions' bodies left out: what of it runs at import."""
    node = ast.parse(ast.unparse(node)).body[0] if not isinstance(node, ast.Module) else node
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.body = [ast.Pass()]
    return node


@pytest.fixture
def grade_variant(grade_source):
    def run(course: Course, variant, **options):
        result = grade_source("", base=edited(course.base, variant.code), name=f"{course.exercise}.py",
                              cache=CACHES[course.exercise], **options)
        ALL_CHECKS[course.exercise].update(c.name for s in result.steps for c in s.checks)
        LOST_CHECKS[course.exercise][variant.name] = {
            c.name for s in result.steps for c in s.checks if c.points < c.max_points
        }
        SHOWN[course.exercise][variant.name] = {c.mistake_id for s in result.steps for c in s.checks if c.mistake_id}
        return result

    return run


def _collateral(result, course: Course, step: str) -> list:
    """Checks lost outside `step`, but for the composite's end-to-end checks that say they were charged elsewhere."""
    return [
        f"{s.id}/{c.name}" for s in result.steps if s.id != step for c in s.checks
        if c.points < c.max_points and not (s.id == course.composer and c.end_to_end and step in c.charged_elsewhere)
    ]


@of("BUGGY")
def test_buggy_variant_loses_points_in_its_own_step(grade_variant, course, variant):
    result = grade_variant(course, variant)
    assert variant.step in lost(result), explain(result)
    assert not _collateral(result, course, variant.step), explain(result)
    missing = set(variant.shows) - mistakes(result, variant.step)
    assert not missing, f"not shown: {sorted(missing)}\n{explain(result)}"


@of("CORRECT")
def test_correct_variant_scores_full_marks(grade_variant, course, variant):
    result = grade_variant(course, variant)
    assert result.full_marks, explain(result)


@of("RULES_ONLY")
def test_rule_breaker_loses_its_step(grade_variant, course, variant):
    result = grade_variant(course, variant)
    if variant.step is None:  # the whole file breaks a rule that is no call (an import): only rules checks pay
        failed = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}
        assert failed and all(name.endswith("_rules") for name in failed), explain(result)
        return
    step = next(s for s in result.steps if s.id == variant.step)
    assert step.breach and step.score == 0, explain(result)
    assert not _collateral(result, course, variant.step), explain(result)


@of("DEVICE_BUGGY")
def test_device_bug_loses_only_device_checks(grade_variant, course, variant):
    result = grade_variant(course, variant, device="auto")
    failed = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}
    assert failed and all(name.endswith("_device") for name in failed), explain(result)
    assert variant.step in lost(result) and set(lost(result)) <= {variant.step, course.composer}, explain(result)
    if variant.mistake:
        assert variant.mistake in mistakes(result, variant.step), explain(result)


@of("DEVICE_CORRECT")
def test_device_correct_variant_scores_full_marks(grade_variant, course, variant):
    result = grade_variant(course, variant, device="auto")
    assert result.full_marks, explain(result)


def test_every_step_and_named_mistake_has_a_buggy_variant(course):
    assert {v.step for v in course.variants.BUGGY} == {s.id for s in MANIFEST[course.exercise].steps}
    own = {e.id for e in catalogue.exercise_mistakes(course.exercise)}
    written_for = {m for v in course.buggy() for m in v.shows}
    assert own == written_for & own, f"no variant is written to show: {sorted(own - written_for)}"
    unknown = written_for - catalogue.all_ids(course.exercise)
    assert not unknown, f"not in the catalogue: {sorted(unknown)}"


def test_every_general_mistake_has_a_buggy_variant_in_some_exercise():
    written_for = {m for c in COURSES for v in c.buggy() for m in v.shows}
    general = {e.id for e in catalogue.general_mistakes()}
    assert general <= written_for, f"no variant is written to show: {sorted(general - written_for)}"


def test_every_check_is_failed_by_some_buggy_variant(course):
    """Runs after the variant tests above, in their module and so their process, from what they recorded."""
    graded = set(LOST_CHECKS[course.exercise])
    if not graded:
        pytest.skip("needs the exercise's buggy variants graded in this session (none was selected)")
    missing = {v.name for v in course.buggy()} - graded
    assert not missing, ("buggy variants not graded in this process (selected out by -k, or run in another: .ci/run "
                         f"keeps each file in one, --dist loadfile): {sorted(missing)}")
    never_failed = ALL_CHECKS[course.exercise] - set().union(*LOST_CHECKS[course.exercise].values())
    assert not never_failed, f"no buggy variant fails these checks: {sorted(never_failed)}"
