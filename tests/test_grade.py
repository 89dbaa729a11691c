"""Whole grades: the reference, the stubs, determinism, and broken or hostile candidate files."""

import hashlib
import importlib.metadata
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from grader import report
from grader.candidate import NOT_IMPORTED
from grader.exercise import load_course
from grader.grade import grade, kit_version
from tests.conftest import REFERENCE, ROOT, explain, lost, report_but_when

STEPS = ["project", "split_heads", "attention_scores", "scale_scores", "apply_mask",
         "softmax", "weighted_sum", "merge_heads", "MultiHeadAttention"]


def test_reference_scores_100_with_device_checks():
    result = grade(ROOT / "solutions" / "mha.py")
    assert [s.id for s in result.steps] == STEPS
    assert (result.score, result.max_score) == (100, 100), explain(result)
    assert result.environment["device"] in ("meta", "cuda")
    device_checks = [c for s in result.steps for c in s.checks if c.name.endswith("_device")]
    assert len(device_checks) == len(STEPS) and all(c.outcome == "passed" for c in device_checks)


def test_stubs_score_0_and_every_step_says_not_implemented():
    result = grade(ROOT / "exercises" / "mha.py", device="cpu")
    assert result.score == 0
    for step in result.steps:
        assert step.score == 0
        assert all(c.outcome == "error" and "not implemented yet" in c.message for c in step.checks), step.id


def test_same_file_twice_gives_the_same_report_and_seed_changes_the_inputs(grade_source):
    override = "def softmax(scores, dim=-1):\n    e = torch.exp(scores)\n    return e / e.sum(dim, keepdim=True)"
    first, second = grade_source(override), grade_source(override)
    assert report_but_when(first) == report_but_when(second)
    other = grade_source(override, seed=1)
    assert dict(report_but_when(other), seed=0) != report_but_when(first)  # the error messages quote the inputs


def test_syntax_error_scores_0_everywhere_and_is_reported_once_for_the_file(grade_source):
    result = grade_source("def broken(:\n    pass\n")
    line = len((REFERENCE + "\n\n").splitlines()) + 1
    assert result.score == 0
    assert result.environment["file_error"] == f"could not import: SyntaxError at line {line}: invalid syntax"
    messages = {c.message for s in result.steps for c in s.checks}
    assert messages == {NOT_IMPORTED}, messages  # no check is charged with it
    assert report.to_text(result).count("SyntaxError") == 1


def test_sys_exit_at_import_is_never_a_pass(grade_source):
    for code in ("import sys\nsys.exit(0)", "exit()", "import os\nos._exit(0)"):
        result = grade_source(code)
        assert result.score == 0, code
        error = result.environment["file_error"]
        exited = ("could not import: candidate exited while importing", "candidate exited while importing")
        assert error.startswith(exited), error


@pytest.mark.parametrize("code", ["", "# nothing yet\n", "def helper(x):\n    return x\n"])
def test_a_file_that_defines_none_of_the_steps_says_so_by_their_names(grade_source, code):
    result = grade_source(code, base="")
    steps = ", ".join(step.id for step in load_course()["mha"].steps)
    assert result.score == 0
    assert result.environment["file_error"] == (
        f"mha.py defines none of {steps}: start from the stub (attn-grade init writes one) and keep its names."
    )
    assert "defines none of project, split_heads, attention_scores" in result.environment["file_error"]
    text = report.to_text(result)
    assert "module 'candidate'" not in text and "the file defines no softmax" in text, text


def test_a_file_that_defines_some_steps_is_graded_step_by_step(grade_source):
    alone = "import torch\ndef scale_scores(scores, head_dim):\n    return scores / head_dim ** 0.5\n"
    result = grade_source(alone, base="")
    assert "file_error" not in result.environment
    assert next(s for s in result.steps if s.id == "scale_scores").score == 8
    assert {c.message for s in result.steps if s.id == "softmax" for c in s.checks} == {"the file defines no softmax"}


def test_infinite_loop_in_one_step_costs_only_that_step(grade_source):
    start = time.monotonic()
    result = grade_source("def softmax(scores, dim=-1):\n    while True:\n        pass", timeout=1.0)
    elapsed = time.monotonic() - start
    assert set(lost(result)) == {"softmax", "MultiHeadAttention"}, explain(result)
    softmax = next(s for s in result.steps if s.id == "softmax")
    assert softmax.score == 0 and all("timed out after 1 s" in c.message for c in softmax.checks)
    assert elapsed < 20, elapsed  # two hung functions (softmax, the module): not one timeout per check


def test_os_exit_in_one_step_costs_only_that_step(grade_source):
    result = grade_source("import os\ndef merge_heads(x):\n    os._exit(0)", timeout=5.0)
    assert set(lost(result)) == {"merge_heads", "MultiHeadAttention"}, explain(result)
    merge = next(s for s in result.steps if s.id == "merge_heads")
    assert merge.score == 0 and all("worker died (exit code 0)" in c.message for c in merge.checks), explain(result)


def test_patching_comparisons_at_import_earns_nothing(grade_source):
    override = """
    import torch, numpy, math
    torch.allclose = lambda *a, **k: True
    torch.equal = lambda *a, **k: True
    torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
    torch.testing.assert_close = lambda *a, **k: None
    numpy.allclose = lambda *a, **k: True
    math.isclose = lambda *a, **k: True
    def scale_scores(scores, head_dim):
        return scores * 0
    """
    result = grade_source(override)
    assert set(lost(result)) == {"scale_scores", "MultiHeadAttention"}, explain(result)
    assert next(s for s in result.steps if s.id == "scale_scores").score <= 1  # only the shape check


