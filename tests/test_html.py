"""The HTML report (grader/html.py): the step table, lost checks with their named mistakes and hints, and the
pictures of masks and weights, for `--format html`, the notebook's check and the interview scorecard.
In a real browser: tests/test_browser.py."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from click.testing import CliRunner

from grader import cli, html
from grader.interview import Scorecard
from grader.score import CheckResult, Grade, StepResult
from tests.conftest import REFERENCE

MASK = {"grid": {"expected": [[True, False], [True, True]], "got": [[True, True], [True, True]], "shape": [2, 2]}}
WEIGHTS = {"grid": {"expected": [[1.0, 0.0], [0.5, 0.5]], "got": [[0.5, 0.5], [0.5, 0.5]], "shape": [2, 2]}}


def _grade(details=MASK, message="2 / 4 entries differ", environment=None) -> Grade:
    lost = CheckResult("causal_mask", "causal_mask_values", "failed", 5, message, "causal_mask.top_left",
                       "aligned to the <top-left>: use tril(diagonal=t_k - t_q)", details=details)
    kept = CheckResult("causal_mask", "causal_mask_shape", "passed", 5)
    other = CheckResult("padding_mask", "padding_mask_values", "passed", 10)
    steps = (StepResult("causal_mask", "Causal mask", (kept, lost)), StepResult("padding_mask", "Padding", (other,)))
    env = {"torch": "2.13.0", "device": "meta", "fs_isolation": True, **(environment or {})}
    return Grade("masks", "Causal and padding masks", "masks.py", steps, env)


def test_the_report_has_the_step_table_the_named_mistake_its_hint_and_the_two_masks_drawn():
    page = html.to_html(_grade())
    assert page.startswith("<!DOCTYPE html>") and "@page { size: A4" in page
    table = re.search(r'<table class="steps">.*?</table>', page, re.S).group(0)
    assert "<code>causal_mask</code>" in table and "5/10" in table and "15/20" in table
    assert "likely mistake" in page and "&lt;top-left&gt;" in page and "<top-left>" not in page  # escaped
    assert "Hint (the idea)" in page
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 3  # expected, got, and where they differ
    for svg in svgs:
        ET.fromstring(svg)  # well-formed: it draws in every browser
    assert "expected mask" in page and "got mask" in page and "differ (1 entries)" in page


def test_weights_are_shaded_by_value_and_other_values_by_their_shared_range():
    weights = html.pictures(WEIGHTS)
    assert "expected weights" in weights and "differ (2 entries)" in weights and "white 0 to dark blue 1" in weights
    assert 'fill="#ffffff"' in weights and 'fill="#0b3d91"' in weights  # 0 and 1
    values = html.pictures({"grid": {"expected": [[-3.0, 2.0]], "got": [[-3.0, "nan"]]}})
    assert "expected values" in values and "white -3 to dark blue 2" in values and ">?</text>" in values


def test_no_grid_no_picture_and_a_forged_grid_draws_nothing():
    assert html.pictures({"max_abs_error": 0.5}) == ""
    assert html.pictures({"grid": {"expected": [["<script>"]], "got": "x"}}) == ""
    assert html.grid_of({"grid": {"expected": [[1] * 100], "got": [[1] * 100]}}) is None  # too large to be ours


def test_a_one_step_fragment_shows_that_step_and_the_whole_files_total():
    part = html.fragment(_grade(), steps=("padding_mask",), file="the notebook's cells")
    assert "<code>padding_mask</code>" in part and "<code>causal_mask</code>" not in part
    assert "Whole file" in part and "15/20" in part and "the notebook&#x27;s cells" in part


def test_the_report_says_when_the_file_system_was_not_isolated_and_when_the_file_did_not_import():
    page = html.to_html(_grade(environment={"fs_isolation": False, "file_error": "could not import: <oops>"}))
    assert "without file-system isolation" in page and "could not import: &lt;oops&gt;" in page
    assert "without file-system isolation" not in html.to_html(_grade())


def test_the_command_line_writes_the_html_report(tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE.replace("math.sqrt(head_dim)", "head_dim"))
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli.main, [str(path), "--device", "cpu", "--format", "html", "--output", str(out)])
    assert result.exit_code == 1, result.output
    page = out.read_text()
    assert "<table class=\"steps\">" in page and "scale_scores" in page and "likely mistake" in page


def test_the_scorecard_draws_the_same_pictures_and_redraws_only_grids_from_its_session_file():
    card = Scorecard("Interview scorecard: Ada", [("Candidate", "Ada")], [], [], [], [],
                     pictures=[("causal_mask / causal_mask_values", html.grid_of(MASK))])
    page = card.html()
    assert page.count("<svg") == 3 and "causal_mask / causal_mask_values" in page
    saved = card.to_json()
    assert Scorecard.from_json(saved).html() == page
    saved["pictures"].append(["forged", {"expected": "<script>alert(1)</script>", "got": []}])
    assert "<script>" not in Scorecard.from_json(saved).html()
