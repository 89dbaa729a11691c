"""The `masks` exercise: every buggy variant loses points in its own step and nowhere else (no step composes
another), with the right named mistake; every unusual but correct variant scores 100; every check is failed
by some buggy variant."""

import pytest

from tests.conftest import ROOT, explain, lost, mistakes
from tests.variants_masks import BUGGY, CORRECT, DEVICE_BUGGY

BASE = (ROOT / "solutions" / "masks.py").read_text()
STEPS = {"causal_mask", "padding_mask", "combine_masks", "attention"}

LOST_CHECKS: dict[str, set[str]] = {}  # variant -> the checks it failed, for the coverage test below
ALL_CHECKS: set[str] = set()


@pytest.fixture
def grade_variant(grade_source):
    def run(code, **options):
        return grade_source(code, base=BASE, name="masks.py", **options)

    return run


def _record(variant, result):
    ALL_CHECKS.update(c.name for s in result.steps for c in s.checks)
    LOST_CHECKS[variant.name] = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}


def test_reference_scores_full_marks(grade_variant):
    result = grade_variant("")
    assert result.full_marks, explain(result)
    assert {s.id for s in result.steps} == STEPS


@pytest.mark.parametrize("variant", BUGGY, ids=str)
def test_buggy_variant_loses_points_in_its_own_step(grade_variant, variant):
    result = grade_variant(variant.code)
    _record(variant, result)
    assert set(lost(result)) == {variant.step}, explain(result)
    if variant.mistake:
        assert variant.mistake in mistakes(result, variant.step), explain(result)


@pytest.mark.parametrize("variant", CORRECT, ids=str)
def test_correct_variant_scores_full_marks(grade_variant, variant):
    result = grade_variant(variant.code)
    assert result.full_marks, explain(result)


def test_correct_variants_score_full_marks_with_another_seed(grade_variant):
    """Dropout is graded by properties of a random draw: they must hold for other seeds too."""
    for variant in CORRECT:
        result = grade_variant(variant.code, seed=1)
        assert result.full_marks, f"{variant.name}:\n{explain(result)}"


def test_every_step_has_a_buggy_variant_and_every_named_mistake_one():
    from grader.checks import masks as checks
    from grader.checks.expect import Mistake

    assert {v.step for v in BUGGY} == STEPS
    named = set()
    for value in vars(checks).values():
        items = value if isinstance(value, tuple) else (value,)
        named |= {m.id for m in items if isinstance(m, Mistake)}
    assert named == {v.mistake for v in BUGGY if v.mistake}


@pytest.mark.parametrize("variant", DEVICE_BUGGY, ids=str)
def test_device_bug_loses_only_its_device_check(grade_variant, variant):
    result = grade_variant(variant.code, device="auto")
    _record(variant, result)
    step = next(s for s in result.steps if s.id == variant.step)
    failed = [c.name for c in step.checks if c.points < c.max_points]
    assert len(failed) == 1 and failed[0].endswith("_device"), explain(result)
    assert set(lost(result)) == {variant.step}, explain(result)


def test_every_check_is_failed_by_some_buggy_variant():
    """A check that no candidate can fail is not a check (runs after the variant tests above)."""
    if set(LOST_CHECKS) != {v.name for v in BUGGY + DEVICE_BUGGY}:
        pytest.skip("needs every buggy variant graded in this session")
    never_failed = ALL_CHECKS - set().union(*LOST_CHECKS.values())
    assert not never_failed, f"no buggy variant fails these checks: {sorted(never_failed)}"
