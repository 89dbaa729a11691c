"""The course check, graded: for every exercise of the course the reference scores 100 and the stubs 0."""

import pytest

from grader.exercise import load_course
from grader.grade import grade
from tests.conftest import ROOT, explain

EXERCISES = list(load_course().values())


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_reference_scores_100(exercise, zygote):
    result = grade(ROOT / "solutions" / exercise.file, zygote=zygote)
    assert result.full_marks and result.max_score == 100, explain(result)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_stubs_score_0_with_every_step_not_implemented(exercise, zygote):
    result = grade(exercise.stub_path, zygote=zygote)
    assert result.score == 0, explain(result)
    for step in result.steps:
        assert all("not implemented yet" in c.message for c in step.checks), explain(result)
