"""How an exercise's declared checks run: each becomes a pytest item that makes its inputs,
calls the candidate in its worker, compares the answer with the reference, and diagnoses a
failure.

pytest collects a spec module (grader/checks/NAME.py, which declares `SPEC`) through
`SpecFile`, pytest's own way of collecting non-Python tests: the module says what to
check, this one runner says how. Every comparison runs here, in the grader's process, on
plain tensors decoded from the worker's bytes.

A composite step (a module that calls the exercise's other steps) is graded on its own
wiring: while its checks run, the worker asks the grader for the answers of the step
functions it calls (`Step.answered`) that lost points in their own checks, and the grader
answers with the reference's, so a bug in `softmax` costs `softmax` and not the module
(a step that passed runs as written: the same answers, without the round trips). A check marked `end_to_end` runs the
module with the candidate's own steps, so an interviewer also sees whether the whole
thing works; when only it fails and other steps have lost points, the report says so.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from grader import wire
from grader.candidate import CandidateError, Strided
from grader.engine import diagnose
from grader.engine.expect import (
    CheckFailed,
    Tolerance,
    as_tensor,
    as_tensor_tree,
    check_rules,
    expect_close,
    expect_form,
    generator,
    random_mask,
    upcast,
)
from grader.engine.spec import Call, Check, Spec, StepSpec

VALUE_DRAWS = 2  # a step's values check (the one run on several dtypes) runs on this many draws of its inputs


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
                    item = SpecItem.from_parent(self, name=name, spec=spec, step=step, check=check, dtype=dtype)
                    item.add_marker(pytest.mark.step(step.id, points=check.points))
                    yield item


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
        Run(context, self.spec, self.step, self.check, self.dtype, self.name).run()

    def reportinfo(self):
        return self.path, None, self.name


@dataclass
class Context:
    """What every check of one grade shares: the candidate, the seed, the device under test, the source."""

    candidate: object
    seed: int
    device: str  # where device checks run: cuda, meta, cpu, or none
    source: str
    forbidden: dict  # step id -> forbidden torch function names, from the manifest
    outcomes: list = field(default_factory=list)  # the results so far (steps run in course order)
    shared: dict = field(default_factory=dict)  # a step's main call (see main_call): its answer, once asked

    def passed(self, step_id: str) -> bool:
        """Did this step run, and pass (or skip) every one of its checks?"""
        mine = [o for o in self.outcomes if o.step == step_id]
        return bool(mine) and all(o.outcome in ("passed", "skipped") for o in mine)


class Gen:
    """The check's own seeded inputs, as tensors (torch exercises) or arrays (NumPy exercises)."""

    def __init__(self, rng: torch.Generator, backend: str):
        self.rng, self.backend = rng, backend

    def randn(self, *shape: int, dtype=torch.float32, scale: float = 1.0):
        x = torch.randn(shape, generator=self.rng, dtype=torch.float64) * scale
        return self.native(x.to(torch_dtype(dtype)))

    def mask(self, *shape: int, keep_first: bool = True):
        return self.native(random_mask(self.rng, *shape, keep_first=keep_first))

    def native(self, x):
        """A tensor as the exercise's functions take it."""
        return x.numpy() if self.backend == "numpy" and isinstance(x, torch.Tensor) else x

    def seed(self) -> int:
        return int(torch.randint(2**31 - 1, (1,), generator=self.rng))


