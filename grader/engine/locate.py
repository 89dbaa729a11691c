"""Where a wrong answer is wrong, when no mistake explains what it is: the part of a tuple answer that is off,
or a simpler case the candidate gets right.

The last diagnosis of a failed check, after the step's own mistakes, the general ones and the search
(grader/engine/search.py), and before a check's situation (spec.Check.situation, which asks that the
step's plain case passed):

  parts    a tuple answer whose parts are some right, some wrong: "dk is wrong while dq and dv are
           right" (a step may say it in its own words: StepSpec.parts, by the parts that are right);
  probes   the step's simpler cases (StepSpec.probes: one sequence, one head, one query) asked of the
           candidate once a grade, when its plain case fails: a probe answered right names its mistake
           ("right for one batch·head, wrong for several").
"""

from __future__ import annotations

from grader.engine.failure import CheckFailed
from grader.engine.spec import Mistake
from grader.engine.tolerance import Tolerance, expect_close, expect_form

PARTS_WRONG = Mistake(
    "parts_wrong",
    "some parts of the answer are right and others wrong: the error is in what computes only the wrong parts",
    why="The parts that are right clear what they share (the inputs, the scores, the softmax); look at what only "
        "the wrong ones do.",
)
GENERIC = (PARTS_WRONG,)


def parts(run, value, call):
    """The mistake of a tuple answer some of whose parts are right, in the step's words if it has them."""
    names = run.step.outputs
    if not names or not isinstance(value, (tuple, list)) or len(value) != len(names):
        return None
    try:
        native, exact = run.reference(call, exact=False), run.reference(call)
    except Exception:
        return None
    if not (isinstance(exact, tuple) and len(exact) == len(names)):
        return None
    right = tuple(name for name, got, want, form in zip(names, value, exact, native, strict=True)
                  if _close(got, want, form, call))
    if not right or len(right) == len(names):
        return None
    for shown, mistake in run.step.parts:
        if tuple(shown) == right:
            return mistake
    wrong = [name for name in names if name not in right]
    return Mistake(PARTS_WRONG.id, f"{_listed(wrong)} {'is' if len(wrong) == 1 else 'are'} wrong while "
                                   f"{_listed(right)} {'is' if len(right) == 1 else 'are'} right: the error is in what "
                                   f"computes only {_listed(wrong)}", why=PARTS_WRONG.why)


def probed(run):
    """The mistake of the step's first probe the candidate answers right: asked once a grade, None if none."""
    if not run.step.probes:
        return None
    key = ("probes", run.step.id)
    if key not in run.ctx.shared:
        run.ctx.shared[key] = None  # asked once, and never again from inside a probe
        for probe in run.step.probes:
            if _right(run, run.inputs(**probe.params)):
                run.ctx.shared[key] = probe.mistake
                break
    return run.ctx.shared[key]


def _right(run, call) -> bool:
    try:
        value = run.output(run.answer(call))
        native, exact = run.reference(call, exact=False), run.reference(call)
        expect_form(value, native, run.spec.backend, "cpu", run.step.outputs)
        (run.step.compare or expect_close)(value, exact, call, Tolerance.of(native, exact), run.step.outputs)
    except CheckFailed:
        return False
    except Exception:  # a probe that cannot be formed or compared says nothing
        return False
    return True


def _close(got, want, native, call) -> bool:
    try:
        expect_form(got, native)
        expect_close(got, want, call, Tolerance.of(native, want))
    except CheckFailed:
        return False
    except Exception:
        return False
    return True


def _listed(names) -> str:
    names = [f"`{n}`" for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