def test_json_report_has_the_documented_fields():
    result = grade(ROOT / "solutions" / "mha.py", device="cpu")
    data = json.loads(report.to_json(result))
    assert set(data) == {"exercise", "file", "sha256", "seed", "graded_at", "kit_version", "score", "max_score",
                         "steps", "environment"}
    assert set(data["environment"]) == {"torch", "device", "cuda_available", "fs_isolation", "limits"}
    check = data["steps"][0]["checks"][0]
    assert set(check) == {"name", "outcome", "points", "max_points", "message"}


def test_json_report_says_what_was_graded_when_with_which_seed_by_which_kit(grade_source, monkeypatch):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    result = grade_source("", seed=7)
    data = json.loads(report.to_json(result))
    assert data["seed"] == 7
    assert data["sha256"] == hashlib.sha256(Path(result.file).read_bytes()).hexdigest()
    assert before <= datetime.fromisoformat(data["graded_at"]) <= datetime.now(timezone.utc)
    assert data["graded_at"].endswith("+00:00")
    assert data["kit_version"] == importlib.metadata.version("attn-grade")

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # a checkout run without installing it
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{kit_version.__wrapped__()}"' in pyproject


def test_a_cached_regrade_runs_only_what_changed_and_agrees_with_a_full_grade(tmp_path, zygote):
    """watch keeps a cache: a check is run again only when the source it depends on changed."""
    path = tmp_path / "mha.py"
    cache: dict = {}
    versions = [REFERENCE, REFERENCE + "\ndef scale_scores(scores, head_dim):\n    return scores\n", REFERENCE,
                REFERENCE + "\nHELPER = 2.0\n",  # a change outside every step: everything runs again
                # a default argument runs at import, and here breaks every step's torch.softmax: all run again
                REFERENCE + "\ndef merge_heads(x, _=setattr(torch, 'softmax', None)):\n"
                            "    B, H, T, Dh = x.shape\n    return x.transpose(1, 2).reshape(B, T, H * Dh)\n",
                # a form feed (a page break) is no line break to the parser: the steps are still found
                "\x0c\n" + REFERENCE, "\x0c\n" + REFERENCE.replace("y = x @ weight.T", "y = x @ weight")]
    for text in versions:
        path.write_text(text)
        before = set(cache)
        cached = grade(path, device="cpu", zygote=zygote, cache=cache)
        full = grade(path, device="cpu", zygote=zygote)
        assert [(c.name, c.outcome, c.message) for s in cached.steps for c in s.checks] == \
               [(c.name, c.outcome, c.message) for s in full.steps for c in s.checks]
        ran = {key[0] for key in set(cache) - before}
        if text is versions[1]:  # only scale_scores, and the module and the rules (which read the whole file) ran
            assert ran and all(name.startswith(("scale_scores_", "module_")) or name.endswith("_rules")
                               for name in ran), ran
            assert "softmax_values[float32]" not in ran and "softmax_rules" in ran, ran
        if text is versions[3]:
            assert "project_shape" in ran and "module_structure" in ran
        if text is versions[4]:
            assert "softmax_values[float32]" in ran and "project_shape" in ran
        if text is versions[6]:
            assert "project_shape" in ran and "softmax_values[float32]" not in ran


def test_an_answered_call_that_asks_for_a_device_gets_its_answer_there(tmp_path, zygote):
    """local_attention calls sliding_window_mask(..., device=q.device); with that step broken the grader answers
    the call, and the answer must reach the device asked for, or a correct local_attention would be charged for it."""
    path = tmp_path / "local_attention.py"
    path.write_text((ROOT / "solutions" / "local_attention.py").read_text() + """
def sliding_window_mask(t_q, t_k, window, device=None):
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()  # top-left: a bug of this step
""")
    result = grade(path, zygote=zygote)  # the device checks on the meta device
    assert set(lost(result)) == {"sliding_window_mask"}, explain(result)


def test_the_worker_records_the_shapes_a_call_creates_when_asked(tmp_path, zygote):
    """The record flash_attention's memory check reads: each distinct shape a torch call created once, a view
    counted as the tensor it views (einsum returns one), an expand of a small tensor as small; only when asked."""
    import torch

    from grader.candidate import Candidate

    path = tmp_path / "shapes.py"
    path.write_text("""
import torch

def tiles(q, k):
    s = torch.einsum("bqd,bkd->bqk", q, k)  # a view of a (2, 6, 7) result
    wide = torch.zeros(6, 1).expand(6, 1000)  # no memory of its own: counts as (6, 1)
    for i in range(0, 6, 2):
        q[:, i:i + 2] @ k.mT  # (2, 2, 7), three times: listed once
    return s.sum(-1)  # (2, 6)
""")
    q, k = torch.ones(2, 6, 3), torch.ones(2, 7, 3)
    with Candidate(path, zygote=zygote) as candidate:
        answer = candidate.invoke("tiles", (q, k), {}, shapes=True)
        assert answer.shapes["more"] == 0
        created = answer.shapes["created"]
        assert (2, 6, 7) in created and (6, 1) in created and (2, 2, 7) in created and (2, 6) in created
        assert (6, 1000) not in created and len(created) == len(set(created))
        assert candidate.invoke("tiles", (q, k), {}).shapes is None  # not asked: not recorded