class Run:
    """One check, run: the inputs, the call, the comparison, the diagnosis."""

    def __init__(self, context: Context, spec: Spec, step: StepSpec, check: Check, dtype, name: str):
        self.ctx, self.spec, self.step, self.check = context, spec, step, check
        self.dtype = dtype if dtype is not None else torch.float32
        self.name = name
        main = main_call(step)
        plain = check.kind in ("shape", "rules") and not check.params and not check.strided
        self.shared = main if plain or name == main else None  # the main call's name, if this check asks it
        self.gen = Gen(generator(context.seed, self.shared or name), spec.backend)

    # -- the kinds of check ------------------------------------------------------------

    def run(self) -> None:
        kind = self.check.kind
        if kind == "property":
            self.check.run(self)
            return
        draws = VALUE_DRAWS if kind == "values" and len(self.check.dtypes) > 1 else 1  # the values check, not an edge case
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
                            source_of(self.ctx.source, self.step.id))
                if self.spec.rules:
                    self.spec.rules(answer, self.ctx.source, self.step.id)
            if kind == "shape":
                self.expect_form(self.output(answer), call)
            elif kind == "rules":  # no points for a rule kept by garbage, but say which it is
                try:
                    self.expect_right(self.output(answer), call, device)
                except CheckFailed as failure:
                    raise CheckFailed(f"the rules were kept, but the answer is wrong: {failure.message}", failure.mistake,
                                      failure.details) from None
            else:
                self.expect_right(self.output(answer), call, device)
                if self.name == arguments_check(self.step):  # a side effect costs one check, the step's main one
                    self.expect_arguments_kept(answer, call)

    # -- pieces a property check uses too ----------------------------------------------

    def inputs(self, dtype=None, **params) -> Call:
        return self.step.inputs(self.gen, dtype=dtype or self.dtype, **params)

    def answers(self) -> Answers | None:
        """The grader's answers to the step functions this step calls, unless the check runs it end to end.

        A step that passed every one of its own checks runs as the candidate wrote it: the same
        answers, without a question to the grader for each call.
        """
        if self.check.end_to_end or not self.step.answered:
            return None
        answered = [name for name in self.step.answered if not self.ctx.passed(name)]
        if not answered:
            return None
        references = {s.id: s.reference for s in self.spec.steps if s.id in answered}
        contract = importlib.import_module(self.spec.contract) if self.spec.contract else None
        signatures = {n: inspect.signature(getattr(contract, n) if contract else f) for n, f in references.items()}
        return Answers(references, signatures, self.spec.backend)

    def answer(self, call: Call, device: str = "cpu", strided=(), shapes: bool = False, **extra):
        """The candidate's answer to `call`; an exception it raised becomes a failed check with its diagnosis.

        `extra` goes to Candidate.module: grad_output and grad_args, repeat. With `shapes` (a function step)
        the answer also holds the shapes of the tensors the call created (Answer.shapes).
        """
        step = self.step
        args = tuple(Strided(a) if i in strided else a for i, a in enumerate(call.args))
        candidate = self.ctx.candidate
        try:
            if step.module:
                return candidate.module(
                    step.id, init=call.init, init_kwargs=call.init_kwargs, state=call.state, args=args,
                    kwargs=call.kwargs, device=device, answers=self.answers(), **extra,
                )
            return candidate.invoke(step.id, args, call.kwargs, device=device, answers=self.answers(), shapes=shapes)
        except CandidateError as error:
            if device == "meta" and diagnose.meta_unsupported(error):
                pytest.skip(f"the meta device cannot run this code, so it was not checked there: {error.message}")
            if error.kind == "not_implemented":
                raise
            raise self.error_failure(error, call, device) from None

    def script(self, actions: list[dict], device: str = "cpu"):
        """The candidate's answer to a script of actions (Candidate.script): one result per action.

        The composite's answered steps are answered as in `answer`. An exception that ends the
        script becomes a failed check with its diagnosis, said with the action that raised.
        """
        try:
            return self.ctx.candidate.script(self.step.id, actions, device=device, answers=self.answers())
        except CandidateError as error:
            if device == "meta" and diagnose.meta_unsupported(error):
                pytest.skip(f"the meta device cannot run this code, so it was not checked there: {error.message}")
            if error.kind == "not_implemented":
                raise
            action = actions[error.action] if error.action is not None else {}
            built = [a.get("class") for a in actions if a.get("do") == "build"]
            owner = built[action["object"]] if type(action.get("object")) is int and action["object"] < len(built) else ""
            what = action.get("class") or ".".join(str(n) for n in (owner, action.get("method") or action.get("attribute")) if n)
            call = Call(tuple(action.get("args") or action.get("init") or ()),
                        dict(action.get("kwargs") or action.get("init_kwargs") or {}), tuple(action.get("names") or ()))
            failure = self.error_failure(error, call, device)
            where = f" (in action {error.action + 1} of the script: {action.get('do')} {what})" if error.action is not None else ""
            raise CheckFailed(failure.message + where, failure.mistake, failure.details, failure.outcome) from None

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
        exact = self.reference(call)
        tolerance = Tolerance.of(native, exact, device)
        try:
            (self.step.compare or expect_close)(value, exact, call, tolerance, self.step.outputs)
        except CheckFailed as failure:
            raise self.diagnosed(failure, value, call, device=device) from None

    # -- diagnosis ---------------------------------------------------------------------

    def diagnosed(self, failure: CheckFailed, value, call: Call, device: str = "cpu") -> CheckFailed:
        mistake = failure.mistake or self.explain(value, call, device)
        if mistake is None and self.step.module:
            mistake = self.module_mistake(call, device)
        return replace_mistake(failure, mistake)

    def explain(self, value, call: Call, device: str = "cpu"):
        """The first of the step's mistakes that explains this wrong answer, else a generic one."""
        if _is_meta(value):  # no values to compare: only its form can say something
            return diagnose.form(value, self.reference(call, exact=False), self.spec.backend, device)
        native = self.reference(call, exact=False)
        if _elements(value) > 64 * max(1, _elements(native)):  # far too big to be a variant: its form says enough,
            return diagnose.form(value, native, self.spec.backend, device)  # without copies of it per mistake
        compare = self.step.compare or expect_close
        args = self.reference_args(call)  # a variant runs in the answer's own dtype: overflows and all
        kwargs = {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in call.kwargs.items()}
        loose = Tolerance.loose(value)
        for mistake in self.step.mistakes:
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
        return diagnose.form(value, native, self.spec.backend, device)

    def module_mistake(self, call: Call, device: str):
        """What the module itself shows when run again: weights it left unloaded, or two answers to one input."""
        try:
            result = self.answer(call, device=device, repeat=True).value
        except (CheckFailed, CandidateError):
            return None
        if result.get("unloaded"):
            return diagnose.PARAMETERS_NOT_LOADED
        first, second = result["output"], result["again"]
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.shape == second.shape:
            if not first.is_meta and not torch.equal(first.nan_to_num(), second.nan_to_num()):
                return diagnose.DROPOUT_AT_EVAL
        return None

    def error_failure(self, error: CandidateError, call: Call, device: str) -> CheckFailed:
        """An exception the candidate's code raised, said with its line and inputs, and named if it is a known one."""
        line = _line(self.ctx.source, error.line)
        source = source_of(self.ctx.source, self.step.id)
        mistake = next((m for m in self.step.mistakes if m.raises and m.raises.matches(error, line, source)), None)
        mistake = mistake or diagnose.error(error, line, source)
        message = error.message
        if error.line:
            label = self.ctx.candidate.where(error.line)  # "line N", or "cell C, line M" in a notebook
            message = message.removesuffix(f" ({label})") + (f" at {label}: `{line.strip()}`" if line.strip() else f" ({label})")
        if error.kind == "raised":
            message += f" [called with {describe(call)}" + (f" on {device}" if device != "cpu" else "") + "]"
        return CheckFailed(message, mistake, outcome="error")


