"""Hints that teach: three levels per step (the idea, the plan, then code), stubs that state the contract
without spelling the answer, and what `attn-grade hint` and watch's h key do past the last level."""

import ast
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from grader import cli, workspace
from grader.exercise import load_course
from grader.progress import FILE_NAME, Progress
from grader.watch import Watcher
from tests.conftest import ROOT

EXERCISES = list(load_course().values())
STEPS = [(e, s) for e in EXERCISES for s in e.steps]

# Code-like text: what a hint before the last level must not hold. Prose and math (√Dh, e^(m − m'), "q·k",
# "(B, H, T, Dh)", "softmax(s) = softmax(s − c)") pass; calls, library functions, indexing and code lines do not.
CODE = re.compile(
    r"\.\w+\("  # a method call: .transpose(
    r"|\b(?:torch|np|numpy|math|F|scipy)\.\w"  # a library's function or constant: torch.exp, np.inf, math.sqrt
    r"|\bnn\.\w+\("  # a layer built: nn.Linear(D, D)
    r"|\b[A-Za-z]\w*_\w*\("  # a call of a snake_case function: repeat_kv(k, G)
    r"|\w\[[^\]]*(?:\.\.\.|None|:)"  # indexing with ..., None or a slice: x[..., None], lengths[:, None]
    r"|\w\.(?:T|mT|shape|dtype|device)\b"  # attributes of a tensor: weight.T, keys.shape
    r"|\b(?:dim|axis|keepdim|keepdims|diagonal|dtype|device)="  # keyword arguments
    r"|\w\s*=\s*[A-Za-z_][\w.]*\("  # an assignment from a call: m = max(...)
    r"|\breturn\s+[\w.]+\s*(?:[-@*/+<&|(\[,]|if\b)|\bdef\s+\w+\(|\bfor\s+\w+\s+in\b|\blambda\b"  # code lines
)


def invoke(*args):
    result = CliRunner().invoke(cli.main, [str(a) for a in args])
    print(result.output)
    return result


def test_the_code_heuristic_tells_code_from_prose():
    code = [
        "x.repeat_interleave(n_rep, dim=1)",
        "m_new = torch.maximum(m, scores.amax(-1)); safe = torch.where(m_new == -math.inf, 0.0, m_new)",
        "k, v = repeat_kv(k, G), repeat_kv(v, G)",
        "padding[:, None, None, :] & causal",
        "x @ weight.T gives (..., d_out)",
        "Divide by math.sqrt(head_dim)",
        "np.where(mask, scores, -np.inf) keeps the allowed entries",
        "return weights @ v",
        "nn.Linear(D, num_kv_heads * Dh)",
    ]
    prose = [
        "softmax(s) = softmax(s − c) for any c constant along the axis",
        "scale by √Dh; the factor e^(m − m') (at most 1) rescales l and acc",
        "a column (T, 1) times a row (1, Dh/2) gives (T, Dh/2); the nn.Linear layout (d_out, d_in)",
        "entry [h, i, j] is −slopes[h]·(p − j); pair i is (x[2i], x[2i+1]); [h·Dh, (h+1)·Dh)",
        "Plan: swap the last two axes of k, then multiply; return the tuple, queries first.",
    ]
    assert [c for c in code if not CODE.search(c)] == []
    assert [p for p in prose if CODE.search(p)] == []


@pytest.mark.parametrize(("exercise", "step"), STEPS, ids=lambda x: getattr(x, "name", None) or x.id)
def test_every_step_has_the_idea_then_the_plan_then_code(exercise, step):
    assert len(step.hints) == 3, f"{exercise.name}/{step.id}: three levels, the idea, the plan, code"
    for level, text in enumerate(step.hints[:2], start=1):
        found = CODE.search(text)
        assert not found, f"{exercise.name}/{step.id} level {level} holds code: {found.group(0)!r} in {text!r}"
    assert CODE.search(step.hints[2]), f"{exercise.name}/{step.id} level 3 holds no code"


