"""The command line: exit codes, the JSON report and its schema, one-line usage errors."""

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import torch
from click.testing import CliRunner

from grader import cli
from tests.conftest import ROOT

SCHEMA = json.loads((Path(__file__).parent / "schemas" / "grade.schema.json").read_text())
REFERENCE = str(ROOT / "solutions" / "mha.py")
STUBS = str(ROOT / "exercises" / "mha.py")


def invoke(*args):
    result = CliRunner().invoke(cli.main, list(args))
    print(result.output)
    return result


def test_reference_exits_0_with_one_valid_json_object():
    result = invoke(REFERENCE, "--format", "json", "--device", "cpu")
    assert result.exit_code == 0
    data = json.loads(result.stdout)  # exactly one object: json.loads rejects anything after it
    jsonschema.validate(data, SCHEMA)
    assert (data["score"], data["max_score"]) == (100, 100)


def test_stubs_exit_1_and_the_text_report_says_not_implemented():
    result = invoke(STUBS, "--device", "cpu")
    assert result.exit_code == 1
    assert "Total: 0/100" in result.stdout
    assert result.stdout.count("not implemented yet") == 9  # once per step, repeats folded


def test_verbose_shows_every_check_and_json_validates_with_mistakes(tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(Path(REFERENCE).read_text() + "\ndef scale_scores(scores, head_dim):\n    return scores\n")
    text = invoke(str(path), "-v", "--device", "cpu")
    assert text.exit_code == 1 and "ok project_shape" in text.stdout and "likely mistake" in text.stdout
    data = json.loads(invoke(str(path), "--format", "json", "--device", "cpu").stdout)
    jsonschema.validate(data, SCHEMA)
    step = next(s for s in data["steps"] if s["id"] == "scale_scores")
    assert any(c.get("mistake", {}).get("id") == "scale_scores.unscaled" for c in step["checks"])


@pytest.mark.parametrize(
    "args, says",
    [
        (["missing.py"], "no such file: missing.py"),
        ([REFERENCE, "--exercise", "nope"], "unknown exercise 'nope'"),
        ([REFERENCE, "--device", "gpu"], "'gpu' is not one of"),
        ([REFERENCE, "--timeout", "0"], "--timeout"),
        (["grade"], "Missing argument 'FILE'"),
        ([], "give a file to grade"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, says):
    result = invoke(*args)
    assert result.exit_code == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_a_file_whose_name_is_no_exercise_needs_exercise(tmp_path):
    path = tmp_path / "attention.py"
    shutil.copy(REFERENCE, path)
    result = invoke(str(path))
    assert result.exit_code == 2 and "pass --exercise NAME" in result.stderr
    assert invoke(str(path), "--exercise", "mha", "--device", "cpu").exit_code == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_a_usage_error():
    result = invoke(REFERENCE, "--device", "cuda")
    assert result.exit_code == 2 and "no CUDA device" in result.stderr


def test_a_grader_bug_exits_3_and_asks_for_a_report(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("grader.grade.grade", broken)
    result = invoke(REFERENCE)
    assert result.exit_code == 3
    assert "internal error" in result.stderr and "not in your code" in result.stderr


def test_the_installed_command_grades_the_reference():
    command = shutil.which("attn-grade")
    assert command, "attn-grade is not on PATH: install the project with pip install -e ."
    done = subprocess.run([command, "solutions/mha.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0 and "Total: 100/100" in done.stdout
    assert "\x1b[" not in done.stdout  # no colour when stdout is not a terminal