# The grader computes a question's answer in its own process, so a question is bounded: its
# inputs' elements and every one of their sizes (an answer can grow with the square of a size,
# q @ kᵀ), and the elements one call may ask about in all. Legitimate calls are far below.
MAX_QUESTION_ELEMENTS = 1 << 16
MAX_QUESTION_SIZE = 256  # the largest size of any axis of any input
MAX_CALL_ELEMENTS = 1 << 24  # inputs and answers of all of one call's questions together
MAX_ANSWER_ELEMENTS = 1 << 22  # an upper bound on one answer (answer_size_bound), before the reference runs


class Answers:
    """The grader's side of a composite's questions: the reference's answer for each step it calls.

    The worker asks {"op": "answer", "name", "args", "kwargs", "grad"} and, in backward,
    {"op": "answer_grad", "index", "grads"}; each reply is plain data. Anything a question
    holds that is not a well-formed question within bounds gets {"ok": false} and an error
    the candidate's code raises: never an exception here.
    """

    def __init__(self, references: dict, signatures: dict, backend: str = "torch"):
        self.references, self.signatures, self.backend = references, signatures, backend
        self.names = tuple(references)
        self.asked: dict[int, tuple] = {}  # the questions a backward pass may come back to
        self.questions = 0
        self.elements = 0

    def reply(self, frame: dict, blobs: list, out: list) -> dict:
        try:
            if frame.get("op") == "answer":
                return self._answer(frame, blobs, out)
            return self._answer_grad(frame, blobs, out)
        except wire.WireError:
            raise  # a malformed frame: the candidate's protocol error
        except Exception as exc:  # a well-formed question the reference cannot answer
            out.clear()
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}

    def _answer(self, frame: dict, blobs: list, out: list) -> dict:
        name = frame.get("name")
        args, kwargs = wire.decode(frame.get("args"), blobs), wire.decode(frame.get("kwargs"), blobs)
        if type(name) is not str or name not in self.references or not isinstance(args, tuple) or not isinstance(kwargs, dict):
            return {"ok": False, "error": f"{str(name)[:40]!r} is not a step the grader answers here"}
        if self.backend == "numpy":  # NumPy promotes mixed float dtypes where torch refuses: promote as it would
            args, kwargs = _promoted(args), dict(zip(kwargs, _promoted(tuple(kwargs.values()))))
        args, kwargs = as_tensor_tree(args), {k: as_tensor_tree(v) for k, v in kwargs.items()}
        leaves = _leaves(args, kwargs)
        size = sum(t.numel() for t in leaves)
        if size > MAX_QUESTION_ELEMENTS or any(n > MAX_QUESTION_SIZE for t in leaves for n in t.shape):
            return {"ok": False, "error": "inputs too large to answer"}
        meta = any(t.is_meta for t in leaves)
        if meta:  # shapes are all a meta answer has: computed on CPU zeros (the meta kernels cost a lazy import)
            args, kwargs = _zeros_for_meta(args), dict(zip(kwargs, _zeros_for_meta(tuple(kwargs.values()))))
        try:
            bound = self.signatures[name].bind(*args, **kwargs)  # by position, or by the contract's names
            bound.apply_defaults()
            if "device" in bound.arguments:  # answered on the CPU; the worker moves the answer where it was asked for
                bound.arguments["device"] = None
            # int arguments are sizes (t_q, num_heads, n_rep): bounded, and counted in the answer's size; not a
            # float parameter given a whole number (rope's base=10000)
            sizes = [v for p, v in bound.arguments.items() if type(v) is int and not _float_parameter(bound.signature.parameters[p])]
            if any(abs(n) > MAX_QUESTION_SIZE for n in sizes) or answer_size_bound(leaves, sizes) > MAX_ANSWER_ELEMENTS:
                return {"ok": False, "error": "inputs too large to answer"}
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
            value = self.references[name](*args, **kwargs)
        except Exception as exc:  # the composite called the step with inputs outside its contract
            called = describe(Call(args, kwargs, tuple(self.signatures[name].parameters)))
            return {"ok": False, "error": f"it was called with {called}: {type(exc).__name__}: {exc}"[:400]}
        self.questions += 1
        self.elements += size + sum(t.numel() for t in _leaves(value if isinstance(value, tuple) else (value,), {}))
        if self.elements > MAX_CALL_ELEMENTS:
            return {"ok": False, "error": "too many questions in one call"}
        if frame.get("grad") is True:
            self.asked[self.questions] = (name, args, kwargs)
        if self.backend == "numpy":
            value = _numpy_tree(value)
        encoded = wire.encode(value, out)
        if meta:  # a meta answer crosses as shapes and dtypes only
            out[:] = [b""] * len(out)
            encoded = _on_meta(encoded)
        return {"ok": True, "value": encoded, "index": self.questions}

    def _answer_grad(self, frame: dict, blobs: list, out: list) -> dict:
        index, grads = frame.get("index"), wire.decode(frame.get("grads"), blobs)
        if type(index) is not int or index not in self.asked or not isinstance(grads, tuple):
            return {"ok": False, "error": "no such answer to differentiate"}
        return {"ok": True, "value": wire.encode(self._gradients(*self.asked[index], grads), out)}

    def _gradients(self, name: str, args: tuple, kwargs: dict, grads: tuple) -> tuple:
        """The reference's vector-Jacobian product at the asked inputs: one gradient (or None) per tensor input."""
        leaves = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]  # the worker's order: top level
        inputs = {id(t): t.detach().requires_grad_(t.is_floating_point()) for t in leaves}
        swap = lambda v: inputs.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        with torch.enable_grad():
            value = self.references[name](*map(swap, args), **{k: swap(v) for k, v in kwargs.items()})
            outputs = value if isinstance(value, tuple) else (value,)
            pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(g, torch.Tensor) and o.requires_grad]
            if any(g.shape != o.shape for o, g in pairs):
                raise ValueError("the gradients do not have the answers' shapes")
            wanted = [t for t in inputs.values() if t.requires_grad]
            if not pairs or not wanted:
                return tuple(None for _ in leaves)
            # sum(o * g) has the gradients of backward(g), without the lazy import (sympy) explicit ones pay
            total = sum((o * g.to(o.dtype)).sum() for o, g in pairs)
            found = torch.autograd.grad(total, wanted, allow_unused=True)
        by_id = dict(zip((id(t) for t in wanted), found))
        return tuple(by_id.get(id(inputs[id(t)])) for t in leaves)


