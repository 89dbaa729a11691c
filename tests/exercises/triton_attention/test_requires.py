"""Without Triton, triton_attention is still listed, and grading it says how to install Triton (exit 2).

Triton's absence is simulated: importlib.util.find_spec, which the grader asks, answers None for it.
Nothing is graded: the usage error comes before the worker starts.
"""

import importlib.util

import pytest
from click.testing import CliRunner

from grader import catalogue, cli
from grader.exercise import UsageError, load_course
from grader.grade import grade
from tests.conftest import ROOT

MESSAGE = "triton_attention needs Triton: pip install 'attn-grade[triton]'"


@pytest.fixture
def without_triton(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args, **kwargs: None if name == "triton" else real(name, *args, **kwargs))


def test_the_exercise_says_it_needs_triton():
    assert load_course()["triton_attention"].requires == ("triton",)
    assert all(not e.requires for name, e in load_course().items() if name != "triton_attention")


def test_grading_without_triton_is_a_usage_error_that_says_how_to_install_it(without_triton):
    with pytest.raises(UsageError) as error:
        grade(ROOT / "exercises" / "triton_attention.py")
    assert str(error.value) == MESSAGE
    result = CliRunner().invoke(cli.main, [str(ROOT / "exercises" / "triton_attention.py")])
    assert result.exit_code == 2, result.output
    assert MESSAGE in result.output
    assert len([line for line in result.output.splitlines() if "triton" in line.lower()]) == 1


def test_without_triton_the_exercise_is_listed_with_its_mistakes(without_triton):
    ids = {m.id for m in catalogue.exercise_mistakes("triton_attention")}  # the spec imports no triton
    assert "flash_attention.program_ids_swapped" in ids
    result = CliRunner().invoke(cli.main, ["mistakes", "triton_attention"])
    assert result.exit_code == 0 and "flash_attention.acc_in_half" in result.output
