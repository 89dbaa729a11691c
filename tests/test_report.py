"""Reports of hand-made grades: masks and attention weights drawn as small grids beside the expected ones."""

import click

from grader import report
from grader.score import CheckResult, Grade, StepResult

CAUSAL = [[j <= i for j in range(4)] for i in range(4)]
INVERTED = [[not allowed for allowed in row] for row in CAUSAL]


def graded(*checks: CheckResult) -> Grade:
    return Grade("mha", "Multi-head attention", "mha.py", (StepResult("apply_mask", "Mask blocked positions", checks),))


def failed(name: str, details: dict, mistake_id: str | None = None) -> CheckResult:
    return CheckResult("apply_mask", name, "failed", 4, "values differ from the reference", mistake_id,
                       "inverted the mask" if mistake_id else None, details=details)


def test_a_mask_is_drawn_beside_the_expected_one_in_text_and_markdown():
    result = graded(failed("apply_mask_values", {"grid": {"expected": CAUSAL, "got": INVERTED}}, "apply_mask.inverted"),
                    failed("apply_mask_causal", {"grid": {"expected": CAUSAL, "got": INVERTED}}, "apply_mask.inverted"))
    text = click.unstyle(report.to_text(result))
    expected = [
        "expected  got",
        "│■···│    │·■■■│",
        "│■■··│    │··■■│",
        "│■■■·│    │···■│",
        "│■■■■│    │····│",
        "(■ may attend, · blocked; a row per query, a column per key)",
    ]
    assert "\n".join("        " + line for line in expected) in text, text
    assert text.count("expected  got") == 1  # one diagnosis for the two checks, one grid
    markdown = report.to_markdown(result)
    assert "\n".join(["  ```text", *("  " + line for line in expected), "  ```"]) in markdown, markdown


def test_attention_weights_are_shaded_and_a_large_grid_is_cut_to_12():
    weights = [[1.0, 0.0], [0.5, 0.5]]
    uniform = [[0.2, 0.8], [0.9999999, 1e-9]]
    lines = report.grid({"grid": {"expected": weights, "got": uniform}})
    assert lines[1:3] == ["│█ │      │░▓│", "│▒▒│      │█ │"], lines  # 0.2 is not blank; 0.9999999 (float32's 1) is █
    assert lines[-1] == "(shade by weight: ' ' 0, ░ ▒ ▓ between, █ 1; a row per query, a column per key)"
    big = [[j <= i for j in range(20)] for i in range(16)]
    lines = report.grid({"grid": {"expected": big, "got": big}})
    assert len(lines) == 1 + 12 + 1 and all(len(line) == 30 for line in lines[1:-1])
    assert lines[-1].endswith("; first 12 shown of 16 × 20)")


def test_details_without_a_grid_or_with_a_malformed_one_draw_nothing():
    assert report.grid({}) == [] and report.grid({"max_abs_error": 1.0}) == []
    for bad in ({"expected": CAUSAL}, {"expected": [[[True]]], "got": CAUSAL}, {"expected": [], "got": []},
                {"expected": "■", "got": CAUSAL}, [CAUSAL, INVERTED]):
        assert report.grid({"grid": bad}) == [], bad
    result = graded(failed("apply_mask_values", {"grid": {"expected": [[[True]]], "got": CAUSAL}}))
    assert "expected  got" not in report.to_text(result) + report.to_markdown(result)


def test_nan_and_inf_weights_reach_json_as_strings_and_are_drawn_as_question_marks():
    """JSON has no NaN: a bare NaN in --format json breaks strict parsers (JavaScript's JSON.parse)."""
    import json

    import torch

    from grader.engine import grid

    got = torch.tensor([[float("nan"), float("inf")], [0.5, 0.5]])
    details = grid(got, torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    assert details["grid"]["got"][0] == ["nan", "inf"]
    text = report.to_json(graded(failed("attention_values", details)))
    json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"bare {name}")))
    assert report.grid(details)[1].endswith("│??│")
