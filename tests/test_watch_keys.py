"""watch's cache keys (issue 17, #8): a save regrades every step whose answer it can change.

A step's checks are taken from the last grade while their key holds: the step's own code, the steps it
names, the rest of the file. Code that runs at import in a step's definition (a class body, a default
argument, a decorator) can change what another step sees without naming it, so a change there must
regrade the whole file rather than keep a stale full mark.
"""

import collections

from grader import watch as watch_module
from grader.candidate import Candidate
from grader.course.mha.spec import SPEC
from grader.watch import watch
from tests.conftest import REFERENCE, save, script

# scale_scores reads a setting that the module's class body writes: it never names the class
READS_A_SETTING = REFERENCE + """

SETTINGS = {"scale": 1.0}


def scale_scores(scores, head_dim):
    return scores / math.sqrt(head_dim) * SETTINGS["scale"]


class MultiHeadAttention(MultiHeadAttention):
    SETTINGS["scale"] = 1.0
"""


def graded(monkeypatch) -> list:
    """Each grade watch makes, in order."""
    results = []
    grade = watch_module.grade

    def spy(*args, **kwargs):
        results.append(grade(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(watch_module, "grade", spy)
    return results


def watched(tmp_path, zygote, monkeypatch, before: str, after: str) -> list:
    """watch's two grades, of `before` and then of `after` saved over it."""
    assert after != before
    path = tmp_path / "mha.py"
    path.write_text(before)
    results = graded(monkeypatch)
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, after)), zygote=zygote)
    return results


def test_a_setting_written_in_a_class_body_regrades_the_step_that_reads_it(tmp_path, zygote, monkeypatch):
    halved = READS_A_SETTING.replace('    SETTINGS["scale"] = 1.0', '    SETTINGS["scale"] = 0.5')
    first, second = watched(tmp_path, zygote, monkeypatch, READS_A_SETTING, halved)
    assert first.full_marks, [(s.id, s.score) for s in first.steps]
    lost = {s.id for s in second.steps if s.score < s.max_score}
    assert "scale_scores" in lost, [(s.id, s.score) for s in second.steps]  # not a stale full mark from the cache


# the steps whose rules checks read the whole file's source (grader/run_checks.py), run again at every change
RULED = {s.id for s in SPEC.steps if any(c.kind == "rules" or c.name == "rules" for c in s.checks)}
REACHING_SCALE_SCORES = {"scale_scores", "MultiHeadAttention"} | RULED
assert len(REACHING_SCALE_SCORES) < len(SPEC.steps)


def regraded(tmp_path, zygote, monkeypatch, before: str, after: str) -> set[str]:
    """The steps whose code the second grade called, watch saving `after` over `before` (both full marks)."""
    assert after != before
    path = tmp_path / "mha.py"
    path.write_text(before)
    results = graded(monkeypatch)
    called = collections.defaultdict(set)  # grade number -> the steps whose code the grader called
    call_child = Candidate._call_child

    def spy(self, header, name, *rest):
        called[len(results)].add(name)  # the grade running now: those before it are in `results`
        return call_child(self, header, name, *rest)

    monkeypatch.setattr(Candidate, "_call_child", spy)
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, after)), zygote=zygote)
    assert [r.full_marks for r in results] == [True, True]
    return called[1]


def test_an_edit_inside_a_function_body_still_regrades_only_what_reaches_it(tmp_path, zygote, monkeypatch):
    """The cache still pays: a change in one step's body reruns that step, the module and the rules checks, not the
    others."""
    edited = REFERENCE.replace("return scores / math.sqrt(head_dim)", "return scores / head_dim ** 0.5")
    assert regraded(tmp_path, zygote, monkeypatch, REFERENCE, edited) == REACHING_SCALE_SCORES


# a helper outside the steps, which one step calls and another's docstring speaks of (a Triton launcher's kernel is
# one such helper)
WITH_A_HELPER = REFERENCE + '''

def root_of(head_dim):
    return math.sqrt(head_dim)


def scale_scores(scores, head_dim):
    return scores / root_of(head_dim)


def merge_heads(x):
    """Unlike scale_scores, which divides by root_of(head_dim), this one needs no helper."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)
'''


def test_an_edit_inside_a_helper_regrades_only_the_steps_that_call_it(tmp_path, zygote, monkeypatch):
    edited = WITH_A_HELPER.replace("return math.sqrt(head_dim)", "return head_dim ** 0.5")
    assert regraded(tmp_path, zygote, monkeypatch, WITH_A_HELPER, edited) == REACHING_SCALE_SCORES


def test_an_edit_inside_a_helper_that_code_run_at_import_calls_regrades_every_step(tmp_path, zygote, monkeypatch):
    """Code that runs at import may call the helper and change what any step sees: every step is run again."""
    at_import = WITH_A_HELPER + "\n\nROOT_OF_ONE = root_of(1.0)\n"
    edited = at_import.replace("return math.sqrt(head_dim)", "return head_dim ** 0.5")
    assert regraded(tmp_path, zygote, monkeypatch, at_import, edited) > REACHING_SCALE_SCORES


def test_a_composite_runs_again_when_a_step_it_is_answered_for_passes_or_fails_otherwise(tmp_path, zygote,
                                                                                        monkeypatch):
    """Review 51: a composite's check runs with the grader's answer for each step that failed, the candidate's for
    each that passed; a step's rules check reads the whole file, so an edit outside every step (a helper no step
    calls, naming what hides calls) flips whether project and softmax pass without changing the composite's key."""
    path = tmp_path / "mha.py"
    hides = REFERENCE + "\n\ndef _helper():\n    return torch._C.DisableTorchFunction\n"
    path.write_text(hides)
    results = graded(monkeypatch)
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, REFERENCE)), zygote=zygote)
    first, second = results
    assert {s.id for s in first.steps if s.score < s.max_score} == {"project", "softmax", "MultiHeadAttention"}
    assert second.full_marks
    before = {c.name: c for s in first.steps for c in s.checks}  # a check taken from the cache is the same result
    for s in second.steps:
        for c in s.checks:
            ran_again = c.name.endswith("rules") or s.id == "MultiHeadAttention" and not c.end_to_end
            assert (c is not before[c.name]) == ran_again, c.name


# softmax reaches its helper by a name it builds as it runs, which its words never say whole (review 68's F1)
LOOKED_UP = REFERENCE + """

def _softmax_impl(x, dim):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def softmax(x, dim=-1):
    return globals()["_softmax_" + "impl"](x, dim)
"""


def test_an_edit_in_a_helper_found_by_a_built_name_regrades_the_step(tmp_path, zygote, monkeypatch):
    """Review 68's F1: a helper reached through globals() by a name built at run time kept softmax's and the module's
    checks from the cache after the helper went wrong (watch showed 97 where 85 is fair). A step whose code looks a
    name up as it runs (globals, getattr, vars, ...) depends on every definition."""
    broken = LOOKED_UP.replace("    return e / e.sum(dim=dim, keepdim=True)", "    return x * 0 + 0.5")
    first, second = watched(tmp_path, zygote, monkeypatch, LOOKED_UP, broken)
    lost = {s.id for s in second.steps if s.score < s.max_score}
    assert {"softmax", "MultiHeadAttention"} <= lost, [(s.id, s.score) for s in second.steps]
    assert first.score - second.score >= 12, (first.score, second.score)
