"""How an exercise's declared checks run: each becomes a pytest item that makes its inputs,
calls the candidate in its worker, compares the answer with the reference, and diagnoses a
failure.

pytest collects a spec module (grader/course/NAME/spec.py, which declares `SPEC`) through
`SpecFile`, pytest's own way of collecting non-Python tests: the spec says what to check,
this one runner says how. Every comparison runs in the grader's process (grader/engine/tolerance.py),
on plain tensors decoded from the worker's bytes. Each item carries its step and check, which
the grader's plugin (grader/run_checks.py) reads back for the points.

A composite step (a module that calls the exercise's other steps) is graded on its own
wiring: while its checks run, the worker asks the grader about the step functions it calls
(`StepSpec.answered`) that lost points in their own checks, and the oracle (grader/oracle.py)
answers with the reference's results, so a bug in `softmax` costs `softmax` and not the module
(a step that passed runs as written: the same answers, without the round trips). A check marked
`end_to_end` (grader/engine/stock.py) runs the module with the candidate's own steps, so an
interviewer also sees whether the whole thing works; when only it fails and other steps have
lost points, the report says so.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import hmac
import importlib
import inspect
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from grader.arrays import as_tensor, describe, leaves
from grader.candidate import CandidateError, Strided
from grader.engine import diagnose, locate, search, tiles
from grader.engine.failure import CheckFailed
from grader.engine.inputs import Gen, generator, torch_dtype
from grader.engine.rules import check_calls, check_rules, reads_forbidden
from grader.engine.spec import Call, Check, Spec, StepSpec
from grader.engine.tolerance import Tolerance, expect_close, expect_form, upcast
from grader.oracle import Oracle
from grader.sandbox.recorder import READ_AS_NUMBER
from grader.source import parse

if TYPE_CHECKING:  # script.py builds on this module
    from grader.engine.script import Script

VALUE_DRAWS = 2  # a step's values check (the one run on several dtypes) runs on this many draws of its inputs
UNFILLED = re.compile(r"the grader's weights did not fill ([\w.]+(?:, [\w.]+)*)")  # the worker's scripts.py says so


def is_spec(module) -> bool:
    return isinstance(getattr(module, "SPEC", None), Spec)


class SpecFile(pytest.File):
    """A spec module as a pytest file: one item per check (and per dtype of a check)."""

    def __init__(self, *, context, module_name: str, **kwargs):
        super().__init__(**kwargs)
        self.context = context
        self.module_name = module_name

    def collect(self):
        spec = importlib.import_module(self.module_name).SPEC
        for step in spec.steps:
            for check in step.checks:
                for dtype in check.dtypes or (None,):
                    name = item_name(step, check, dtype)
                    yield SpecItem.from_parent(self, name=name, spec=spec, step=step, check=check, dtype=dtype)


def item_name(step: StepSpec, check: Check, dtype) -> str:
    several = len(check.dtypes) > 1
    return f"{step.check_prefix}_{check.name}" + (f"[{_dtype_name(dtype)}]" if several else "")


def main_call(step: StepSpec) -> str | None:
    """The item name of the step's plain call: its first values check on float32 with no parameters.

    The step's shape and rules checks (when they have no parameters either) ask the same
    question, so they share its inputs and its answer: one call to the worker for three checks.
    """
    for check in step.checks:
        if check.kind == "values" and not check.params and not check.strided:
            dtype = check.dtypes[0] if check.dtypes else None
            if dtype in (None, torch.float32):
                return item_name(step, check, dtype)
    return None


def arguments_check(step: StepSpec) -> str | None:
    """The item name of the check that also asks whether the call left its arguments alone: the main
    call's values check, else the step's first values check."""
    first = next((c for c in step.checks if c.kind == "values"), None)
    return main_call(step) or (first and item_name(step, first, first.dtypes[0] if first.dtypes else None))


class SpecItem(pytest.Item):
    def __init__(self, *, spec: Spec, step: StepSpec, check: Check, dtype, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.step, self.check, self.dtype = spec, step, check, dtype

    def runtest(self) -> None:
        context = self.parent.context
        run = Run(context, self.spec, self.step, self.check, self.dtype, self.name)
        try:
            run.run()
        except CheckFailed as failure:  # an exception, or a property check's failure: nothing diagnosed it
            if run.passes_fresh(failure):
                raise replace_mistake(failure, diagnose.STATE_SHARED) from None
            if failure.mistake is None and failure.outcome != "skipped" and run.situated():
                raise replace_mistake(failure, self.check.situation) from None
            raise

    def reportinfo(self):
        return self.path, None, self.name


@dataclass
class Context:
    """What every check of one grade shares: the candidate, the seed, the device under test, the source."""

    candidate: object
    seed: int
    device: str  # where device checks run: cuda, meta, cpu, or none
    source: str
    forbidden: dict  # step id -> forbidden torch function names, from exercise.toml
    outcomes: list = field(default_factory=list)  # the results so far (steps run in course order)
    allowed: dict = field(default_factory=dict)  # step id -> the only torch functions it may call, where it says
    shared: dict = field(default_factory=dict)  # a step's main call (see main_call): its answer, once asked
    untiled: dict = field(default_factory=dict)  # step id -> its first call that made more than a tile (tiles.judge)
    traces: dict = field(default_factory=dict)  # a call's inputs (`_layout`) -> the calls it makes (`Run.steered`)
    draw_key: bytes = b""  # the grading account's secret (grader/keys.py): with the source, seeds Gen.unknown

    @functools.cached_property
    def digest(self) -> str:
        """The source's HMAC under the draw key: what seeds the sizes a file cannot know (inputs.Gen.unknown). Its
        author knows the text but not the key, so cannot work the sizes out beforehand and steer them with a comment
        (review 63 did, when they followed the text and the seed alone)."""
        return hmac.new(self.draw_key, self.source.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def passed(self, step_id: str) -> bool:
        """Did this step run, and pass (or skip) every one of its checks?"""
        mine = [o for o in self.outcomes if o.step == step_id]
        return bool(mine) and all(o.outcome in ("passed", "skipped") for o in mine)


class Run:
    """One check, run: the inputs, the call, the comparison, the diagnosis."""

    def __init__(self, context: Context, spec: Spec, step: StepSpec, check: Check, dtype, name: str):
        self.ctx, self.spec, self.step, self.check = context, spec, step, check
        self.dtype = dtype if dtype is not None else torch.float32
        self.name = name
        main = main_call(step)
        plain = check.kind in ("shape", "rules") and not check.params and not check.strided
        self.shared = main if plain or name == main else None  # the main call's name, if this check asks it
        self.gen = Gen(generator(context.seed, self.shared or name), spec.backend,
                       unknown=generator(context.seed, f"{name}: {context.digest}"))
        self.others = generator(context.seed, f"other values: {name}")  # for `steered`, apart from the inputs' draws

    # -- the kinds of check ------------------------------------------------------------

    def run(self) -> None:
        kind = self.check.kind
        if kind == "property":
            self.check.run(self)
            return
        several = kind == "values" and len(self.check.dtypes) > 1  # the step's values check, not an edge case
        draws = VALUE_DRAWS if several else 1
        for draw in range(draws):
            call = self.inputs(**self.check.params)
            device = self.ctx.device if kind == "device" else "cpu"
            if self.shared and draw == 0:  # asked once for the step's shape, values and rules checks
                if self.shared not in self.ctx.shared:
                    self.ctx.shared[self.shared] = self.answer(call, device=device)
                answer = self.ctx.shared[self.shared]
            else:
                answer = self.answer(call, device=device, strided=self.check.strided)
            if kind == "rules":
                check_rules(answer.called, self.ctx.forbidden.get(self.step.id, ()), self.ctx.source,
                            source_of(self.ctx.source, self.step.id), self.ctx.allowed.get(self.step.id))
                if self.spec.rules:
                    self.spec.rules(answer, self.ctx.source, self.step.id)
            if kind == "shape":
                self.expect_form(self.output(answer), call)
            elif kind == "rules":  # no points for a rule kept by garbage, but say which it is
                try:
                    self.expect_right(self.output(answer), call, device)
                except CheckFailed as failure:
                    raise CheckFailed(f"the rules were kept, but the answer is wrong: {failure.message}",
                                      failure.mistake, failure.details) from None
            else:
                self.expect_right(self.output(answer), call, device)
                if self.name == arguments_check(self.step):  # a side effect costs one check, the step's main one
                    self.expect_arguments_kept(answer, call)

    # -- pieces a property check uses too ----------------------------------------------

    def inputs(self, dtype=None, **params) -> Call:
        return self.step.inputs(self.gen, dtype=dtype or self.dtype, **params)

    def oracle(self) -> Oracle | None:
        """The oracle for the step functions this step calls, unless the check runs it end to end.

        A step that passed every one of its own checks runs as the candidate wrote it: the same
        answers, without a question to the grader for each call.
        """
        if self.check.end_to_end or not self.step.answered:
            return None
        answered = [name for name in self.step.answered if not self.ctx.passed(name)]
        return self.answering(answered) if answered else None

    def answering(self, names) -> Oracle:
        """An oracle that answers the step functions `names`, whether they passed or not: a check that counts which
        ones a composite reaches (Oracle.counts)."""
        references = {s.id: s.reference for s in self.spec.steps if s.id in names}
        contract = importlib.import_module(self.spec.contract) if self.spec.contract else None
        signatures = {n: inspect.signature(getattr(contract, n) if contract else f) for n, f in references.items()}
        return Oracle(references, signatures, self.spec.backend)

    def answer(self, call: Call, device: str = "cpu", strided=(), shapes: bool = False, steer: bool = True,
               **extra):
        """The candidate's answer to `call`; an exception it raised becomes a failed check with its diagnosis.

        `extra` goes to Candidate.module: grad_output and grad_args, repeat. With `shapes` (a function step)
        the answer also holds the shapes of the tensors the call created (Answer.shapes). Without `steer`, the
        calls are not compared with a call on other values: for a call whose values no check reads (the bytes it
        keeps alive, tiles.py), the comparison would only cost time.
        """
        step = self.step
        # strided: argument positions, or (position, axis, axis) for another pair of axes than the last two
        layouts = {item[0]: tuple(item[1:]) for item in strided if isinstance(item, tuple)}
        layouts.update({item: (-1, -2) for item in strided if not isinstance(item, tuple)})
        laid = lambda c: tuple(Strided(a, layouts[i]) if i in layouts else a for i, a in enumerate(c.args))  # noqa: E731
        args = laid(call)
        candidate = self.ctx.candidate
        try:
            if step.module:
                answer = candidate.module(
                    step.id, init=call.init, init_kwargs=call.init_kwargs, state=call.state, args=args,
                    kwargs=call.kwargs, device=device, answers=self.oracle(), **extra,
                )
            else:
                judged = step.tiles is not None and device == "cpu"  # every call of a tiled step keeps to tiles
                # and every call of a step that may read no values into Python makes the calls its inputs' shapes
                # make, whatever their values (`steered`)
                traced = device == "cpu" and reads_forbidden(self.ctx.forbidden.get(step.id, ()),
                                                             self.ctx.allowed.get(step.id))
                bounded = step.largest is not None and device == "cpu"  # no tensor past the step's bound
                oracle = self.oracle()

                def invoke(c: Call):
                    got = candidate.invoke(step.id, laid(c), c.kwargs, device=device, answers=oracle,
                                           shapes=shapes or judged or traced or bounded)
                    if bounded:
                        _within(got.shapes, step.largest(c))
                    if judged:
                        sizes = step.tiles(c)
                        tiles.judge_tiles(self.ctx, step.id, sizes, sizes.describe(bool(c.kwargs.get("causal"))),
                                          got.shapes)
                    return got

                answer = self.steered(call, invoke, _layout(args)) if traced and steer else invoke(call)
        except CandidateError as error:
            if device == "meta" and diagnose.meta_unsupported(error):
                pytest.skip(f"the meta device cannot run this code, so it was not checked there: {error.message}")
            if error.kind == "not_implemented":
                raise
            raise self.error_failure(error, call, device) from None
        self.keep_rules(answer)
        return answer

    def keep_rules(self, answer) -> None:
        """Every call keeps the step's rules, not the rules check's call alone (a file can tell that call by its
        inputs: the fortieth review's f05)."""
        check_calls(answer.called, self.ctx.forbidden.get(self.step.id, ()), self.ctx.allowed.get(self.step.id))
        if self.spec.calls:
            self.spec.calls(answer, self.step.id)

    def steered(self, call: Call, invoke, layout=None):
        """The answer to `call` (made by `invoke`), with a read of values (READ_AS_NUMBER) in its calls where what the
        call did follows its inputs' values. Called again on the same shapes and other values (`other_values`), code
        that reads no value into Python makes the same torch calls, answered the same sizes, numbers and bools; code
        that does, not. A key's first call is made twice, the grader's and one on other values, in an order drawn
        under the account's key (`_other_first`), so that a file cannot tell which of them is the grader's (one that
        reads only on a layout's first call reads on the grader's at half the layouts: review 75's O1); a file that
        keeps something between calls may make other calls the first time only, so a difference is settled by one
        more call, compared with the second. A key learned before whose calls are other now (a cache that forgot the
        entry, lru_cache's bound: review 74's F1) is settled by two calls more, compared with each other: a cache
        refilled makes the same calls twice. A
        call made again must answer right where this one did: a file that tells the grader's calls apart and replays
        what it read before (its calls the same, its answer the last one's) reads values too. Those calls keep the
        rules and the tiles as every call does, and one that raises there, where this one answered right, read values
        too (a file that counts the grader's calls could raise on every other one, and be compared with nothing). Only
        a right answer (as the checks judge it) is compared: a wrong one loses its checks as it is, the calls made
        again cost time, and a wrong file that is roughly right on its values, wrong on others (a peaked softmax that
        misses a key) reads nothing. A call made again that is wrong, but neither raised nor replayed, is a slip these
        inputs hide: the check fails on it, as on wrong values."""
        oracle = self.oracle()
        key = (self.step.id, layout or _layout(call.args), _layout(call.kwargs), oracle and oracle.names)
        sequence = lambda a: a.shapes["sequence"] if a.shapes else None  # noqa: E731
        known, again = self.ctx.traces.get(key), []

        def another():
            other = self.other_values(call)
            try:
                got = invoke(other)
            except CandidateError:  # raised (or hung) on other values where this call answered: not right
                again.append((None, other))
                raise
            again.append((got, other))
            return got

        early = None
        if known is None and self._other_first(key):
            try:
                early = another()
            except CandidateError:
                pass
        answer = invoke(call)
        if not self.matches(answer, call):  # a wrong answer loses its checks anyway: no calls made again for it
            return answer
        called, read = answer.called, False
        try:
            if known is None:
                made_early = bool(again)  # then compared in the order made; one that raised is a read, below
                twin = early if made_early else another()
                first, second = (twin, answer) if made_early else (answer, twin)
                if twin is not None:
                    known, called = sequence(second), called | twin.called
                    if sequence(first) != known:
                        latest = another()
                        read = sequence(latest) != known
                        known, called = sequence(latest), called | latest.called
            elif sequence(answer) != known:  # learned before, other now: two calls more, alike where a cache refilled
                latest, confirm = another(), another()
                known, called = sequence(confirm), called | latest.called | confirm.called
                read = sequence(latest) != known
        except CandidateError:
            pass
        slip = None
        for a, c in again if not read else ():
            if a is not None and self.right(a, c):
                continue
            if a is None or any(self.right(a, seen) for seen in (call, *(s for _, s in again if s is not c))):
                read = True  # raised where this call answered, or replayed an earlier call's answer
            else:
                slip = slip or (a, c)
        if slip is not None and not read:
            self._wrong_on_other_values(*slip)
        if read:
            called |= {READ_AS_NUMBER}
        if known is not None:
            self.ctx.traces[key] = known
        return replace(answer, called=called)

    def _other_first(self, key) -> bool:
        """Whether a layout's call on other values comes before the grader's: half the layouts, drawn from the file's
        digest under the account's key (Context.digest), which the file cannot work out."""
        return hashlib.sha256(f"{self.ctx.digest}:{key!r}".encode("utf-8", "surrogatepass")).digest()[0] & 1 == 1

    def _wrong_on_other_values(self, answer, call: Call) -> None:
        """A call on other values made the same torch calls and answered neither right nor an earlier call's answer:
        a kernel wrong where these inputs hide it (acc not rescaled, on keys whose max never rises), which loses the
        check as wrong values do, not the step as a read of values (review 50's F2)."""
        try:
            self.expect_right(self.output(answer), call)
        except CheckFailed as failure:
            raise CheckFailed(f"right on these inputs, wrong on the same shapes with other values: {failure.message}",
                              failure.mistake, failure.details) from None

    def other_values(self, call: Call) -> Call:
        """The call on the same shapes and other values: the step's own `remake`, else every float tensor's finite
        entries drawn afresh, at its scale (integer and bool tensors, infinities and numbers as they were)."""
        if self.step.remake is not None:
            return self.step.remake(call, self.others)
        return replace(call, args=_other_values(call.args, self.others), kwargs=_other_values(call.kwargs, self.others))

    def right(self, answer, call: Call) -> bool:
        """Whether the answer is roughly the reference's: its form, and every value within a hundredth of the largest (a
        16-bit float's by its form only): a replayed answer is off by the values themselves, and a tolerance as tight
        as the checks' would blame an answer's rounding on values it was not checked on."""
        try:
            native, exact = self.reference(call, exact=False), self.reference(call)
            value = self.output(answer)
            expect_form(value, native, self.spec.backend, "cpu", self.step.outputs)
        except CheckFailed:
            return False
        got, want = leaves((value,), {}, np.ndarray) or leaves((value,), {}), leaves((exact,), {})
        if len(got) != len(want):
            return False
        for g, w in zip(got, want, strict=True):
            if as_tensor(g).dtype in (torch.float16, torch.bfloat16):  # 3 digits: no rough value tells a bug apart
                continue
            g, w = as_tensor(g).double(), as_tensor(w).double()
            if g.shape != w.shape or not torch.equal(torch.isnan(g), torch.isnan(w)):
                return False
            finite = torch.isfinite(w)
            if not torch.equal(g[~finite].nan_to_num(), w[~finite].nan_to_num()):
                return False
            scale = w[finite].abs().max().item() if finite.any() else 0.0
            if finite.any() and (g[finite] - w[finite]).abs().max().item() > 1e-2 * scale + 1e-4:
                return False
        return True

    def script(self, script: Script, device: str = "cpu", rules: bool = True, shapes: bool = False, answers=None):
        """The candidate's answer to a Script (grader/engine/script.py): one result per action, in its `value`.

        The composite's answered steps are answered as in `answer`. An exception that ends the
        script becomes a failed check with its diagnosis, said with the action that raised. Its calls keep the
        step's rules, as every call does, unless `rules` is False: a script whose work is a stand-in's of the
        grader's own (Triton's launch probe runs the kernel its own way) answers for calls the file did not make.
        With `shapes`, the answer holds the shapes of what the script's recorded calls created; `answers`, an oracle
        of the check's own in place of the step's.
        """
        try:
            answer = self.ctx.candidate.script(self.step.id, script.actions, device=device,
                                               answers=answers or self.oracle(), shapes=shapes)
        except CandidateError as error:
            if device == "meta" and diagnose.meta_unsupported(error):
                pytest.skip(f"the meta device cannot run this code, so it was not checked there: {error.message}")
            if error.kind == "not_implemented":
                raise
            what, call = script.describe(error.action)
            failure = self.error_failure(error, call, device)
            where = f" (in action {error.action + 1} of the script: {what})" if error.action is not None else ""
            mistake = failure.mistake
            unfilled = UNFILLED.search(error.message) if error.type == "LookupError" else None
            if mistake is None and unfilled:  # a build the grader's weights left parameters of at their random start
                mistake = diagnose.unloaded(unfilled.group(1).split(", "))
            raise CheckFailed(failure.message + where, mistake, failure.details, failure.outcome) from None
        if rules:  # a script's calls too (the thirty-ninth review's f02: a module that called a forbidden function
            self.keep_rules(answer)  # only when it had a cache, which the rules check's cache-less call missed)
        return answer

    def output(self, answer):
        return answer.value["output"] if self.step.module else answer.value

    def reference(self, call: Call, exact: bool = True):
        """The reference's answer, computed in float64 (float32 for the half types) unless `exact` is False."""
        args = self.reference_args(call)
        kwargs = {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in call.kwargs.items()}
        if exact:
            args, kwargs = upcast(args), upcast(kwargs)
        return self.step.reference(*args, **kwargs)

    def reference_args(self, call: Call) -> tuple:
        args = tuple(as_tensor(a) if isinstance(a, np.ndarray) else a for a in call.args)
        return (call.state, *args) if self.step.module else args

    def expect_arguments_kept(self, answer, call: Call) -> None:
        """The call left its arguments as it found them (the worker compares their bytes before and after)."""
        if answer.changed_in_place:
            named = lambda key: call.names[int(key)] if key.isdigit() and int(key) < len(call.names) else key  # noqa: E731
            changed = [named(key) for key in answer.changed_in_place]
            raise CheckFailed(f"the right answer, but the call changed its argument {', '.join(changed)} in place",
                              diagnose.INPUT_CHANGED, details={"changed_in_place": changed})

    def expect_form(self, value, call: Call, device: str = "cpu"):
        """The answer has the reference's type, shape, dtype and device (its values are not looked at)."""
        native = self.reference(call, exact=False)
        try:
            expect_form(value, native, self.spec.backend, device, self.step.outputs)
        except CheckFailed as failure:
            raise self.diagnosed(failure, value, call, device=device) from None
        return native

    def expect_right(self, value, call: Call, device: str = "cpu") -> None:
        """The answer matches the reference; if not, the failure names the mistake that explains it."""
        native = self.expect_form(value, call, device)
        if device == "meta":
            return
        try:
            self._compare(value, native, call, device)
        except CheckFailed as failure:
            raise self.diagnosed(failure, value, call, device=device) from None

    def matches(self, answer, call: Call) -> bool:
        """Whether the answer (on the CPU) is right as the checks judge it: its form, its values within the tolerance
        policy. Nothing is diagnosed."""
        try:
            value = self.output(answer)
            self._compare(value, self.expect_form(value, call, "cpu"), call, "cpu")
        except CheckFailed:
            return False
        return True

    def _compare(self, value, native, call: Call, device: str) -> None:
        """The values against the reference's, within the tolerance policy for `native` (the answer's form)."""
        exact = self.reference(call)
        (self.step.compare or expect_close)(value, exact, call, Tolerance.of(native, exact, device), self.step.outputs)

    # -- diagnosis ---------------------------------------------------------------------

    def diagnosed(self, failure: CheckFailed, value, call: Call, device: str = "cpu") -> CheckFailed:
        mistake = failure.mistake or self.explain(value, call, device)
        if mistake is None and self.step.module:
            mistake = self.module_mistake(call, device)
        return replace_mistake(failure, mistake)

    def explain(self, value, call: Call, device: str = "cpu", mistakes=None):
        """The first of the step's mistakes (or of `mistakes`, those a check finds possible) that explains this
        wrong answer, else a generic one."""
        if _is_meta(value):  # no values to compare: only its form can say something
            return diagnose.form(value, self.reference(call, exact=False), self.spec.backend, device)
        native = self.reference(call, exact=False)
        if _elements(value) > 64 * max(1, _elements(native)):  # far too big to be a variant: its form says enough,
            return diagnose.form(value, native, self.spec.backend, device)  # without copies of it per mistake
        compare = self.step.compare or expect_close
        args = self.reference_args(call)  # a variant runs in the answer's own dtype: overflows and all
        kwargs = {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in call.kwargs.items()}
        loose = Tolerance.loose(value)
        for mistake in self.step.mistakes if mistakes is None else mistakes:
            if mistake.variant is None and mistake.test is None:
                continue
            try:
                if mistake.test is not None:
                    if mistake.test(_torch(value), *args, **kwargs):
                        return mistake
                    continue
                wrong = mistake.variant(*args, **kwargs)
                # a list: the several forms the mistake takes, each an answer (a tuple is one answer of several parts)
                for one in wrong if isinstance(wrong, list) else [wrong]:
                    if not _same_dtypes(value, one):  # a wrong dtype is a mistake of its own (diagnose.form)
                        continue
                    for form in (one, _nan_to_zero(one)):  # as it is, or with its NaN guarded away (nan_to_num)
                        try:
                            compare(value, form, call, loose, self.step.outputs)
                            return mistake
                        except CheckFailed:
                            pass
            except CheckFailed:
                continue
            except Exception:  # a variant that cannot be formed for these inputs explains nothing
                continue
        return self.generic(value, call, native, device)

    def generic(self, value, call: Call, native, device: str):
        """The mistake no list of the step's names: a tuple's parts reordered, the answer's form, then the search
        (grader/engine/search.py) over the wrong answers the step's reference gives with its arguments changed, then
        entries never written or masked unasked, then where it is wrong (the check's situation, the whole answer
        scaled, some slices zeroed, the right numbers rearranged, a part of the answer, a simpler case:
        grader/engine/locate.py)."""
        mistake = search.outputs_reordered(self, value, call)
        if mistake is None:
            mistake = diagnose.form(value, native, self.spec.backend, device)
            if mistake is diagnose.DTYPE_PROMOTED and search.not_cast_back(value, self.reference(call), native):
                mistake = diagnose.NOT_CAST_BACK
        if mistake is None and device != "meta":
            mistake = search.search(self, value, call, native)
        if mistake is None and device != "meta":  # entries never written, or masked where no mask was asked
            mistake = (locate.unwritten(self, value, call) or locate.unasked(self, value, call)
                       or locate.softened(self, value, call))
        if mistake is None and device != "meta":  # where it is wrong: the case this check adds, a part, a probe
            if self.kept_from_earlier_call(call, device):
                return diagnose.KEPT_FROM_EARLIER_CALL
            if self.situated():
                return self.check.situation
            mistake = (locate.scaled(self, value, call) or locate.zeroed(self, value, call)
                       or locate.rearranged(self, value, call) or locate.parts(self, value, call)
                       or (None if self.plain_passed() else locate.probed(self)))
        return mistake

    def kept_from_earlier_call(self, call: Call, device: str) -> bool:
        """Is a function's wrong answer right when asked again as the first call of a fresh process: it kept
        something from an earlier call? Asked by a values check, once a step, in a child of its own (Candidate.aside:
        the step's live child and its caches answer the other checks as before), and the answer kept for its other
        checks."""
        key = ("fresh", self.step.id)
        if key in self.ctx.shared:
            return self.ctx.shared[key]
        # asked again exactly as a values check asked it (a property check may ask its own way)
        if self.step.module or self.check.kind != "values" or device != "cpu" or self.ctx.candidate is None:
            return False
        self.ctx.shared[key] = False
        try:
            with self._aside():
                answer = self.answer(call, device=device, strided=self.check.strided, steer=False)
            self.ctx.shared[key] = self.matches(answer, call)
        except (CheckFailed, CandidateError):
            pass
        return self.ctx.shared[key]

    @contextlib.contextmanager
    def _aside(self):
        """Calls made inside go to a fresh child (Candidate.aside), for a diagnosis: what the grade judges (the tiles
        seen, the calls learned, what the step's checks share) is as if it never asked."""
        shared, untiled, traces = dict(self.ctx.shared), dict(self.ctx.untiled), dict(self.ctx.traces)
        try:
            with self.ctx.candidate.aside():
                yield
        finally:
            self.ctx.shared, self.ctx.untiled, self.ctx.traces = shared, untiled, traces

    def passes_fresh(self, failure: CheckFailed) -> bool:
        """Does a failed check of an object (a class's or a module's) pass when run again as a fresh process's first
        (Candidate.aside)? Then earlier checks' objects left what failed it: state shared between instances (blind set
        58's b17 kept every pool's tables in class-level dicts; the first pool was right). Asked once a step, and for
        each of its failed checks once one passed so; what the grade judges is as if it never asked."""
        key = ("fresh check", self.step.id)
        if (failure.outcome == "skipped" or failure.breach or self.ctx.candidate is None
                or self.ctx.shared.get(key) is False or self.check.kind not in ("property", "values")
                or not (self.step.module or _defines_class(self.ctx.source, self.step.id))):
            return False
        passed = False
        try:
            with self._aside():
                Run(self.ctx, self.spec, self.step, self.check, self.dtype, self.name).run()
            passed = True
        except (CheckFailed, CandidateError, pytest.skip.Exception):
            pass
        self.ctx.shared.setdefault(key, passed)
        return passed

    def plain_passed(self) -> bool:
        """Did the step's plain check (StepSpec.plain) run in this grade, and pass?"""
        plain = self.step.plain_check()
        if plain is None:
            return False
        name = item_name(self.step, plain, None).split("[")[0]
        mine = [o for o in self.ctx.outcomes if o.step == self.step.id and o.name.split("[")[0] == name]
        return bool(mine) and all(o.outcome == "passed" for o in mine)

    def situated(self) -> bool:
        """Does this check's failure name its situation: it has one, and the step's plain case passed?"""
        return self.check.situation is not None and self.plain_passed()

    def module_mistake(self, call: Call, device: str):
        """What the module itself shows when run again: weights it left unloaded, or two answers to one input."""
        try:
            result = self.answer(call, device=device, repeat=True).value
        except (CheckFailed, CandidateError):
            return None
        if result.get("unloaded"):
            return diagnose.unloaded(result["unloaded"])
        first, second = result["output"], result["again"]
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.shape == second.shape:
            if not first.is_meta and not torch.equal(first.nan_to_num(), second.nan_to_num()):
                return diagnose.DROPOUT_AT_EVAL
        return None

    def _unloaded_in_float32(self, call: Call):
        """parameters_not_loaded, if the module run in float32 leaves parameters unloaded: a layer of its own (a bias
        although bias=False) keeps float32 and meets another dtype's weights, which reads as a dtype mismatch."""
        as_float32 = lambda x: x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
        if any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in call.state.values()):
            return None  # already float32: no dtype of the grader's made the mismatch
        state = {name: as_float32(x) for name, x in call.state.items()}
        args = tuple(as_float32(a) for a in call.args)
        again = Call(args, call.kwargs, call.names, call.init, call.init_kwargs, state)
        found = self.module_mistake(again, "cpu")
        return found if found is not None and found.id == diagnose.PARAMETERS_NOT_LOADED.id else None

    def error_failure(self, error: CandidateError, call: Call, device: str) -> CheckFailed:
        """An exception the candidate's code raised, said with its line and inputs, and named if it is a known one."""
        line = _line(self.ctx.source, error.line)
        source = source_of(self.ctx.source, self.step.id)
        mistake = next((m for m in self.step.mistakes if m.raises and m.raises.matches(error, line, source)), None)
        mistake = mistake or diagnose.error(error, line, source)
        if mistake is diagnose.DTYPE_MISMATCH and self.step.module and call.state and device == "cpu":
            mistake = self._unloaded_in_float32(call) or mistake  # a float32 parameter the state never filled
        message = error.message
        if error.line:
            label = self.ctx.candidate.where(error.line)  # "line N", or "cell C, line M" in a notebook
            at = f" at {label}: `{line.strip()}`" if line.strip() else f" ({label})"
            message = message.removesuffix(f" ({label})") + at
        if error.kind == "raised":
            on = f" on {device}" if device != "cpu" else ""
            message += f" [called with {describe(call.args, call.kwargs, call.names)}{on}]"
        return CheckFailed(message, mistake, outcome="error")


