"""attn_grade.check in a notebook, as a learner runs it: a real kernel (nbclient, ipykernel) runs the cells.

The kernel builds a file from its executed cells and a grader process of its own grades it; the kernel
never imports the grader, the model answers or the checks, so a cell that tampers with torch or with
attn_grade changes no score.
"""

from __future__ import annotations

import json

import pytest

import attn_grade
from attn_grade import source_of_cells
from tests.conftest import REFERENCE, ROOT
from tests.notebook_kernel import checks, execute, last_value, of_cells

MASKS_REFERENCE = (ROOT / "solutions" / "masks.py").read_text()
WRONG_SCALE = "def scale_scores(scores, head_dim):\n    return scores / head_dim\n"
TOP_LEFT = ("def causal_mask(t_q, t_k, device=None):\n"
            "    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()\n")
GRADER_MODULES = "sorted(m for m in sys.modules if m.split('.')[0] in ('grader', 'solutions'))"


def test_the_reference_in_cells_scores_100_with_the_step_table_and_the_kernel_imports_no_grader(tmp_path):
    cells = execute(of_cells(
        "import sys\n%time x = 1\n!echo a shell line",
        REFERENCE,
        "out = MultiHeadAttention(8, 2)(torch.randn(1, 3, 8))  # trying it out: no part of the file",
        "import attn_grade\nattn_grade.check('mha')",
        GRADER_MODULES,
    ), tmp_path)
    [result] = checks(cells)
    assert (result["score"], result["max_score"]) == (100, 100), result["report"]
    assert '<table class="steps">' in result["html"] and "MultiHeadAttention" in result["html"]
    assert last_value(cells) == "[]"  # the kernel never imported the grader nor a model answer


def test_a_wrong_scale_shows_its_named_mistake_and_a_one_step_check_shows_that_step(tmp_path):
    cells = execute(of_cells(REFERENCE, WRONG_SCALE, "import attn_grade\nattn_grade.check('mha', 'scale_scores')"),
                    tmp_path)
    [result] = checks(cells)
    assert result["checked"] == ["scale_scores"] and result["score"] < result["max_score"] == 8
    mistakes = {c.get("mistake", {}).get("id") for s in result["report"]["steps"] for c in s["checks"]}
    assert "scale_scores.by_head_dim" in mistakes
    assert "likely mistake" in result["html"] and "<code>project</code>" not in result["html"]
    assert last_value(cells).startswith("mha: scale_scores ")


def test_a_top_left_causal_mask_shows_the_two_masks_as_pictures(tmp_path):
    cells = execute(of_cells(MASKS_REFERENCE, TOP_LEFT, "import attn_grade\nattn_grade.check('masks')"), tmp_path)
    [result] = checks(cells)
    assert result["steps"]["causal_mask"][0] < result["steps"]["causal_mask"][1]
    page = result["html"]
    assert page.count("<svg") >= 3 and "expected mask" in page and "got mask" in page and "differ (" in page


def test_tampering_in_the_kernel_changes_no_score_and_no_record(tmp_path):
    """torch's comparisons patched, a fake grader module planted, attn_grade's own objects patched: the score
    is the one the untampered notebook gets, and the workspace records that one."""
    (tmp_path / ".attn-grade.json").write_text(json.dumps({"version": 1, "exercises": {}}))
    tamper = (
        "import sys, types, torch, attn_grade\n"
        "torch.allclose = lambda *a, **k: True\n"
        "torch.equal = lambda *a, **k: True\n"
        "torch.testing.assert_close = lambda *a, **k: None\n"
        "torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)\n"
        "fake = types.ModuleType('grader'); fake.__path__ = []\n"
        "sys.modules['grader'] = fake\n"
        "sys.modules['grader.engine'] = types.SimpleNamespace(expect_close=lambda *a, **k: None)\n"
        "attn_grade.Report.full_marks = property(lambda self: True)  # the kernel's view of a result, forged\n"
    )
    honest = execute(of_cells(REFERENCE, WRONG_SCALE, "import attn_grade\nattn_grade.check('mha')"), tmp_path)
    tampered = execute(of_cells(REFERENCE, WRONG_SCALE, tamper, "attn_grade.check('mha')"), tmp_path)
    [before], [after] = checks(honest), checks(tampered)
    assert after["score"] == before["score"] < 100, (before["steps"], after["steps"])
    assert after["report"]["score"] == before["report"]["score"]  # the grader's own numbers
    assert after["steps"] == before["steps"]
    recorded = json.loads((tmp_path / ".attn-grade.json").read_text())["exercises"]["mha"]
    assert [g["score"] for g in recorded["grades"]] == [before["score"]] * 2
    assert recorded["steps"]["scale_scores"]["best"] < 8


