"""Every exercise, graded on its variants: each buggy one loses points in its own step (and the step
that composes the others, if the exercise has one) and nowhere else, with the right named mistake;
each unusual but correct one scores 100; a device bug loses only device checks; and every check
of every exercise is failed by some buggy variant (a check no candidate can fail is not a check).

The variants live in tests/variants*.py, one module per exercise."""

from dataclasses import dataclass
from types import ModuleType

import pytest

from grader.checks.expect import Mistake
from grader.exercise import load_manifest
from tests import variants, variants_masks, variants_mha_numpy, variants_self_attention
from tests.conftest import ROOT, explain, lost, mistakes


@dataclass(frozen=True)
class Course:
    exercise: str
    variants: ModuleType
    composer: str | None  # the step that calls the others, which a buggy step may cost too

    @property
    def base(self) -> str:
        return (ROOT / "solutions" / f"{self.exercise}.py").read_text()

    def buggy(self) -> list:
        return self.variants.BUGGY + getattr(self.variants, "DEVICE_BUGGY", []) + getattr(self.variants, "RULES_ONLY", [])


COURSES = [
    Course("mha", variants, "MultiHeadAttention"),
    Course("mha_numpy", variants_mha_numpy, "multi_head_attention"),
    Course("self_attention", variants_self_attention, "SelfAttention"),
    Course("masks", variants_masks, None),
]
LOST_CHECKS: dict[str, dict[str, set[str]]] = {c.exercise: {} for c in COURSES}  # for the coverage test
ALL_CHECKS: dict[str, set[str]] = {c.exercise: set() for c in COURSES}


def cases(attribute: str):
    return [
        pytest.param(course, variant, id=f"{course.exercise}-{variant.name}")
        for course in COURSES
        for variant in getattr(course.variants, attribute, [])
    ]


@pytest.fixture
def grade_variant(grade_source):
    def run(course: Course, variant, **options):
        result = grade_source(variant.code, base=course.base, name=f"{course.exercise}.py", **options)
        ALL_CHECKS[course.exercise].update(c.name for s in result.steps for c in s.checks)
        LOST_CHECKS[course.exercise][variant.name] = {
            c.name for s in result.steps for c in s.checks if c.points < c.max_points
        }
        return result

    return run


@pytest.mark.parametrize("course, variant", cases("BUGGY"))
def test_buggy_variant_loses_points_in_its_own_step(grade_variant, course, variant):
    result = grade_variant(course, variant)
    assert variant.step in lost(result), explain(result)
    assert set(lost(result)) <= {variant.step, course.composer}, explain(result)
    if variant.mistake:
        assert variant.mistake in mistakes(result, variant.step), explain(result)


@pytest.mark.parametrize("course, variant", cases("CORRECT"))
def test_correct_variant_scores_full_marks(grade_variant, course, variant):
    result = grade_variant(course, variant)
    assert result.full_marks, explain(result)


@pytest.mark.parametrize("course, variant", cases("RULES_ONLY"))
def test_rule_breaker_loses_only_rule_points(grade_variant, course, variant):
    result = grade_variant(course, variant)
    failed = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}
    assert failed and all(name.endswith("_rules") for name in failed), explain(result)
    if variant.step is not None:  # None: the whole file breaks the rule (an import), every step pays
        assert variant.step in lost(result) and set(lost(result)) <= {variant.step, course.composer}, explain(result)


@pytest.mark.parametrize("course, variant", cases("DEVICE_BUGGY"))
def test_device_bug_loses_only_device_checks(grade_variant, course, variant):
    result = grade_variant(course, variant, device="auto")
    failed = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}
    assert failed and all(name.endswith("_device") for name in failed), explain(result)
    assert variant.step in lost(result) and set(lost(result)) <= {variant.step, course.composer}, explain(result)


@pytest.mark.parametrize("course, variant", cases("DEVICE_CORRECT"))
def test_device_correct_variant_scores_full_marks(grade_variant, course, variant):
    result = grade_variant(course, variant, device="auto")
    assert result.full_marks, explain(result)
    skipped = [c for s in result.steps for c in s.checks if c.outcome == "skipped"]
    assert skipped and all("meta device cannot run" in c.message for c in skipped)


@pytest.mark.parametrize("course", COURSES, ids=lambda c: c.exercise)
def test_every_step_and_named_mistake_has_a_buggy_variant(course):
    steps = {s.id for s in load_manifest()[course.exercise].steps}
    assert {v.step for v in course.variants.BUGGY} == steps
    checks = __import__(f"grader.checks.{course.exercise}", fromlist=["_"])
    named = set()
    for value in vars(checks).values():
        items = value if isinstance(value, tuple) else (value,)
        named |= {m.id for m in items if isinstance(m, Mistake)}
    assert named <= {v.mistake for v in course.buggy() if v.mistake}, named - {v.mistake for v in course.buggy()}


def test_mha_names_at_least_fifteen_mistakes_across_its_steps():
    assert len({v.mistake for v in variants.BUGGY if v.mistake}) >= 15


@pytest.mark.parametrize("course", COURSES, ids=lambda c: c.exercise)
def test_every_check_is_failed_by_some_buggy_variant(course):
    """Runs after the variant tests above, from what they recorded."""
    graded = set(LOST_CHECKS[course.exercise])
    if not {v.name for v in course.buggy()} <= graded:
        pytest.skip("needs every buggy variant of the exercise graded in this session")
    never_failed = ALL_CHECKS[course.exercise] - set().union(*LOST_CHECKS[course.exercise].values())
    assert not never_failed, f"no buggy variant fails these checks: {sorted(never_failed)}"