@functools.lru_cache(maxsize=64)
def _defines_class(source: str, name: str) -> bool:
    """Whether the file defines `name` as a class at its top level (an exercise's cache, pool or module)."""
    tree = parse(source)
    return tree is not None and any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body)


def matches_any(value, candidates) -> bool:
    """Does the answer equal one of these (a list among them: a mistake's several forms), within its dtype's floor?"""
    for candidate in (form for c in candidates for form in (c if isinstance(c, list) else [c])):
        try:
            expect_close(value, candidate, None, Tolerance.loose(value))
            return True
        except CheckFailed:
            continue
    return False


def _within(shapes, largest: int) -> None:
    """The tensors a call created hold at most `largest` elements each (StepSpec.largest), else its rules broke; a
    call that made more shapes than the record lists is not judged, and fails (review 58's F3 hid a numerical
    gradient behind 299 shapes made first)."""
    if (shapes or {}).get("more"):
        raise CheckFailed(f"the call created tensors of more than {len(shapes['created'])} different shapes: too many "
                          "to check that it differentiates by hand")
    size = max((math.prod(s) for s in (shapes or {}).get("created", ())), default=0)
    if size > largest:
        raise CheckFailed(f"a tensor of {size} elements was created, more than this step ever needs ({largest}, a "
                          "score matrix as wide as a head for every batch and head): derive the gradients by hand, "
                          "not by differentiating numerically", diagnose.FORBIDDEN_CALL,
                          details={"created_elements": size, "largest_allowed": largest}, breach=True)


