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

import importlib
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


# The exercises this module grades; Triton's, the slowest by far, are tests/test_variants_triton.py's (this module's
# tests, imported there), so that under `--dist loadfile` two processes share the work: an exercise's variants and
# the coverage test that reads what they recorded stay in one module, hence one process.
SEPARATE = ("triton_attention",)
EXERCISES = tuple(name for name in MANIFEST if name not in SEPARATE)


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


@pytest.fixture
def grade_variant(grade_source):
    def run(course: Course, variant, **options):
        result = grade_source(variant.code, base=course.base, name=f"{course.exercise}.py",
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
