"""The practice and classroom workflow: init, hint, solution, reset, list, watch, batch, report formats, bundles."""

import base64
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import click
import jsonschema
import pytest
from click.testing import CliRunner

from grader import cli, report
from grader.progress import FILE_NAME, Progress
from tests.conftest import LINUX_SANDBOX_ONLY, PORTABLE, REFERENCE, ROOT, STUB

SCHEMAS = Path(__file__).parent / "schemas"
STEPS = ["project", "split_heads", "attention_scores", "scale_scores", "apply_mask", "softmax", "weighted_sum",
         "merge_heads", "MultiHeadAttention"]
BUGGY = REFERENCE + "\ndef scale_scores(scores, head_dim):\n    return scores\n"


def schema(name):
    return json.loads((SCHEMAS / name).read_text())


def invoke(*args, input=None):
    result = CliRunner().invoke(cli.main, [str(a) for a in args], input=input)
    print(result.output)
    return result


@pytest.fixture(scope="module")
def buggy_grade(tmp_path_factory, zygote):
    from grader.grade import grade

    path = tmp_path_factory.mktemp("buggy") / "mha.py"
    path.write_text(BUGGY)
    return grade(path, device="cpu", zygote=zygote)


# -- formats ----------------------------------------------------------------------------


def test_markdown_report_has_hash_table_mistakes_and_hints(buggy_grade, tmp_path):
    progress = Progress(tmp_path)
    progress.record_hint("mha", "scale_scores", 1)
    progress.record_grade(buggy_grade)
    text = report.to_markdown(buggy_grade, progress)
    lines = text.splitlines()
    position = 0
    for pattern in schema("markdown.schema.json")["required_lines"]:
        found = [i for i, line in enumerate(lines) if i >= position and re.match(pattern, line)]
        assert found, f"no line matches {pattern!r} after line {position}:\n{text}"
        position = found[0]
    assert "likely mistake (5 checks): returned the scores unscaled" in text
    assert "`scale_scores` level 1" in text
    assert re.search(r"\| ✓ `project` \| 10 \| 10 \| \d+ s \|", text)  # time to green, from the progress file


def test_markdown_report_outside_a_workspace_says_unknown_not_none(buggy_grade):
    text = report.to_markdown(buggy_grade)  # graded outside a workspace: no progress file, nothing recorded
    assert "none recorded" not in text and re.search(r"\| ✓ `project` \| 10 \| 10 \| unknown \|", text), text
    assert "Time to green: unknown (not graded in a workspace)." in text
    for section in ("## Hints used", "## Solutions viewed"):
        assert f"{section}\n\n- unknown (not graded in a workspace)\n" in text, section