def _answers(tree) -> dict[str, list[str]]:
    """Each function's returned expressions, spaces removed: the one-line answers."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            out[node.name] = [re.sub(r"\s", "", ast.unparse(r)) for r in returns]
    return out


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_stub_states_the_contract_not_the_one_line_answer(exercise):
    """No expression the model answer returns (of eight characters or more) is spelled in the stub, in its
    docstrings or its comments: x.repeat_interleave(n_rep, dim=1), weights @ v."""
    stub = re.sub(r"\s", "", exercise.stub_path.read_text())
    reference = ast.parse((ROOT / "solutions" / exercise.file).read_text())
    spelled = [(name, a) for name, answers in _answers(reference).items() for a in answers
               if len(a) >= 8 and a in stub]
    assert spelled == [], f"the stub exercises/{exercise.file} spells the answer"


# -- attn-grade hint ----------------------------------------------------------------------


def test_hint_shows_the_next_level_then_points_to_the_solution_and_records_nothing_more(tmp_path):
    assert invoke("init", tmp_path, "--exercise", "mha").exit_code == 0
    shown = [invoke("hint", "mha", "softmax", "--workspace", tmp_path) for _ in range(3)]
    assert [r.exit_code for r in shown] == [0, 0, 0]
    for level, name, result in zip((1, 2, 3), ("the idea", "the plan", "code"), shown, strict=True):
        assert result.stdout.startswith(f"mha/softmax, hint {level} of 3 ({name}): "), result.stdout
    hints = load_course()["mha"].step("softmax").hints
    assert [r.stdout.split("): ", 1)[1].strip() for r in shown] == list(hints)
    saved = (tmp_path / FILE_NAME).read_text()
    past = invoke("hint", "mha", "softmax", "--workspace", tmp_path)
    assert past.exit_code == 0
    assert past.stdout.strip() == ("mha/softmax: all 3 hints seen; the model answer is next: "
                                   "attn-grade solution mha softmax")
    again = invoke("hint", "mha", "softmax", "--level", "2", "--workspace", tmp_path)  # a level seen before
    assert again.exit_code == 0 and "hint 2 of 3 (the plan)" in again.stdout
    assert (tmp_path / FILE_NAME).read_text() == saved  # neither is recorded again
    recorded = [(h["step"], h["level"]) for h in Progress.find(tmp_path).hints("mha")]
    assert recorded == [("softmax", 1), ("softmax", 2), ("softmax", 3)]


def test_hint_takes_the_lowest_level_not_seen_and_refuses_a_level_past_the_last(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    assert "hint 2 of 3" in invoke("hint", "mha", "apply_mask", "--level", "2", "--workspace", tmp_path).stdout
    assert "hint 1 of 3" in invoke("hint", "mha", "apply_mask", "--workspace", tmp_path).stdout
    assert "hint 3 of 3" in invoke("hint", "mha", "apply_mask", "--workspace", tmp_path).stdout
    refused = invoke("hint", "mha", "apply_mask", "--level", "4", "--workspace", tmp_path)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.strip() == ("attn-grade: apply_mask has 3 hint levels; pass --level 1 to 3, "
                                      "or see the model answer: attn-grade solution mha apply_mask")
    assert [h["level"] for h in Progress.find(tmp_path).hints("mha")] == [2, 1, 3]


def test_hint_outside_a_workspace_shows_level_one_and_says_how_to_see_the_next(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("hint", "gqa", "repeat_kv")
    assert result.exit_code == 0 and result.stdout.startswith("gqa/repeat_kv, hint 1 of 3 (the idea): ")
    assert "--level 2 shows the next hint" in result.stderr
    assert not (tmp_path / FILE_NAME).exists()


def test_hint_without_a_step_lists_the_steps_their_levels_and_those_seen(tmp_path):
    invoke("init", tmp_path, "--exercise", "mha")
    invoke("hint", "mha", "softmax", "--workspace", tmp_path)
    invoke("hint", "mha", "softmax", "--workspace", tmp_path)
    invoke("hint", "mha", "project", "--level", "3", "--workspace", tmp_path)
    result = invoke("hint", "mha", "--workspace", tmp_path)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "mha: hints by step, 1 the idea, 2 the plan, 3 code. Next: attn-grade hint mha STEP"
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[1:]}
    assert list(rows) == [s.id for s in load_course()["mha"].steps]
    assert rows["softmax"] == "3 levels seen 1, 2" and rows["project"] == "3 levels seen 3"
    assert rows["split_heads"] == "3 levels seen none"


def test_hint_without_a_step_outside_a_workspace_lists_the_steps_and_says_seen_is_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("hint", "flash_attention")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1:] == [f"  {s:<21}  3 levels" for s in
                                              ("online_softmax_update", "merge_partials", "flash_attention")]
    assert "hints seen are unknown" in result.stderr
    assert invoke("hint", "nope").exit_code == 2


# -- watch's h key ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # watch wraps its messages to the terminal's width: one line each here


def _watcher(folder, step="softmax"):
    watcher = Watcher(folder / "mha.py", {}, zygote=None)
    watcher.focus = SimpleNamespace(id=step)  # as after a grade whose detail is that step
    return watcher


def test_the_h_key_past_the_last_level_points_to_the_solution_and_records_nothing_more(tmp_path, capsys):
    workspace.init(tmp_path, [load_course()["mha"]])
    watcher = _watcher(tmp_path)
    for _ in range(5):
        watcher.press("h")
    out = capsys.readouterr().out
    assert [out.count(f"mha/softmax, hint {level} of 3") for level in (1, 2, 3)] == [1, 1, 1]
    assert out.count("all 3 hints seen; the model answer is next: attn-grade solution mha softmax") == 2
    assert [h["level"] for h in Progress.find(tmp_path).hints("mha")] == [1, 2, 3]


def test_the_h_key_outside_a_workspace_goes_through_the_levels_once_too(tmp_path, capsys):
    (tmp_path / "mha.py").write_text((ROOT / "exercises" / "mha.py").read_text())
    watcher = _watcher(tmp_path, "split_heads")
    for _ in range(4):
        watcher.press("h")
    out = capsys.readouterr().out
    assert [out.count(f"mha/split_heads, hint {level} of 3") for level in (1, 2, 3)] == [1, 1, 1]
    assert out.count("not recorded") == 3 and "attn-grade solution mha split_heads" in out
    assert not (tmp_path / FILE_NAME).exists()
