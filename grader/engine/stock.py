"""The stock checks: property checks that the specs of module steps share, each a function of its
parameters that returns the check's run function (`prop("structure", 2, linear_layers(...))`).

  linear_layers       the module, only built, has nn.Linear layers with the contract's names
  raises_value_error  invalid constructor arguments raise ValueError, not an assert
  gradients           the gradients reach every input and weight, and match the reference's
  end_to_end          the module with the candidate's own steps, not the oracle's
  defaults            the module built with only its required arguments is the contract's, and two calls on it agree
"""

from __future__ import annotations

import re

import torch

from grader.candidate import CandidateError
from grader.engine import diagnose
from grader.engine.failure import CheckFailed
from grader.engine.runner import Run, replace_mistake, source_of
from grader.engine.spec import Call
from grader.engine.tolerance import expect_close, expect_form


def linear_layers(names: tuple[str, ...], init: tuple, what: str):
    """A check: the module, only built, has nn.Linear layers (or subclasses, such as nn.LazyLinear) with these names."""

    def check(run: Run) -> None:
        children = run.ctx.candidate.module(run.step.id, init=init, forward=False).value["children"]
        for name in names:
            if "torch.nn.modules.linear.Linear" not in children.get(name, ()):
                layers = ", ".join(children) or "none"
                got = children[name][0] if name in children else f"nothing (its layers: {layers})"
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
        found = [*((names[i], g, inputs[i]) for i, g in zip(grad_args, result["arg_grads"], strict=False)),
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
            details = {**failure.details, "calls": calls}
            raise CheckFailed(failure.message, failure.mistake, details, failure.outcome) from None

    return check


def defaults(**params):
    """A check: the module built with only its required arguments (its constructor's defaults for the rest) gives the
    reference's answer for the contract's defaults, twice in a row on one module (no state kept between calls).

    `params` go to the step's input maker and must describe the defaults' module (bias=True where the contract's
    default is True). The same call with every argument given runs first: a module wrong either way is named by
    its own mistakes, one wrong only when built from its defaults by CONSTRUCTOR_DEFAULTS.
    """

    def check(run: Run) -> None:
        call = run.inputs(**params)
        run.expect_right(run.output(run.answer(call)), call)  # wrong with every argument given: said as such
        bare = Call(call.args, call.kwargs, call.names, call.init, {}, call.state)
        given = ", ".join(f"{k}={v!r}" for k, v in call.init_kwargs.items())
        try:
            result = run.answer(bare, repeat=True).value
            if result.get("unloaded"):
                raise CheckFailed(f"built without {given}, the module has parameters the contract's defaults do not "
                                  f"give it: {', '.join(result['unloaded'])}", diagnose.CONSTRUCTOR_DEFAULTS)
            run.expect_right(result["output"], bare)
        except CheckFailed as failure:
            raise replace_mistake(CheckFailed(f"built with only its required arguments (the defaults for {given}): "
                                              f"{failure.message}", details=failure.details, outcome=failure.outcome),
                                  diagnose.CONSTRUCTOR_DEFAULTS) from None
        first, again = result["output"], result["again"]
        if isinstance(first, torch.Tensor) and isinstance(again, torch.Tensor) and first.shape == again.shape:
            if not torch.equal(first.nan_to_num(), again.nan_to_num()):
                raise CheckFailed("a second call with the same input on the same module gave another answer: calls "
                                  "without a cache must not depend on each other", diagnose.STATE_BETWEEN_CALLS)
        elif type(first) is not type(again):
            raise CheckFailed("a second call with the same input on the same module gave another kind of answer",
                              diagnose.STATE_BETWEEN_CALLS)

    return check
