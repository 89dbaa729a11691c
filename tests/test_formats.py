"""Every report format says why a file that does not import earned nothing, with the error's line; with -v,
what the candidate's code printed is shown under the check whose calls printed it."""

import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import jsonschema
import pytest

from grader import batch, report
from grader.candidate import NOT_IMPORTED
from grader.grade import grade
from grader.pool import CHECK_OUTPUT_CAP
from tests.conftest import REFERENCE

SCHEMAS = Path(__file__).parent / "schemas"
BROKEN = REFERENCE + "\n\ndef extra(x):\n    return (x + 1\n\n\nTHE_END = 1\n"  # a parenthesis never closed


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def error_line(source: str) -> int:
    try:
        compile(source, "mha.py", "exec")
    except SyntaxError as error:
        return error.lineno
    raise AssertionError("the source compiles")


@pytest.fixture(scope="module")
def broken(tmp_path_factory, zygote):
    """The grade of a file with a syntax error, and what every report must say about it."""
    path = tmp_path_factory.mktemp("broken") / "mha.py"
    path.write_text(BROKEN)
    result = grade(path, device="cpu", zygote=zygote)
    says = f"SyntaxError at line {error_line(BROKEN)}: '(' was never closed"
    assert result.environment["file_error"] == f"could not import: {says}"
    assert {c.message for s in result.steps for c in s.checks} == {NOT_IMPORTED}  # each check alone says only this
    return result, says


def test_text_and_json_say_why(broken):
    result, says = broken
    assert says in click.unstyle(report.to_text(result))
    assert says in json.loads(report.to_json(result))["environment"]["file_error"]


def test_gradescope_says_why_at_the_top_and_in_every_test(broken):
    result, says = broken
    data = json.loads(report.to_gradescope(result))
    jsonschema.validate(data, schema("gradescope.schema.json"))
    assert says in data["output"]
    assert all(says in test["output"] for test in data["tests"]), [t["output"] for t in data["tests"]]


def test_github_says_why_in_every_test(broken):
    result, says = broken
    data = json.loads(report.to_github(result))
    jsonschema.validate(data, schema("github.schema.json"))
    assert all(says in test["message"] for test in data["tests"]), [t["message"] for t in data["tests"]]


def test_markdown_says_why(broken):
    result, says = broken
    markdown = report.to_markdown(result)
    assert f"- **The whole file**: could not import: {says}" in markdown


def test_junit_says_why_in_every_failure(broken):
    result, says = broken
    root = ET.fromstring(report.to_junit(result).split("\n", 1)[1])
    failures = [e for e in root.iter() if e.tag in ("failure", "error")]
    assert failures and len(failures) == sum(len(s.checks) for s in result.steps)
    assert all(says in e.text and says in e.get("message") for e in failures), failures[0].attrib


def test_the_csv_row_says_could_not_import_and_why(broken):
    result, says = broken
    [row] = csv.DictReader(io.StringIO(batch.to_csv([batch.row_of(result, 0.5)])))
    assert row["status"] == "could not import" and row["reason"] == says, row
    assert row["total"] == "0" and row["sha256"] == result.sha256


def test_a_file_that_imports_says_no_file_error_anywhere(grade_source):
    """The reasons are the file's only when it has one: a full-marks file's reports carry none."""
    result = grade_source("")
    assert "file_error" not in result.environment
    assert json.loads(report.to_gradescope(result))["output"].count("\n") == 0
    assert "The whole file" not in report.to_markdown(result)


# -- -v: who printed what ----------------------------------------------------------------

PRINTING = """
print("AT IMPORT")
_reference_scale = scale_scores
_reference_merge = merge_heads


def scale_scores(scores, head_dim):
    print("SCALING", tuple(scores.shape))
    return _reference_scale(scores, head_dim)


def merge_heads(x):
    print("M" * 100_000)
    return _reference_merge(x)
"""


@pytest.fixture(scope="module")
def printing(tmp_path_factory, zygote):
    path = tmp_path_factory.mktemp("printing") / "mha.py"
    path.write_text(REFERENCE + "\n\n" + PRINTING)
    return grade(path, device="cpu", zygote=zygote)


def _checks(data: dict, step: str) -> list[dict]:
    return next(s for s in data["steps"] if s["id"] == step)["checks"]


def test_verbose_json_puts_what_was_printed_under_the_check_that_printed_it(printing):
    data = json.loads(report.to_json(printing, verbose=True))
    jsonschema.validate(data, schema("grade.schema.json"))
    shape = next(c for c in _checks(data, "scale_scores") if c["name"] == "scale_scores_shape")
    assert shape["output"].startswith("SCALING ("), shape
    assert not any("output" in c for c in _checks(data, "project") + _checks(data, "softmax"))  # they print nothing
    every = [c.get("output", "") for s in data["steps"] for c in s["checks"]]
    assert not any("AT IMPORT" in text for text in every)  # the import's prints are no check's
    assert "AT IMPORT" in data["candidate_output"]  # but are in the whole, as before
    merged = [c["output"] for c in _checks(data, "merge_heads") if "output" in c]
    assert merged and all(t.endswith("more bytes not kept]") and len(t) < CHECK_OUTPUT_CAP + 100 for t in merged)
    plain = json.loads(report.to_json(printing))
    assert not any("output" in c for s in plain["steps"] for c in s["checks"])  # only with -v


def test_verbose_text_shows_the_prints_under_their_check(printing):
    lines = click.unstyle(report.to_text(printing, verbose=True)).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "ok scale_scores_shape")
    assert lines[at + 1].strip() == "printed (escaped):" and lines[at + 2].strip().startswith("│ SCALING ("), lines[at:]
    project = next(i for i, line in enumerate(lines) if line.strip() == "ok project_shape")
    assert lines[project + 1].strip().startswith("ok project_"), lines[project:]  # nothing printed there
    assert "printed" not in click.unstyle(report.to_text(printing))  # only with -v


def test_junit_is_well_formed_xml_whatever_the_raising_line_holds(grade_source):
    """The forty-fourth review's r02: the candidate's line quoted in a failure held U+FFFE, which XML 1.0 has no
    place for, and the report did not parse."""
    result = grade_source('\n\ndef scale_scores(scores, head_dim):\n    return scores.no_such_method("\ufffe\uffff")\n')
    assert not result.full_marks
    assert any("\ufffe" in c.message for s in result.steps for c in s.checks)  # it reached the report
    root = ET.fromstring(report.to_junit(result).split("\n", 1)[1])
    assert [e for e in root.iter() if e.tag in ("failure", "error")]
