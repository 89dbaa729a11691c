"""Where a wrong answer is wrong, when no mistake explains what it is: entries never written or masked unasked, the
part of a tuple answer that is off, or a simpler case the candidate gets right.

The last diagnosis of a failed check, after the step's own mistakes, the general ones and the search
(grader/engine/search.py); the first two before a check's situation (spec.Check.situation, which asks that the
step's plain case passed), the others after it:

  unwritten  an answer right but for a run of slices at one end of an axis, all 0: a loop one short
             (range(n - 1) over the sequences, heads or blocks) into an output made of zeros;
  unasked    scores right but for -inf (or a large negative) on every later key: a causal mask where the
             call asked for none;
  softened   the softmax of the right answer over its last axis: probabilities returned for scores;
  scaled     an answer that is the right one times one constant (1/H: a mean over the heads where a sum
             belongs), said with the size of the inputs the constant is, if any;
  zeroed     an answer right but for some slices along one axis, anywhere on it, all 0: a sequence, a head or
             a block skipped by a condition (a length of 1, a boundary) into an output made of zeros;
  rearranged an answer holding the right numbers, each as often, in other places: a reshape where a transpose
             belongs, axes permuted, rows written to another row's place;

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
SLICES_UNWRITTEN = Mistake(
    "slices_unwritten",
    "entries at one end of an axis were never written (left 0), the rest right: a loop stopped one short "
    "(range(n - 1)) or started late; cover every index",
    why="A loop over sequences, heads or blocks whose bound is one off writes all but one of them; an output made "
        "with zeros keeps 0 there.",
)
CAUSAL_UNASKED = Mistake(
    "causal_unasked",
    "a causal mask was applied where none was asked: every later key's score is -inf; mask only what the caller's "
    "mask (or causal=True) blocks",
    why="Decoding and training code masks the future by habit; a step given no mask sees every key.",
)
ANSWER_SCALED = Mistake(
    "answer_scaled",
    "the answer is the right one times one constant: a factor is off (a mean where a sum belongs, a scale twice or "
    "not at all); find what multiplies it",
    why="Every entry off by the same factor clears the shapes, the order and the masking: only a multiplication, a "
        "division, or a mean, is left.",
)
SOFTMAX_APPLIED = Mistake(
    "softmax_applied",
    "the answer is the softmax of what was asked, over its last axis: return the values themselves; the softmax "
    "comes later, in the step that takes it",
    why="A function named for scores ends where the probabilities begin; attention code written whole takes the "
        "softmax next, by habit.",
)
SLICES_ZEROED = Mistake(
    "slices_zeroed",
    "some slices along one axis are all 0 where the answer has values, the rest right: a condition skipped them (a "
    "length of 1, an edge case); compute every one",
    why="An output made with zeros keeps 0 wherever a branch or a loop's bound passes an index by; here the skipped "
        "ones are not at an end, so the loop's range is fine and a condition is not.",
)
VALUES_REARRANGED = Mistake(
    "values_rearranged",
    "the answer holds the right numbers in the wrong places: a reshape or view where a transpose belongs, or axes "
    "permuted; move axes with transpose or permute",
    why="Every number is right, each as often as it should be: what computed them is right, and only the order "
        "they were laid out in is not. A reshape keeps the memory's order; a transpose changes it.",
)
GENERIC = (SLICES_UNWRITTEN, CAUSAL_UNASKED, SOFTMAX_APPLIED, ANSWER_SCALED, SLICES_ZEROED, VALUES_REARRANGED,
           PARTS_WRONG)
BLOCKED = -1e4  # a score this low (or -inf) is one a mask set


def _zero_slices(got, want):
    """For each axis of at least two slices: its length, and which of its slices are all 0 in the answer and in the
    reference (bool tensors)."""
    for axis in range(got.dim()):
        n = got.shape[axis]
        if n >= 2:
            yield axis, n, (got == 0).movedim(axis, 0).reshape(n, -1).all(1), \
                (want == 0).movedim(axis, 0).reshape(n, -1).all(1)


def unwritten(run, value, call):
    """SLICES_UNWRITTEN: a tensor answer equal to the reference but for a run of slices at one end of an axis, every
    one of them all 0 (and not all 0 in the reference)."""
    got, want, native = _tensors(run, value, call)
    if got is None or got.dim() == 0:
        return None
    import torch

    for axis, n, zero, blank in _zero_slices(got, want):
        zero, blank = zero.tolist(), blank.tolist()
        for end in ("last", "first"):
            order = list(range(n)) if end == "first" else list(range(n - 1, -1, -1))
            run_of = next((i for i, index in enumerate(order) if not zero[index]), n)
            missed = order[:run_of]
            if not missed or run_of == n or all(blank[i] for i in missed):
                continue
            index = torch.tensor(sorted(missed), device=got.device)
            patched = got.index_copy(axis, index, want.index_select(axis, index).to(got.dtype))
            if _close(patched, want, native, call):
                return Mistake(SLICES_UNWRITTEN.id, f"the {end} {len(missed)} of {n} entries along axis {axis} were "
                                                    "never written (left 0) while the rest is right: a loop stopped "
                                                    "one short, or started late; cover every index",
                               why=SLICES_UNWRITTEN.why)
    return None


def unasked(run, value, call):
    """CAUSAL_UNASKED: scores equal to the reference but blocked (-inf, or below BLOCKED) on exactly the keys a causal
    mask hides, top-left or bottom-right, where the reference blocks none."""
    got, want, native = _tensors(run, value, call)
    if got is None or got.dim() < 2 or got.shape[-2] < 2 or not bool(want.isfinite().all()):
        return None
    import torch

    blocked = got.isnan().logical_not() & (got <= BLOCKED)
    t_q, t_k = got.shape[-2:]
    for offset in dict.fromkeys((t_k - t_q, 0)):
        later = torch.ones(t_q, t_k, dtype=torch.bool, device=got.device).triu(offset + 1)
        if not later.any() or not bool((blocked == later).all()):
            continue
        if _close(torch.where(later, want.to(got.dtype), got), want, native, call):
            return CAUSAL_UNASKED
    return None


def softened(run, value, call):
    """SOFTMAX_APPLIED: a tensor answer equal to the softmax of the reference over its last axis (which is not that
    softmax already)."""
    got, want, native = _tensors(run, value, call)
    if got is None or got.dim() == 0 or got.shape[-1] < 2 or not bool(want.isfinite().all()):
        return None
    soft = want.double().softmax(-1)
    native_soft = native.double().softmax(-1).to(native.dtype)  # the tolerance follows the reference's own error
    if bool(((want.double() - soft).abs() < 1e-6).all()) or not _close(got, soft.to(want.dtype), native_soft, call):
        return None
    return SOFTMAX_APPLIED


def scaled(run, value, call):
    """ANSWER_SCALED: a tensor answer equal to c times the reference, for one constant c other than 1."""
    got, want, native = _tensors(run, value, call)
    if got is None or not bool(got.isfinite().all()) or not bool(want.isfinite().all()):
        return None
    g, w = got.double().flatten(), want.double().flatten()
    norm = float((w * w).sum())
    factor = float((g * w).sum()) / norm if norm > 0 else 0.0
    if abs(factor) < 1e-6 or abs(factor - 1) < 1e-3 or not _close(got, want * factor, native * factor, call):
        return None
    sizes = sorted({n for x in call.args if hasattr(x, "shape") for n in x.shape if n > 1})
    named = next((f" (1/{n}: a mean over an axis of {n} where a sum belongs, or a division by it)" for n in sizes
                  if abs(factor * n - 1) < 1e-3), "")
    named = named or next((f" ({n}: a sum over an axis of {n} where a mean belongs, or a product by it)"
                           for n in sizes if abs(factor - n) < 1e-3 * n), "")
    return Mistake(ANSWER_SCALED.id, f"the answer is the right one times {factor:.4g}{named}: find the factor that "
                                     "multiplies it", why=ANSWER_SCALED.why)


def zeroed(run, value, call):
    """SLICES_ZEROED: a tensor answer equal to the reference but for some slices along one axis, anywhere on it,
    every one all 0 where the reference's are not."""
    got, want, native = _tensors(run, value, call)
    if got is None or got.dim() == 0:
        return None

    for axis, n, zero, blank in _zero_slices(got, want):
        missed = (zero & ~blank).nonzero().flatten()
        if not 0 < len(missed) < n:
            continue
        patched = got.index_copy(axis, missed, want.index_select(axis, missed).to(got.dtype))
        if _close(patched, want, native, call):
            return Mistake(SLICES_ZEROED.id, f"{len(missed)} of {n} slices along axis {axis} (index "
                                             f"{', '.join(map(str, missed.tolist()[:4]))}) are all 0 where the "
                                             "answer has values, the rest right: a condition skipped them; compute "
                                             "every one", why=SLICES_ZEROED.why)
    return None


def rearranged(run, value, call):
    """VALUES_REARRANGED: a tensor answer whose numbers, sorted, are the reference's, sorted (each as often), where
    the reference has enough different numbers for that to say something."""
    got, want, native = _tensors(run, value, call)
    if got is None or got.numel() < 4 or not bool(got.isfinite().all()) or not bool(want.isfinite().all()):
        return None
    if want.flatten().unique().numel() < max(4, want.numel() // 2):  # many equal numbers: any order may match
        return None
    flat = lambda t: t.flatten().sort().values  # noqa: E731
    if not _close(flat(got), flat(want), flat(native), call):
        return None
    return VALUES_REARRANGED


def _tensors(run, value, call):
    """(value, the exact reference, the native one) when the answer and the reference are tensors of one shape."""
    import torch

    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None, None, None
    try:
        native, exact = run.reference(call, exact=False), run.reference(call)
    except Exception:
        return None, None, None
    if not isinstance(exact, torch.Tensor) or exact.shape != value.shape or not isinstance(native, torch.Tensor):
        return None, None, None
    return value, exact.to(value.device), native


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
