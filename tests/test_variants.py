"""Every buggy variant loses points in its own step (and the module, which composes every step) and
nowhere else, with the right named mistake; every unusual but correct variant scores 100."""

import pytest

from tests.conftest import explain, lost, mistakes
from tests.variants import BUGGY, CORRECT, DEVICE_BUGGY, DEVICE_CORRECT


LOST_CHECKS: dict[str, set[str]] = {}  # variant -> the checks it failed, for the coverage test below
ALL_CHECKS: set[str] = set()


def _record(variant, result):
    ALL_CHECKS.update(c.name for s in result.steps for c in s.checks)
    LOST_CHECKS[variant.name] = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}


@pytest.mark.parametrize("variant", BUGGY, ids=str)
def test_buggy_variant_loses_points_in_its_own_step(grade_source, variant):
    result = grade_source(variant.code)
    _record(variant, result)
    assert variant.step in lost(result), explain(result)
    assert set(lost(result)) <= {variant.step, "MultiHeadAttention"}, explain(result)
    if variant.mistake:
        assert variant.mistake in mistakes(result, variant.step), explain(result)


@pytest.mark.parametrize("variant", CORRECT, ids=str)
def test_correct_variant_scores_full_marks(grade_source, variant):
    result = grade_source(variant.code)
    assert result.full_marks, explain(result)


def test_named_mistakes_cover_at_least_fifteen():
    named = {v.mistake for v in BUGGY if v.mistake}
    assert len(named) >= 15
    assert {v.step for v in BUGGY} >= {
        "project", "split_heads", "attention_scores", "scale_scores", "apply_mask",
        "softmax", "weighted_sum", "merge_heads", "MultiHeadAttention",
    }


@pytest.mark.parametrize("variant", DEVICE_BUGGY, ids=str)
def test_device_bug_loses_the_device_check(grade_source, variant):
    result = grade_source(variant.code, device="auto")
    _record(variant, result)
    step = next(s for s in result.steps if s.id == variant.step)
    assert [c.name for c in step.checks if c.points < c.max_points] == [f"{_prefix(step.id)}_device"], explain(result)
    assert set(lost(result)) == {variant.step}, explain(result)


@pytest.mark.parametrize("variant", DEVICE_CORRECT, ids=str)
def test_device_correct_variant_scores_full_marks(grade_source, variant):
    result = grade_source(variant.code, device="auto")
    assert result.full_marks, explain(result)
    skipped = [c for s in result.steps for c in s.checks if c.outcome == "skipped"]
    assert skipped and all("meta device cannot run" in c.message for c in skipped)


def _prefix(step_id: str) -> str:
    return "module" if step_id == "MultiHeadAttention" else step_id


def test_every_check_is_failed_by_some_buggy_variant():
    """A check that no candidate can fail is not a check (runs after the variant tests above)."""
    if set(LOST_CHECKS) != {v.name for v in BUGGY + DEVICE_BUGGY}:
        pytest.skip("needs every buggy variant graded in this session")
    never_failed = ALL_CHECKS - set().union(*LOST_CHECKS.values())
    assert not never_failed, f"no buggy variant fails these checks: {sorted(never_failed)}"