def replace_mistake(failure: CheckFailed, mistake) -> CheckFailed:
    return CheckFailed(failure.message, mistake, failure.details, failure.outcome, failure.breach)


def _other_values(value, rng: torch.Generator, depth: int = 0):
    """The same inputs with other values (`Run.steered`): a float tensor's finite entries drawn afresh, normal at
    its spread; an infinity, a NaN, an integer or bool tensor and a number as they were."""
    if isinstance(value, Strided):
        return Strided(_other_values(value.tensor, rng, depth), value.axes)
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        finite = torch.isfinite(value)
        scale = value[finite].double().std().item() if finite.sum() > 1 else 1.0
        fresh = torch.randn(value.shape, generator=rng, dtype=torch.float64) * scale
        return torch.where(finite, fresh.to(value.dtype), value)
    if isinstance(value, (tuple, list)) and depth < 3:
        return type(value)(_other_values(v, rng, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 3:
        return {k: _other_values(v, rng, depth + 1) for k, v in value.items()}
    return value


def _layout(value, depth: int = 0):
    """A call's inputs as what makes its calls the same (rules.values_steered): a float tensor's shape, strides and
    dtype; an integer or bool tensor's values too (lengths, a mask: what a step may read); a number as itself."""
    if isinstance(value, Strided):
        return ("strided", value.axes, _layout(value.tensor, depth))
    if isinstance(value, torch.Tensor):
        exact = not (value.is_floating_point() or value.is_complex())
        values = exact and tuple(value.flatten().tolist())
        return ("tensor", tuple(value.shape), value.stride(), str(value.dtype), values)
    if isinstance(value, np.ndarray):
        return ("array", value.shape, str(value.dtype))
    if isinstance(value, (tuple, list)) and depth < 3:
        return tuple(_layout(v, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 3:
        return tuple((k, _layout(v, depth + 1)) for k, v in sorted(value.items(), key=lambda item: str(item[0])))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


def _elements(value) -> int:
    """How many numbers an answer holds (tensors and arrays, however nested)."""
    return sum(math.prod(getattr(x, "shape", ())) for x in leaves((value,), {}, (torch.Tensor, np.ndarray)))


def _is_meta(value) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_is_meta(v) for v in value)
    return isinstance(value, torch.Tensor) and value.is_meta


def _nan_to_zero(value):
    if isinstance(value, tuple):
        return tuple(_nan_to_zero(v) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():  # NaN only: an lse of -inf stays -inf
        return torch.where(torch.isnan(value), torch.zeros((), dtype=value.dtype), value)
    return value


def _same_dtypes(value, wrong) -> bool:
    if isinstance(wrong, tuple):
        return isinstance(value, (tuple, list)) and len(value) == len(wrong) and all(map(_same_dtypes, value, wrong))
    got, want = _torch(value), _torch(wrong)
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        return got.dtype == want.dtype
    return True


def _torch(value):
    if isinstance(value, np.ndarray):
        return as_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_torch(v) for v in value)
    return value


def _dtype_name(dtype) -> str:
    return str(torch_dtype(dtype)).removeprefix("torch.")


def _line(source: str, number) -> str:
    lines = source.splitlines()
    return lines[number - 1] if isinstance(number, int) and 0 < number <= len(lines) else ""


@functools.lru_cache(maxsize=64)  # asked by every rules check and diagnosis of one file: parsed once
def source_of(source: str, name: str) -> str:
    """The source of the candidate's top-level function or class `name` ('' if it has none or does not parse)."""
    tree = parse(source)
    if tree is None:
        return ""
    found = [node for node in tree.body if getattr(node, "name", None) == name]
    # the last definition is the one that runs
    return (ast.get_source_segment(source, found[-1]) or "") if found else ""