def test_without_file_system_isolation_the_report_says_so(tmp_path):
    cells = execute(of_cells(
        "import os\nos.environ['ATTN_GRADE_SANDBOX'] = 'portable'  # as where no namespaces can be made",
        REFERENCE, "import attn_grade\nattn_grade.check('mha')"), tmp_path)
    [result] = checks(cells)
    assert result["score"] == 100
    assert "without file-system isolation" in result["html"]


def test_a_second_check_in_the_kernel_reuses_the_warm_grader(tmp_path):
    cells = execute(of_cells(
        REFERENCE, "import time, attn_grade\nstarted = time.monotonic(); attn_grade.check('mha')",
        "first = time.monotonic() - started",
        WRONG_SCALE, "started = time.monotonic(); attn_grade.check('mha', 'scale_scores')",
        "second = time.monotonic() - started\nprint(first, second)\nsecond < first",
    ), tmp_path)
    assert last_value(cells) == "True", cells[-1]["outputs"]
    assert [r["score"] for r in checks(cells)][0] == 100


# -- the file the cells make (no kernel needed) -----------------------------------------------


def test_the_file_keeps_imports_definitions_and_constants_in_the_order_run():
    cells = [
        "import torch, attn_grade, math\nget_ipython().run_line_magic('matplotlib', 'inline')",
        "SCALE = 2.0\ndef f(x):\n    return x * SCALE\nprint(f(1))",
        "def f(x):  # edited and run again: this one counts\n    return x / SCALE",
        "y = f(torch.ones(2))  # trying it out\nattn_grade.check('mha')",
        "def broken(:\n    pass",
        "@torch.no_grad()\ndef g():\n    return 1",
        "try:\n    import numpy as np\nexcept ImportError:\n    np = None",
        "if __name__ == '__main__':\n    print(f(3))",
        "torch.allclose = lambda *a, **k: True\nCONFIG = {}\nCONFIG['x'] = 1\na, b = 1, 2",
        "started = 3; attn_grade.check('mha')",
    ]
    made = source_of_cells(cells)
    assert "import torch, math" in made and "attn_grade" not in made and "get_ipython" not in made
    assert "return x * SCALE" not in made and "return x / SCALE" in made  # the definition run last counts
    assert "print" not in made and "y = f(" not in made and "broken" not in made
    assert "@torch.no_grad()\ndef g():" in made and "import numpy as np" in made
    assert "started = 3" in made and "check(" not in made
    assert "allclose" not in made and "CONFIG['x']" not in made and "CONFIG = {}" in made and "a, b = 1, 2" in made
    compile(made, "cells.py", "exec")


def test_a_wrong_argument_is_the_callers_error_in_one_line():
    """Review 48's B4: check('mha', ['softmax']) came back as the grader's internal error; nothing is asked of the
    grader here, so no kernel is needed."""
    for args, kwargs, says in [(("mha", ["softmax"]), {}, "steps are names"),
                               ((["mha"],), {}, "the exercise is a name"),
                               (("mha",), {"seed": "x"}, "seed is an int"), (("mha",), {"device": "gpu"}, "device is"),
                               (("mha",), {"source": b"x"}, "source is Python text")]:
        with pytest.raises((TypeError, ValueError), match=says):
            attn_grade.check(*args, **kwargs)