def _promoted(values: tuple) -> tuple:
    floats = [v for v in values if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    if not floats:
        return values
    common = np.result_type(*floats)
    return tuple(v.astype(common) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for v in values)


def _zeros_for_meta(values: tuple) -> tuple:
    return tuple(torch.zeros(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) and v.is_meta else v for v in values)


def _on_meta(item):
    """An encoded answer as a meta tensor's: its dtype and shape, on the meta device, no bytes."""
    if isinstance(item, dict) and item.get("kind") == "tensor":
        return {k: v for k, v in item.items() if k != "blob"} | {"device": "meta"}
    if isinstance(item, dict) and isinstance(item.get("items"), list):
        return dict(item, items=[_on_meta(v) for v in item["items"]])
    return item


def _float_parameter(parameter: inspect.Parameter) -> bool:
    return parameter.annotation in (float, "float") or type(parameter.default) is float


def _elements(value) -> int:
    """How many numbers an answer holds (tensors and arrays, however nested)."""
    return sum(math.prod(getattr(x, "shape", ())) for x in _leaves((value,), {}, (torch.Tensor, np.ndarray)))


def _leaves(args: tuple, kwargs: dict, kind=torch.Tensor) -> list:
    """Every `kind` in the arguments, however deep in tuples, lists and dicts (a bool is no int)."""
    found = []

    def visit(x):
        if isinstance(x, kind) and not isinstance(x, bool):
            found.append(x)
        elif isinstance(x, (tuple, list, dict)):
            for y in x.values() if isinstance(x, dict) else x:
                visit(y)

    visit((*args, *kwargs.values()))
    return found


def answer_size_bound(leaves: list, ints: list) -> int:
    """About the most elements a reference makes of these inputs, known before it runs: the broadcast of
    them all, every leading axis at its largest, then two axes as long as the longest of the last two
    or of the integer arguments (a matmul's Tq × Tk, a mask's t_q × t_k). A question whose inputs
    broadcast to more than the grader can hold is refused before anything is built."""
    rank = max((t.dim() for t in leaves), default=0)
    widest = [max((t.shape[t.dim() - rank + i] for t in leaves if t.dim() >= rank - i), default=1) for i in range(rank)]
    longest = max([1, *widest[-2:], *(abs(n) for n in ints)])
    return math.prod(widest[:-2]) * longest * longest


def _numpy_tree(value):
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, tuple):
        return tuple(_numpy_tree(v) for v in value)
    return value


