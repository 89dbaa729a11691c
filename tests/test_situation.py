"""A check's situation (spec.Check.situation) names a failure nothing else names, only while the step's plain
case passes: a bug that breaks one case is named by that case (each exercise's `*_situations` variants show
it), a bug that breaks every case is not."""

import pytest

from grader.engine import Mistake, StepSpec, values
from tests.conftest import ROOT, explain, mistakes

BASE = (ROOT / "solutions" / "attention_backward.py").read_text()
SITUATIONS = {"attention_backward.mask_mishandled", "attention_backward.masked_rows_mishandled",
              "attention_backward.square_mishandled", "attention_backward.large_scores_mishandled"}

# Every gradient wrong in every case: no situation says where, since the plain case fails too.
EVERYWHERE = """
_right = attention_backward

def attention_backward(q, k, v, grad_out, mask=None):
    dq, dk, dv = _right(q, k, v, grad_out, mask)
    return dq + 0.5, dk, dv
"""


def test_no_situation_is_named_when_the_plain_case_fails_too(grade_source):
    result = grade_source(EVERYWHERE, base=BASE, name="attention_backward.py")
    assert "attention_backward" in {s.id for s in result.steps if s.score < s.max_score}, explain(result)
    assert not mistakes(result, "attention_backward") & SITUATIONS, explain(result)


def test_a_step_cannot_situate_checks_without_a_plain_case():
    situation = Mistake("x.y", "wrong: fix it")
    with pytest.raises(ValueError, match="no plain check"):
        StepSpec("x", lambda gen, dtype: None, lambda: None, checks=(values("edge", 1, situation=situation),),
                 plain="missing")
