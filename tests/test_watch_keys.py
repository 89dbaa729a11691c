"""watch's cache keys (issue 17, #8): a save regrades every step whose answer it can change.

A step's checks are taken from the last grade while their key holds: the step's own code, the steps it
names, the rest of the file. Code that runs at import in a step's definition (a class body, a default
argument, a decorator) can change what another step sees without naming it, so a change there must
regrade the whole file rather than keep a stale full mark.
"""

import collections

from grader import watch as watch_module
from grader.candidate import Candidate
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


def test_a_setting_written_in_a_class_body_regrades_the_step_that_reads_it(tmp_path, zygote, monkeypatch):
    path = tmp_path / "mha.py"
    path.write_text(READS_A_SETTING)
    results = graded(monkeypatch)
    halved = READS_A_SETTING.replace('    SETTINGS["scale"] = 1.0', '    SETTINGS["scale"] = 0.5')
    assert halved != READS_A_SETTING
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, halved)), zygote=zygote)
    first, second = results
    assert first.full_marks, [(s.id, s.score) for s in first.steps]
    lost = {s.id for s in second.steps if s.score < s.max_score}
    assert "scale_scores" in lost, [(s.id, s.score) for s in second.steps]  # not a stale full mark from the cache


def test_an_edit_inside_a_function_body_still_regrades_only_what_reaches_it(tmp_path, zygote, monkeypatch):
    """The cache still pays: a change in one step's body reruns that step and the module, not the others."""
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE)
    results = graded(monkeypatch)
    called = collections.defaultdict(set)  # grade number -> the steps whose code the grader called
    call_child = Candidate._call_child

    def spy(self, header, name, *rest):
        called[len(results)].add(name)  # the grade running now: those before it are in `results`
        return call_child(self, header, name, *rest)

    monkeypatch.setattr(Candidate, "_call_child", spy)
    edited = REFERENCE.replace("return scores / math.sqrt(head_dim)", "return scores / head_dim ** 0.5")
    assert edited != REFERENCE
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, edited)), zygote=zygote)
    assert [r.full_marks for r in results] == [True, True]
    assert called[1] == {"scale_scores", "MultiHeadAttention"}, called