def matches_any(value, candidates) -> bool:
    """Does the answer equal one of these (a list among them: a mistake's several forms), within its dtype's floor?"""
    for candidate in (form for c in candidates for form in (c if isinstance(c, list) else [c])):
        try:
            expect_close(value, candidate, None, Tolerance.loose(value))
            return True
        except CheckFailed:
            continue
    return False


def replace_mistake(failure: CheckFailed, mistake) -> CheckFailed:
    return CheckFailed(failure.message, mistake, failure.details, failure.outcome, failure.breach)


def describe(call: Call) -> str:
    """The inputs of a call, as a person reads them: names, shapes and dtypes."""
    names = call.names or tuple(f"arg{i}" for i in range(len(call.args)))
    parts = [f"{n} {_describe_value(a)}" for n, a in zip(names, call.args)]
    parts += [f"{k}={_describe_value(v)}" for k, v in call.kwargs.items()]
    return ", ".join(parts)


def _describe_value(value) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{tuple(value.shape)} {dtype}"
    if isinstance(value, Strided):
        return _describe_value(value.tensor) + " non-contiguous"
    return repr(value)


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


def torch_dtype(dtype) -> torch.dtype:
    """A torch dtype, or the one a NumPy dtype stands for."""
    return dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _line(source: str, number) -> str:
    lines = source.splitlines()
    return lines[number - 1] if isinstance(number, int) and 0 < number <= len(lines) else ""


