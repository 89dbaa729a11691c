"""The practice notebooks (`attn-grade init --notebook`), executed headless as a learner runs them.

For every exercise the course lists, its notebook with the model answer in the step cells scores 100 graded
as a file; for one exercise of each kind, run in a kernel, it scores full marks at every check cell and
100 at the last, and the workspace records the grades the check cells made, as it records watch's. The
notebook as written (the stubs) scores 0 at each check: shown for one exercise of each kind (functions and
a module, a stateful one, Triton's), since every stub's 0 is tested as a file.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from grader import cli
from grader.exercise import load_course
from grader.grade import grade
from grader.notebook import practice
from grader.progress import Progress
from tests.conftest import explain
from tests.notebook_kernel import checks, execute

EXERCISES = list(load_course())


# run in a kernel, a check cell after each step: one exercise of each kind (functions, NumPy, a module, a stateful
# one, Triton's); every exercise's notebook is graded as a file below
RUN_IN_A_KERNEL = ["mha", "mha_numpy", "kv_cache", "triton_attention"]


@pytest.mark.parametrize("name", EXERCISES)
def test_the_practice_notebook_holding_the_model_answer_scores_100_as_a_file(name, tmp_path, zygote):
    path = tmp_path / f"{name}.ipynb"
    path.write_text(json.dumps(practice(load_course()[name], answers="reference")))
    result = grade(path, zygote=zygote, device="cpu")
    assert result.full_marks, explain(result)


@pytest.mark.parametrize("name", RUN_IN_A_KERNEL)
def test_the_practice_notebook_holding_the_model_answer_scores_100_at_every_check(name, tmp_path):
    exercise = load_course()[name]
    (tmp_path / ".attn-grade.json").write_text(json.dumps({"version": 1, "exercises": {}}))
    results = checks(execute(practice(exercise, answers="reference"), tmp_path))
    assert [r["checked"] for r in results] == [[s.id] for s in exercise.steps] + [[]]
    for result in results:
        assert result["score"] == result["max_score"], (result["checked"], result["report"]["steps"])
    assert (results[-1]["score"], results[-1]["max_score"]) == (100, 100)
    progress = Progress.find(tmp_path)
    assert len(progress.grades(name)) == len(results)  # each check cell's grade, as watch records a save
    assert all(progress.full_marks(name, s.id) for s in exercise.steps)


@pytest.mark.parametrize("name", ["mha", "kv_cache", "triton_attention"])
def test_the_practice_notebook_as_written_scores_0_at_every_check(name, tmp_path):
    exercise = load_course()[name]
    results = checks(execute(practice(exercise), tmp_path))
    assert len(results) == len(exercise.steps) + 1
    assert [r["score"] for r in results] == [0] * len(results), [r["steps"] for r in results]


def test_init_notebook_writes_a_notebook_per_exercise_and_keeps_work_unless_forced(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli.main, ["init", str(tmp_path), "--notebook"])
    assert result.exit_code == 0, result.output
    for exercise in load_course().values():
        data = json.loads((tmp_path / f"{exercise.file[:-3]}.ipynb").read_text())
        assert data["nbformat"] == 4 and data["metadata"]["kernelspec"]["name"] == "python3"
        sources = ["".join(c["source"]) for c in data["cells"]]
        assert sources[0].startswith(f"# {exercise.title}")
        for step in exercise.steps:
            assert f'attn_grade.check("{exercise.name}", "{step.id}")' in sources
        assert sources[-1] == f'attn_grade.check("{exercise.name}")'
        assert len({c["id"] for c in data["cells"]}) == len(data["cells"])  # nbformat 4.5: unique cell ids
    assert Progress.find(tmp_path) is not None
    again = runner.invoke(cli.main, ["init", str(tmp_path), "--notebook"])
    assert again.exit_code == 0, again.output  # fresh notebooks hold no work: written again
    mha = tmp_path / "mha.ipynb"
    mha.write_text(mha.read_text().replace("# TODO", "# my work", 1))
    refused = runner.invoke(cli.main, ["init", str(tmp_path), "--notebook", "--exercise", "mha"])
    assert refused.exit_code == 2 and "--force" in refused.output
    forced = runner.invoke(cli.main, ["init", str(tmp_path), "--notebook", "--exercise", "mha", "--force"])
    assert forced.exit_code == 0 and "your version is in" in forced.output
