"""The course check, graded: for every exercise of the course the reference scores 100 and the stubs 0, and every
report format says so."""

import json
import xml.etree.ElementTree as ET

import pytest

from grader import report
from grader.exercise import load_course
from grader.grade import grade
from tests.conftest import ROOT, explain

EXERCISES = list(load_course().values())


def said_in_every_format(result, score: int) -> None:
    """Each report format renders the grade and gives its total."""
    for fmt in report.FORMATS:
        text = report.render(fmt, result)
        if fmt == "json":
            assert json.loads(text)["score"] == score, fmt
        elif fmt == "gradescope":
            assert json.loads(text)["score"] == score and sum(t["score"] for t in json.loads(text)["tests"]) == score
        elif fmt == "github":
            assert sum(t["score"] for t in json.loads(text)["tests"]) == score, fmt
        elif fmt == "junit":
            failures = int(ET.fromstring(text).get("failures")) + int(ET.fromstring(text).get("errors"))
            assert (failures == 0) == (score == 100), fmt
        else:
            assert f"{score}/100" in text, fmt


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_reference_scores_100(exercise, zygote):
    result = grade(ROOT / "solutions" / exercise.file, zygote=zygote)
    assert result.full_marks and result.max_score == 100, explain(result)
    said_in_every_format(result, 100)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_stubs_score_0_with_every_step_not_implemented(exercise, zygote):
    result = grade(exercise.stub_path, zygote=zygote)
    assert result.score == 0, explain(result)
    for step in result.steps:
        assert all("not implemented yet" in c.message for c in step.checks), explain(result)
    said_in_every_format(result, 0)