def test_markdown_report_in_a_workspace_lists_hints_and_solutions_viewed(buggy_grade, tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    assert "## Solutions viewed\n\n- none recorded\n" in report.to_markdown(buggy_grade, Progress.find(tmp_path))
    invoke("solution", "mha", "softmax", "--workspace", tmp_path, "--yes")
    invoke("solution", "mha", "--workspace", tmp_path, "--yes")
    text = report.to_markdown(buggy_grade, Progress.find(tmp_path))
    assert re.search(r"## Solutions viewed\n\n- `softmax` at \S+\n- the whole model answer at \S+\n", text), text
    assert "## Hints used\n\n- none recorded\n" in text


def test_markdown_report_passes_over_records_it_did_not_write(buggy_grade, tmp_path):
    """The progress file is the learner's to edit: a hint without its level or time, a time that is none, are left
    out of the report (review 48's B1 crashed it, exit 3)."""
    progress = Progress(tmp_path)
    progress.record_grade(buggy_grade)
    progress.record_hint("mha", "softmax", 1)
    entry = progress.exercise("mha")
    entry["hints"] += [{"step": "softmax"}, {"step": "scale_scores", "level": True, "at": entry["started"]}]
    entry["solutions"].append({"step": 3, "at": entry["started"]})
    entry["started"] = "soon"
    text = report.to_markdown(buggy_grade, progress)
    assert re.search(r"## Hints used\n\n- `softmax` level 1 at \S+\n\n", text), text
    assert "## Solutions viewed\n\n- none recorded\n" in text


def test_a_step_record_of_another_shape_is_started_afresh_when_a_grade_is_recorded(buggy_grade, tmp_path):
    """Review 50's F4: a step record without first_green, or with attempts that are no count, crashed every grade
    in the workspace (exit 3, and an interview ended without its scorecard)."""
    progress = Progress(tmp_path)
    steps = progress.exercise("mha")["steps"]
    steps["softmax"] = {"best": 0, "max": 14}
    steps["project"] = {"best": 0, "max": 10, "first_green": 7, "attempts": "many", "version": ["x"]}
    progress.record_grade(buggy_grade, {"project": "v1"})
    assert steps["project"]["attempts"] == 1 and steps["project"]["version"] == "v1"
    assert steps["softmax"]["best"] == 14 and isinstance(steps["softmax"]["first_green"], str)
    assert progress.attempts("mha", "project") == 1


def test_a_progress_file_nested_past_the_parsers_depth_is_no_workspace(tmp_path):
    """Review 51's F2: a `.attn-grade.json` of JSON nested 200,000 deep beside a model answer made every grade exit 3
    (RecursionError; a Gradescope upload could carry it). Nested 500 deep, it is read and saved."""
    (tmp_path / FILE_NAME).write_text('{"version": 1, "exercises": {}, "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert Progress.find(tmp_path) is None
    (tmp_path / FILE_NAME).write_text('{"version": 1, "exercises": {}, "x": ' + "[" * 500 + "]" * 500 + "}")
    Progress.find(tmp_path).save()


def test_markdown_report_gives_no_time_to_green_for_a_step_failing_now(buggy_grade, tmp_path):
    progress = Progress(tmp_path)
    progress.record_grade(buggy_grade)
    progress.exercise("mha")["steps"]["scale_scores"]["first_green"] = progress.exercise("mha")["started"]  # green once
    text = report.to_markdown(buggy_grade, progress)
    assert re.search(r"\| ~ `scale_scores` \| \d \| 8 \| – \|", text), text


def test_junit_is_one_testcase_per_check_grouped_by_step(buggy_grade):
    root = ET.fromstring(report.to_junit(buggy_grade))
    jsonschema.validate(_as_dict(root), schema("junit.schema.json"))
    suites = {s.get("name"): s for s in root}
    assert list(suites) == [f"mha.{s.id}" for s in buggy_grade.steps]
    failures = suites["mha.scale_scores"].findall("testcase/failure")
    assert failures and "likely mistake" in failures[0].text
    assert int(root.get("tests")) == sum(len(s.checks) for s in buggy_grade.steps)  # no rule broken here
    # times: each check's own duration, summed per step and for the whole grade
    cases = [(suite, case) for suite in root for case in suite]
    assert all(float(case.get("time")) >= 0 for _, case in cases) and sum(float(c.get("time")) for _, c in cases) > 0
    for suite in root:
        assert float(suite.get("time")) == pytest.approx(sum(float(c.get("time")) for c in suite), abs=0.01)
    seconds = sum(c.seconds for s in buggy_grade.steps for c in s.checks)
    assert float(root.get("time")) == pytest.approx(seconds, abs=0.001)


def test_gradescope_results_one_test_per_step(buggy_grade):
    data = json.loads(report.to_gradescope(buggy_grade))
    jsonschema.validate(data, schema("gradescope.schema.json"))
    assert data["score"] == buggy_grade.score and len(data["tests"]) == len(buggy_grade.steps)
    failed = [t for t in data["tests"] if t["status"] == "failed"]
    assert {t["name"].split(":")[0] for t in failed} == {"scale_scores", "MultiHeadAttention"}


def test_github_classroom_result_version_3(buggy_grade):
    data = json.loads(report.to_github(buggy_grade))
    jsonschema.validate(data, schema("github.schema.json"))
    assert data["status"] == "fail" and data["max_score"] == 100
    assert sum(t["score"] for t in data["tests"]) == buggy_grade.score
    durations = [t["duration"] for t in data["tests"]]  # seconds: the sum of the step's checks' durations
    assert durations == [round(sum(c.seconds for c in s.checks), 3) for s in buggy_grade.steps] and sum(durations) > 0


@pytest.mark.parametrize("submission", ["reference", "missing"])
def test_readme_github_workflow_always_reports_a_valid_result(tmp_path, submission):
    """The grading lines of the README's workflow, run as Actions runs them (bash -e)."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("        run: |\n") :].split("\n      - name:")[0]
    script = "\n".join(line[10:] for line in block.splitlines()[1:] if not line.lstrip().startswith("pip install"))
    if submission == "reference":
        (tmp_path / "mha.py").write_text(REFERENCE)
    output = tmp_path / "github_output"
    env = dict(os.environ, GITHUB_OUTPUT=str(output), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    command = ["bash", "-eo", "pipefail", "-c", script]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(base64.b64decode(output.read_text().strip().removeprefix("result=")))
    jsonschema.validate(result, schema("github.schema.json"))
    assert result["status"] == ("pass" if submission == "reference" else "error"), result


def test_output_writes_the_report_to_a_file_and_keeps_the_exit_code(tmp_path):
    out = tmp_path / "results.json"
    result = invoke(ROOT / "solutions" / "mha.py", "--format", "gradescope", "--output", out, "--device", "cpu")
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(out.read_text())["score"] == 100


# -- init, hint, solution, reset, list -------------------------------------------------


def test_init_copies_stubs_and_refuses_to_overwrite_work(tmp_path):
    assert invoke("init", tmp_path, "--exercise", "mha").exit_code == 0
    fresh = (tmp_path / "mha.py").read_text()
    assert fresh == STUB.replace("attn-grade exercises/mha.py", "attn-grade watch mha.py")
    assert (tmp_path / FILE_NAME).exists()
    assert invoke("init", tmp_path, "--exercise", "mha").exit_code == 0  # a fresh stub holds no work
    (tmp_path / "mha.py").write_text(fresh + "# my work\n")
    refused = invoke("init", tmp_path, "--exercise", "mha")
    assert refused.exit_code == 2 and "--force" in refused.stderr
    assert (tmp_path / "mha.py").read_text().endswith("# my work\n")
    assert invoke("init", tmp_path, "--exercise", "mha", "--force").exit_code == 0
    assert (tmp_path / "mha.py").read_text() == fresh


def test_the_stubs_init_copies_name_the_command_that_works_in_the_workspace(tmp_path):
    from grader.exercise import load_course

    assert invoke("init", tmp_path).exit_code == 0
    for exercise in load_course().values():
        kit_copy = (ROOT / "exercises" / exercise.file).read_text()
        assert f"attn-grade exercises/{exercise.file}" in kit_copy
        text = (tmp_path / exercise.file).read_text()
        assert f"Grade your work with:\n\n    attn-grade watch {exercise.file}\n" in text, exercise.name
        assert f"exercises/{exercise.file}" not in text, exercise.name


def test_hints_come_in_levels_and_are_recorded(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    first = invoke("hint", "mha", "softmax", "--workspace", tmp_path)
    second = invoke("hint", "mha", "softmax", "--level", "2", "--workspace", tmp_path)
    assert "hint 1 of 3" in first.stdout and "hint 2 of 3" in second.stdout and first.stdout != second.stdout
    assert [h["level"] for h in Progress.find(tmp_path).hints("mha")] == [1, 2]
    assert invoke("hint", "mha", "softmax", "--level", "9").exit_code == 2
    assert invoke("hint", "mha", "nope").exit_code == 2


def test_solution_asks_first_unless_the_step_has_full_marks(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    declined = invoke("solution", "mha", "softmax", "--workspace", tmp_path, input="n\n")
    assert declined.exit_code == 1 and "def softmax" not in declined.stdout
    shown = invoke("solution", "mha", "softmax", "--workspace", tmp_path, "--yes")
    assert shown.exit_code == 0 and shown.stdout.startswith("def softmax")
    (tmp_path / "mha.py").write_text(REFERENCE)
    invoke(tmp_path / "mha.py", "--device", "cpu")  # full marks recorded in the workspace
    solved = invoke("solution", "mha", "softmax", "--workspace", tmp_path)
    assert solved.exit_code == 0 and "def softmax" in solved.stdout


def test_solution_views_are_recorded_with_their_time(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    invoke("solution", "mha", "softmax", "--workspace", tmp_path, "--yes")
    invoke("solution", "mha", "--workspace", tmp_path, "--yes")
    invoke("solution", "mha", "project", "--workspace", tmp_path, input="n\n")  # declined: nothing seen
    views = Progress.find(tmp_path).solutions("mha")
    assert [v["step"] for v in views] == ["softmax", None] and all(v["at"] for v in views)
    elsewhere = invoke("solution", "mha", "softmax", "--workspace", tmp_path / "nowhere", "--yes")
    assert elsewhere.exit_code == 0 and "not recorded" in elsewhere.stderr


def test_every_grade_in_a_workspace_is_recorded_and_a_new_version_of_a_step_is_an_attempt(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    path = tmp_path / "mha.py"
    wrong = STUB.replace('    # TODO\n    raise NotImplementedError("softmax: not implemented yet")',
                         "    return scores.exp() / scores.exp().sum(dim, keepdim=True)")
    for text in [STUB, wrong, wrong + "\n# a comment outside every step\n", REFERENCE]:
        path.write_text(text)
        invoke(path, "--device", "cpu")
    progress = Progress.find(tmp_path)
    assert [g["edited"] for g in progress.grades("mha")] == [[], ["softmax"], [], [s for s in STEPS]]
    assert [g["score"] for g in progress.grades("mha")][-1] == 100
    assert progress.attempts("mha", "softmax") == 2 and progress.attempts("mha", "project") == 1


def test_reset_restores_one_step_or_the_whole_file_and_keeps_a_backup(tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE)
    declined = invoke("reset", path, "--step", "softmax", input="n\n")
    assert declined.exit_code == 1 and path.read_text() == REFERENCE and not list(tmp_path.glob("mha.py.bak-*"))
    asked = r"Replace your softmax in mha\.py with the stub's\? A backup is kept in mha\.py\.bak-\d{8}-\d{6}\."
    assert re.search(asked, declined.stderr), declined.stderr
    done = invoke("reset", path, "--step", "softmax", "--yes")
    assert done.exit_code == 0
    text = path.read_text()
    assert 'raise NotImplementedError("softmax: not implemented yet")' in text
    assert "def merge_heads" in text and "return x.reshape(B, T, H * Dh)" in text  # the rest is kept
    [backup] = tmp_path.glob("mha.py.bak-*")
    assert backup.read_text() == REFERENCE and str(backup) in done.stdout
    asked = invoke("reset", path, input="n\n")
    assert asked.exit_code == 1 and path.read_text() == text
    assert "Replace all of mha.py with a fresh stub?" in asked.stderr
    assert invoke("reset", path, "--yes").exit_code == 0 and path.read_text() == STUB  # no workspace: the kit's stub
    backups = list(tmp_path.glob("mha.py.bak-*"))
    assert len(backups) == 2 and {b.read_text() for b in backups} == {REFERENCE, text}  # the same second: .bak-...-2


def test_reset_leaves_a_notebook_alone(tmp_path):
    notebook = tmp_path / "mha.ipynb"
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    result = invoke("reset", notebook, "--yes")
    assert result.exit_code == 2 and "not a .py file" in result.stderr
    assert notebook.read_text().startswith('{"cells"') and not list(tmp_path.glob("*.bak-*"))


def test_reset_in_a_workspace_puts_back_the_workspace_stub(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    fresh = (tmp_path / "mha.py").read_text()
    (tmp_path / "mha.py").write_text(REFERENCE)
    assert invoke("reset", tmp_path / "mha.py", "--yes").exit_code == 0
    assert (tmp_path / "mha.py").read_text() == fresh


def test_list_shows_steps_points_and_best_so_far(tmp_path):
    plain = invoke("list")
    assert "mha: Multi-head attention" in plain.stdout and "softmax" in plain.stdout and "best" not in plain.stdout
    invoke("init", tmp_path, "--exercise", "mha")
    (tmp_path / "mha.py").write_text(BUGGY)
    invoke(tmp_path / "mha.py", "--device", "cpu")
    listed = invoke("list", "--workspace", tmp_path)
    assert re.search(r"scale_scores +1/8 +Scale by", listed.stdout), listed.stdout
    assert re.search(r"project_qkv +–/16 ", listed.stdout)  # not graded yet
    assert "best 91/100" in listed.stdout  # 7 points of scale_scores, and the module's 2 for running end to end
    for output in (plain.stdout, listed.stdout):  # every column lines up: the scores' slashes, the titles
        steps = [re.match(r"  \S+ +(\S+) +", line) for line in output.splitlines() if line.startswith("  ")]
        assert len({m.end() for m in steps}) == 1 and len({m.group().find("/") for m in steps}) == 1, output


# -- watch ------------------------------------------------------------------------------


def test_watch_regrades_on_save_shows_syntax_errors_and_stops_on_ctrl_c(tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(STUB)
    command = [shutil.which("attn-grade"), "watch", str(path), "--device", "cpu"]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "Total: 0/100" in _next_total(watcher)
        for text, expected in [(REFERENCE, "Total: 100/100"), (REFERENCE + "\ndef broken(:\n", "SyntaxError at line")]:
            time.sleep(0.05)  # a new modification time
            path.write_text(text)
            screen = _next_total(watcher)
            assert expected in screen, screen
            assert "Traceback" not in screen
        watcher.send_signal(signal.SIGINT)
        rest = watcher.communicate(timeout=20)[0]
        assert watcher.returncode == 0 and "Stopped watching." in rest
    finally:
        watcher.kill()


def _next_total(process, timeout=60) -> str:
    """Lines up to the next screen's total line."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("Total:"):
            return "".join(lines)
    raise AssertionError("no regrade seen:\n" + "".join(lines))


# -- batch ------------------------------------------------------------------------------


def test_batch_grades_a_folder_and_a_hang_costs_only_its_row(tmp_path, monkeypatch):
    for name, text in {
        "alice": REFERENCE,
        "bob": STUB,
        "carol": BUGGY,
        "dave": REFERENCE + "\ndef softmax(scores, dim=-1):\n    while True:\n        pass\n",
        "erin": "def broken(:\n",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "mha.py").write_text(text)
    (tmp_path / "notes.txt").write_text("not a submission")
    (tmp_path / "frank").mkdir()
    (tmp_path / "frank" / "mha (1).py").write_text(REFERENCE)  # a browser's download name: no exercise's
    (tmp_path / "frank" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "frank" / ".ipynb_checkpoints" / "mha-checkpoint.ipynb").write_text("{}")  # Jupyter's, not a submission
    out = tmp_path / "results.csv"
    monkeypatch.setattr(cli, "_terminal", lambda: True)  # the progress line, as on a terminal
    result = invoke("batch", tmp_path, "--jobs", "2", "--timeout", "1", "--device", "cpu", "--output", out)
    assert result.exit_code == 0
    rows = {Path(r["file"]).parent.name: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert set(rows) == {"alice", "bob", "carol", "dave", "erin", "frank"}
    assert rows["alice"]["total"] == "100" and rows["alice"]["status"] == "full marks"
    assert rows["bob"]["total"] == "0" and rows["erin"]["total"] == "0"
    assert rows["carol"]["scale_scores"] == "1"
    assert rows["dave"]["softmax"] == "0" and rows["dave"]["project"] == "10"
    assert all(float(r["seconds"]) > 0 for name, r in rows.items() if name != "frank")
    assert rows["frank"]["status"] == "usage error"
    assert rows["frank"]["reason"].startswith("cannot tell the exercise from the file name 'mha (1).py'")
    assert "--exercise" in rows["frank"]["reason"] and rows["frank"]["total"] == "0"
    # the status says why a row lost its points: a syntax error, a hang and a wrong answer are told apart
    assert rows["erin"]["status"] == "could not import" and rows["erin"]["reason"].startswith("SyntaxError at line 1")
    assert rows["dave"]["status"] == "timed out" and rows["dave"]["reason"] == "softmax: timed out after 1 s"
    assert rows["dave"]["softmax_mistake"] == "timed out after 1 s"
    assert rows["carol"]["status"] == rows["bob"]["status"] == "points lost"
    # per step, the first lost check, what went wrong in a sentence, and the named mistake's id
    assert rows["carol"]["scale_scores_first_lost"].startswith("scale_scores_values")
    assert rows["carol"]["scale_scores_mistake_id"] == "scale_scores.unscaled"
    assert rows["carol"]["scale_scores_mistake"].startswith("returned the scores unscaled")
    assert rows["carol"]["softmax_first_lost"] == rows["carol"]["softmax_mistake"] == ""
    assert rows["bob"]["project_first_lost"] and rows["bob"]["project_mistake_id"] == ""
    assert rows["bob"]["project_mistake"].startswith("not implemented yet")
    assert re.search(r"graded 6 files in [\d.]+ s \(1 error: see the status column\)", result.stderr), result.stderr
    assert "grading: 6/6 files" in result.stderr and "/5 files" not in result.stderr  # the summary's count


def test_batch_of_one_file_says_file_and_a_file_of_no_exercise_has_a_row(tmp_path):
    (tmp_path / "attempt.py").write_text(REFERENCE)
    out = tmp_path / "results.csv"
    result = invoke("batch", tmp_path, "--output", out)
    assert result.exit_code == 0 and re.search(r"^graded 1 file in ", result.stderr), result.stderr
    [row] = csv.DictReader(io.StringIO(out.read_text()))
    assert row["status"] == "usage error" and "pass --exercise NAME" in row["reason"]


def test_batch_writes_its_csv_when_a_file_name_is_no_utf8(tmp_path):
    """A name of bytes that are no UTF-8 once made the CSV write fail after every file was graded (exit 3)."""
    odd = os.fsdecode(bytes(tmp_path / "attempt") + b"\xff.py")
    Path(odd).write_text(REFERENCE)
    out = tmp_path / "results.csv"
    result = invoke("batch", tmp_path, "--output", out)
    assert result.exit_code == 0, result.stderr
    [row] = csv.DictReader(io.StringIO(out.read_text(encoding="utf-8")))
    assert "\\udcff" in row["file"]


def test_batch_with_nothing_to_grade_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a submission")
    assert invoke("batch", tmp_path).exit_code == 2
    assert invoke("batch", tmp_path / "missing").exit_code == 2


# -- Gradescope bundle ------------------------------------------------------------------


HUNTER = """
import os
for folder, subfolders, files in os.walk("/"):  # the unpacked bundle's kit is in /autograder/source/kit
    if folder in ("/proc", "/sys", "/dev"):
        subfolders[:] = []
    elif folder.endswith("/solutions") and "mha.py" in files:
        exec(compile(open(folder + "/mha.py").read(), folder + "/mha.py", "exec"))
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    assert invoke("gradescope-bundle", out).exit_code == 0
    return out


def run_autograder(bundle, root, submission: str | None) -> dict:
    """Lay the bundle out as Gradescope does under `root`, run run_autograder, return results.json.

    The attn-grade on PATH is this test run's: the root has no venv/ (setup.sh makes that).
    """
    zipfile.ZipFile(bundle).extractall(root / "source")
    (root / "submission").mkdir()
    if submission is not None:
        (root / "submission" / "mha.py").write_text(submission)
    run = root / "source" / "run_autograder"
    run.chmod(0o755)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run([str(run)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(results, schema("gradescope.schema.json"))
    return results


def test_gradescope_bundle_holds_the_scripts_and_the_kit(bundle):
    names = zipfile.ZipFile(bundle).namelist()
    kit = {"kit/pyproject.toml", "kit/grader/sandbox/worker.py", "kit/grader/course/mha/spec.py",
           "kit/solutions/mha.py"}
    assert {"setup.sh", "run_autograder"} | kit <= set(names)


@pytest.mark.parametrize("name, submission, score", [
    ("reference", REFERENCE, 100),
    ("stubs", STUB, 0),
    # scale_scores loses 7 (its device check too: on the meta device it sees only shapes, so it earns only beside
    # a right answer; on CUDA it fails), the module its 2 end to end
    ("buggy", BUGGY, 91),
    ("hunter", HUNTER, 0),  # the kit in /autograder/source is out of its sight
])
def test_gradescope_bundle_grades_a_submission_as_gradescope_runs_it(bundle, tmp_path, name, submission, score):
    if name == "hunter" and PORTABLE:
        pytest.skip(LINUX_SANDBOX_ONLY)
    if name == "hunter" and os.geteuid() != 0 and not _workers_isolated(tmp_path):
        pytest.skip("this system allows a non-root worker no mount namespace (see docs/sandbox.md)")
    results = run_autograder(bundle, tmp_path / "autograder", submission)
    assert results["score"] == score and len(results["tests"]) == 9, results


def test_gradescope_bundle_reports_a_missing_submission_as_an_error_not_a_silent_zero(bundle, tmp_path):
    results = run_autograder(bundle, tmp_path / "autograder", None)
    says = "No mha.py or mha.ipynb in the submission (it holds nothing): upload your mha.py (or mha.ipynb) itself."
    assert results["score"] == 0 and says in results["output"]


def _workers_isolated(tmp_path) -> bool:
    path = tmp_path / "probe" / "mha.py"
    path.parent.mkdir()
    path.write_text("")
    return json.loads(invoke(path, "--format", "json", "--device", "cpu").output)["environment"]["fs_isolation"]


@pytest.mark.parametrize("version, accepted", [("3.8", False), ("3.9", False), ("3.10", True), ("3.13", True)])
def test_gradescope_setup_checks_the_python_version(bundle, tmp_path, version, accepted):
    """setup.sh with stand-ins for apt-get and python3: an old Python stops it with a message."""
    zipfile.ZipFile(bundle).extract("setup.sh", tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\nexit 0\n")
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/python3.log\necho {version}\nexit 0\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:/usr/bin:/bin")
    done = subprocess.run(["bash", str(tmp_path / "setup.sh")], env=env, capture_output=True, text=True, timeout=30)
    print(done.stdout, done.stderr)
    reached_venv = "-m venv /autograder/venv" in (tmp_path / "python3.log").read_text()
    assert reached_venv == accepted
    if not accepted:
        assert done.returncode == 1
        assert f"attn-grade needs Python 3.10 or newer; this image's python3 is {version}." in done.stderr


def test_python_3_10_is_supported_where_tomllib_is_missing():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10"' in pyproject and "tomli>=1.1; python_version < '3.11'" in pyproject
    from grader.bundle import MIN_PYTHON
    assert MIN_PYTHON == (3, 10)
    # Python 3.10 has no tomllib; tomli is the same parser under another name.
    code = (
        "import sys, tomllib; sys.modules['tomli'] = tomllib; sys.modules['tomllib'] = None\n"
        "from grader.exercise import load_course; print(sorted(load_course()))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "'mha'" in done.stdout, done.stderr


def _as_dict(element) -> dict:
    children = [_as_dict(c) for c in element]
    return {"tag": element.tag, "attrib": dict(element.attrib), "children": children, "text": element.text}


def test_a_broken_rule_costs_the_step_and_shows_in_every_format(tmp_path, zygote):
    """An interviewer cannot miss it: softmax written with torch.softmax earns nothing, and every format says so."""
    from grader.grade import grade

    path = tmp_path / "mha.py"
    forbidden = "\ndef softmax(scores, dim=-1):\n    return torch.softmax(scores, dim).nan_to_num(0.0)\n"
    path.write_text(REFERENCE + forbidden)
    result = grade(path, device="cpu", zygote=zygote)
    step = next(s for s in result.steps if s.id == "softmax")
    assert step.score == 0 and "called softmax" in step.breach and result.score == 86
    assert "RULE BROKEN" in click.unstyle(report.to_text(result))
    assert "## Rules broken" in report.to_markdown(result)
    assert json.loads(report.to_json(result))["steps"][5]["rule_broken"] == step.breach
    junit = ET.fromstring(report.to_junit(result))
    assert junit.find("testsuite[@name='mha.softmax']/testcase[@name='rule_broken']/failure") is not None
    gradescope = json.loads(report.to_gradescope(result))["tests"]
    assert "RULE BROKEN" in next(t for t in gradescope if t["name"].startswith("softmax"))["output"]
    github = json.loads(report.to_github(result))["tests"]
    assert "RULE BROKEN" in next(t for t in github if t["name"] == "softmax")["message"]


def test_a_files_segments_are_the_parsers_own_whatever_its_line_ends():
    """source.segments (each step's text, read at every save in watch) gives what ast.get_source_segment does, with
    the file split into lines once: at \\r\\n, \\r and \\n alone, as the parser counts them (a form feed, U+2028 in a
    string, and a character of two bytes before a column among them)."""
    import ast

    from grader.source import segments

    texts = [(ROOT / "solutions" / name).read_text() for name in ("mha.py", "mla.py")]
    texts += ["def f():\r\n    return 'é'\r\n\rclass C:\r    x = 1\n\ndef g(): pass",
              "x = 1\n\fdef h():\n  return 2  # ünï\n\x0c\ny = '\u2028'\n"]
    for text in texts:
        nodes = [n for n in list(ast.walk(ast.parse(text)))[1:] if getattr(n, "end_lineno", None) is not None]
        assert segments(text, nodes) == [ast.get_source_segment(text, n) for n in nodes]