@functools.lru_cache(maxsize=64)  # asked by every rules check and diagnosis of one file: parsed once
def source_of(source: str, name: str) -> str:
    """The source of the candidate's top-level function or class `name` ('' if it has none or does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    found = [node for node in tree.body if getattr(node, "name", None) == name]
    return (ast.get_source_segment(source, found[-1]) or "") if found else ""  # the last definition is the one that runs


# -- property checks that every module step has --------------------------------------------


def linear_layers(names: tuple[str, ...], init: tuple, what: str):
    """A check: the module, only built, has nn.Linear layers (or subclasses, such as nn.LazyLinear) with these names."""

    def check(run: Run) -> None:
        children = run.ctx.candidate.module(run.step.id, init=init, forward=False).value["children"]
        for name in names:
            if "torch.nn.modules.linear.Linear" not in children.get(name, ()):
                got = children[name][0] if name in children else f"nothing (its layers: {', '.join(children) or 'none'})"
                raise CheckFailed(f"expected {name} to be {what}, got {got}", diagnose.LAYER_NAMES)

    return check


def raises_value_error(init: tuple, what: str, missing):
    """A check: building the module with `init` raises ValueError (an assert would vanish under python -O).

    `what` says why the arguments are invalid; `missing` is the mistake of a module built without complaint.
    """

    def check(run: Run) -> None:
        name = f"{run.step.id}({', '.join(map(repr, init))})"
        try:
            run.ctx.candidate.module(run.step.id, init=init, forward=False)
        except CandidateError as error:
            if error.type == "ValueError":
                return
            if error.kind != "raised":  # not implemented, not importable, hung, died: said as it is
                raise
            mistake = diagnose.ASSERT_NOT_VALUEERROR if error.type == "AssertionError" else None
            raise CheckFailed(f"{name} raised {error.message}; the contract says ValueError", mistake) from None
        raise CheckFailed(f"{name} was built without complaint: {what}, so raise ValueError", missing)

    return check


def gradients(**params):
    """A check: the gradients of the module's output with respect to its tensor inputs and every weight."""

    def check(run: Run) -> None:
        call = run.inputs(**params)
        grad_args = tuple(i for i, a in enumerate(call.args) if isinstance(a, torch.Tensor) and a.is_floating_point())
        expected_output = run.reference(call, exact=False)
        grad_output = torch.as_tensor(run.gen.randn(*expected_output.shape))
        result = run.answer(call, grad_output=grad_output, grad_args=grad_args).value
        run.expect_right(result["output"], call)  # a wrong forward is named as such, not as wrong gradients
        inputs = [a.detach().double().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) else a
                  for i, a in enumerate(call.args)]
        params_ = {k: v.detach().double().requires_grad_(True) for k, v in call.state.items()}
        (run.step.reference(params_, *inputs, **call.kwargs) * grad_output.double()).sum().backward()
        names = call.names or tuple(f"argument {i}" for i in range(len(call.args)))
        found = [*((names[i], g, inputs[i]) for i, g in zip(grad_args, result["arg_grads"])),
                 *((n, result["param_grads"].get(n), p) for n, p in params_.items())]
        cut = [name for name, got, _ in found if got is None]
        if cut:  # first: a cut graph also makes the gradients that do arrive wrong
            raise CheckFailed(f"no gradient reached {', '.join(cut)}: it is not on the graph", diagnose.GRADIENT_CUT)
        for name, got, x in found:
            try:
                expect_form(got, x.grad.float())
                expect_close(got, x.grad)
            except CheckFailed as failure:
                raise CheckFailed(f"the gradient of {name}: {failure.message}", details=failure.details) from None

    return check


def end_to_end(**params):
    """A check: the module with the candidate's own steps, not the grader's: does the whole thing work?"""

    def check(run: Run) -> None:
        call = run.inputs(**params)
        try:
            run.expect_right(run.output(run.answer(call)), call)
        except CheckFailed as failure:  # which of the steps it could have lost through: those its source names,
            # and those theirs name (gqa's module calls grouped_attention, which calls repeat_kv)
            calls, sources = [], [source_of(run.ctx.source, run.step.id)]
            while sources:
                source = sources.pop()
                for name in run.step.answered:
                    if name not in calls and re.search(rf"\b{re.escape(name)}\b", source):
                        calls.append(name)
                        sources.append(source_of(run.ctx.source, name))
            raise CheckFailed(failure.message, failure.mistake, {**failure.details, "calls": calls}, failure.outcome) from None

    return check
